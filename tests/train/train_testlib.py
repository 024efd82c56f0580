"""Shared by the train tests (tests/train is on sys.path under pytest's rootdir-based import)."""

from __future__ import annotations

import json

import pytest


def write_traces(path, n=16):
    """Short, variable-length traces in the trace format; returns the path as a string."""
    with open(path, "w") as f:
        for i in range(n):
            steps = [f"{i} plus {j} is {i + j}" for j in range(1 + i % 3)]
            f.write(json.dumps({"id": f"t{i:03d}", "question": f"Add {i} and {'one ' * (i % 4)}?",
                                "steps": steps, "answer": str(i)}) + "\n")
    return str(path)


def write_pairs(path, n=16) -> str:
    """Pairs of different lengths in TRL's prompt/chosen/rejected format."""
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": f"Add {i} and {i % 5}?",
                                "chosen": f"<reasoning>{i} plus {i % 5} is {i + i % 5}</reasoning>\n"
                                          f"<answer>{i + i % 5}</answer>",
                                "rejected": f"<answer>{3 * i + 1}</answer>" + " no" * (i % 4)}) + "\n")
    return str(path)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """2 shared cores: one thread avoids OpenMP oversubscription stalls (autouse where imported)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def rl_cfg(tmp_path, **over):
    """A tiny GRPO config (12 traces, 2 prompts x 4 samples of 12 tokens, 4 steps, a length
    reward that varies so every step learns); fields in `over` replace the defaults."""
    from tunix_rt.train.config import TrainConfig

    base = dict(model="tiny-gemma3", dataset=write_traces(tmp_path / "traces.jsonl", 12), split="all",
                eval_split="all", eval_limit=2, system_prompt="Be brief.", method="grpo", batch_size=4,
                max_seq_len=96, max_steps=4, lr=1e-2, warmup_steps=0, log_interval=1, save_interval=2,
                group_size=4, rl_prompts=2, rollout_max_new_tokens=12, beta=0.04,
                rewards={"rl_rewards:length_share": 1.0, "format": 0.5}, device="cpu")
    base.update(over)
    return TrainConfig(**base)


def run_train_cli(home, args, fault=None):
    """`tunix-rt train ARGS` in a child process of its own (a SIGKILL from a fault point kills
    it, not the test), on `home`, one thread, with this folder on its path (for test rewards);
    `fault` sets TUNIX_RT_FAULT (train/faults.py), else none is inherited."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = str(Path(__file__).resolve().parent)
    env = {**os.environ, "TUNIX_RT_HOME": str(home.root), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    env.pop("TUNIX_RT_FAULT", None)
    if fault:
        env["TUNIX_RT_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "tunix_rt.cli", "train", *args], env=env,
                          capture_output=True, text=True, timeout=600)


def jax_engine_with_drawn_adapter(cfg, home, seed: int, scale: float):
    """(JaxEngine on cfg, tokenizer) with every trainable weight drawn from N(0, scale) (the LoRA
    factors: the policy is no longer the adapter-off reference)."""
    import jax
    import numpy as np
    from flax import nnx

    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.train.jax_engine import JaxEngine

    tok = load_tokenizer(cfg.model, home)
    engine = JaxEngine(cfg)
    engine.devices()
    engine.setup(ensure_model(cfg.model, home), tok)
    rng = np.random.default_rng(seed)
    for _, var in nnx.to_flat_state(engine.params):
        var[...] = jax.numpy.asarray(rng.normal(0, scale, var[...].shape), jax.numpy.float32)
    return engine, tok
