"""Queue chaos: 50 real import jobs, 3 `tunix-rt worker` processes, one killed with SIGKILL
every ~0.5 s while it holds a job (8 kills, each worker restarted), then the rest drains. Every job must end terminal, and each job's side effect (its
dataset version `job<ID>`) must exist exactly once, with one registry row."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import func, select

from registry_testlib import upload as _upload
from tunix_rt.registry import db, queue
from tunix_rt.registry.models import Dataset

# Kills come every 0.5 s while a worker holds a job: on a fast machine the 50 jobs take only
# a few seconds, and a slower kill rate let them all finish before the chaos began.
N_JOBS, N_WORKERS, KILL_EVERY_S, KILLS, DEADLINE_S = 50, 3, 0.5, 8, 150


def _start_worker(home, log_dir: Path, i: int) -> subprocess.Popen:
    env = dict(os.environ, TUNIX_RT_HOME=str(home.root), PYTHONUNBUFFERED="1")
    log = open(log_dir / f"worker-{i}.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "tunix_rt.cli", "worker", "--lease", "2", "--poll", "0.1"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)


def _victim(workers: list[subprocess.Popen], rng: random.Random) -> int | None:
    """Prefer a worker that holds a job right now, so kills land mid-job."""
    busy = {int(j.lease_owner.rsplit(":", 1)[1]) for j in queue.list_jobs(status="running") if j.lease_owner}
    holding = [i for i, w in enumerate(workers) if w.pid in busy]
    return rng.choice(holding) if holding else None


def test_chaos_every_job_terminal_each_side_effect_once(home, db_url, tmp_path):
    rng = random.Random(6)
    ids = [queue.enqueue("import", {"upload": _upload(home, n=1000, tag=f"c{i}"), "name": "chaos"}, max_attempts=6)
           for i in range(N_JOBS)]
    workers = [_start_worker(home, tmp_path, i) for i in range(N_WORKERS)]
    kills, started, last_kill = 0, time.monotonic(), time.monotonic()
    try:
        while time.monotonic() - started < DEADLINE_S:
            c = queue.counts()
            if sum(c.get(s, 0) for s in queue.TERMINAL) == N_JOBS:
                break
            if kills < KILLS and time.monotonic() - last_kill > KILL_EVERY_S:
                i = _victim(workers, rng)
                if i is None:  # nobody holds a job this instant: look again next tick
                    time.sleep(0.02)
                    continue
                workers[i].send_signal(signal.SIGKILL)
                workers[i].wait()
                kills += 1
                workers[i] = _start_worker(home, tmp_path, 100 + kills)
                last_kill = time.monotonic()
            time.sleep(0.1)
    finally:
        for w in workers:
            w.kill()
            w.wait()
    logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in tmp_path.glob("worker-*.log"))
    jobs = {j.id: j for j in queue.list_jobs(limit=1000)}
    assert all(jobs[i].status in queue.TERMINAL for i in ids), (queue.counts(), logs)
    assert kills >= 3, f"only {kills} kills: the chaos did not happen"
    assert any(jobs[i].attempts > 1 for i in ids), "no kill landed mid-job"
    versions = sorted(p.name for p in (home.datasets / "chaos").iterdir() if not p.name.startswith("."))
    succeeded = [i for i in ids if jobs[i].status == "succeeded"]
    assert len(versions) == len(set(versions))
    assert set(versions) >= {f"job{i}" for i in succeeded}
    assert set(versions) <= {f"job{i}" for i in ids}
    for i in succeeded:
        assert jobs[i].result["dataset"] == f"chaos@job{i}"
        assert (home.datasets / "chaos" / f"job{i}" / "manifest.json").is_file()
    with db.session() as s:
        rows = s.execute(select(Dataset.version, func.count()).where(Dataset.name == "chaos").group_by(Dataset.version)).all()
    assert all(n == 1 for _, n in rows) and {v for v, _ in rows} >= {f"job{i}" for i in succeeded}
    others = {i: (jobs[i].status, jobs[i].error) for i in ids if jobs[i].status != "succeeded"}
    retried = sum(1 for i in ids if jobs[i].attempts > 1)
    print(f"chaos: {len(succeeded)}/{N_JOBS} succeeded, {kills} SIGKILLs, {retried} jobs retried, "
          f"{time.monotonic() - started:.1f} s; not succeeded: {others}")
    assert len(succeeded) >= N_JOBS - 2, others
