"""`init` (the run a GRPO run starts from) is a run id of this home, never a path: the API
refuses anything else with 422 before a job exists, and a worker handed a job row written
straight into the database refuses it as bad input (dead at its first attempt) without
reading the other home's run. The rule is the one `model` and `dataset` follow
(registry.jobs.HOME_NAMES)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from registry_testlib import write_run
from service_testlib import make_client
from tunix_rt.home import Home
from tunix_rt.registry import db, queue
from tunix_rt.registry.models import Job
from tunix_rt.registry.worker import Worker, WorkerConfig


@pytest.fixture
def other_run(tmp_path) -> str:
    """A run in another home: what a path in `init` would make a worker read."""
    other = Home(tmp_path / "other-home").ensure()
    return str(write_run(other, "victim-run"))


def _jobs(url: str) -> int:
    with db.session(url) as s:
        return s.scalar(select(func.count()).select_from(Job))


def _submit(client, init):
    return client.post("/api/runs", json={"preset": "smoke", "overrides": {"init": init, "max_steps": 2, "warmup_steps": 0}})


def test_the_api_takes_init_only_as_a_run_of_this_home(home, other_run):
    write_run(home, "sft-run")
    (home.runs / "escape").symlink_to(other_run, target_is_directory=True)
    url = home.database_url
    with make_client(home, url) as client:
        bad = {other_run: "not a path", "../victim-run": "not a path", "runs/../../victim-run": "not a path",
               "../../other-home/runs/victim-run": "not a path", "escape": "link out",
               "no-such-run": "no run 'no-such-run'", "sft-run\n": "not a path"}
        for init, why in bad.items():
            r = _submit(client, init)
            assert r.status_code == 422, (init, r.status_code, r.text)
            assert why in r.json()["detail"] and "init" in r.json()["detail"], (init, r.text)
        assert _jobs(url) == 0  # nothing was queued
        r = _submit(client, "sft-run")
        assert r.status_code == 202, r.text
        assert r.json()["params"]["overrides"]["init"] == "sft-run"
        # model and dataset keep their rule (and their 400) from the same table
        r = client.post("/api/runs", json={"preset": "smoke", "overrides": {"model": "/etc"}})
        assert r.status_code == 400 and "model must be a name from the home" in r.text


def _insert_job(url: str, init: str) -> int:
    """A train job row as something other than enqueue (an old version, a hand) wrote it."""
    params = {"preset": "smoke", "overrides": {"init": init, "method": "grpo", "max_steps": 2, "warmup_steps": 0}}
    with db.session(url) as s:
        job = Job(kind="train", params=params, status=queue.QUEUED, max_attempts=3, attempts=0,
                  lease_token=0, cancel_requested=False)
        s.add(job)
        s.flush()
        return job.id


def test_a_worker_refuses_an_init_path_in_a_job_row_as_bad_input(home, other_run):
    url = home.database_url
    db.get_engine(url)
    (home.runs / "escape").symlink_to(other_run, target_is_directory=True)
    by_path, by_link = _insert_job(url, other_run), _insert_job(url, "escape")
    assert Worker(home, WorkerConfig(lease_s=5, poll_s=0.05, max_jobs=2, url=url)).run() == 2
    for jid, why in ((by_path, "init must be a run id from the home, not a path"), (by_link, "link out")):
        job = queue.get_job(jid, url=url)
        assert (job.status, job.attempts) == ("dead", 1), (job.status, job.attempts, job.error)
        assert why in job.error, job.error
    assert [p.name for p in home.runs.iterdir()] == ["escape"]  # no run was started
    assert not list(home.models.glob("init-*"))  # the other home's adapter was never merged
    assert json.loads((home.runs / "escape" / "run_manifest.json").read_text())["status"] == "succeeded"


def test_a_sweep_whose_base_names_init_by_path_writes_nothing(home, other_run):
    """The sweep's trials are jobs too: its base config follows the same rule."""
    from tunix_rt.errors import BadInput
    from tunix_rt.sweep.space import parse_space
    from tunix_rt.sweep.study import create_sweep, list_sweeps

    base = {"model": "tiny-gemma3", "dataset": "tiny@v1", "method": "grpo", "init": other_run,
            "max_steps": 2, "warmup_steps": 0}
    with pytest.raises(BadInput) as e:
        create_sweep("from-elsewhere", base, parse_space({"params": {"lr": {"type": "float", "low": 1e-4,
                                                                             "high": 1e-2, "log": True}}}), 2)
    assert "init must be a run id from the home, not a path" in str(e.value), str(e.value)
    assert list_sweeps() == [] and queue.list_jobs() == []


def test_an_eval_job_takes_its_adapter_run_by_the_same_rule(home, other_run):
    """adapter_run names a run like init does: a link out of runs/ is bad input too."""
    url = home.database_url
    (home.runs / "escape").symlink_to(other_run, target_is_directory=True)
    jid = queue.enqueue("eval", {"model": "tiny-gemma3", "adapter_run": "escape", "dataset": "tiny"}, url=url)
    assert Worker(home, WorkerConfig(lease_s=5, poll_s=0.05, max_jobs=1, url=url)).run() == 1
    job = queue.get_job(jid, url=url)
    assert (job.status, job.attempts) == ("dead", 1) and "adapter_run" in job.error and "link out" in job.error, \
        job.error
    assert not (home.root / "evals").exists() and not (home.runs / "escape" / "eval").exists()


def test_init_is_never_read_from_the_current_directory(home, tmp_path, monkeypatch):
    """The stages' run lookup takes a path too (the CLI's convenience): a same-named run in
    the process's current directory would be read instead of the home's, so it is refused."""
    write_run(home, "sft-run")
    elsewhere = Home(tmp_path / "cwd").ensure()
    write_run(elsewhere, "sft-run")
    monkeypatch.chdir(elsewhere.runs)
    with make_client(home, home.database_url) as client:
        r = _submit(client, "sft-run")
        assert r.status_code == 422 and "current directory" in r.json()["detail"], r.text
    monkeypatch.chdir(home.runs)  # the home's own runs/ is the same run: fine
    with make_client(home, home.database_url) as client:
        assert _submit(client, "sft-run").status_code == 202
