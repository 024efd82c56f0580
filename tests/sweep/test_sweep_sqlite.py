"""A TPE sweep on SQLite (the registry's default database): a real `tunix-rt worker` killed at
the first step of its trial, before any checkpoint, then an in-process worker that runs every
trial, the killed one resumed in the same run from step 0. Then: a finished trial's job run
again only reports it; `sweep show`; the REST API; the sweep page in headless chromium."""

from __future__ import annotations

import json
import signal

import pytest

from registry_testlib import import_tiny_dataset, start_worker
from sweep_testlib import BASE, STEPS, cli_main, manifest, run_dirs, train_steps
from tunix_rt.home import Home

NAME, N = "tpe5", 5
SPACE = {"params": {"lr": {"type": "float", "low": 1e-3, "high": 30.0, "log": True},
                    "lora_rank": {"type": "int", "low": 4, "high": 16, "step": 4},
                    "schedule": {"type": "categorical", "choices": ["cosine", "constant"]}},
         "enqueue": [{"lr": 3e-3}], "sampler": {"n_startup_trials": 2}, "pruner": {"n_startup_trials": 1}}


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """(home, job ids, the killed job): the finished sweep, shared by this module's tests."""
    from tunix_rt.registry import db, queue
    from tunix_rt.registry.worker import Worker, WorkerConfig
    from tunix_rt.sweep.space import parse_space
    from tunix_rt.sweep.study import create_sweep

    import torch

    tmp = tmp_path_factory.mktemp("sweep")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the worker processes (start_worker): a 2-core machine runs several
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNIX_RT_HOME", str(tmp / "home"))
        mp.delenv("DATABASE_URL", raising=False)
        home = Home.resolve().ensure()
        import_tiny_dataset(home, n=16)
        jobs = create_sweep(NAME, {**BASE, "save_interval": 0}, parse_space(SPACE), N, seed=1)
        killed = start_worker(home, tmp / "killed.log", "--lease", "2", "--poll", "0.1", fault="step@1")
        assert killed.wait(timeout=240) == -signal.SIGKILL, (tmp / "killed.log").read_text()[-3000:]
        assert queue.get_job(jobs[0]).status == "running"  # held by the dead worker until its lease ends
        assert Worker(home, WorkerConfig(lease_s=5, poll_s=0.05, max_jobs=N)).run() == N
        torch.set_num_threads(threads)
        yield home, jobs
        db.dispose_all()


def _trials(name: str = NAME):
    import optuna

    from tunix_rt.sweep.study import opened

    with opened() as storage:
        return optuna.load_study(study_name=name, storage=storage).get_trials()


def test_tpe_trials_on_sqlite_each_once_the_killed_one_resumed_in_its_run(swept):
    from tunix_rt.registry import queue

    home, jobs = swept
    assert [(queue.get_job(i).status, queue.get_job(i).attempts) for i in jobs] == [("succeeded", 2)] + [("succeeded", 1)] * 4
    trials = _trials()
    assert sorted(t.user_attrs["job"] for t in trials) == jobs and sorted(t.number for t in trials) == list(range(N))
    assert {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}
    assert trials[0].params["lr"] == 3e-3  # the enqueued value; the other values were asked of TPE
    for t in trials:
        assert 1e-3 <= t.params["lr"] <= 30 and t.params["lora_rank"] in (4, 8, 12, 16)
        assert t.params["schedule"] in ("cosine", "constant")
    assert len({tuple(sorted(t.params.items())) for t in trials}) == N
    # one run per trial: the killed attempt (no checkpoint yet) was resumed in its own run from step 0
    assert sorted(r.name for r in run_dirs(home)) == sorted(t.user_attrs["run_id"] for t in trials)
    first = home.runs / trials[0].user_attrs["run_id"]
    assert "resumed_from_step" not in manifest(first) and train_steps(first) == list(range(1, STEPS + 1))
    for t in trials:
        cfg = manifest(home.runs / t.user_attrs["run_id"])["config"]
        assert {k: cfg[k] for k in t.params} == t.params


def test_optunas_tables_beside_the_registry_leave_its_migrations_alone(swept):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy import text

    from tunix_rt.registry import db
    from tunix_rt.registry.models import Base

    engine = db.get_engine()
    db.migrate(engine)  # again, with Optuna's tables there: nothing to do
    with engine.connect() as conn:
        assert conn.execute(text("select version_num from alembic_version")).scalars().all() == ["0001"]
        ours = compare_metadata(MigrationContext.configure(conn, opts={"include_name": db.registry_tables_only}),
                                Base.metadata)
        everything = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert ours == []
    # what the filter keeps out: Optuna's tables and their indexes, nothing of ours
    assert {d[0] for d in everything} == {"remove_table", "remove_index"}
    touched = {d[1].name if d[0] == "remove_table" else d[1].table.name for d in everything}
    assert {"studies", "trials", "trial_params", "version_info"} <= touched and not touched & set(Base.metadata.tables)


def test_a_finished_trials_job_run_again_only_reports_it(swept):
    from tunix_rt.registry import queue
    from tunix_rt.registry.jobs import JobContext, TrialParams
    from tunix_rt.sweep.trial import run_trial

    home, jobs = swept
    before = sorted(p.name for p in home.runs.iterdir())
    for i in jobs:
        again = run_trial(JobContext(job_id=i, attempt=9, home=home), TrialParams(study=NAME))
        assert again == queue.get_job(i).result
    assert sorted(p.name for p in home.runs.iterdir()) == before and len(_trials()) == N


def test_sweep_show_and_list(swept, monkeypatch, capsys):
    home, jobs = swept
    complete = [t for t in _trials() if t.state.name == "COMPLETE"]
    best = min(complete, key=lambda t: manifest(home.runs / t.user_attrs["run_id"])["final"]["eval_loss"])
    code, out, _ = cli_main(monkeypatch, capsys, "sweep", "show", NAME, "--json")
    shown = json.loads(out)
    assert code == 0 and shown["best"]["trial"] == best.number and shown["best"]["params"] == best.params
    assert [r["job_id"] for r in shown["trials"]] == jobs and sum(shown["counts"].values()) == N
    code, out, _ = cli_main(monkeypatch, capsys, "sweep", "show", NAME)
    assert code == 0 and f"best: trial {best.number}, eval_loss" in out and "lora_rank" in out
    code, out, _ = cli_main(monkeypatch, capsys, "sweep", "list")
    assert code == 0 and NAME in out and f"{N}/{N}" in out
    code, _, err = cli_main(monkeypatch, capsys, "sweep", "show", "no-such-sweep")
    assert code == 2 and "no sweep 'no-such-sweep'" in err


def test_sweeps_api(swept):
    from service_testlib import make_client

    home, jobs = swept
    with make_client(home, home.database_url) as client:
        listed = client.get("/api/sweeps").json()
        assert [(s["name"], s["trials_asked"], s["trials_requested"]) for s in listed] == [(NAME, N, N)]
        detail = client.get(f"/api/sweeps/{NAME}").json()
        assert [t["job_id"] for t in detail["trials"]] == jobs and detail["best"]["config"]["dataset"] == "tiny@v1"
        assert detail["best"]["value"] == min(t["value"] for t in detail["trials"] if t["state"] == "COMPLETE")
        assert client.get("/api/sweeps/nope").status_code == 404
        assert client.get("/api/sweeps", headers={"Authorization": "Bearer wrong"}).status_code == 401


@pytest.mark.browser
def test_sweep_page_in_chromium(swept):
    from requires import require_chromium
    from service_testlib import TOKEN, LiveServer, live_app

    chromium = require_chromium()
    from playwright.sync_api import sync_playwright

    home, jobs = swept
    trials = {t.number: t for t in _trials()}
    best = min((t for t in trials.values() if t.state.name == "COMPLETE"), key=lambda t: t.value)
    with LiveServer(live_app(home, home.database_url)) as srv, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True,
                                    args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"])
        page = browser.new_page()
        page.set_default_timeout(15000)
        page.goto(f"{srv.url}/#token={TOKEN}")
        page.wait_for_selector("[data-testid=leaderboard], [data-testid=empty]")
        page.click("nav >> text=Sweeps")
        page.click(f"[data-testid=sweeps] >> text={NAME}")
        page.wait_for_selector("[data-testid=sweep-trials]")
        rows = page.locator("[data-testid=sweep-trial]")
        assert rows.count() == N
        assert [rows.nth(k).locator("td").nth(0).inner_text() for k in range(N)] == \
            [str(next(n for n, t in trials.items() if t.user_attrs["job"] == i)) for i in jobs]
        best_text = page.inner_text("[data-testid=sweep-best]")
        assert f"trial {best.number}" in best_text and f"lora_rank: {best.params['lora_rank']}" in best_text
        assert f'schedule: "{best.params["schedule"]}"' in best_text
        for name in SPACE["params"]:  # one point per trial (all have a value), pruned ones hollow
            chart = f"[data-testid=sweep-chart-{name}]"
            assert page.locator(f"{chart} circle").count() == N
            assert page.locator(f"{chart} circle.pruned").count() == sum(t.state.name == "PRUNED" for t in trials.values())
        assert "null" not in page.inner_text("main") and "NaN" not in page.inner_text("main")
        page.click(f"[data-testid=sweep-best] a >> text={best.user_attrs['run_id']}")
        page.wait_for_selector("[data-testid=loss-chart]")
        browser.close()


@pytest.fixture
def one_trial(home):
    """A one-trial sweep (nothing can be pruned: the pruner waits for 5 complete trials)."""
    import torch

    from tunix_rt.sweep.space import parse_space
    from tunix_rt.sweep.study import create_sweep

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    import_tiny_dataset(home, n=16)
    space = {"params": {"lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True}}}
    (job,) = create_sweep("one", {**BASE, "save_interval": 0}, parse_space(space), 1)
    yield home, job
    torch.set_num_threads(threads)


@pytest.mark.serial
def test_a_trial_stopped_for_shutdown_is_handed_back_and_resumed(one_trial):
    """What SIGTERM's handler does (worker.install_signals) while the trial trains: the run
    stops at a checkpoint, the job goes back to the queue with its trial RUNNING (not pruned,
    not failed), and the next worker finishes the same trial in the same run."""
    import threading
    import time

    from tunix_rt.registry import queue
    from tunix_rt.registry.worker import Worker, WorkerConfig
    from tunix_rt.train.metrics import read_jsonl

    home, job = one_trial
    w = Worker(home, WorkerConfig(lease_s=5, poll_s=0.05, max_jobs=1))

    def sigterm_after_step_3() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            runs = run_dirs(home) if home.runs.exists() else []
            if runs and any(r.get("step", 0) >= 3 for r in read_jsonl(runs[0] / "metrics.jsonl")):
                w.shutdown.set()
                w.current.stop.set()
                return
            time.sleep(0.01)

    threading.Thread(target=sigterm_after_step_3, daemon=True).start()
    assert w.run() == 1
    j = queue.get_job(job)
    assert (j.status, j.attempts, j.max_attempts) == ("queued", 1, 4) and "handed back" in j.error
    (t,) = _trials("one")
    (run,) = run_dirs(home)
    stopped = int(manifest(run)["error"].split("stopped at step ")[1].split()[0])
    assert t.state.name == "RUNNING" and manifest(run)["status"] == "stopped" and 3 <= stopped < STEPS
    assert sorted(t.intermediate_values) == [2]
    assert Worker(home, WorkerConfig(lease_s=5, poll_s=0.05, max_jobs=1)).run() == 1
    (t,) = _trials("one")
    assert queue.get_job(job).status == "succeeded" and t.state.name == "COMPLETE"
    assert run_dirs(home) == [run] and manifest(run)["resumed_from_step"] == stopped
    assert train_steps(run) == list(range(1, STEPS + 1)) and sorted(t.intermediate_values) == [2, 4, 6]


def test_two_trials_inserted_for_one_job_keep_the_first(one_trial):
    """Should two attempts of a job both insert a trial (a worker paused a whole lease between
    its fence guard and its insert), the job runs the lower-numbered one; the other is failed."""
    import optuna

    from tunix_rt.registry import queue
    from tunix_rt.registry.worker import Worker, WorkerConfig
    from tunix_rt.sweep.study import describe, opened

    home, job = one_trial
    with opened() as storage:
        study = optuna.load_study(study_name="one", storage=storage)
        for _ in range(2):  # what the two racing attempts' inserts leave
            study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, user_attrs={"job": job}))
    assert Worker(home, WorkerConfig(lease_s=5, poll_s=0.05, max_jobs=1)).run() == 1
    first, second = _trials("one")
    assert (first.state.name, second.state.name) == ("COMPLETE", "FAIL")
    assert queue.get_job(job).result["trial"] == 0 and len(run_dirs(home)) == 1
    assert [(r["trial"], r["state"]) for r in describe("one")["trials"]] == [(0, "COMPLETE")]
