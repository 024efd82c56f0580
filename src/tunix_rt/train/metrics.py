"""A run's metrics as training writes them: metrics.jsonl, data_order.jsonl, TensorBoard
events of the same scalars (torch's writer in a torch run, tensorboardX's otherwise: the JAX
engine needs no torch), and loss.png, the curves drawn at the end.

Whoever wants to know that a run moved on (the registry, so the web UI shows a run while it
trains) passes an `on_update(run_dir)` hook: training calls it after every metrics line and
imports nothing above it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from tunix_rt import fence
from tunix_rt.errors import TunixRtError
from tunix_rt.files import write_bytes_atomic
from tunix_rt.rundir import DATA_ORDER, LOSS_PLOT, METRICS, TENSORBOARD, reward_curves
from tunix_rt.train import dist

OnUpdate = Callable[[Path], None]
"""Told the run directory after every metrics line (it throttles itself if it must)."""


def ignore_update(run_dir: Path) -> None:
    """The default on_update hook: nobody to tell (a run outside a registry)."""


class MetricsLog:
    """metrics.jsonl plus TensorBoard; on resume, lines past the checkpoint step are cut so
    every step appears exactly once."""

    def __init__(self, run_dir: Path, resume_step: int = 0, on_update: OnUpdate = ignore_update):
        self.run_dir = run_dir
        self.path = run_dir / METRICS
        self.order_path = run_dir / DATA_ORDER
        for p in (self.path, self.order_path):
            _truncate_after(p, resume_step)
        self.tb = summary_writer(run_dir / TENSORBOARD, resume_step + 1 if resume_step else None)
        self.on_update = on_update

    def log(self, record: dict[str, Any]) -> None:
        _append(self.path, record)
        self.on_update(self.run_dir)
        if self.tb is None:
            return
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)):
                self.tb.add_scalar(f"train/{key}" if not key.startswith("eval") else f"eval/{key}", value, record["step"])

    def log_order(self, step: int, example_ids: list[str]) -> None:
        """Which examples made each optimizer step (data provenance; the resume test reads it)."""
        _append(self.order_path, {"step": step, "ids": example_ids})

    def __enter__(self) -> "MetricsLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.flush()
            self.tb.close()


TB_WRITERS = ("torch.utils.tensorboard", "tensorboardX")


def summary_writer(logdir: Path, purge_step: int | None):
    """A TensorBoard SummaryWriter, or None (with a note) when no writer is installed.
    torch's (the [torch] extra's tensorboard) when torch is already loaded: the torch engine,
    as before. Otherwise tensorboardX first: the [jax] extra brings it (google-tunix needs
    google-metrax, which needs it) and it writes the same event files without torch."""
    import importlib

    order = TB_WRITERS if "torch" in sys.modules else TB_WRITERS[::-1]
    for name in order:
        try:
            writer = importlib.import_module(name).SummaryWriter
        except ImportError:
            continue
        return writer(str(logdir), purge_step=purge_step)
    print(f"note: no TensorBoard writer installed ({' or '.join(TB_WRITERS)}); metrics go to "
          f"{METRICS} only", file=sys.stderr)
    return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _append(path: Path, record: dict[str, Any]) -> None:
    fence.guard(f"{path.name} line of run {path.parent.name}")
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, allow_nan=False) + "\n")
        f.flush()


def _truncate_after(path: Path, step: int) -> None:
    """Keep the lines of steps <= step (a killed run may have logged past its checkpoint,
    and may have died mid-line)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("step", 0) <= step:
            kept.append(line + "\n")
    write_bytes_atomic(path, "".join(kept).encode())


#: the panels below the loss in loss.png, each drawn when the run's train rows have its first
#: key: (keys, labels, y label). An RL run's rewards come first (reward_curves).
PANELS = (
    (("rewards_chosen", "rewards_rejected", "rewards_margin"), ("chosen", "rejected", "margin"),
     "implicit reward"),
    (("rewards_accuracy",), ("chosen reward higher",), "accuracy (share of pairs)"),
    (("kept_share",), ("kept share",), "RFT: kept share of each round's samples"),
    (("kl_teacher", "nll"), ("KL(teacher || student)", "student NLL"), "distillation, nats per token"),
)


@dist.main_only
def plot_loss(run_dir: Path) -> Path:
    """loss.png: training loss per step and eval loss where measured; below it a panel per
    family of the run's own figures: for an RL run the mean reward and each reward, for a
    preference run the implicit rewards and their accuracy, for RFT the kept share per round,
    for distillation the KL to the teacher (PANELS)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_jsonl(run_dir / METRICS)
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    evals = [(r["step"], r["eval_loss"]) for r in rows if "eval_loss" in r]
    if not train:
        raise TunixRtError(f"{run_dir / METRICS}: no loss to plot")
    rewards = reward_curves(rows)
    panels = [(list(rewards), list(rewards), "mean reward over the step's rollouts")] if rewards else []
    panels += [p for p in PANELS if any(p[0][0] in r and "loss" in r for r in rows)]
    fig, axes = plt.subplots(1 + len(panels), 1, figsize=(7, 4 + 3 * len(panels)), dpi=100, squeeze=False)
    ax = axes[0][0]
    ax.plot(*zip(*train), label="train loss")
    if evals:
        ax.plot(*zip(*evals), "o-", label="eval loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("policy loss" if rewards else "loss per pair" if any("rewards_margin" in r for r in rows)
                  else "cross-entropy per supervised token")
    ax.set_title(run_dir.name)
    ax.grid(alpha=0.3)
    ax.legend()
    for (keys, labels, ylabel), row in zip(panels, axes[1:]):
        rx = row[0]
        for key, label in zip(keys, labels):
            points = [(r["step"], r[key]) for r in rows if key in r and "loss" in r]
            if points:
                rx.plot(*zip(*points), "o-" if len(points) < 3 else "-", label=label,
                        linewidth=2.0 if key in ("reward", "rewards_margin") else 1.0)
        rx.set_xlabel("optimizer step")
        rx.set_ylabel(ylabel, fontsize=8)
        rx.grid(alpha=0.3)
        rx.legend(fontsize=8)
    fig.tight_layout()
    out = run_dir / LOSS_PLOT
    tmp = run_dir / f".{LOSS_PLOT}.tmp"
    fig.savefig(tmp, format="png")
    plt.close(fig)
    os.replace(tmp, out)
    return out
