"""Sampled evaluation: `eval --samples K --temperature T` on the tiny model (K completions per
item on one line, pass@k/maj@K in the summary, bit-identical reruns, per-sample seeds), the
line and metric aggregation on hand-made samples, and `compare` of sampled evals with the
paired pass@1 test."""

from __future__ import annotations

import json
import sqlite3

import pytest

from tunix_rt.eval.passk import item_counts, pass_at_k, paired_sign_test
from tunix_rt.eval.runner import sampled_prediction, sampled_scores

PER_SAMPLE = ["completion", "reasoning", "answer", "correct", "format_ok", "n_tokens", "finish_reason"]


def _records(n=3):
    return [{"id": f"q{i}", "question": f"What is {i}+{i}?", "steps": [f"{i}+{i}={2 * i}"], "answer": str(2 * i),
             "meta": {"category": "even" if i % 2 == 0 else "odd"}} for i in range(n)]


@pytest.fixture
def traces(tmp_path):
    p = tmp_path / "toy.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    return p


def _eval(cli, tiny_dirs, traces, out, *extra):
    r = cli("eval", "--model", tiny_dirs["tiny-gemma3"], "--dataset", traces, "--max-new-tokens", "5",
            "--device", "cpu", "--temperature", "1.0", "--out", out, "--json", *extra)
    assert r.code == 0, r.err
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    return json.loads(r.out), preds


def test_sampled_eval_writes_k_completions_per_item_and_reruns_bit_identically(cli, home, tiny_dirs, traces, tmp_path):
    s, preds = _eval(cli, tiny_dirs, traces, tmp_path / "e1", "--samples", "4", "--seed", "3", "--batch-size", "8")
    m = s["metrics"]
    assert {"pass@1", "pass@2", "pass@4", "maj@4"} <= set(m) and m["samples"] == 4 and "pass@3" not in m
    assert m["accuracy"] == m["pass@1"] and m["n"] == 3  # rates over all n*K samples; n counts items
    assert s["decoding"]["samples"] == 4 and s["decoding"]["strategy"] == "sample" and s["decoding"]["seed"] == 3
    assert set(s["by_category"]) == {"even", "odd"} and s["by_category"]["even"]["samples"] == 4
    assert [p["id"] for p in preds] == ["q0", "q1", "q2"]  # one line per item, dataset order
    for p in preds:
        assert p["n_samples"] == 4 and len(p["samples"]) == 4
        assert p["n_correct"] == sum(x["correct"] for x in p["samples"])
        for x in p["samples"]:
            assert all(f in x for f in PER_SAMPLE) and "id" not in x and "question" not in x
        top = p["samples"][max(p["majority_sample"], 0)]
        assert all(p[f] == top[f] for f in PER_SAMPLE)  # the line's own fields: the majority's sample
    texts = [x["completion"] for p in preds for x in p["samples"]]
    assert len(set(texts)) > 1  # samples, not one greedy answer repeated
    # the registry indexes one row per item (the line's top fields)
    with sqlite3.connect(home.registry_db) as db:
        assert db.execute("select count(*) from predictions").fetchone()[0] == 3
        stored = json.loads(db.execute("select metrics from evaluations").fetchone()[0])
    assert stored["pass@4"] == m["pass@4"] and stored["maj@4"] == m["maj@4"]

    # same seed, another batch size: bit-identical samples; the first 2 of 4 are a 2-sample eval's
    _, again = _eval(cli, tiny_dirs, traces, tmp_path / "e2", "--samples", "4", "--seed", "3", "--batch-size", "3")
    assert again == preds
    assert (tmp_path / "e2" / "predictions.jsonl").read_bytes() == (tmp_path / "e1" / "predictions.jsonl").read_bytes()
    _, two = _eval(cli, tiny_dirs, traces, tmp_path / "e3", "--samples", "2", "--seed", "3")
    assert [[x["completion"] for x in p["samples"]] for p in two] == [[x["completion"] for x in p["samples"][:2]] for p in preds]
    _, other = _eval(cli, tiny_dirs, traces, tmp_path / "e4", "--samples", "4", "--seed", "4")
    assert [x["completion"] for p in other for x in p["samples"]] != texts

    # compare of two sampled evals: the pass@k rows and the paired pass@1 test
    r = cli("compare", tmp_path / "e1", tmp_path / "e4")
    assert r.code == 0, r.err
    assert "pass@4" in r.out and "maj@4" in r.out and "paired sign-flip" in r.out
    j = json.loads(cli("compare", tmp_path / "e1", tmp_path / "e4", "--json").out)
    assert j["pass1"]["items"] == 3 and 0.0 <= j["pass1"]["p"] <= 1.0 and j["pass1"]["a_correct_is"] == "maj@4"


@pytest.mark.parametrize("args, message", [
    (["--samples", "4"], "needs temperature > 0"),
    (["--samples", "0", "--temperature", "1"], "samples must be an integer >= 1"),
])
def test_bad_samples_exit_2(cli, traces, args, message):
    r = cli("eval", "--model", "tiny-gemma3", "--dataset", traces, *args)
    assert r.code == 2 and message in r.err


def _sample(answer: str, correct: bool, tokens: int = 4) -> dict:
    return {"id": "i", "question": "q", "gold": "7", "completion": f"<answer>{answer}</answer>", "reasoning": "",
            "answer": answer, "correct": correct, "format_ok": bool(answer), "n_tokens": tokens,
            "finish_reason": "stop", "answer_source": "tag" if answer else "none", "correct_lenient": correct,
            "category": "c", "prompt_tokens": 9, "arith_claims": 0, "arith_true": 0}


def test_sampled_line_and_metrics_from_hand_made_samples():
    # item A: 7 wins 2-1 (sample 1 "7.0" is its earliest); item B: 9 and 7 tie 2-2, 9 came first
    a = sampled_prediction([_sample("", False), _sample("7.0", True), _sample("8", False), _sample("7", True)])
    b = sampled_prediction([_sample("9", False), _sample("7", True), _sample("$7", True), _sample("9.0", False)])
    c = sampled_prediction([_sample("", False)] * 4)  # nobody answered: sample 0 on top, wrong
    fallback = dict(_sample("7", False), answer_source="fallback")  # an untagged number: no vote
    d = sampled_prediction([fallback, fallback, _sample("8", False), _sample("7", True)])
    assert (d["majority_answer"], d["majority_votes"], d["majority_sample"], d["correct"]) == ("8", 1, 2, False)
    assert (a["majority_answer"], a["majority_votes"], a["majority_sample"], a["answer"], a["correct"]) == ("7", 2, 1, "7.0", True)
    assert (b["majority_answer"], b["majority_sample"], b["correct"], b["n_correct"]) == ("9", 0, False, 2)
    assert (c["majority_answer"], c["majority_sample"], c["correct"], c["n_correct"]) == ("", -1, False, 0)
    m, cats = sampled_scores([a, b, c])
    assert m["pass@1"] == m["accuracy"] == round(4 / 12, 6)
    assert m["pass@2"] == round(2 * pass_at_k(4, 2, 2) / 3, 6) == round(2 * (5 / 6) / 3, 6)
    assert m["pass@4"] == round(2 / 3, 6) and m["maj@4"] == round(1 / 3, 6) and m["samples"] == 4
    assert m["n"] == 3 and m["format_rate"] == round(7 / 12, 6)
    assert cats["c"]["maj@4"] == m["maj@4"] and cats["c"]["n"] == 3
    assert [item_counts(x) for x in (a, b, c)] == [(2, 4), (2, 4), (0, 4)]
    assert item_counts({"correct": True}) == (1, 1)  # a greedy line: one sample


def _write_eval(d, lines, metrics):
    d.mkdir(parents=True)
    (d / "predictions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (d / "eval_summary.json").write_text(json.dumps({
        "eval_id": d.name, "model": "tiny-gemma3", "adapter": "none", "run_id": "not a run (base model)",
        "dataset": {"name": "toy", "version": "v1", "split": "dev", "sha256": "ab" * 32, "n": len(lines)},
        "metrics": metrics, "finished_at": "2026-11-22T06:00:00+00:00"}))
    return d


def test_compare_greedy_against_sampled_reports_the_paired_pass1_test(cli, tmp_path):
    greedy = [dict(_sample("7" if i < 3 else "8", i < 3), id=f"x{i}") for i in range(8)]
    sampled = [dict(sampled_prediction([_sample("7", j < i) for j in range(4)]), id=f"x{i}") for i in range(8)]
    m, _ = sampled_scores(sampled)
    ga = _write_eval(tmp_path / "greedy", greedy, {"accuracy": 3 / 8, "n": 8})
    sb = _write_eval(tmp_path / "sampled", sampled, m)
    r = cli("compare", ga, sb, "--json", "--fail-below", "pass@4=0.5")
    out = json.loads(r.out)
    p1 = out["pass1"]
    assert p1["a"] == 0.375 and p1["b"] == round(sum(min(i, 4) / 4 for i in range(8)) / 8, 6)
    assert p1["a_correct_is"] == "one completion" and p1["b_correct_is"] == "maj@4"
    expected = paired_sign_test([item_counts(x) for x in greedy], [item_counts(x) for x in sampled])
    assert p1["p"] == expected
    rows = {row["metric"]: row for row in out["metrics"]}
    assert rows["pass@4"]["a"] is None and rows["pass@4"]["b"] == m["pass@4"] and rows["maj@4"]["b"] == m["maj@4"]
    assert r.code == 0 and out["passed"]  # pass@4 = 7/8 clears 0.5
    assert cli("compare", ga, sb, "--fail-below", "maj@4=0.99").code == 1
    assert cli("compare", ga, sb, "--fail-below", "pass@x=0.5").code == 2
