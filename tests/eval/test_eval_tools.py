"""`tunix-rt eval` with tools (issue 24): a run's tools are eval's default (`--tools` overrides,
`--tools none` turns them off); predictions record each call and the tokens the tools wrote,
arith counts only the model's own claims, and the summary's metrics the tool use."""

from __future__ import annotations

import json

from test_eval_runner import _make_adapter_run, _read

from tunix_rt.eval.generate import Generation, tool_spans
from tunix_rt.eval.runner import prediction, tool_scores
from tunix_rt.traces.schema import Trace
from tunix_rt.train.config import TrainConfig


def _traces(tmp_path):
    p = tmp_path / "toy.jsonl"
    rows = [{"id": f"q{i}", "question": f"What is {i}*4?", "steps": [f"{i}*4 = {4 * i}"], "answer": str(4 * i)}
            for i in range(3)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _tool_run(home, tiny_dir, tools):
    run = _make_adapter_run(home, tiny_dir, "Be brief.")
    cfg = TrainConfig(model="tiny-gemma3", dataset="x.jsonl", system_prompt="Be brief.", tools=list(tools))
    (run / "config.yaml").write_text(cfg.to_yaml())
    return run


def test_eval_decodes_with_the_runs_tools_unless_told_otherwise(cli, home, tmp_path, tiny_dirs):
    traces = _traces(tmp_path)
    _tool_run(home, tiny_dirs["tiny-gemma3"], ["calculator"])
    base = ("eval", "--adapter", "tiny-run-1", "--dataset", traces, "--max-new-tokens", "5", "--device", "cpu")
    r = cli(*base, "--out", tmp_path / "own")
    assert r.code == 0, r.err
    summary, preds = _read(tmp_path / "own")
    assert summary["decoding"]["tools"] == ["calculator"]
    assert all("tool_calls" in p and "tool_tokens" in p for p in preds)
    assert {"tool_calls_per_item", "tool_error_rate", "tool_use_rate", "tool_tokens_per_item"} <= set(summary["metrics"])

    r = cli(*base, "--tools", "none", "--out", tmp_path / "none")
    assert r.code == 0, r.err
    summary, preds = _read(tmp_path / "none")
    assert "tools" not in summary["decoding"] and not any("tool_calls" in p for p in preds)
    assert "tool_calls_per_item" not in summary["metrics"]

    r = cli(*base, "--tools", "calculator,python", "--out", tmp_path / "both")
    assert r.code == 0, r.err
    assert _read(tmp_path / "both")[0]["decoding"]["tools"] == ["calculator", "python"]

    r = cli(*base, "--tools", "abacus", "--out", tmp_path / "bad")
    assert r.code == 2 and "tools" in r.err and not (tmp_path / "bad").exists()


def test_a_prediction_records_the_calls_and_counts_only_the_models_claims(tiny_tok):
    head = "<reasoning>\n3*4 = <<3*4="
    tail = " and 2*2 = 5\n</reasoning>\n<answer>12</answer>"
    ids = tiny_tok.encode(head)
    forced = tiny_tok.encode("12>>")
    rest = tiny_tok.encode("12" + tail)
    gen = Generation(ids=ids + forced + rest, text=head + "12>>12" + tail, n_tokens=len(ids) + len(forced) + len(rest),
                     finish_reason="length", tool_mask=[0] * len(ids) + [1] * len(forced) + [0] * len(rest),
                     tool_calls=[{"tool": "calculator", "call": "3*4", "result": "12>>", "error": False}])
    spans = tool_spans(gen, tiny_tok)
    assert [gen.text[a:b] for a, b in spans] == ["12>>"]
    record = Trace(id="q", question="What is 3*4?", steps=["3*4 = 12"], answer="12")
    p = prediction(record, [1, 2], gen, tiny_tok, ("calculator",))
    assert p["correct"] and p["tool_tokens"] == len(forced) and p["tool_calls"][0]["call"] == "3*4"
    # "3*4 = <<3*4=12>>12" holds only through the tool's result: not the model's claim; "2*2 = 5" is
    assert (p["arith_claims"], p["arith_true"]) == (1, 0)
    without = prediction(record, [1, 2], gen)
    assert "tool_calls" not in without and without["arith_claims"] >= 1
    scores = tool_scores([p, {**p, "tool_calls": [], "tool_tokens": 0}])
    assert scores == {"tool_calls_per_item": 0.5, "tool_error_rate": 0.0, "tool_use_rate": 0.5,
                      "tool_tokens_per_item": round(len(forced) / 2, 3)}
