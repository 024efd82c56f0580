"""The job queue, in the registry database.

Life of a job: queued → running (claimed with a lease) → succeeded | cancelled | dead.
A failed attempt goes back to queued until `max_attempts`, then dead with its error. An
attempt handed back by a worker that shut down (its run stopped at a committed checkpoint)
goes back to queued without using up the budget: `max_attempts` grows by one with it, since
`attempts` counts claims (it numbers each attempt's log chunks).

Fencing: each claim increments `lease_token`; a worker writes heartbeats, logs and its result
only with `WHERE lease_token = <its token> AND status = 'running'`. A worker whose lease
expired (paused, partitioned, killed) and was reclaimed can therefore never overwrite the
newer attempt: its writes match no row, and it learns that it lost the job. Its files are
fenced the same way (tunix_rt.fence: the worker's guard renews the lease under its token).

Time: every lease deadline is computed and compared by the database's clock (claim,
heartbeat, reclaim), never by a worker's, so workers whose clocks disagree still agree on
who holds a job. Times are naive UTC in both dialects: PostgreSQL's `now()` converted to UTC
whatever the session's time zone, SQLite's `'now'` (UTC) in the text form SQLAlchemy stores.

Claiming: PostgreSQL `SELECT … FOR UPDATE SKIP LOCKED`; SQLite one `UPDATE … WHERE id =
(SELECT … LIMIT 1) AND status = 'queued' RETURNING` inside BEGIN IMMEDIATE (db.py).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import DateTime, func, select, type_coerce, update
from sqlalchemy.sql.elements import ColumnElement

from tunix_rt.errors import BadInput
from tunix_rt.registry import db
from tunix_rt.registry.queries import NotFound
from tunix_rt.registry.models import Job, JobLogChunk, utcnow

QUEUED, RUNNING, SUCCEEDED, CANCELLED, DEAD = "queued", "running", "succeeded", "cancelled", "dead"
FAILED, HANDBACK = "failed", "handback"
"""Outcomes a worker reports besides the statuses: retry if the budget allows; requeue uncounted."""
TERMINAL = (SUCCEEDED, CANCELLED, DEAD)
STATUSES = (QUEUED, RUNNING, SUCCEEDED, CANCELLED, DEAD)


@dataclass(frozen=True)
class Claim:
    """What a worker holds while it runs a job; `token` fences every write it makes."""

    job_id: int
    token: int
    attempt: int
    kind: str
    params: dict[str, Any]
    owner: str


def enqueue(kind: str, params: dict[str, Any], *, max_attempts: int = 3, url: str | None = None) -> int:
    """Insert a validated job; returns its id. Parameters are checked by the kind's model."""
    from tunix_rt.registry.jobs import validate_params

    clean = validate_params(kind, params)
    if not 1 <= max_attempts <= 20:
        raise BadInput(f"max_attempts must be in 1..20, got {max_attempts}")
    with db.session(url) as s:
        job = Job(kind=kind, params=clean, status=QUEUED, max_attempts=max_attempts, attempts=0,
                  lease_token=0, cancel_requested=False)
        s.add(job)
        s.flush()
        return job.id


def db_now(dialect: str, plus_s: float = 0.0) -> ColumnElement:
    """The database's current time (+ plus_s seconds) as naive UTC, in SQL."""
    if dialect == "postgresql":
        now = func.timezone("UTC", func.now(), type_=DateTime)
        return now + dt.timedelta(seconds=plus_s) if plus_s else now
    # SQLAlchemy stores SQLite DateTime as 'YYYY-MM-DD HH:MM:SS.ffffff'; this text compares
    # with it in the same order (same layout, milliseconds).
    return type_coerce(func.strftime("%Y-%m-%d %H:%M:%f", "now", f"{plus_s:+.3f} seconds"), DateTime)


def claim(owner: str, lease_s: float, *, url: str | None = None, kinds: tuple[str, ...] | None = None) -> Claim | None:
    """Take the oldest queued job, or None when there is none."""
    engine = db.get_engine(url)
    now, expires = db_now(engine.dialect.name), db_now(engine.dialect.name, lease_s)
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            q = select(Job.id).where(Job.status == QUEUED).order_by(Job.id).limit(1).with_for_update(skip_locked=True)
            if kinds:
                q = q.where(Job.kind.in_(kinds))
            job_id = conn.execute(q).scalar()
            if job_id is None:
                return None
            where = Job.id == job_id
        else:
            sub = select(Job.id).where(Job.status == QUEUED).order_by(Job.id).limit(1)
            if kinds:
                sub = sub.where(Job.kind.in_(kinds))
            where = Job.id == sub.scalar_subquery()
        row = conn.execute(
            update(Job).where(where, Job.status == QUEUED)
            .values(status=RUNNING, attempts=Job.attempts + 1, lease_token=Job.lease_token + 1,
                    lease_owner=owner, lease_expires_at=expires, heartbeat_at=now, started_at=now, error=None)
            .returning(Job.id, Job.lease_token, Job.attempts, Job.kind, Job.params)
        ).first()
    if row is None:
        return None
    return Claim(job_id=row[0], token=row[1], attempt=row[2], kind=row[3], params=row[4], owner=owner)


def heartbeat(c: Claim, lease_s: float, *, url: str | None = None) -> str:
    """Extend the lease to lease_s from now (one round trip). Returns "ok", "cancel" (cancel
    requested) or "lost" (fenced out)."""
    with db.session(url) as s:
        dialect = s.get_bind().dialect.name
        res = s.execute(
            update(Job).where(Job.id == c.job_id, Job.lease_token == c.token, Job.status == RUNNING)
            .values(lease_expires_at=db_now(dialect, lease_s), heartbeat_at=db_now(dialect))
            .returning(Job.cancel_requested)
        ).first()
    if res is None:
        return "lost"
    return "cancel" if res[0] else "ok"


def set_run(c: Claim, run_id: str, *, url: str | None = None) -> bool:
    """Link the run directory this attempt created (fenced)."""
    with db.session(url) as s:
        n = s.execute(update(Job).where(Job.id == c.job_id, Job.lease_token == c.token, Job.status == RUNNING)
                      .values(run_id=run_id)).rowcount
    return n == 1


def finish(c: Claim, status: str, *, result: dict[str, Any] | None = None, error: str | None = None,
           url: str | None = None) -> bool:
    """Write the outcome of this attempt, only while still holding the lease. `status` is
    succeeded, cancelled, dead, "failed" (retried while attempts remain, else dead) or
    "handback" (queued again, the attempt not counted against max_attempts)."""
    with db.session(url) as s:
        job = s.scalars(select(Job).where(Job.id == c.job_id, Job.lease_token == c.token, Job.status == RUNNING)
                        .with_for_update()).first()
        if job is None:
            return False
        if status in (FAILED, HANDBACK) and job.cancel_requested:
            status = CANCELLED
        elif status == HANDBACK:
            status, job.max_attempts = QUEUED, job.max_attempts + 1
        elif status == FAILED:
            status = QUEUED if job.attempts < job.max_attempts else DEAD
        job.status = status
        job.error = error
        job.lease_owner = None
        job.lease_expires_at = None
        if result is not None:
            job.result = result
        if status in TERMINAL:
            job.finished_at = utcnow()
    return True


def reclaim_expired(*, url: str | None = None) -> int:
    """Requeue (or bury, or cancel) running jobs whose lease ran out by the database's clock;
    returns how many."""
    n = 0
    with db.session(url) as s:
        now = s.scalar(select(db_now(s.get_bind().dialect.name)))
        for job in s.scalars(select(Job).where(Job.status == RUNNING, Job.lease_expires_at < now).with_for_update(skip_locked=True)):
            note = f"attempt {job.attempts}: lease expired (worker {job.lease_owner} stopped heartbeating)"
            if job.cancel_requested:
                job.status, job.finished_at = CANCELLED, now
            elif job.attempts >= job.max_attempts:
                job.status, job.finished_at = DEAD, now
            else:
                job.status = QUEUED
            job.error, job.lease_owner, job.lease_expires_at = note, None, None
            n += 1
    return n


def cancel(job_id: int, *, url: str | None = None) -> str:
    """Cancel a queued job now; ask a running one to stop at its next step. Returns the status."""
    with db.session(url) as s:
        job = s.scalars(select(Job).where(Job.id == job_id).with_for_update()).first()
        if job is None:
            raise NotFound(f"no job {job_id}")
        if job.status == QUEUED:
            job.status, job.finished_at, job.cancel_requested = CANCELLED, utcnow(), True
        elif job.status == RUNNING:
            job.cancel_requested = True
        return job.status


def append_log(c: Claim, seq: int, chunk: str, *, url: str | None = None) -> bool:
    """Store one chunk of this attempt's output (fenced: a zombie's output is dropped)."""
    with db.session(url) as s:
        alive = s.execute(select(Job.id).where(Job.id == c.job_id, Job.lease_token == c.token,
                                               Job.status == RUNNING)).first()
        if alive is None:
            return False
        s.add(JobLogChunk(job_id=c.job_id, seq=seq, attempt=c.attempt, text=chunk))
    return True


def read_logs(job_id: int, after: int = 0, *, url: str | None = None, limit: int = 500) -> list[JobLogChunk]:
    """Chunks with id > `after`, oldest first (the id is the SSE event id)."""
    with db.session(url) as s:
        return list(s.scalars(select(JobLogChunk).where(JobLogChunk.job_id == job_id, JobLogChunk.id > after)
                              .order_by(JobLogChunk.id).limit(limit)))


def get_job(job_id: int, *, url: str | None = None) -> Job:
    with db.session(url) as s:
        job = s.get(Job, job_id)
        if job is None:
            raise NotFound(f"no job {job_id}")
        return job


def list_jobs(*, status: str | None = None, kind: str | None = None, limit: int = 100, offset: int = 0,
              url: str | None = None) -> list[Job]:
    with db.session(url) as s:
        q = select(Job).order_by(Job.id.desc()).limit(limit).offset(offset)
        if status:
            q = q.where(Job.status == status)
        if kind:
            q = q.where(Job.kind == kind)
        return list(s.scalars(q))


def counts(*, url: str | None = None) -> dict[str, int]:
    with db.session(url) as s:
        return {k: v for k, v in s.execute(select(Job.status, func.count()).group_by(Job.status))}
