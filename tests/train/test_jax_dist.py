"""Multi-process training of the JAX engine on this CPU: 2 processes (jax.distributed,
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, gloo between them), each with
its own CPU device, on a mesh spanning both (fsdp=2), against one process (fsdp=1) at the same
global batch: the same per-step losses, eval losses, data order and final weights. One run
directory, written by process 0, with committed checkpoints.

A process is SIGKILLed after step 2: the other's next collective fails, the run is left
"failed" (RankFailed), and `--resume` with 2 processes finishes it with exactly the steps
asked, equal to the uninterrupted run."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from requires import require_module
from train_testlib import write_traces

pytestmark = pytest.mark.jax

require_module("jax")

STEPS = 3
#: small enough that AdamW's eps-dominated elements (gradients summed in another order differ
#: in the last bits) stay well inside 1e-6, large enough that the weights tested move
LR = 1e-4
PROCESS_TIMEOUT = 240


def _config(tmp_path, **over) -> str:
    from tunix_rt.train.config import TrainConfig

    fields = dict(model="tiny-gemma3", dataset=write_traces(tmp_path / "traces.jsonl", 12), split="all",
                  eval_split="all", eval_limit=4, system_prompt="Be brief.", batch_size=4, grad_accum=2,
                  max_seq_len=128, max_steps=STEPS, lr=LR, warmup_steps=0, schedule="constant",
                  save_interval=1, keep_checkpoints=2, log_interval=1, eval_interval=2,
                  lora_rank=4, lora_alpha=8.0, engine="jax", device="cpu")
    cfg = TrainConfig(**{**fields, **over})
    path = tmp_path / f"cfg-{len(list(tmp_path.glob('cfg-*.yaml')))}.yaml"
    path.write_text(cfg.to_yaml())
    return str(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home, **extra) -> dict[str, str]:
    env = {**os.environ, "TUNIX_RT_HOME": str(home.root), "OMP_NUM_THREADS": "1",
           # the resumed run compiles what the first one did: a shared cache saves it the time
           "JAX_COMPILATION_CACHE_DIR": str(home.root.parent / "jax-cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}
    for name in ("TUNIX_RT_FAULT", "TUNIX_RT_FAULT_RANK", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
                 "JAX_PROCESS_ID", "XLA_FLAGS"):
        env.pop(name, None)
    env.update(extra)
    return env


def _cmd(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "tunix_rt.cli", "train", "--engine", "jax", *args]


def _two(home, args: list[str], fault_rank: int | None = None) -> list[subprocess.CompletedProcess]:
    """The CLI in 2 processes (0 and 1), as a scheduler would start them; both waited for."""
    address = f"127.0.0.1:{_free_port()}"
    procs = []
    for rank in (0, 1):
        extra = {"JAX_COORDINATOR_ADDRESS": address, "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(rank)}
        if fault_rank is not None:
            extra.update(TUNIX_RT_FAULT="step@2", TUNIX_RT_FAULT_RANK=str(fault_rank))
        procs.append(subprocess.Popen(_cmd(args), env=_env(home, **extra), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=PROCESS_TIMEOUT)  # a hang fails the test
            out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def _rows(run, key="loss"):
    from tunix_rt.train.metrics import read_jsonl

    return [(r["step"], r[key]) for r in read_jsonl(run / "metrics.jsonl") if key in r]


def _runs(home) -> list[Path]:
    return sorted(p for p in home.runs.iterdir() if not p.name.startswith("."))


def _tail(rs) -> str:
    return "\n".join(f"--- process {i} rc={r.returncode}\n{r.stderr[-2500:]}" for i, r in enumerate(rs))


def test_two_processes_killed_resumed_equal_one(home, tmp_path):
    from safetensors.numpy import load_file

    from tunix_rt.train import checkpoint
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.driver import train
    from tunix_rt.train.metrics import read_jsonl

    cfg = _config(tmp_path, mesh={"fsdp": 2, "tp": 1})
    rs = _two(home, ["--config", cfg], fault_rank=1)
    assert rs[1].returncode != 0 and rs[0].returncode != 0, _tail(rs)
    [run] = _runs(home)  # process 0 made it, the other opened the same one
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "failed", (manifest.get("status"), _tail(rs))
    assert manifest["error"].startswith("RankFailed: "), manifest["error"]
    assert [p.name for p in checkpoint.committed(run)] == ["step-000001"]

    rs = _two(home, ["--resume", run.name])
    assert [r.returncode for r in rs] == [0, 0], _tail(rs)
    # process 0 alone reports (gloo's own connection notice goes to stdout too)
    assert rs[0].stdout.strip().splitlines()[-1] == str(run) and str(run) not in rs[1].stdout
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "succeeded" and manifest["resumed_from_step"] == 1
    assert manifest["device"]["processes"] == 2 and manifest["device"]["count"] == 2
    assert manifest["summary"]["mesh"] == {"fsdp": 2, "tp": 1}
    with sqlite3.connect(home.registry_db) as db:
        assert db.execute("select status from runs").fetchall() == [("succeeded",)]
    assert [p.name for p in checkpoint.committed(run)] == ["step-000002", "step-000003"]

    ref = train(TrainConfig.load(_config(tmp_path, mesh={"fsdp": 1, "tp": 1})), home)  # one process, one device
    assert [s for s, _ in _rows(run)] == list(range(1, STEPS + 1))  # each step exactly once
    for key in ("loss", "eval_loss", "grad_norm"):
        got, want = _rows(run, key), _rows(ref, key)
        assert [s for s, _ in got] == [s for s, _ in want] and got, key
        np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=0, atol=1e-6, err_msg=key)
    assert read_jsonl(run / "data_order.jsonl") == read_jsonl(ref / "data_order.jsonl")
    name = "final/adapter/adapter_model.safetensors"
    got, want = load_file(str(run / name)), load_file(str(ref / name))
    assert got.keys() == want.keys() and len(got) == 2 * 2 * 7
    for k, w in want.items():
        np.testing.assert_allclose(got[k], w, rtol=0, atol=1e-6, err_msg=k)
    assert np.abs(want[next(k for k in want if "lora_B" in k)]).max() > 0  # training moved B off zero


GROUP = """
import json, sys
from tunix_rt.train import dist
dist.init("jax")
r = dist.rank()
dist.barrier("start")
out = {"rank": r, "world": dist.world(), "main": dist.is_main(),
       "sum": dist.all_sum([0.1 * (r + 1), 1e-17, -float(r)]),
       "broadcast": dist.broadcast("from 0: ünïcode" if r == 0 else "ignored"),
       "texts": dist.gather_texts("x" * (3 * r))}
dist.check_same(lambda: "same", "a constant")
print("RESULT " + json.dumps(out))
"""


def test_group_collectives(home):
    """dist's collectives over jax.distributed: exact float64 sums, texts of any length."""
    address = f"127.0.0.1:{_free_port()}"
    procs = [subprocess.Popen([sys.executable, "-c", GROUP], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env(home, JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES="2",
                                       JAX_PROCESS_ID=str(rank))) for rank in (0, 1)]
    outs = [p.communicate(timeout=PROCESS_TIMEOUT) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
    got = [json.loads(next(line for line in o.splitlines() if line.startswith("RESULT "))[7:]) for o, _ in outs]
    for r, g in enumerate(got):
        assert (g["rank"], g["world"], g["main"]) == (r, 2, r == 0)
        assert g["sum"] == [0.1 + 0.2, 2e-17, -1.0]  # float64, summed in rank order
        assert g["broadcast"] == "from 0: ünïcode" and g["texts"] == ["", "xxx"]


def test_refusals(home, tmp_path):
    """A mesh that leaves a process out, and GRPO, are refused before a run directory exists."""
    rs = _two(home, ["--config", _config(tmp_path, mesh={"fsdp": 1, "tp": 1})])
    assert all(r.returncode == 2 for r in rs), _tail(rs)
    assert "must span them all" in rs[0].stderr, _tail(rs)
    rs = _two(home, ["--config", _config(tmp_path, method="grpo", group_size=2, rl_prompts=2, rollout_max_new_tokens=16,
                                         rewards={"format": 1.0})])
    assert all(r.returncode == 2 for r in rs), _tail(rs)
    assert "method=grpo samples from the model it trains, and on the JAX engine runs in one process" in rs[0].stderr, _tail(rs)
    # DPO on its own rollouts samples too (refused before a run directory exists, not at its first step)
    rs = _two(home, ["--config", _config(tmp_path, method="dpo", pref_loss="simpo", pairs="rollouts", group_size=2,
                                         rl_prompts=2, rollout_max_new_tokens=16, rewards={"format": 1.0})])
    assert all(r.returncode == 2 for r in rs), _tail(rs)
    assert "method=dpo samples from the model it trains" in rs[0].stderr, _tail(rs)
    assert not _runs(home)
