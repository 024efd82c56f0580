"""A train job's run, shared by the `train` handler and a sweep trial: the job's own run
(resumed from an earlier attempt's last committed checkpoint) and the check that it succeeded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tunix_rt.errors import TunixRtError
from tunix_rt.registry.jobs import JobContext, check_home_runs
from tunix_rt.rundir import CHECKPOINTS, Run, final_dir


def train_for_job(ctx: JobContext, cfg, should_stop: Callable[[], bool], *, one_run: bool = False) -> Path:
    """The job's run (cfg.run_name starts with job<ID>): an earlier attempt's run that already
    succeeded as it is, else trained, resuming the earlier attempt's last committed checkpoint.
    one_run: resume the earlier attempt's run even before its first checkpoint (from step 0),
    so the job has exactly one run (a sweep trial's). `should_stop` is polled after every step
    (RunStopped once it says so)."""
    check_home_runs(cfg, ctx.home)  # checked where the files are: a job row may come from anywhere
    earlier = ctx.find_run_dir()
    if earlier is not None and Run(earlier).status() == "succeeded":
        run_dir = earlier  # an earlier attempt finished training and died before reporting
    else:
        from tunix_rt.registry.live import LiveIndex
        from tunix_rt.train.driver import train

        resumable = earlier is not None and (one_run or any(earlier.glob(f"{CHECKPOINTS}/*/COMMIT")))
        resume = earlier if resumable else None
        ctx.cooperative = True  # the driver polls should_stop after every step
        ctx.interruptible = True
        try:
            run_dir = Path(train(cfg, ctx.home, resume=str(resume) if resume else None, should_stop=should_stop,
                                 on_update=LiveIndex()))
        finally:
            ctx.interruptible = False
    ctx.run_dir = run_dir
    return run_dir


def require_succeeded(run_dir: Path) -> None:
    """A train job succeeds only with its run: manifest status succeeded and every final
    output it lists present and non-empty."""
    try:
        manifest = Run(run_dir).manifest
    except (OSError, ValueError) as e:
        raise TunixRtError(f"run {run_dir.name}: cannot read its manifest: {e}") from e
    status, outputs = manifest.get("status"), manifest.get("outputs") or {}
    if status != "succeeded":
        raise TunixRtError(f"run {run_dir.name} ended {status!r}, not succeeded: {manifest.get('error', '')}")
    missing = [k for k in outputs if not (final_dir(run_dir) / k).is_dir() or not any((final_dir(run_dir) / k).iterdir())]
    if not outputs or missing:
        raise TunixRtError(f"run {run_dir.name} says succeeded but its final outputs are missing: "
                           f"{missing or 'none listed'}")
