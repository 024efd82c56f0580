"""The training progress bar (rich, on stderr): step, loss, tokens/s, ETA."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)


class TrainProgress:
    """A context manager around rich.Progress showing the latest loss and throughput."""

    def __init__(self, total_steps: int, start: int = 0):
        self._progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self._task = self._progress.add_task("train", total=total_steps, completed=start, loss="-", tps="-")

    def __enter__(self) -> "TrainProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        self._progress.update(self._task, completed=step, loss=f"{loss:.4f}", tps=f"{tokens_per_s:,.0f}")
