"""The JAX engine end to end, through the CLI, in subprocesses (each needs its own JAX:
the sharding test fakes 8 CPU devices, which JAX reads once at import).

- sharded training (fsdp=8 on 8 fake CPU devices) gives the unsharded run's losses/weights;
- SIGKILL mid-run, --resume: exactly max_steps steps, final weights equal an uninterrupted
  run's, the same example order;
- --device tpu here fails with what was found and how to get one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from requires import require_module
from train_testlib import write_traces  # noqa: E402

pytestmark = pytest.mark.jax

require_module("jax")

MAX_STEPS = 6



def _traces(path, n=16):
    return write_traces(path, n)


def _config(tmp_path, **over) -> str:
    from tunix_rt.train.config import TrainConfig

    fields = dict(model="tiny-gemma3", dataset=_traces(tmp_path / "traces.jsonl"), split="all",
                  eval_split="all", eval_limit=4, system_prompt="Be brief.", batch_size=4,
                  grad_accum=2, max_seq_len=128, max_steps=MAX_STEPS, lr=1e-2, warmup_steps=2,
                  save_interval=2, keep_checkpoints=2, log_interval=1, eval_interval=3,
                  lora_rank=4, lora_alpha=8.0, loss_chunk_bytes=64 * 1024 * 4, engine="jax")
    cfg = TrainConfig(**{**fields, **over})
    path = tmp_path / "cfg.yaml"
    path.write_text(cfg.to_yaml())
    return str(path)


def _env(home, fault=None, devices=None):
    env = {**os.environ, "TUNIX_RT_HOME": str(home.root)}
    env.pop("TUNIX_RT_FAULT", None)
    if fault:
        env["TUNIX_RT_FAULT"] = fault
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def _cli(home, args, fault=None):
    cmd = [sys.executable, "-m", "tunix_rt.cli", "train", "--engine", "jax", *args]
    return subprocess.run(cmd, env=_env(home, fault), capture_output=True, text=True, timeout=600)


def _rows(run):
    from tunix_rt.train.metrics import read_jsonl

    return read_jsonl(run / "metrics.jsonl")


def _adapter(run):
    from safetensors.numpy import load_file

    return load_file(str(run / "final/adapter/adapter_model.safetensors"))


def test_sigkill_then_resume_equals_uninterrupted(home, tmp_path):
    from tunix_rt.train.metrics import read_jsonl

    cfg = _config(tmp_path)
    r = _cli(home, ["--config", cfg])
    assert r.returncode == 0, r.stderr[-3000:]
    ref = home.runs / r.stdout.strip().splitlines()[-1].split("/")[-1]

    r = _cli(home, ["--config", cfg], fault="step@4")  # killed after step 4 was logged
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    run = next(p for p in home.runs.iterdir() if p.name.startswith("sft-tiny") and p != ref)
    assert json.loads((run / "run_manifest.json").read_text())["status"] == "running"
    assert not (run / "final").exists()
    assert (run / "checkpoints").is_dir()

    r = _cli(home, ["--resume", run.name])
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "succeeded" and manifest["resumed_from_step"] in (2, 4)

    steps = [row["step"] for row in _rows(run) if "loss" in row]
    assert steps == list(range(1, MAX_STEPS + 1))  # exactly max_steps, each once
    ref_loss = [row["loss"] for row in _rows(ref) if "loss" in row]
    assert [row["loss"] for row in _rows(run) if "loss" in row] == ref_loss
    order = lambda p: [(o["step"], o["ids"]) for o in read_jsonl(p / "data_order.jsonl")]  # noqa: E731
    assert order(run) == order(ref)
    a, b = _adapter(run), _adapter(ref)
    assert set(a) == set(b) and len(a) == 2 * 2 * 7  # 2 layers x 7 projections x (A, B)
    for k in a:  # bit-identical on CPU, not close
        assert np.array_equal(a[k], b[k]), k
    assert np.abs(a[next(k for k in a if "lora_B" in k)]).max() > 0  # training moved B off zero
    for name in ("config.yaml", "loss.png", "data_order.jsonl", "final/adapter/adapter_config.json"):
        assert (run / name).is_file(), name


SHARDED = textwrap.dedent("""
    import json, sys
    import jax
    from tunix_rt.home import Home
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.driver import train
    assert jax.device_count() == 8, jax.devices()
    home = Home.resolve()
    out = {}
    for name, mesh in (("sharded", {"fsdp": 8, "tp": 1}), ("single", {"fsdp": 1, "tp": 1})):
        cfg = TrainConfig.load(sys.argv[1], [f"mesh={json.dumps(mesh)}", f"run_name={name}"])
        out[name] = str(train(cfg, home))
    print(json.dumps(out))
""")


def test_fsdp8_on_fake_devices_equals_one_device(home, tmp_path):
    cfg = _config(tmp_path, finetune="full", optimizer="adamw", grad_accum=1, batch_size=8,
                  eval_interval=0, save_interval=0, max_steps=3)
    r = subprocess.run([sys.executable, "-c", SHARDED, cfg], env=_env(home, devices=8),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    from pathlib import Path

    runs = {k: Path(v) for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}
    manifest = json.loads((runs["sharded"] / "run_manifest.json").read_text())
    assert manifest["summary"]["mesh"] == {"fsdp": 8, "tp": 1} and manifest["device"]["count"] == 8
    sharded, single = (_rows(runs[k]) for k in ("sharded", "single"))
    loss = lambda rows: [x["loss"] for x in rows if "loss" in x]  # noqa: E731
    assert len(loss(sharded)) == 3
    np.testing.assert_allclose(loss(sharded), loss(single), rtol=1e-5)
    assert loss(sharded)[-1] < loss(sharded)[0]
    from safetensors.numpy import load_file

    a = load_file(str(runs["sharded"] / "final/merged/model.safetensors"))
    b = load_file(str(runs["single"] / "final/merged/model.safetensors"))
    for k in a:
        # Adam divides by sqrt(v): where a gradient is ~0, summation-order rounding becomes a
        # visible (but lr-bounded) difference for a handful of elements; the bulk is equal.
        # (Counted, not averaged: in a 64-element norm one such element moves the mean to 1e-6.)
        diff = np.abs(a[k] - b[k])
        assert diff.max() < 0.05 * 1e-2 and np.mean(diff > 1e-5) < 0.02, (k, diff.max(), np.mean(diff > 1e-5))


def test_missing_tpu_says_what_was_found_and_how_to_get_one(home, tmp_path):
    r = _cli(home, ["--config", _config(tmp_path), "--device", "tpu"])
    assert r.returncode == 2  # bad input: the device asked for is not here
    assert "no TPU device" in r.stderr and "cpu" in r.stderr and "Kaggle" in r.stderr, r.stderr[-2000:]
    assert not any(home.runs.iterdir())  # nothing half-written
