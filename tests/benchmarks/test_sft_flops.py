"""bench_torch_vs_trl's analytic FLOP count against a direct count: torch's FlopCounterMode
around the benchmark's own workers (our engine's step, TRL's SFTTrainer step) on tiny-gemma3,
one step of a padded batch.

FlopCounterMode has no formula for three ops these steps run on a CPU; they are given torch's
own formulas: the CPU flash attention forward and backward (`sdpa_flop_count` and
`sdpa_backward_flop_count`: the full query x key square, 2 and 5 matmuls) and the in-place
`addmm_` (TRL's head backward: 2·M·K·N, as `addmm`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from requires import require_module
from tunix_rt.models.store import ensure_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_torch_vs_trl as bench  # noqa: E402

aten = torch.ops.aten
ATTENTION = {
    aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *a, out_shape=None, **kw: sdpa_flop_count(q, k, v),
    aten._scaled_dot_product_flash_attention_for_cpu_backward:
        lambda g, q, k, v, *a, out_shape=None, **kw: sdpa_backward_flop_count(g, q, k, v),
}
MISSING = {**ATTENTION, aten.addmm_: lambda c, a, b, *x, out_shape=None, **kw: 2 * a[0] * a[1] * b[1]}


def _batch(lengths=(12, 9), prompt=4) -> list[list[dict]]:
    """One step of rows with random ids, the first `prompt` tokens masked out of the loss."""
    g = torch.Generator().manual_seed(0)
    return [[{"id": f"r{i}", "ids": torch.randint(5, 1000, (n,), generator=g).tolist(),
              "loss_mask": [0] * prompt + [1] * (n - prompt)} for i, n in enumerate(lengths)]]


def _counted(worker, data: dict, args) -> tuple[int, int]:
    """(attention FLOPs, all other matmul FLOPs) FlopCounterMode counts over `worker`'s run."""
    import tunix_rt.train.cpu_matmul  # noqa: F401  its FLOP formula for oneDNN's products, registered on
    # import, must be in place before the mode copies the registry (the worker imports it only later)
    with FlopCounterMode(display=False, custom_mapping=MISSING) as fc:
        worker(data, args)
    counts = fc.get_flop_counts()["Global"]
    attention = sum(v for op, v in counts.items() if op in ATTENTION)
    return attention, fc.get_total_flops() - attention


def _hf(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


@pytest.fixture
def tiny(home) -> Path:
    return ensure_model("tiny-gemma3", home)


@pytest.mark.parametrize("gc", [False, True], ids=["plain", "checkpointing"])
def test_our_step_flops_equal_the_counted_ones(tiny, gc):
    steps = _batch()
    data = {"model_dir": str(tiny), "pad_id": 0, "steps": steps}
    attention, rest = _counted(bench.worker_ours, data, SimpleNamespace(warmup=0, ours_gc=gc))
    parts = bench.side_flops(_hf(tiny), steps, "ours", bench.LORA_RANK, gc)[0]
    assert rest == parts["projections"] + parts["head"] + parts["rope"]
    # the counter's convention is the full square; the benchmark counts our causal kernel's triangle
    width = max(len(e["ids"]) for e in steps[0])
    square = bench.sft_step_flops(_hf(tiny), rows=2, width=width, head_rows=0, lora_rank=bench.LORA_RANK,
                                  head_passes=2, recompute=gc, input_grad=gc, causal=False, rope_rows=2)
    assert attention == square["attention"] > 0
    assert parts["attention"] == square["attention"] * (width + 1) // (2 * width)


@pytest.mark.parametrize("gc", [True, False], ids=["trl-default", "trl-no-gc"])
def test_trl_step_flops_equal_the_counted_ones(tiny, gc):
    require_module("trl")
    steps = _batch()  # rows of different lengths: TRL pads and masks, so attention is the full square
    data = {"model_dir": str(tiny), "pad_id": 0, "steps": steps}
    attention, rest = _counted(bench.worker_trl, data, SimpleNamespace(warmup=0, trl_no_gc=not gc))
    parts = bench.side_flops(_hf(tiny), steps, "trl", bench.LORA_RANK, gc)[0]
    assert (attention, rest) == (parts["attention"], parts["projections"] + parts["head"] + parts["rope"])
