"""A tiny sweep on the tiny random Gemma 3: the base config, a space whose lr=30 trials fall
behind at the first eval (the median rule prunes them once a trial completed), and readers of
what the trials left on disk."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from cli_testlib import cli_main  # noqa: F401 (the tests import it from here)

from tunix_rt.train.metrics import read_jsonl

STEPS, EVAL_EVERY = 6, 2
BASE = {"model": "tiny-gemma3", "dataset": "tiny@v1", "split": "all", "eval_split": "all", "eval_limit": 8,
        "method": "sft", "finetune": "lora", "lora_rank": 8, "lora_alpha": 16, "lr": 0.003, "warmup_steps": 0,
        "batch_size": 2, "max_seq_len": 128, "max_steps": STEPS, "log_interval": 1, "eval_interval": EVAL_EVERY,
        "save_interval": 1, "keep_checkpoints": 2, "seed": 0}


def write_base(path: Path) -> Path:
    path.write_text(yaml.safe_dump(BASE))
    return path


def write_space(path: Path, space: dict) -> Path:
    path.write_text(yaml.safe_dump(space))
    return path


def train_steps(run: Path) -> list[int]:
    return [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]


def manifest(run: Path) -> dict:
    return json.loads((run / "run_manifest.json").read_text())


def run_dirs(home) -> list[Path]:
    return sorted(p for p in home.runs.iterdir() if not p.name.startswith("."))
