"""`tunix-rt compare` on hand-made eval dirs: the table, flips on shared ids, the exact
McNemar p-value, --fail-below exit codes, --json, and run ids resolving to their latest eval."""

from __future__ import annotations

from tunix_rt.eval.runner import NO_ADAPTER, NO_RUN

import json
import math

import pytest

from tunix_rt.eval.compare import mcnemar_exact


def make_eval(root, name, correct: dict[str, bool], finished_at="2026-11-22T06:00:00+00:00", **metric_over):
    d = root / name
    d.mkdir(parents=True)
    preds = [{"id": i, "question": "q", "gold": "1", "completion": "c", "reasoning": "", "answer": "1" if ok else "2",
              "correct": ok, "format_ok": ok, "n_tokens": 5, "finish_reason": "stop"} for i, ok in correct.items()]
    (d / "predictions.jsonl").write_text("".join(json.dumps(p) + "\n" for p in preds))
    acc = sum(correct.values()) / len(correct)
    metrics = {"accuracy": acc, "format_rate": acc, "answer_found_rate": 1.0, "lenient_accuracy": acc,
               "mean_completion_tokens": 5.0, "truncated_rate": 0.0, "n": len(correct), **metric_over}
    (d / "eval_summary.json").write_text(json.dumps({
        "eval_id": name, "model": "tiny-gemma3", "adapter": NO_ADAPTER, "run_id": NO_RUN, "engine": "torch",
        "device": "cpu", "dataset": {"name": "toy", "version": "v1", "split": "dev", "sha256": "ab" * 32, "n": len(correct)},
        "decoding": {}, "metrics": metrics, "by_category": {}, "started_at": finished_at,
        "finished_at": finished_at, "duration_s": 1.0, "tokens_per_s": 10.0}))
    return d


@pytest.fixture
def pair(tmp_path):
    # 10 shared items: A right/B wrong on 1, A wrong/B right on 5; plus one id only in A
    a = {f"x{i}": i < 3 for i in range(10)} | {"only-a": True}
    b = {f"x{i}": (i < 8 and i != 0) for i in range(10)}
    return make_eval(tmp_path, "base", a), make_eval(tmp_path, "tuned", b)


def test_mcnemar_exact_by_hand():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(3, 3) == 1.0
    # b=1, c=6: 2 * (C(7,0) + C(7,1)) / 2^7 = 16/128
    assert math.isclose(mcnemar_exact(1, 6), 0.125)
    assert math.isclose(mcnemar_exact(6, 1), 0.125)
    assert math.isclose(mcnemar_exact(0, 10), 2 / 1024)
    assert mcnemar_exact(10, 12) < 1.0 and mcnemar_exact(0, 1) == 1.0


def test_compare_json(cli, pair):
    a, b = pair
    r = cli("compare", a, b, "--json")
    assert r.code == 0, r.err
    out = json.loads(r.out)
    assert out["shared"] == 10
    assert out["right_to_wrong"] == ["x0"]
    assert out["wrong_to_right"] == ["x3", "x4", "x5", "x6", "x7"]
    assert out["both_right"] == 2 and out["both_wrong"] == 2
    assert math.isclose(out["mcnemar_p"], mcnemar_exact(1, 5))
    acc = next(m for m in out["metrics"] if m["metric"] == "accuracy")
    assert math.isclose(acc["a"], 4 / 11) and math.isclose(acc["b"], 0.7)
    assert math.isclose(acc["delta"], 0.7 - 4 / 11)
    assert out["same_dataset"] and out["passed"]


def test_compare_table(cli, pair):
    r = cli("compare", *pair)
    assert r.code == 0, r.err
    for text in ("accuracy", "format_rate", "right→wrong 1", "wrong→right 5", "McNemar exact p", "x0"):
        assert text in r.out, text


def test_fail_below_gates_the_candidate(cli, pair):
    a, b = pair
    assert cli("compare", a, b, "--fail-below", "accuracy=0.6").code == 0
    r = cli("compare", a, b, "--fail-below", "accuracy=0.6", "--fail-below", "format_rate=0.75")
    assert r.code == 1 and "FAIL" in r.out and "format_rate" in r.out
    r = cli("compare", a, b, "--fail-below", "accuracy=0.9", "--json")
    assert r.code == 1 and json.loads(r.out)["failed_bars"][0]["metric"] == "accuracy"
    # the bar applies to B: the weaker A passing is irrelevant, swapping fails
    assert cli("compare", b, a, "--fail-below", "accuracy=0.6").code == 1


@pytest.mark.parametrize("bar", ["accuracy", "speed=1", "accuracy=high"])
def test_bad_bar_is_bad_input(cli, pair, bar):
    r = cli("compare", *pair, "--fail-below", bar)
    assert r.code == 2 and "--fail-below" in r.err


def test_run_id_picks_its_latest_eval(cli, home, tmp_path):
    run_evals = home.runs / "run-7" / "eval"
    make_eval(run_evals, "old", {"x0": False, "x1": False}, finished_at="2026-11-22T05:00:00+00:00")
    make_eval(run_evals, "new", {"x0": True, "x1": True}, finished_at="2026-11-22T07:00:00+00:00")
    other = make_eval(tmp_path, "base", {"x0": False, "x1": False})
    out = json.loads(cli("compare", other / "eval_summary.json", "run-7", "--json").out)
    assert out["b"]["path"].endswith("new") and out["wrong_to_right"] == ["x0", "x1"]


def test_unknown_reference_is_bad_input(cli, pair):
    r = cli("compare", pair[0], "no-such-thing")
    assert r.code == 2 and "no-such-thing" in r.err
