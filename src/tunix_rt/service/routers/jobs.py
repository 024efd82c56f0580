"""Jobs: submit (a kind and its validated parameters), list, show, cancel, and stream logs
as server-sent events."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Header, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from tunix_rt.registry import queue
from tunix_rt.service.deps import JobId, Position, SettingsDep, SQL_INT_MAX, paged
from tunix_rt.service.schemas import JobCreate, JobPublic
from tunix_rt.service.settings import Settings

router = APIRouter(prefix="/api/jobs", tags=["jobs"])
JobPage = paged(100, 1000)
EVENT_ID = re.compile(r"[0-9]{1,19}")


@router.get("", response_model=list[JobPublic])
def list_jobs(settings: SettingsDep, page: JobPage, status: str | None = None, kind: str | None = None):
    return queue.list_jobs(status=status, kind=kind, limit=page.limit, offset=page.offset, url=settings.database_url)


@router.post("", status_code=202, response_model=JobPublic)
def submit_job(body: JobCreate, settings: SettingsDep):
    job_id = queue.enqueue(body.kind, body.params, max_attempts=settings.max_attempts, url=settings.database_url)
    return queue.get_job(job_id, url=settings.database_url)


@router.get("/{job_id}", response_model=JobPublic)
def show_job(job_id: JobId, settings: SettingsDep):
    return queue.get_job(job_id, url=settings.database_url)


@router.post("/{job_id}/cancel", response_model=JobPublic)
def cancel_job(job_id: JobId, settings: SettingsDep):
    queue.cancel(job_id, url=settings.database_url)
    return queue.get_job(job_id, url=settings.database_url)


@router.get("/{job_id}/logs", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}}}})
def job_logs(job_id: JobId, request: Request, settings: SettingsDep, after: Position = 0,
             last_event_id: str | None = Header(default=None)):
    """`event: log` per stored chunk (id = chunk id, data = {"attempt", "text"}), `event:
    status` when the job's status changes, `event: end` once it is terminal and drained."""
    queue.get_job(job_id, url=settings.database_url)  # 404 before the stream starts
    start = _resume_from(last_event_id, after)
    return StreamingResponse(log_events(job_id, start, settings, request), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _resume_from(last_event_id: str | None, after: int) -> int:
    """The chunk id a reconnecting client last saw, when it is one (ASCII digits a SQL integer
    holds: str.isdigit() also passes "²", which int() refuses); else `after`."""
    if last_event_id and EVENT_ID.fullmatch(last_event_id) and int(last_event_id) <= SQL_INT_MAX:
        return int(last_event_id)
    return after


async def log_events(job_id: int, after: int, settings: Settings, request: Request) -> AsyncIterator[str]:
    url, deadline, status = settings.database_url, time.monotonic() + settings.sse_max_s, None
    while time.monotonic() < deadline:
        job = await run_in_threadpool(queue.get_job, job_id, url=url)
        chunks = await run_in_threadpool(queue.read_logs, job_id, after, url=url)
        for c in chunks:
            after = c.id
            yield f"id: {c.id}\nevent: log\ndata: {json.dumps({'attempt': c.attempt, 'text': c.text})}\n\n"
        if (job.status, job.run_id) != status:
            status = (job.status, job.run_id)
            yield f"event: status\ndata: {json.dumps({'status': job.status, 'run_id': job.run_id, 'error': job.error})}\n\n"
        if job.status in queue.TERMINAL and not chunks:
            yield "event: end\ndata: {}\n\n"
            return
        if await request.is_disconnected():
            return
        await asyncio.sleep(settings.sse_poll_s)
