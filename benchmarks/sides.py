"""The harness the side-by-side benchmarks share (bench_dpo, bench_grpo, bench_jax_loss,
bench_torch_vs_trl): each side runs in its own subprocess of the benchmark script (`--worker
SIDE --data FILE`) so that its peak RSS is its own, model loading included; the worker prints
one TAG line of JSON that the parent reads back; the parent alternates the order of the
sides every round so that a busy, shared machine slows them alike.

Allocators: our sides ("ours", "jax") start as `tunix-rt train` does, with jemalloc preloaded
where it is installed (tunix_rt.heap.preload_env); the other sides (TRL, Tunix) as their users
start them, with glibc's malloc, unless OTHERS_JEMALLOC=1 gives them jemalloc too (to see
what the allocator alone is worth to them). Each worker's result names its allocator.

The scripts import it as `from sides import ...`: run as `python benchmarks/X.py` from any
directory, benchmarks/ is sys.path[0] (how bench_jax_loss already imports bench_torch_vs_trl).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from tunix_rt.files import peak_rss_bytes
from tunix_rt.heap import allocator, preload_env

TAG = "BENCH_JSON "
"""Prefix of the one stdout line that carries a worker's result."""
#: the sides that are our engines (the rest are the libraries we compare with)
OURS = frozenset({"ours", "jax"})


def run_worker(script: str | Path, side: str, data: Path, flags: Sequence[str]) -> dict:
    """Run `script --worker side --data data *flags` in a fresh Python process and return the
    JSON of its TAG line; exit with the worker's stderr tail when it fails or prints none."""
    cmd = [sys.executable, str(script), "--worker", side, "--data", str(data), *flags]
    mine = side in OURS or os.environ.get("OTHERS_JEMALLOC") == "1"
    r = subprocess.run(cmd, capture_output=True, text=True, env=preload_env() if mine else {**os.environ})
    line = next((x for x in r.stdout.splitlines() if x.startswith(TAG)), None)
    if r.returncode != 0 or line is None:
        raise SystemExit(f"{side} failed (exit {r.returncode}):\n{r.stderr[-4000:]}")
    return json.loads(line[len(TAG):])


def matmul() -> str:
    """Whose fp32 CPU products this worker ran: "onednn" where tunix_rt.train.cpu_matmul routed a
    model's layers, "torch" (MKL) where torch ran without that, "xla" in a JAX-only worker."""
    routed = getattr(sys.modules.get("tunix_rt.train.cpu_matmul"), "routed", 0)
    return "onednn" if routed else ("torch" if "torch" in sys.modules else "xla")


def print_result(side: str, res: dict) -> None:
    """A worker's last act: print `res` as its TAG line, with its side, this process's peak
    RSS (model loading included) and CPU seconds added."""
    res.update({"side": side, "peak_rss": peak_rss_bytes(), "cpu_s": time.process_time(), "allocator": allocator(),
                "matmul": matmul()})
    print(TAG + json.dumps(res), flush=True)


def alternate(sides: Sequence[str], rounds: int, run_one: Callable[[str], dict],
              show: Callable[[int, str, dict], None]) -> dict[str, list[dict]]:
    """Run every side once a round, in the given order in even rounds and reversed in odd
    ones; `show(round, side, result)` prints each as it comes. Returns the results per side,
    in round order."""
    results: dict[str, list[dict]] = {s: [] for s in sides}
    for r in range(rounds):
        for side in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            res = run_one(side)
            results[side].append(res)
            show(r, side, res)
    return results
