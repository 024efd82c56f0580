"""The run directory, read: what a finished or running run holds, for everything above
training (evidence, the registry, serving, reports).
"""

from __future__ import annotations

from typing import Any


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
