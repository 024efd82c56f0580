"""Kill the trainer with SIGKILL (inside a checkpoint write, inside an accumulation window,
and at a random moment), resume it, and get exactly the weights and the example order of a
run that was never interrupted. CPU, fp32, bit-exact."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tunix_rt.train import checkpoint
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.metrics import read_jsonl
from tunix_rt.train.driver import train
from train_testlib import write_traces  # noqa: E402

MAX_STEPS = 8



def _traces(path, n=12):
    return write_traces(path, n)


def _config(tmp_path) -> TrainConfig:
    return TrainConfig(model="tiny-gemma3", dataset=_traces(tmp_path / "traces.jsonl"), split="all",
                       eval_split="all", eval_limit=2, system_prompt="Be brief.", batch_size=2,
                       grad_accum=2, max_seq_len=128, max_steps=MAX_STEPS, lr=1e-2, warmup_steps=2,
                       save_interval=2, keep_checkpoints=2, log_interval=1, eval_interval=3,
                       lora_dropout=0.1)  # dropout draws from torch's RNG: resume must restore it


def _cli(home, args, fault=None, env_extra=None):
    env = {**os.environ, "TUNIX_RT_HOME": str(home.root), "OMP_NUM_THREADS": "1"}
    env.pop("TUNIX_RT_FAULT", None)
    if fault:
        env["TUNIX_RT_FAULT"] = fault
    return [sys.executable, "-m", "tunix_rt.cli", "train", *args], env


def _run(home, args, fault=None):
    cmd, env = _cli(home, args, fault)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _final_state(run):
    weights = load_file(str(run / "final/adapter/adapter_model.safetensors"))
    order = [(r["step"], r["ids"]) for r in read_jsonl(run / "data_order.jsonl")]
    return weights, order


def test_sigkill_anywhere_then_resume_is_bit_exact(home, tmp_path):
    torch.set_num_threads(1)
    cfg = _config(tmp_path)
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(cfg.to_yaml())

    # 1. killed while writing the 2nd checkpoint (step 4): step 2 is the last committed one
    r = _run(home, ["--config", str(cfg_file)], fault="ckpt-write@2")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    run = next(p for p in home.runs.iterdir() if not p.name.startswith("."))
    assert [p.name for p in checkpoint.committed(run)] == ["step-000002"]
    assert json.loads((run / "run_manifest.json").read_text())["status"] == "running"

    # 2. resumed, then killed between the two micro-batches of its 3rd step
    r = _run(home, ["--resume", run.name], fault="accum@3")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert checkpoint.latest(run).name == "step-000004"

    # 3. resumed, then killed at a random moment once it has trained a step
    cmd, env = _cli(home, ["--resume", run.name])
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if any(r["step"] > 4 for r in read_jsonl(run / "data_order.jsonl") if "step" in r):
            break
        time.sleep(0.05)
    time.sleep(random.Random().uniform(0.0, 0.4))
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)

    # 4. resumed to the end (unless the random kill came after it finished)
    if proc.returncode != 0:
        out = train(cfg, home, resume=run.name)
        assert out == run
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "succeeded"

    # the uninterrupted reference, same config, in a fresh run directory
    ref = train(cfg, home)
    got_w, got_order = _final_state(run)
    ref_w, ref_order = _final_state(ref)
    assert got_order == ref_order and [s for s, _ in got_order] == list(range(1, MAX_STEPS + 1))
    assert got_w.keys() == ref_w.keys()
    for name in ref_w:
        assert torch.equal(got_w[name], ref_w[name]), name
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert steps == list(range(1, MAX_STEPS + 1))  # exactly the steps asked for, each once
    ref_loss = [r["loss"] for r in read_jsonl(ref / "metrics.jsonl") if "loss" in r]
    assert [r["loss"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r] == ref_loss


def test_sigterm_stops_after_the_step_with_a_checkpoint_and_resume_finishes(home, tmp_path):
    """`tunix-rt train` sent SIGTERM (a preempted job) ends the step it is in, commits a
    checkpoint and says `stopped` (exit 1, not success, not a run left `running`); --resume
    then trains exactly the remaining steps."""
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(_config(tmp_path).to_yaml())
    r = _run(home, ["--config", str(cfg_file)], fault="step@3:SIGTERM")
    assert r.returncode == 1, r.stderr[-2000:]
    run = next(p for p in home.runs.iterdir() if not p.name.startswith("."))
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "stopped" and f"stopped at step 3 of {MAX_STEPS}" in manifest["error"]
    assert f"--resume {run.name}" in r.stderr
    assert checkpoint.latest(run).name == "step-000003" and not (run / "final").exists()
    r = _run(home, ["--resume", run.name])
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((run / "run_manifest.json").read_text())["status"] == "succeeded"
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert steps == list(range(1, MAX_STEPS + 1))


def test_resume_ignores_uncommitted_and_refuses_what_cannot_continue(home, tmp_path):
    torch.set_num_threads(1)
    cfg = _config(tmp_path)
    cfg = TrainConfig(**{**cfg.to_dict(), "max_steps": 3, "save_interval": 1})
    run = train(cfg, home)
    # a torn write: a later step dir without COMMIT and a temp dir are ignored
    (run / "checkpoints/step-000009").mkdir()
    (run / "checkpoints/.tmp-step-000010-1").mkdir()
    assert checkpoint.latest(run).name == "step-000003"
    state = json.loads((checkpoint.latest(run) / "state.json").read_text())
    assert state["data_position"] and state["model_sha256"] and state["dataset_sha256"]
    assert state["engine"] == "torch" and state["device_kind"] == "cpu" and len(state["config_digest"]) == 64
    assert set(state["rng"]) >= {"python", "numpy", "torch"}
    assert {p.name for p in checkpoint.latest(run).iterdir()} >= {
        "weights.safetensors", "optimizer.safetensors", "optimizer.json", "state.json", "config.yaml", "COMMIT"}
    from tunix_rt.errors import BadInput

    # a succeeded run is not resumed; a different config is not accepted
    with pytest.raises(BadInput, match="already succeeded"):
        train(cfg, home, resume=run.name)
    with pytest.raises(BadInput, match="lr=0.01"):
        train(TrainConfig(**{**cfg.to_dict(), "lr": 0.5}), home, resume=run.name)
    # an unfinished run whose checkpoint came from another engine, device kind, config or
    # dataset is refused naming what the run holds, and nothing of the run is touched
    manifest = json.loads((run / "run_manifest.json").read_text())
    manifest["status"] = "running"
    (run / "run_manifest.json").write_text(json.dumps(manifest))
    before = {f: (run / f).read_bytes() for f in ("metrics.jsonl", "data_order.jsonl", "run_manifest.json")}
    ckpt = checkpoint.latest(run)
    original = (ckpt / "state.json").read_text()
    for key, value, said in (("engine", "jax", "engine: the checkpoint has 'jax'"),
                             ("device_kind", "cuda", "device_kind: the checkpoint has 'cuda'"),
                             ("config_digest", "0" * 64, "config_digest"),
                             ("dataset_sha256", "1" * 64, "dataset_sha256")):
        (ckpt / "state.json").write_text(json.dumps({**json.loads(original), key: value}))
        with pytest.raises(BadInput, match=said):
            train(cfg, home, resume=run.name)
        assert {f: (run / f).read_bytes() for f in before} == before, key
    assert yaml.safe_load((run / "config.yaml").read_text())["max_steps"] == 3


def test_the_config_digest_ignores_what_a_resume_may_change():
    base = TrainConfig.load("smoke", [])
    assert checkpoint.config_digest(base) == checkpoint.config_digest(
        TrainConfig.load("smoke", ["reward_timeout_s=3", "log_interval=7"]))
    assert checkpoint.config_digest(base) != checkpoint.config_digest(TrainConfig.load("smoke", ["lr=0.01"]))
