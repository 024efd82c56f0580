"""The lease fences files and keeps time by the database, on SQLite and PostgreSQL: lease
deadlines come from the database's clock whatever the workers' clocks and time zones say; a
heartbeat without a database for a whole lease stops the job; a real `tunix-rt worker`
frozen past its lease (SIGSTOP) while another finishes its train job writes nothing once it
wakes: committed checkpoints, final weights, manifest, metrics and registry rows stay
byte-identical, the outcome is written once, and its late writes are refused and logged."""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import logging
import os
import signal
import time

import pytest
from sqlalchemy import func, select, update

from registry_testlib import import_tiny_dataset, start_worker, upload as _upload, wait_for
from tunix_rt import fence
from tunix_rt.registry import db, queue
from tunix_rt.registry.jobs import JobContext
from tunix_rt.registry.models import Checkpoint, Job, JobLogChunk, Metric, Run
from tunix_rt.registry.worker import LogSink, Worker, WorkerConfig, _Heartbeat

pytestmark = pytest.mark.serial  # it times itself or races a lease: `make test` runs it alone (Makefile)

HOUR = dt.timedelta(hours=1)


def _tz_url(url: str) -> str:
    """The same database, with a PostgreSQL session time zone far from UTC."""
    return url + "%20-ctimezone%3DAsia%2FKolkata" if url.startswith("postgresql") else url


def test_lease_deadlines_come_from_the_database_clock(home, db_url, monkeypatch):
    url = _tz_url(db_url)
    real = queue.utcnow
    jid = queue.enqueue("import", {"upload": _upload(home), "name": "d"}, url=url)
    monkeypatch.setattr(queue, "utcnow", lambda: real() - HOUR)  # this worker's clock is an hour behind
    c = queue.claim("slow-clock", 30, url=url)
    assert queue.heartbeat(c, 30, url=url) == "ok"
    monkeypatch.setattr(queue, "utcnow", lambda: real() + HOUR)  # and this one's an hour ahead
    assert queue.reclaim_expired(url=url) == 0  # the lease runs 30 s by the database's clock
    job = queue.get_job(jid, url=url)
    assert job.lease_expires_at - job.heartbeat_at == dt.timedelta(seconds=30)
    assert abs(job.heartbeat_at - real()) < dt.timedelta(seconds=10)  # naive UTC, not Kolkata time
    with db.session(url) as s:
        s.execute(update(Job).where(Job.id == jid).values(lease_expires_at=queue.db_now(s.get_bind().dialect.name, -1)))
    assert queue.reclaim_expired(url=url) == 1
    assert queue.get_job(jid, url=url).status == "queued"


def test_a_handed_back_attempt_keeps_the_retry_budget(home, db_url):
    jid = queue.enqueue("import", {"upload": _upload(home), "name": "d"}, max_attempts=1)
    assert queue.finish(queue.claim("w1", 30), queue.HANDBACK, error="attempt 1 handed back: worker shut down")
    job = queue.get_job(jid)
    assert (job.status, job.attempts, job.max_attempts) == ("queued", 1, 2)
    c = queue.claim("w2", 30)
    assert c.attempt == 2
    assert queue.finish(c, queue.FAILED, error="OSError: disk on fire")
    assert (queue.get_job(jid).status, queue.get_job(jid).error) == ("dead", "OSError: disk on fire")
    other = queue.enqueue("import", {"upload": _upload(home, tag="y"), "name": "d"})
    c = queue.claim("w3", 30)
    queue.cancel(other)
    assert queue.finish(c, queue.HANDBACK) and queue.get_job(other).status == "cancelled"


def test_heartbeat_without_a_database_for_a_lease_stops_the_job(home, caplog):
    queue.enqueue("import", {"upload": _upload(home), "name": "d"})
    c = queue.claim("w", 30)
    dead = "postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=1"  # nothing listens there
    w = Worker(home, WorkerConfig(lease_s=1, url=dead))
    ctx = JobContext(job_id=c.job_id, attempt=c.attempt, home=home)
    beat = _Heartbeat(w, c, ctx, LogSink(io.StringIO()))
    t0 = time.monotonic()
    with fence.installed(beat.holds, c.token), pytest.raises(fence.LeaseLost, match="cannot confirm"):
        fence.guard("a checkpoint")  # retried for a lease period, then refused
    assert 1.0 <= time.monotonic() - t0 < 10
    beat.last_ok = t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="tunix_rt.worker"):
        beat.start()
        assert ctx.stop.wait(10) and beat.lost.is_set()
        beat.done.set()
        beat.join()
    assert time.monotonic() - t0 >= 1.0
    assert "a whole lease: stopping the job" in caplog.text


# --- a worker frozen past its lease -------------------------------------------------------

STEPS, PAUSE_AT = 24, 3


def _train_params() -> dict:
    return {"preset": "smoke", "evaluate": False, "overrides": {
        "dataset": "tiny@v1", "split": "all", "max_steps": STEPS, "batch_size": 2, "save_interval": 2,
        "keep_checkpoints": 2, "eval_interval": 0, "warmup_steps": 0, "max_seq_len": 128}}


def _frozen(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def _db_free(url: str, job_id: int, run_id: str) -> bool:
    """Whether a writer could write now: the frozen worker holds no lock a successor needs (a
    process frozen inside a transaction blocks the database, fence or not)."""
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(url[len("sqlite:///"):], timeout=0.2, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import OperationalError

    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("SELECT 1 FROM jobs WHERE id = :j FOR UPDATE NOWAIT"), {"j": job_id})
            conn.execute(text("SELECT 1 FROM runs WHERE id = :r FOR UPDATE NOWAIT"), {"r": run_id})
        return True
    except OperationalError:
        return False
    finally:
        engine.dispose()


def _freeze_between_writes(proc, url: str, job_id: int, run_id: str) -> None:
    """The worker froze itself at a step (TUNIX_RT_FAULT=step@N:SIGSTOP); if its heartbeat
    thread was inside a transaction just then, let it go and freeze it again."""
    wait_for(lambda: _frozen(proc.pid), 120, "the worker to freeze itself")
    for _ in range(100):
        if _db_free(url, job_id, run_id):
            return
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.01)
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: _frozen(proc.pid), 10, "the worker to freeze")
    raise AssertionError("the frozen worker keeps holding a database lock")


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _snapshot(run, job_id: int) -> dict:
    """Every file of the run (TensorBoard event files are per writer, left out) by sha256, and
    the rows that say what happened."""
    files = {str(p.relative_to(run)): _sha(p) for p in sorted(run.rglob("*"))
             if p.is_file() and p.relative_to(run).parts[0] != "tensorboard"}
    with db.session() as s:
        r, j = s.get(Run, run.name), s.get(Job, job_id)
        rows = {
            "run": (r.status, r.manifest, r.finished_at, r.error),
            "checkpoints": list(s.execute(select(Checkpoint.step, Checkpoint.path).where(Checkpoint.run_id == run.name)
                                          .order_by(Checkpoint.step))),
            "metrics": s.scalar(select(func.count()).select_from(Metric).where(Metric.run_id == run.name)),
            "job": (j.status, j.result, j.error, j.attempts, j.lease_token, j.finished_at, j.run_id),
            "log_chunks": s.scalar(select(func.count()).select_from(JobLogChunk).where(JobLogChunk.job_id == job_id)),
        }
    return {"files": files, **rows}


def test_a_worker_frozen_past_its_lease_writes_nothing_once_it_wakes(home, db_url, tmp_path):
    import_tiny_dataset(home)
    jid = queue.enqueue("train", _train_params())
    log_a, log_b = tmp_path / "worker-a.log", tmp_path / "worker-b.log"
    a = start_worker(home, log_a, "--lease", "2", "--poll", "0.1", fault=f"step@{PAUSE_AT}:SIGSTOP")
    b = None
    try:
        # the run directory, not the job row: the heartbeat links the row up to a beat later,
        # and on an idle machine A reaches step PAUSE_AT and freezes before that beat
        run = wait_for(JobContext(job_id=jid, attempt=1, home=home).find_run_dir, 150, "the run to start", a, log_a)
        run_id = run.name
        _freeze_between_writes(a, db_url, jid, run_id)
        frozen_ckpts = {p.parent.name: _sha(p.parent / "weights.safetensors") for p in run.glob("checkpoints/*/COMMIT")}
        assert frozen_ckpts, "worker A froze before its first checkpoint"
        # B starts only now: while A runs, nobody may take its job (a 2 s lease on a loaded machine)
        b = start_worker(home, log_b, "--lease", "2", "--poll", "0.1", "--max-jobs", "1")
        assert b.wait(timeout=300) == 0, log_b.read_text()[-3000:]
        job = queue.get_job(jid)
        assert (job.status, job.attempts) == ("succeeded", 2), (job.status, job.error, log_b.read_text()[-3000:])
        before = _snapshot(run, jid)
        os.kill(a.pid, signal.SIGCONT)
        wait_for(lambda: "outcome of attempt 1 dropped" in log_a.read_text(), 60, "worker A to give the job up", a, log_a)
        a.send_signal(signal.SIGTERM)
        assert a.wait(timeout=60) == 0
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    after = _snapshot(run, jid)
    assert after == before
    assert sorted(k for k in after["files"] if k.endswith("COMMIT")) == [
        f"checkpoints/step-{STEPS - 2:06d}/COMMIT", f"checkpoints/step-{STEPS:06d}/COMMIT"]
    assert after["run"][0] == "succeeded" and after["files"]["final/adapter/adapter_model.safetensors"]
    assert not [p for p in run.rglob(".tmp-*")], "a temp dir was left behind"
    text = log_a.read_text()
    assert "fence: refused" in text, text[-3000:]
    refused = [line for line in text.splitlines() if "fence: refused" in line]
    outcomes = [line for c in queue.read_logs(jid) for line in c.text.splitlines() if line.startswith("[worker] attempt")]
    assert outcomes == ["[worker] attempt 2: succeeded"], outcomes
    print(f"frozen at step {PAUSE_AT} holding {sorted(frozen_ckpts)}; B finished; A's late writes refused: {refused}")
