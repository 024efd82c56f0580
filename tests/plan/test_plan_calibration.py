"""Calibration: the plan's predicted peak against the peak RSS of real training runs on
this CPU (each in its own process, see rss_child.py), for the torch engine on the tiny
model (fast) and on Gemma 3 270M, LoRA and full (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("rss_child.py")


def write_traces(path: Path, n: int = 16, words: int = 1) -> str:
    with open(path, "w") as f:
        for i in range(n):
            steps = [f"{i} plus {j} is {i + j}. " * words for j in range(1 + i % 3)]
            f.write(json.dumps({"id": f"t{i:03d}", "question": f"Add {i} and {'one ' * (i % 4)}?",
                                "steps": steps, "answer": str(i)}) + "\n")
    return str(path)


def run_child(fields: dict, home: Path, timeout: int = 240) -> dict:
    env = {**os.environ, "TUNIX_RT_HOME": str(home)}
    proc = subprocess.run([sys.executable, str(CHILD), json.dumps(fields)], env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    print(f"\n{fields.get('model')} {fields.get('method')}: predicted {out['predicted'] / 1e9:.3f} GB, "
          f"measured peak RSS {out['measured_peak_rss'] / 1e9:.3f} GB "
          f"(ratio {out['measured_peak_rss'] / out['predicted']:.2f}), train {out['train_s']} s")
    return out


def test_tiny_full_finetune_rss_matches_the_plan(home, tmp_path):
    """On the tiny model the process dominates (Python, torch, transformers, tensorboard,
    matplotlib: ~0.46 GB of ~0.48); the plan models that baseline. Tolerance 20%: the
    baseline moves by tens of MB with what gets imported and with glibc's arenas, and the
    model's own bytes (~30 MB) are a few percent of the total (measured ratio 0.97)."""
    fields = dict(model="tiny-gemma3", dataset=write_traces(tmp_path / "t.jsonl"), split="all",
                  eval_split="all", eval_limit=4, batch_size=4, max_seq_len=128, max_steps=2,
                  method="full", _threads=1)
    out = run_child(fields, Path(os.environ["TUNIX_RT_HOME"]))
    assert abs(out["measured_peak_rss"] / out["predicted"] - 1) < 0.20


@pytest.mark.slow
@pytest.mark.parametrize("method", ["lora", "full"])
def test_gemma3_270m_rss_matches_the_plan(method, gemma3_270m, tmp_path):
    """Gemma 3 270M, batch 4 x 256 (packed, so every batch is full width), chunked loss
    (256-token chunks), two optimizer steps on the torch engine. Tolerance 25%: the model's bytes now dominate, but RSS also holds the
    safetensors file pages read at load (up to 1.07 GB until the kernel drops them) and
    glibc keeps freed blocks; the plan counts neither."""
    fields = dict(model=str(gemma3_270m), dataset=write_traces(tmp_path / "t.jsonl", n=40, words=6),
                  split="all", eval_split="all", eval_limit=2, batch_size=4, max_seq_len=256,
                  packing=True, max_steps=2, method=method, loss_chunk_tokens=256, _threads=2)
    out = run_child(fields, tmp_path / "home", timeout=600)  # the model dir is used in place
    assert abs(out["measured_peak_rss"] / out["predicted"] - 1) < 0.25


@pytest.mark.slow
@pytest.mark.jax
def test_tiny_jax_engine_rss_matches_the_plan(home, tmp_path):
    """The JAX engine on the tiny model (CPU): the process (jax, torch for the data path,
    tunix, orbax, XLA's compiler: ~1.2 GB) dominates as with torch; same 20% tolerance.
    Measured 1.22 GB; the plan's JAX baseline (1.15 GB) was set from this run, so this test
    guards against drift (a heavier import, a leak), not the model of the weights."""
    fields = dict(model="tiny-gemma3", dataset=write_traces(tmp_path / "t.jsonl"), split="all",
                  eval_split="all", eval_limit=4, batch_size=4, max_seq_len=128, max_steps=2,
                  method="lora", engine="jax")
    out = run_child(fields, Path(os.environ["TUNIX_RT_HOME"]), timeout=600)
    assert abs(out["measured_peak_rss"] / out["predicted"] - 1) < 0.20
