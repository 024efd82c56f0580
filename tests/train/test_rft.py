"""method=rft (train.rft): the acceptance rule; a complete run on each engine whose rounds log
their kept share and train on what they kept; a round that keeps nothing trains nothing;
accumulation 8x1 = 1x8 on one round's kept set; SIGKILL mid-round, then resume, gives
bit-identical weights and metrics."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import train_testlib
from requires import require_module
from train_testlib import one_torch_thread  # noqa: F401 (autouse fixture)
from train_testlib import run_train_cli as _run  # noqa: E402
from tunix_rt.errors import BadInput
from tunix_rt.train import checkpoint
from tunix_rt.train.driver import train
from tunix_rt.train.metrics import read_jsonl
from tunix_rt.train.rft import accepted

HERE = Path(__file__).resolve().parent
LONG = "rl_rewards:length_share"


@pytest.fixture(autouse=True)
def user_rewards_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


def rft_cfg(tmp_path, **over):
    """Rounds of 2 prompts x 4 samples of the tiny model, kept when at least 12 characters
    long (a tiny random model never writes a right answer), 2 steps a round."""
    return train_testlib.rl_cfg(tmp_path, **{
        "method": "rft", "engine": "torch", "lora_dropout": 0.0, "rewards": {LONG: 1.0, "format": 0.5},
        "rft_accept": {LONG: 0.12}, "rft_round_steps": 2, "max_steps": 4, "save_interval": 2, **over})


def test_acceptance_is_every_named_reward_at_its_threshold():
    parts = {"answer": np.array([1.0, 1.0, 0.0, 1.0]), "format": np.array([1.0, 0.0, 1.0, 1.0]),
             "arith": np.array([1.0, 1.0, 1.0, 0.5])}
    assert accepted(parts, {"answer": 1.0, "format": 1.0}).tolist() == [True, False, False, True]
    assert accepted(parts, {"answer": 1.0, "format": 1.0, "arith": 1.0}).tolist() == [True, False, False, False]
    assert accepted(parts, {"arith": 0.5}).tolist() == [True, True, True, True]


def test_an_acceptance_rule_naming_no_reward_of_the_run_is_refused(home, tmp_path):
    with pytest.raises(BadInput, match="rft_accept names \\['answer'\\]"):
        train(rft_cfg(tmp_path, rft_accept={"answer": 1.0}), home)
    assert not any(p for p in home.runs.iterdir() if not p.name.startswith("."))  # refused before a run exists


def _check_run(run):
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "succeeded" and manifest["summary"]["method"] == "rft"
    assert [p.name for p in checkpoint.committed(run)] == ["step-000002", "step-000004"]
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    rounds = [r for r in rows if "kept_share" in r]
    assert [r["step"] for r in rounds] == [1, 3] and [r["rft_round"] for r in rounds] == [1, 2]
    for r in rounds:
        assert r["rft_samples"] == 8 and 0 < r["rft_kept"] <= r["rft_accepted"] <= 8
        assert r["kept_share"] == r["rft_kept"] / 8 and f"reward_{LONG}" in r
    assert all(r["grad_norm"] > 0 and r["tokens"] > 0 for r in rows)
    assert (run / "final/adapter/adapter_model.safetensors").is_file()
    assert any("eval_reward" in r for r in read_jsonl(run / "metrics.jsonl"))
    kept = {i for line in read_jsonl(run / "data_order.jsonl") for i in line["ids"]}
    assert all("~r" in i for i in kept)  # trained on sampled completions, never on the traces


def test_rft_run_is_complete_with_kept_share_per_round(home, tmp_path):
    from tunix_rt.train.report import _report_loss

    run = train(rft_cfg(tmp_path), home)
    _check_run(run)
    text = _report_loss(run)  # REPORT.md's training section lists the rounds
    assert "| round | step | samples | accepted | kept | kept share |" in text and "Over 2 rounds:" in text


@pytest.mark.jax
def test_rft_run_on_the_jax_engine(home, tmp_path):
    require_module("jax")
    _check_run(train(rft_cfg(tmp_path, engine="jax"), home))


def test_a_round_that_keeps_nothing_trains_nothing_and_the_next_step_samples_again(home, tmp_path):
    run = train(rft_cfg(tmp_path, rft_accept={"format": 1.0}, max_steps=2, save_interval=0), home)
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert [(r["rft_round"], r["rft_kept"], r["kept_share"], r["grad_norm"]) for r in rows] == [(1, 0, 0.0, 0.0),
                                                                                                 (2, 0, 0.0, 0.0)]


def test_rft_accumulation_8x1_equals_1x8(home, tmp_path):
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.train.data import weighted
    from tunix_rt.train.rft import RFT
    from tunix_rt.train.torch_engine import TorchEngine

    out = []
    for batch, accum in ((8, 1), (1, 8)):
        cfg = rft_cfg(tmp_path, batch_size=batch, grad_accum=accum, rft_accept={LONG: 0.0})
        tok = load_tokenizer(cfg.model, home)
        engine, method = TorchEngine(cfg), RFT(cfg, home, tok)
        engine.devices()
        engine.setup(ensure_model(cfg.model, home), tok)
        method.sample(engine)
        assert len(method.kept) == 8  # every sample accepted, none the same
        batches = weighted([method.stream.next_batch() for _ in range(accum)])
        loss = 0.0
        for b in batches:
            part, _ = engine.objective_sum(b, method.objective)
            part.backward()
            loss += float(part.detach())
        out.append((loss, sorted(i for b in batches for i in b.example_ids),
                    {n: p.grad.clone() for n, p in engine.trainable.items()}))
    assert out[0][1] == out[1][1]
    assert out[0][0] == pytest.approx(out[1][0], abs=1e-6)
    for name, g in out[0][2].items():
        torch.testing.assert_close(out[1][2][name], g, atol=1e-6, rtol=0, msg=name)




def test_rft_sigkill_mid_round_then_resume_is_bit_exact(home, tmp_path):
    """3 steps a round, a checkpoint every step: killed after step 3, the run resumes from
    step 2, in the middle of round 1 (its kept set and stream position come back)."""
    cfg = rft_cfg(tmp_path, rft_round_steps=3, save_interval=1, max_steps=5, lora_dropout=0.1)
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(cfg.to_yaml())
    r = _run(home, ["--config", str(cfg_file)], fault="step@3")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    run = next(p for p in home.runs.iterdir() if not p.name.startswith("."))
    assert checkpoint.latest(run).name == "step-000002"
    assert checkpoint.read_state(checkpoint.latest(run))["rft"]["left"] == 1
    r = _run(home, ["--resume", run.name])
    assert r.returncode == 0, r.stderr[-2000:]
    ref = train(cfg, home)
    got = load_file(str(run / "final/adapter/adapter_model.safetensors"))
    want = load_file(str(ref / "final/adapter/adapter_model.safetensors"))
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    rows = lambda d: [(r["step"], r["loss"], r.get("kept_share")) for r in read_jsonl(d / "metrics.jsonl") if "loss" in r]
    assert rows(run) == rows(ref) and [s for s, *_ in rows(run)] == [1, 2, 3, 4, 5]
