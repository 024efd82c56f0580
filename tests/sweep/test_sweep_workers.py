"""A 6-trial sweep run by 3 real `tunix-rt worker` processes on PostgreSQL, one of them killed
(SIGKILL) in the middle of its trial: every trial runs exactly once, the killed one resumed by
another worker from its committed checkpoint, the lr=30 trials pruned at their first eval, and
`tunix-rt sweep show` reports the best COMPLETE trial's config.

Why the pruning is certain: the trials' values are pinned (the space's `enqueue`), the median
rule needs one COMPLETE trial (n_startup_trials=1), and the queue hands out jobs in id order to
workers that run one job at a time, so the lr=30 trials (jobs 5 and 6) are asked for only after
two jobs of the two live workers finished (worker 0 holds its first job until it dies); the
first trial to finish cannot have been pruned (no trial had completed while it ran). Their eval loss at step 2 (7.1) is above every other
trial's (6.0 to 6.5)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from registry_testlib import import_tiny_dataset, pg_database, start_worker, wait_for
from sweep_testlib import EVAL_EVERY, STEPS, manifest, run_dirs, train_steps, write_base, write_space
from tunix_rt.registry import queue
from tunix_rt.train import checkpoint

pytestmark = pytest.mark.serial  # it times itself or races a lease: `make test` runs it alone (Makefile)

LRS = [3e-3, 1e-2, 5e-3, 2e-3, 30.0, 30.0]
SPACE = {"params": {"lr": {"type": "float", "low": 1e-3, "high": 30.0, "log": True}},
         "enqueue": [{"lr": lr} for lr in LRS], "pruner": {"n_startup_trials": 1}}
NAME = "pg6"


def _cli(home, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TUNIX_RT_HOME=str(home.root))
    return subprocess.run([sys.executable, "-m", "tunix_rt.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def _trials(name: str) -> list:
    import optuna

    from tunix_rt.sweep.study import opened

    with opened() as storage:
        return optuna.load_study(study_name=name, storage=storage).get_trials()


def test_three_workers_run_each_trial_exactly_once(home, tmp_path, monkeypatch):
    with pg_database(monkeypatch):
        import_tiny_dataset(home, n=16)
        made = _cli(home, "sweep", "--config", str(write_base(tmp_path / "base.yaml")),
                    "--space", str(write_space(tmp_path / "space.yaml", SPACE)), "--trials", "6", "--name", NAME)
        assert made.returncode == 0, made.stderr
        jobs = [j.id for j in sorted(queue.list_jobs(kind="trial"), key=lambda j: j.id)]
        assert len(jobs) == 6 and f"jobs {jobs[0]}..{jobs[-1]}" in made.stdout

        # worker 0 dies (SIGKILL) at the second training step of its first trial: after the
        # step-1 checkpoint (save_interval 1), before the step-2 eval (the first pruning check)
        logs = [tmp_path / f"worker-{i}.log" for i in range(3)]
        workers = [start_worker(home, log, "--lease", "5", "--poll", "0.1", fault="step@2" if i == 0 else None)
                   for i, log in enumerate(logs)]
        try:
            assert workers[0].wait(timeout=240) == -signal.SIGKILL, logs[0].read_text()[-3000:]
            wait_for(lambda: sum(queue.counts().get(s, 0) for s in queue.TERMINAL) == 6, 300, "all six trials",
                     log=logs[1])
        finally:
            for w in workers:
                if w.poll() is None:
                    w.send_signal(signal.SIGTERM)
            for w in workers:
                try:
                    w.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    w.kill()
                    w.wait()
        worker_logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in logs)

        done = {j.id: j for j in queue.list_jobs(kind="trial")}
        assert {i: done[i].status for i in jobs} == {i: "succeeded" for i in jobs}, worker_logs
        # the killed worker's trial was retried; on a loaded machine a worker whose heartbeat
        # came late may lose a lease too (its writes are then fenced): more retries, same outcome
        killed_job = int(re.findall(r"\] job (\d+) \(trial\)", logs[0].read_text())[-1])
        assert done[killed_job].attempts >= 2, worker_logs

        trials = _trials(NAME)
        assert sorted(t.number for t in trials) == list(range(6))
        assert sorted(t.user_attrs["job"] for t in trials) == jobs  # one trial per job, none twice
        by_job = {t.user_attrs["job"]: t for t in trials}
        assert [by_job[i].params for i in jobs] == [{"lr": lr} for lr in LRS]
        assert {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}
        assert [by_job[i].state.name for i in jobs[4:]] == ["PRUNED", "PRUNED"], worker_logs
        assert any(t.state.name == "COMPLETE" for t in trials)

        # one run per trial, named after its job and trial, each training step exactly once
        runs = run_dirs(home)
        assert sorted(r.name for r in runs) == sorted(t.user_attrs["run_id"] for t in trials)
        for i in jobs:
            t, path = by_job[i], home.runs / by_job[i].user_attrs["run_id"]
            assert path.name.startswith(f"job{i}-{NAME}-t{t.number}-")
            m, steps = manifest(path), train_steps(path)
            assert m["config"]["lr"] == t.params["lr"]
            if t.state.name == "COMPLETE":
                assert m["status"] == "succeeded" and steps == list(range(1, STEPS + 1))
                assert t.value == m["final"]["eval_loss"]
                assert sorted(t.intermediate_values) == list(range(EVAL_EVERY, STEPS + 1, EVAL_EVERY))
            else:
                last = int(checkpoint.latest(path).name.split("-")[1])
                assert m["status"] == "pruned" and m["sweep"]["trial"] == t.number, m
                assert steps == list(range(1, last + 1)) and last < STEPS and not (path / "final").exists()
                assert max(t.intermediate_values) <= last
        killed = home.runs / by_job[killed_job].user_attrs["run_id"]
        assert manifest(killed)["resumed_from_step"] >= 1

        # sweep show: the best COMPLETE trial, as the runs on disk say
        complete = [(manifest(home.runs / t.user_attrs["run_id"])["final"]["eval_loss"], t) for t in trials
                    if t.state.name == "COMPLETE"]
        value, best = min(complete, key=lambda c: c[0])
        shown = _cli(home, "sweep", "show", NAME, "--json")
        assert shown.returncode == 0, shown.stderr
        report = json.loads(shown.stdout)
        assert report["best"]["trial"] == best.number and report["best"]["value"] == value
        assert report["best"]["params"] == best.params and report["best"]["config"]["lr"] == best.params["lr"]
        ran = manifest(home.runs / best.user_attrs["run_id"])["config"]  # the manifest omits null fields
        assert {k: v for k, v in report["best"]["config"].items() if v is not None} == \
            {k: v for k, v in ran.items() if k != "run_name"}
        assert [r["trial"] for r in report["trials"]] == [by_job[i].number for i in jobs]
        table = _cli(home, "sweep", "show", NAME)
        assert f"best: trial {best.number}, eval_loss {value:.6g}, lr={best.params['lr']:.6g}" in table.stdout
        print(f"sweep {NAME}: " + ", ".join(f"t{t.number} lr={t.params['lr']:g} {t.state.name} {t.value:.4f}"
                                           for t in sorted(trials, key=lambda t: t.number))
              + f"; best t{best.number}")
