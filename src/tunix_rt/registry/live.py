"""The registry told about a live run: the on_update hook (train.metrics.OnUpdate) that the
entry points with a registry (`tunix-rt train`, a worker's train job, the demo) pass to
training, so the web UI shows a run (status, growing curves) before it finishes. Training
itself never imports the registry."""

from __future__ import annotations

import time
from pathlib import Path

from tunix_rt.home import Home
from tunix_rt.registry.record import record_run


class LiveIndex:
    """Record the run in its home's registry after a metrics line, at most every
    REGISTRY_EVERY_S; the registry never fails the run (record_run logs and returns on any
    error). A run directory outside a home (not under <home>/runs) has no registry: ignored."""

    REGISTRY_EVERY_S = 10.0
    """How often a training run re-indexes itself in the registry while it runs."""

    def __init__(self) -> None:
        self._indexed_at = float("-inf")

    def __call__(self, run_dir: Path) -> None:
        now = time.monotonic()
        if now - self._indexed_at < self.REGISTRY_EVERY_S or run_dir.parent.name != "runs":
            return  # throttled, or a run directory outside a home (no registry of its own)
        self._indexed_at = now
        record_run(run_dir, url=Home(run_dir.parent.parent).database_url)
