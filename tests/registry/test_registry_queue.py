"""The job queue on SQLite and PostgreSQL: claims, the fencing token, retries, dead jobs,
reclaimed leases, cancellation, validated parameters, and a worker running real imports."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import update

from registry_testlib import upload as _upload
from tunix_rt.errors import BadInput
from tunix_rt.registry import db, queries, queue
from tunix_rt.registry.handlers import run_job
from tunix_rt.registry.jobs import JobContext
from tunix_rt.registry.models import Job, utcnow
from tunix_rt.registry.worker import Worker, WorkerConfig


def _expire(job_id: int) -> None:
    with db.session() as s:
        s.execute(update(Job).where(Job.id == job_id).values(lease_expires_at=utcnow().replace(year=2000)))


def test_fencing_token_refuses_a_stale_worker(home, db_url):
    jid = queue.enqueue("import", {"upload": _upload(home), "name": "d"})
    first = queue.claim("w1", 30)
    assert first.job_id == jid and first.token == 1 and queue.claim("w2", 30) is None
    _expire(jid)
    assert queue.reclaim_expired() == 1
    second = queue.claim("w2", 30)
    assert second.token == 2 and second.attempt == 2
    assert queue.heartbeat(first, 30) == "lost"
    assert not queue.append_log(first, 0, "zombie output")
    assert not queue.finish(first, queue.SUCCEEDED, result={"by": "w1"})
    assert queue.heartbeat(second, 30) == "ok"
    assert queue.finish(second, queue.SUCCEEDED, result={"by": "w2"})
    job = queue.get_job(jid)
    assert (job.status, job.result, job.attempts) == ("succeeded", {"by": "w2"}, 2)
    assert queue.read_logs(jid) == []


def test_retries_then_dead_with_the_error(home, db_url):
    jid = queue.enqueue("import", {"upload": _upload(home), "name": "d"}, max_attempts=2)
    c = queue.claim("w", 30)
    assert queue.finish(c, "failed", error="OSError: disk on fire")
    assert queue.get_job(jid).status == "queued"
    c = queue.claim("w", 30)
    assert queue.finish(c, "failed", error="OSError: still on fire")
    job = queue.get_job(jid)
    assert (job.status, job.attempts, job.error) == ("dead", 2, "OSError: still on fire")
    assert job.finished_at is not None and queue.claim("w", 30) is None


def test_expired_last_attempt_is_dead(home, db_url):
    jid = queue.enqueue("import", {"upload": _upload(home), "name": "d"}, max_attempts=1)
    queue.claim("w", 30)
    _expire(jid)
    queue.reclaim_expired()
    job = queue.get_job(jid)
    assert job.status == "dead" and "lease expired" in job.error


def test_cancel_queued_and_running(home, db_url):
    a = queue.enqueue("import", {"upload": _upload(home), "name": "d"})
    b = queue.enqueue("import", {"upload": _upload(home, tag="y"), "name": "d"})
    assert queue.cancel(a) == "cancelled"
    c = queue.claim("w", 30)
    assert c.job_id == b  # the cancelled job is never claimed
    assert queue.cancel(b) == "running"
    assert queue.heartbeat(c, 30) == "cancel"
    assert queue.finish(c, "failed", error="stopped")
    assert queue.get_job(b).status == "cancelled"
    with pytest.raises(queries.NotFound):
        queue.cancel(999)


@pytest.mark.parametrize("params", [
    {"upload": "../../etc/passwd", "name": "d"},
    {"upload": "/etc/passwd", "name": "d"},
    {"upload": "a" * 64 + ".jsonl", "name": "../d"},
    {"upload": "a" * 64 + ".jsonl", "name": "d", "command": "rm -rf /"},
])
def test_import_params_are_validated(home, params):
    with pytest.raises(BadInput):
        queue.enqueue("import", params)


def test_train_and_eval_params_refuse_paths_and_unknown_kinds(home):
    with pytest.raises(BadInput, match="dataset must be a name"):
        queue.enqueue("train", {"preset": "smoke", "overrides": {"dataset": "/etc/passwd"}})
    with pytest.raises(BadInput, match="model must be a name"):
        queue.enqueue("train", {"preset": "smoke", "overrides": {"model": "../models/x"}})
    with pytest.raises(BadInput, match="preset"):
        queue.enqueue("train", {"preset": "../../etc/x"})
    with pytest.raises(BadInput, match="unknown field"):
        queue.enqueue("train", {"preset": "smoke", "overrides": {"no_such_key": 1}})
    with pytest.raises(BadInput):
        queue.enqueue("eval", {"model": "tiny-gemma3", "adapter_run": "../x", "dataset": "tiny"})
    with pytest.raises(BadInput, match="unknown job kind"):
        queue.enqueue("shell", {"cmd": "ls"})
    assert queue.enqueue("train", {"preset": "smoke", "overrides": {"max_steps": 2}}) > 0


def test_concurrent_claims_never_share_a_job(home, db_url):
    up = _upload(home)
    ids = {queue.enqueue("import", {"upload": up, "name": "d"}) for _ in range(24)}
    got: list[int] = []
    lock = threading.Lock()

    def grab(owner):
        while (c := queue.claim(owner, 30)) is not None:
            with lock:
                got.append(c.job_id)

    threads = [threading.Thread(target=grab, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(ids)


def test_worker_runs_a_real_import_exactly_once_across_a_retry(home, db_url):
    jid = queue.enqueue("import", {"upload": _upload(home, n=5), "name": "tiny"})
    c = queue.claim("crashed-worker", 30)
    # The first attempt does its side effect and then "dies" before writing its outcome.
    run_job(JobContext(job_id=c.job_id, attempt=c.attempt, home=home), c.kind, c.params)
    _expire(jid)
    w = Worker(home, WorkerConfig(lease_s=5, poll_s=0.05, max_jobs=1))
    assert w.run() == 1
    job = queue.get_job(jid)
    assert job.status == "succeeded" and job.attempts == 2
    assert job.result["dataset"] == f"tiny@job{jid}"
    assert [p.name for p in (home.datasets / "tiny").iterdir()] == [f"job{jid}"]
    assert queries.get_dataset("tiny", f"job{jid}").count == 5
    logs = "".join(ch.text for ch in queue.read_logs(jid))
    assert f"job {jid} (import) attempt 2" in logs and "attempt 2: succeeded" in logs


def test_bad_input_is_dead_without_retrying(home, db_url):
    jid = queue.enqueue("import", {"upload": "b" * 64 + ".jsonl", "name": "tiny"})
    Worker(home, WorkerConfig(lease_s=5, poll_s=0.05, max_jobs=1)).run()
    job = queue.get_job(jid)
    assert job.status == "dead" and job.attempts == 1 and "upload it first" in job.error
