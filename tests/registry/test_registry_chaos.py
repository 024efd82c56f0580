"""Queue chaos: 50 real import jobs, 3 `tunix-rt worker` processes, one killed with SIGKILL
every ~0.5 s while it holds a job (8 kills, each worker restarted), then the rest drains.

Every job must end succeeded (attempts are enough to absorb every kill), and each job's side
effect must exist exactly once, checked by content: the dataset version `job<ID>` holds the
records of that job's upload and nothing else, its manifest matches its data, its registry
row matches its manifest, no upload landed twice or never, and no other version or row exists."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from registry_testlib import upload as _upload
from tunix_rt.registry import db, queue
from tunix_rt.registry.models import Dataset

pytestmark = pytest.mark.serial  # it times itself or races a lease: `make test` runs it alone (Makefile)

# Kills come every 0.5 s while a worker holds a job: on a fast machine the 50 jobs take only
# a few seconds, and a slower kill rate let them all finish before the chaos began.
N_JOBS, N_WORKERS, KILL_EVERY_S, KILLS, DEADLINE_S, N_RECORDS = 50, 3, 0.5, 8, 150, 1000
MAX_ATTEMPTS = KILLS + 1  # even a job killed by every kill has an attempt left: only a bug fails one


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


def _chaos(home, tmp_path: Path) -> int:
    """Run the workers, killing one every KILL_EVERY_S while it holds a job; returns the kills."""
    rng = random.Random(6)
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
    return kills


def _expected(tag: str) -> list[tuple]:
    """The records of upload `tag` (registry_testlib.write_dataset_file), in file order."""
    return [(f"{tag}-{k}", f"What is {k}+1?", [f"{k}+1={k + 1}"], str(k + 1)) for k in range(N_RECORDS)]


def _content(version_dir: Path) -> list[tuple]:
    lines = (version_dir / "data.jsonl").read_text(encoding="utf-8").splitlines()
    return [(r["id"], r["question"], r["steps"], r["answer"]) for r in map(json.loads, lines)]


def test_chaos_every_job_succeeds_each_side_effect_once(home, db_url, tmp_path):
    tags = {queue.enqueue("import", {"upload": _upload(home, n=N_RECORDS, tag=f"c{i}"), "name": "chaos"},
                          max_attempts=MAX_ATTEMPTS): f"c{i}" for i in range(N_JOBS)}
    started = time.monotonic()
    kills = _chaos(home, tmp_path)
    logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in tmp_path.glob("worker-*.log"))
    jobs = {j.id: j for j in queue.list_jobs(limit=1000)}
    assert set(jobs) == set(tags)
    not_succeeded = {i: (j.status, j.attempts, j.error) for i, j in jobs.items() if j.status != queue.SUCCEEDED}
    assert not not_succeeded, (not_succeeded, queue.counts(), logs)
    assert kills >= 3, f"only {kills} kills: the chaos did not happen"
    assert any(j.attempts > 1 for j in jobs.values()), "no kill landed mid-job"

    # the files: one version per job, holding exactly its own upload's records
    root = home.datasets / "chaos"
    assert sorted(p.name for p in root.iterdir()) == sorted(f"job{i}" for i in tags)
    landed: dict[str, list[int]] = {}
    for i, tag in tags.items():
        assert jobs[i].result == {"dataset": f"chaos@job{i}", "path": str(root / f"job{i}")}
        vdir = root / f"job{i}"
        content = _content(vdir)
        landed.setdefault(content[0][0].rsplit("-", 1)[0], []).append(i)
        assert content == _expected(tag), f"job {i}: chaos@job{i} does not hold upload {tag}"
        manifest = json.loads((vdir / "manifest.json").read_text())
        assert manifest["count"] == N_RECORDS
        assert manifest["sha256"] == hashlib.sha256((vdir / "data.jsonl").read_bytes()).hexdigest()
    assert landed == {tag: [i] for i, tag in tags.items()}  # each upload once, none missing
    # a worker killed mid-import leaves its hidden staging dir (never a version: not listed, not
    # indexed); nothing else may sit beside the dataset
    staging = [p.name for p in home.datasets.iterdir() if p.name != "chaos"]
    assert all(n.startswith(".tmp-chaos-") for n in staging), staging

    # the registry: one row per version, and it describes the files
    with db.session() as s:
        rows = s.scalars(select(Dataset).where(Dataset.name == "chaos")).all()
        got = sorted((r.version, r.count, r.sha256, Path(r.path).resolve()) for r in rows)
    want = sorted((f"job{i}", N_RECORDS, json.loads((root / f"job{i}" / "manifest.json").read_text())["sha256"],
                   (root / f"job{i}").resolve()) for i in tags)
    assert got == want
    retried = sum(1 for j in jobs.values() if j.attempts > 1)
    print(f"chaos: {N_JOBS}/{N_JOBS} succeeded, {kills} SIGKILLs, {retried} jobs retried, "
          f"{time.monotonic() - started:.1f} s, {len(staging)} staging dirs left by killed imports")
