"""`tunix-rt runs list|show`, `tunix-rt registry sync|jobs`, `tunix-rt worker`."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from tunix_rt.home import Home
from tunix_rt.registry.liveness import STALE_AFTER_S

runs_app = typer.Typer(no_args_is_help=True, help="List and show training runs in the registry.")
registry_app = typer.Typer(no_args_is_help=True, help="Index the home into the registry database.")
out = Console()


@runs_app.command("list")
def runs_list(
    status: Annotated[Optional[str], typer.Option(help="Only runs with this status (running, finished, failed, …).")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per run.")] = False,
) -> None:
    """Runs, newest first."""
    from tunix_rt.registry import queries

    rows = queries.list_runs(status=status, limit=limit)
    if as_json:
        for r in rows:
            print(json.dumps(_run_dict(r), default=str))
        return
    table = Table("run", "status", "engine", "model", "dataset", "started", "last loss")
    for r in rows:
        metrics = queries.run_metrics(r.id)
        losses = [m.loss for m in metrics if m.loss is not None]
        table.add_row(r.id, r.status, r.engine or "", r.model or "", r.dataset or "",
                      str(r.started_at or ""), f"{losses[-1]:.4f}" if losses else "")
    out.print(table if rows else "no runs (run `tunix-rt registry sync` to index existing run directories)")


@runs_app.command("show")
def runs_show(run: Annotated[str, typer.Argument(help="Run id (the run directory's name).")]) -> None:
    """A run's record: status, config, metrics summary, checkpoints and evaluations."""
    from tunix_rt.registry import queries

    row = queries.get_run(run)
    data = _run_dict(row)
    metrics = queries.run_metrics(run)
    data["metrics"] = {"lines": len(metrics), "last": metrics[-1].values if metrics else None}
    data["checkpoints"] = [c.step for c in queries.run_checkpoints(run)]
    data["evaluations"] = [{"id": e.id, "accuracy": e.accuracy, "format_rate": e.format_rate, "n": e.n}
                           for e in queries.list_evals(run_id=run)]
    data["config"] = row.config
    print(json.dumps(data, indent=2, default=str))


def _run_dict(r) -> dict:
    return {"id": r.id, "status": r.status, "engine": r.engine, "device": r.device, "model": r.model,
            "dataset": r.dataset, "path": r.path, "started_at": r.started_at, "finished_at": r.finished_at,
            "error": r.error, "job_id": r.job_id}


@registry_app.command("sync")
def registry_sync(
    stale_after: Annotated[float, typer.Option(
        help="A running run of another host whose files have not changed for this many seconds "
             "is marked interrupted (on this host its process is asked).")] = STALE_AFTER_S,
) -> None:
    """Index every dataset, model, run and evaluation directory already in the home; a run
    left `running` by a process that is gone (killed) is marked interrupted first."""
    from tunix_rt.errors import BadInput
    from tunix_rt.registry.record import sync_home

    if not stale_after > 0:
        raise BadInput(f"--stale-after must be > 0 seconds, got {stale_after}")
    home = Home.resolve().ensure()
    notes: list[str] = []
    with out.status("indexing…") as status:
        counts = sync_home(home, progress=lambda msg: status.update(f"indexing {msg}"), report=notes.append,
                           stale_after_s=stale_after)
    for line in notes:
        out.print(line, highlight=False, soft_wrap=True)
    out.print(" ".join(f"{k}={v}" for k, v in counts.items()), highlight=False)


@registry_app.command("jobs")
def registry_jobs(
    status: Annotated[Optional[str], typer.Option(help="Only jobs with this status.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
) -> None:
    """Jobs in the queue, newest first."""
    from tunix_rt.registry import queue

    table = Table("job", "kind", "status", "attempts", "run", "error")
    for j in queue.list_jobs(status=status, limit=limit):
        table.add_row(str(j.id), j.kind, j.status, f"{j.attempts}/{j.max_attempts}", j.run_id or "",
                      (j.error or "").splitlines()[-1][:80] if j.error else "")
    out.print(table)


def worker(
    lease: Annotated[float, typer.Option(help="Lease seconds; a silent worker's job is reclaimed after this.")] = 30.0,
    poll: Annotated[float, typer.Option(help="Seconds between claims when the queue is empty.")] = 1.0,
    max_idle: Annotated[Optional[float], typer.Option(help="Exit after this many idle seconds.")] = None,
    max_jobs: Annotated[Optional[int], typer.Option(help="Exit after this many jobs.")] = None,
) -> None:
    """Run queued jobs (train, eval, import) from the registry until stopped."""
    import logging

    from tunix_rt.registry import db
    from tunix_rt.registry.worker import Worker, WorkerConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    home = Home.resolve().ensure()
    db.get_engine()  # migrate before the first claim
    w = Worker(home, WorkerConfig(lease_s=lease, poll_s=poll, max_idle_s=max_idle, max_jobs=max_jobs))
    w.install_signals()
    out.print(f"worker {w.owner} on {_safe_url(home.database_url)}", highlight=False)
    n = w.run()
    out.print(f"worker {w.owner}: {n} job(s) handled", highlight=False)


def _safe_url(url: str) -> str:
    """The database URL without a password."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
