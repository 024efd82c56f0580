"""The Method contract: what the driver asks of a training method (train.sft, train.grpo).

A method says what one optimizer step does with the engine (which batches, which objective,
what it logs); the driver decides the order of things (train.driver) and the engine how a
step runs (train.engine). A method is made as `cls(cfg, home, tok)` from the one table of
methods (train.methods), which also says its phases.
"""

from __future__ import annotations

from typing import Any, Protocol

from tunix_rt.home import Home
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.engine import Engine, Objective
from tunix_rt.train.methods import method_class


class Method(Protocol):
    cfg: TrainConfig
    objective: Objective
    """The elementwise objective its updates train (the engine asks it, never the name)."""
    total_steps: int
    """Optimizer steps of the whole run."""
    dataset: dict[str, Any]
    """The dataset facts the run manifest records (name, version, sha256, split, counts)."""

    def step(self, engine: Engine, step: int, lr: float) -> tuple[dict[str, Any], list[str]]:
        """One optimizer step: its metrics row (without step/lr/timing) and the ids of the
        examples (or prompts) it trained on."""

    def evaluate(self, engine: Engine) -> dict[str, float]:
        """Held-out metrics logged at eval intervals and at the end ({} when there is none)."""

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the method (its data position) to resume exactly."""

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's state()."""

    def summary(self) -> dict[str, Any]:
        """The pre-run facts the manifest and the console show."""

    @staticmethod
    def report_line(cfg: dict[str, Any]) -> str | None:
        """REPORT.md's line on what the method did and with which settings, from a run's
        resolved config (its manifest's: the run may be long finished); None: nothing to add."""


def make_method(cfg: TrainConfig, home: Home, tok) -> Method:
    return method_class(cfg.method)(cfg, home, tok)
