"""What both engines share and neither framework is needed for: the rendered examples of a
run, its number of optimizer steps and the dtype rule (the CPU allocator setting: tunix_rt.heap).

Nothing here imports torch or JAX, so the JAX engine runs where torch is not installed
(a Kaggle TPU image with `tunix-rt[jax,hub]`), and the torch engine never loads JAX.
"""

from __future__ import annotations

import math
from typing import Any

from tunix_rt.errors import BadInput
from tunix_rt.home import Home
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.data import BatchStream


def load_data(cfg: TrainConfig, home: Home, tok) -> tuple[list, list, dict[str, Any]]:
    """Rendered train and eval examples, and the dataset facts for the manifest."""
    from tunix_rt.render import render_dataset
    from tunix_rt.traces.dataset import load_dataset

    ds = load_dataset(cfg.dataset, home)
    records = list(ds.split(cfg.split))[: cfg.limit]
    if bare := [r.id for r in records if not r.steps]:
        raise BadInput(f"dataset {ds.ref} split {cfg.split}: {len(bare)} record(s) without reasoning steps (e.g. {bare[0]}): "
                       "verifier records (reasoning-gym) are for RL and eval; SFT needs worked solutions "
                       "(use method=grpo, or SFT on traces generated for them)")
    train, stats = render_dataset(records, tok, cfg.max_seq_len, cfg.system_prompt,
                                  on_overlong="drop" if cfg.drop_overlong else "fail", tools=cfg.tools)
    held_out = list(ds.split(cfg.eval_split))[: cfg.eval_limit]
    evals, eval_stats = render_dataset(held_out, tok, cfg.max_seq_len, cfg.system_prompt, on_overlong="drop",
                                       tools=cfg.tools)
    facts = {**dataset_facts(cfg, ds, len(records), len(train), len(evals)),
             "max_rendered_len": stats.max_len, "eval_dropped_overlong": eval_stats.dropped_overlong}
    return train, evals, facts


def dataset_facts(cfg: TrainConfig, ds, n_records: int, n_examples: int, n_eval: int) -> dict[str, Any]:
    """What every method's run manifest records of its dataset (Method.dataset): which one,
    which split, how many records became examples (the rest were too long)."""
    return {"name": ds.name, "version": ds.version, "path": str(ds.path), "sha256": ds.sha256,
            "split": cfg.split, "n_records": n_records, "n_examples": n_examples,
            "dropped_overlong": n_records - n_examples, "eval_split": cfg.eval_split, "n_eval_examples": n_eval}


def steps_for(cfg: TrainConfig, examples: list, pad_id: int) -> int:
    """max_steps, or the optimizer steps of `epochs` passes (packing simulated on lengths)."""
    if cfg.max_steps is not None:
        return cfg.max_steps
    probe = BatchStream(examples, cfg.batch_size, cfg.max_seq_len, cfg.packing, cfg.seed, pad_id)
    micro = 0
    while probe.position.epoch == 0:
        probe.next_rows()
        micro += 1
    return max(1, math.ceil(cfg.epochs * micro / cfg.grad_accum))


def check_dtype(cfg: TrainConfig, platform: str) -> None:
    """bf16 on a CPU is refused (both engines): no bf16 matmul units on these CPUs."""
    if platform == "cpu" and cfg.dtype == "bf16" and not cfg.force_bf16_cpu:
        raise BadInput("dtype bf16 on a CPU is refused: these CPUs have no bf16 matmul units and bf16 "
                       "runs ~300x slower than fp32 here; use dtype=fp32, or force_bf16_cpu=true")
