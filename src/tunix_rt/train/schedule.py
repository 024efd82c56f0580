"""The learning rate as a pure function of the optimizer step.

No scheduler object: the rate of step k depends on k and the config only, so a resumed run
needs nothing but the step number to continue the curve exactly.
"""

from __future__ import annotations

import math

from tunix_rt.train.config import TrainConfig


def lr_at(step: int, cfg: TrainConfig, total_steps: int) -> float:
    """Rate for the optimizer step `step` (0-based) of `total_steps`."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.schedule == "linear":
        return cfg.lr * (1.0 - progress)
    floor = cfg.min_lr_ratio
    return cfg.lr * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))
