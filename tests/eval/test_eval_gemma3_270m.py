"""The real Gemma 3 270M base model on four GSM8K dev questions: complete files, and an
honest report that a base model does not answer in the trained format."""

from __future__ import annotations

import json

import pytest

from tunix_rt.eval.scoring import metrics


@pytest.mark.slow
def test_base_model_eval_is_complete_and_honest(cli, gemma3_270m, monkeypatch, tmp_path):
    monkeypatch.setenv("TUNIX_RT_HOME", str(gemma3_270m.parents[1]))  # the fixture's home: no re-import
    out = tmp_path / "eval"
    r = cli("eval", "--model", "gemma3-270m", "--dataset", "gsm8k", "--split", "dev", "--limit", "4",
            "--max-new-tokens", "64", "--device", "cpu", "--out", out)
    assert r.code == 0, r.err
    summary = json.loads((out / "eval_summary.json").read_text())
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 4 and summary["dataset"]["n"] == 4 and summary["dataset"]["name"] == "gsm8k"
    assert "null" not in (out / "eval_summary.json").read_text()
    assert all(v is not None for p in preds for v in p.values())
    assert summary["metrics"] == metrics(preds).to_dict()  # the summary is what the items say
    assert summary["metrics"]["format_rate"] <= 0.25  # the base model never learned the tags
    assert all(1 <= p["n_tokens"] <= 64 for p in preds) and summary["tokens_per_s"] > 0
    assert "accuracy" in r.out and str(out) in r.out.replace("\n", "")
