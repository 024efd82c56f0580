"""GRPO on the PyTorch engine, through the driver: a complete run with reward rows and
committed checkpoints; accumulation 8x1 == 1x8 on the same rollouts; SIGKILL during the
rollout and during the update, then resume, gives bit-identical weights; a failing reward
fails the run naming the record, and so does one past reward_timeout_s; a run started from a
run is named <method>-<base>-<date>-<id>."""

from __future__ import annotations

import json
import re
import signal
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tunix_rt.train import checkpoint
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.driver import train
from tunix_rt.train.metrics import read_jsonl
import train_testlib  # noqa: E402
from train_testlib import one_torch_thread, write_traces  # noqa: E402,F401 (autouse fixture)
from train_testlib import run_train_cli as _run  # noqa: E402

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def user_rewards_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


def rl_cfg(tmp_path, **over) -> TrainConfig:
    return train_testlib.rl_cfg(tmp_path, **{"lora_dropout": 0.1, "engine": "torch", **over})


def test_grpo_run_is_complete_with_reward_rows_and_checkpoints(home, tmp_path):
    run = train(rl_cfg(tmp_path), home)
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "succeeded" and manifest["summary"]["method"] == "grpo"
    assert [p.name for p in checkpoint.committed(run)] == ["step-000002", "step-000004"]
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for key in ("reward", "reward_rl_rewards:length_share", "reward_format", "rollout_accuracy",
                "rollout_format_rate", "rollout_pass_at_g", "zero_variance_share", "kl", "clip_fraction", "completion_tokens",
                "rollout_s", "update_s", "grad_norm"):
        assert all(key in r for r in rows), key
    assert all(r["grad_norm"] > 0 for r in rows)  # length rewards vary: every step learns
    assert all(r["rollout_pass_at_g"] >= r["rollout_accuracy"] for r in rows)  # any of G >= the mean
    assert all(r["completion_tokens_max"] >= r["completion_tokens"] > 0 for r in rows)  # the longest >= the mean
    assert any(r["kl"] > 0 for r in rows[1:])  # the policy moved away from the reference
    assert (run / "final/adapter/adapter_model.safetensors").is_file()
    assert any("eval_reward" in r for r in read_jsonl(run / "metrics.jsonl"))


@pytest.mark.parametrize("shared", [False, True], ids=["row-per-sample", "shared-prompt"])
def test_grpo_accumulation_8x1_equals_1x8(home, tmp_path, shared):
    """Same rollouts, the update split into 8 micro-batches of 1 or one of 8: same loss and
    gradient (the coefficients are normalised over the whole window); with shared-prompt
    rows, one of 8 is two rows of a prompt and 4 completions."""
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.train.grpo import GRPO
    from tunix_rt.train.torch_engine import TorchEngine

    out = []
    for batch in (8, 1):
        cfg = rl_cfg(tmp_path, batch_size=batch, lora_dropout=0.0, rl_loss="dapo", epsilon_high=0.28)
        tok = load_tokenizer(cfg.model, home)
        engine, method = TorchEngine(cfg), GRPO(cfg, home, tok)
        engine.devices()
        engine.setup(ensure_model(cfg.model, home), tok)
        groups, _ = method.rollouts(engine, 0)
        batches = method.update_batches(groups, shared=shared)
        assert len(batches) == 8 // batch
        assert [len(b.input_ids) for b in batches] == ([2] if shared and batch == 8 else [batch] * (8 // batch))
        loss = 0.0
        for b in batches:
            b.aux["ref_logp"] = engine.token_logprobs(b, adapter=False)
            b.aux["old_logp"] = np.zeros(b.labels.shape, np.float32)
            part, _ = engine.objective_sum(b, method.objective)
            part.backward()
            loss += float(part.detach())
        out.append((loss, [c.ids for g in groups for c in g.completions],
                    {n: p.grad.clone() for n, p in engine.trainable.items()}))
    assert out[0][1] == out[1][1]  # the same rollouts (seeded per step, draw and row)
    assert out[0][0] == pytest.approx(out[1][0], abs=1e-6)
    assert any(g.abs().sum() > 0 for g in out[0][2].values())
    for name, g in out[0][2].items():
        torch.testing.assert_close(out[1][2][name], g, atol=1e-6, rtol=0, msg=name)




def test_grpo_sigkill_in_rollout_and_update_then_resume_is_bit_exact(home, tmp_path):
    cfg = rl_cfg(tmp_path, batch_size=2, save_interval=1, max_steps=4)
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(cfg.to_yaml())
    r = _run(home, ["--config", str(cfg_file)], fault="rollout@2")  # dies after step 2's rollouts
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    run = next(p for p in home.runs.iterdir() if not p.name.startswith("."))
    assert checkpoint.latest(run).name == "step-000001"
    r = _run(home, ["--resume", run.name], fault="accum@5")  # 3 boundaries a step: inside step 3
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert checkpoint.latest(run).name == "step-000002"
    r = _run(home, ["--resume", run.name])
    assert r.returncode == 0, r.stderr[-2000:]
    ref = train(cfg, home)
    got = load_file(str(run / "final/adapter/adapter_model.safetensors"))
    want = load_file(str(ref / "final/adapter/adapter_model.safetensors"))
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    rows = lambda d: [(r["step"], r["reward"], r["loss"]) for r in read_jsonl(d / "metrics.jsonl") if "loss" in r]
    assert rows(run) == rows(ref) and [s for s, *_ in rows(run)] == [1, 2, 3, 4]


def test_a_reward_that_raises_fails_the_run_naming_the_record(home, tmp_path):
    cfg = rl_cfg(tmp_path, rewards={"rl_rewards:explodes": 1.0}, max_steps=3)
    with pytest.raises(Exception, match=r"reward 'rl_rewards:explodes' on record t0\d\d: ZeroDivisionError"):
        train(cfg, home)
    run = next(home.runs.iterdir())
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "failed" and "ZeroDivisionError" in manifest["error"]


@pytest.mark.serial
def test_a_reward_past_reward_timeout_s_fails_the_run_within_seconds_naming_the_record(home, tmp_path):
    """rl_rewards:sleeps sleeps 60 s a call; with reward_timeout_s=1 the CLI run fails at the
    first call, and the stuck call (a daemon thread) does not keep the process alive."""
    cfg = rl_cfg(tmp_path, rewards={"rl_rewards:sleeps": 1.0}, reward_timeout_s=1.0, max_steps=2)
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(cfg.to_yaml())
    t0 = time.monotonic()
    r = _run(home, ["--config", str(cfg_file)])
    took = time.monotonic() - t0
    said = re.compile(r"reward 'rl_rewards:sleeps' on record t0\d\d: no result within reward_timeout_s=1 s")
    assert r.returncode == 1 and said.search(" ".join(r.stderr.split())), r.stderr[-2000:]
    assert took < 60, took  # one sleeping call alone would take 60 s
    (run,) = home.runs.iterdir()
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "failed" and said.search(manifest["error"]), manifest.get("error")
    ran = datetime.fromisoformat(manifest["finished_at"]) - datetime.fromisoformat(manifest["started_at"])
    assert ran.total_seconds() < 30, ran


def test_runs_are_named_method_base_date_id_and_a_run_from_a_run_keeps_its_base(home, tmp_path):
    """Not init-tiny-gemma3-<run>-<date>-<id> (the merged model's directory) any more: the
    method, then the catalog model the chain started from; a user's run_name still wins."""
    from tunix_rt.train.run import base_model_name, new_run_id

    stamp = r"-\d{8}-\d{6}-[0-9a-f]{4}"
    sft = train(rl_cfg(tmp_path, method="sft", max_steps=1, save_interval=0), home)
    assert re.fullmatch("sft-tiny-gemma3" + stamp, sft.name), sft.name
    rl = train(rl_cfg(tmp_path, init=sft.name, max_steps=1, save_interval=0), home)
    assert re.fullmatch("grpo-tiny-gemma3" + stamp, rl.name), rl.name
    assert json.loads((rl / "run_manifest.json").read_text())["config"]["model"].endswith(f"init-{sft.name}")
    assert base_model_name(rl_cfg(tmp_path, init=rl.name), home) == "tiny-gemma3"  # a chain of runs
    assert re.fullmatch("mine" + stamp, new_run_id(rl_cfg(tmp_path, init=sft.name, run_name="mine"), home))
    assert re.fullmatch("sft-my-gemma" + stamp, new_run_id(rl_cfg(tmp_path, method="sft", model="/m/my-gemma"), home))


@pytest.mark.parametrize("engine", ["torch", pytest.param("jax", marks=pytest.mark.jax)])
def test_full_fine_tuning_with_beta_compares_with_a_frozen_copy_of_the_start(home, tmp_path, engine):
    """finetune=full with beta > 0: the reference is a frozen copy of the starting weights (not
    the policy itself, whose KL to itself is 0). At step 1 the policy is the start (KL 0 to
    float precision); from step 2 it has moved, and the KL is positive. On torch, a run stopped
    after step 1 and resumed (the copy loaded again, from the start, not the checkpoint) ends
    with the same weights and rows. The memory plan counts the copy."""
    import dataclasses

    from tunix_rt.plan.make import plan_train

    if engine == "jax":
        from requires import require_module

        require_module("jax")
    cfg = train_testlib.rl_cfg(tmp_path, engine=engine, finetune="full", beta=0.5, max_steps=2, lr=1e-3,
                               save_interval=0)
    run = train(cfg, home)
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert abs(rows[0]["kl"]) < 1e-6 and rows[1]["kl"] > 1e-6, rows
    if engine == "torch":
        from tunix_rt.train.run import RunStopped

        stop = dataclasses.replace(cfg, save_interval=1)
        with pytest.raises(RunStopped):
            train(stop, home, should_stop=lambda: True)
        stopped = max((p for p in home.runs.iterdir() if not p.name.startswith(".")), key=lambda p: p.stat().st_mtime)
        train(stop, home, resume=stopped.name)
        got = [(r["step"], r["loss"], r["kl"]) for r in read_jsonl(stopped / "metrics.jsonl") if "loss" in r]
        assert got == [(r["step"], r["loss"], r["kl"]) for r in rows]
        a, b = (load_file(str(d / "final/merged/model.safetensors")) for d in (stopped, run))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    plan = plan_train(cfg, "cpu", 1)
    lora = plan_train(dataclasses.replace(cfg, finetune="lora"), "cpu", 1)
    assert plan.items["reference_weights"] == plan.items["weights"] and "reference_weights" not in lora.items
    no_kl = plan_train(dataclasses.replace(cfg, beta=0.0), "cpu", 1)
    assert "reference_weights" not in no_kl.items and no_kl.peak_bytes_per_device < plan.peak_bytes_per_device
