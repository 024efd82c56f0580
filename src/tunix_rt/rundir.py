"""The names of a run directory and of an evaluation directory, and a read-only view of a
run. Every module that opens a run's or an evaluation's files names them here, so that the
layout is written once (train.run writes it; evidence, the registry, eval, serving, jobs,
the demo and the submission read it).

    runs/<run_id>/
        config.yaml         the resolved TrainConfig (a checkpoint holds one too)
        run_manifest.json   command, config, engine, devices, packages, status, outputs, ...
        metrics.jsonl       one JSON object per logged step (eval lines carry "eval_loss")
        data_order.jsonl    the example order of each epoch
        environment.json    where it ran (evidence.ensure_environment)
        loss.png, REPORT.md the loss curve and the report
        tensorboard/, checkpoints/
        final/adapter/      the LoRA adapter (PEFT format); "adapter" in the manifest's outputs
        final/merged/       the HF-layout merged model; "merged" in the manifest's outputs
        eval/<eval_id>/     evaluations of the run (eval dirs)

    <eval dir>/
        eval_summary.json   model, adapter, decoding, metrics, ...
        predictions.jsonl   one line per item
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG = "config.yaml"
MANIFEST = "run_manifest.json"
METRICS = "metrics.jsonl"
DATA_ORDER = "data_order.jsonl"
ENVIRONMENT = "environment.json"
LOSS_PLOT = "loss.png"
REPORT = "REPORT.md"
TENSORBOARD = "tensorboard"
CHECKPOINTS = "checkpoints"
FINAL = "final"
#: the final outputs: folder names under final/ and keys of the manifest's "outputs"
ADAPTER, MERGED = "adapter", "merged"
EVALS = "eval"
#: what makes a final/ output loadable: PEFT's adapter files, an HF model's config
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
MODEL_CONFIG = "config.json"

SUMMARY = "eval_summary.json"
PREDICTIONS = "predictions.jsonl"


def final_dir(run_dir: Path) -> Path:
    return Path(run_dir) / FINAL


def adapter_dir(run_dir: Path) -> Path:
    return final_dir(run_dir) / ADAPTER


def merged_dir(run_dir: Path) -> Path:
    return final_dir(run_dir) / MERGED


@dataclass(frozen=True)
class Run:
    """A run directory, read only: what it holds now (nothing is cached)."""

    path: Path

    @property
    def manifest(self) -> dict[str, Any]:
        """run_manifest.json (OSError / ValueError when missing or unreadable)."""
        return json.loads((self.path / MANIFEST).read_text())

    def status(self) -> str | None:
        """The manifest's status; None when there is no readable manifest."""
        try:
            return self.manifest.get("status")
        except (OSError, ValueError):
            return None

    def config(self) -> dict[str, Any]:
        """config.yaml as a mapping (train.run.RunDir.config() gives the TrainConfig)."""
        import yaml

        return yaml.safe_load((self.path / CONFIG).read_text(encoding="utf-8")) or {}

    def metrics(self) -> list[dict[str, Any]]:
        """metrics.jsonl's rows ([] before the first)."""
        path = self.path / METRICS
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []

    @property
    def adapter(self) -> Path | None:
        """final/adapter when it holds a loadable adapter."""
        return adapter_dir(self.path) if (adapter_dir(self.path) / ADAPTER_CONFIG).is_file() else None

    @property
    def merged(self) -> Path | None:
        """final/merged when it holds a loadable model."""
        return merged_dir(self.path) if (merged_dir(self.path) / MODEL_CONFIG).is_file() else None

    def evals(self) -> list[Path]:
        """The run's evaluation directories (those with a summary)."""
        return [p.parent for p in sorted((self.path / EVALS).glob(f"*/{SUMMARY}"))]


def reward_curves(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """{"reward": [(step, mean total)], "reward_<name>": [...]} of an RL run's rows ({} for SFT)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if "loss" not in r:
            continue
        for key, value in r.items():
            if key == "reward" or key.startswith("reward_"):
                out.setdefault(key, []).append((r["step"], value))
    return out
