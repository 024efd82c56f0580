"""Runs: submit a train job, list with filters, show, metrics, logs (SSE, from the run's
job), cancel, and the run directory's files."""

from __future__ import annotations

from types import SimpleNamespace

from fastapi import APIRouter, Header, HTTPException, Request
from fastapi.responses import FileResponse, StreamingResponse

from tunix_rt.errors import BadInput
from tunix_rt.registry import queries, queue
from tunix_rt.registry.jobs import check_home_runs
from tunix_rt.registry.queries import NotFound
from tunix_rt.service.artifacts import list_artifacts, resolve_artifact, run_root
from tunix_rt.service.deps import Position, SettingsDep, paged
from tunix_rt.service.routers.jobs import job_logs
from tunix_rt.service.schemas import Artifact, JobPublic, MetricPoint, RunDetail, RunPublic, TrainSubmit

router = APIRouter(prefix="/api/runs", tags=["runs"])
RunPage = paged(100, 1000)


@router.post("", status_code=202, response_model=JobPublic)
def submit_run(body: TrainSubmit, settings: SettingsDep):
    """Queue a train job; the run appears once a worker starts it (job.run_id links it).
    `init` must be a run of this home, `teacher` a catalog model or a run of this home (422
    otherwise); the worker checks them again."""
    try:
        check_home_runs(SimpleNamespace(init=body.overrides.get("init"), teacher=body.overrides.get("teacher")),
                        settings.home_obj)
    except BadInput as e:
        raise HTTPException(422, str(e)) from None
    job_id = queue.enqueue("train", body.model_dump(), max_attempts=settings.max_attempts, url=settings.database_url)
    return queue.get_job(job_id, url=settings.database_url)


@router.get("", response_model=list[RunPublic])
def list_runs(settings: SettingsDep, page: RunPage, status: str | None = None, engine: str | None = None,
              model: str | None = None, dataset: str | None = None):
    return queries.list_runs(status=status, engine=engine, model=model, dataset=dataset,
                             limit=page.limit, offset=page.offset, url=settings.database_url)


@router.get("/{run_id}", response_model=RunDetail)
def show_run(run_id: str, settings: SettingsDep):
    url = settings.database_url
    run = queries.get_run(run_id, url=url)
    detail = RunDetail.model_validate(run)
    detail.checkpoints = queries.run_checkpoints(run_id, url=url)
    detail.evaluations = queries.list_evals(run_id=run_id, url=url)
    return detail


@router.get("/{run_id}/metrics", response_model=list[MetricPoint])
def run_metrics(run_id: str, settings: SettingsDep):
    queries.get_run(run_id, url=settings.database_url)
    return queries.run_metrics(run_id, url=settings.database_url)


@router.get("/{run_id}/logs", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}}}})
def run_logs(run_id: str, request: Request, settings: SettingsDep, after: Position = 0,
             last_event_id: str | None = Header(default=None)):
    """The live output of the job that made this run (SSE; see /api/jobs/{id}/logs)."""
    run = queries.get_run(run_id, url=settings.database_url)
    if run.job_id is None:
        raise NotFound(f"run {run_id} was not made by a job (its output is in the run directory)")
    return job_logs(run.job_id, request, settings, after, last_event_id)


@router.post("/{run_id}/cancel", response_model=JobPublic)
def cancel_run(run_id: str, settings: SettingsDep):
    """Cancel the run's job: it stops at the next step and keeps its last checkpoint."""
    run = queries.get_run(run_id, url=settings.database_url)
    if run.job_id is None:
        raise HTTPException(409, f"run {run_id} was not started by a job; stop its process instead")
    queue.cancel(run.job_id, url=settings.database_url)
    return queue.get_job(run.job_id, url=settings.database_url)


@router.get("/{run_id}/artifacts", response_model=list[Artifact])
def artifacts(run_id: str, settings: SettingsDep):
    root = run_root(queries.get_run(run_id, url=settings.database_url).path, settings.home / "runs")
    return [Artifact(path=p, size=n) for p, n in list_artifacts(root)]


@router.get("/{run_id}/artifacts/{path:path}", response_class=FileResponse)
def download(run_id: str, path: str, settings: SettingsDep):
    root = run_root(queries.get_run(run_id, url=settings.database_url).path, settings.home / "runs")
    try:
        target = resolve_artifact(root, path)
    except FileNotFoundError:
        raise HTTPException(404, "no such artifact") from None
    media = "text/plain; charset=utf-8" if target.suffix in (".jsonl", ".yaml", ".txt", ".log", ".md") else None
    inline = media is not None or target.suffix in (".json", ".png")
    return FileResponse(target, media_type=media, filename=target.name,
                        content_disposition_type="inline" if inline else "attachment",
                        headers={"Content-Security-Policy": "sandbox", "X-Content-Type-Options": "nosniff"})
