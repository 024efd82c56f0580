"""After kill -9 the registry tells the truth. A real `tunix-rt train` killed with SIGKILL
leaves its manifest `running`; `registry sync` sees its process is gone (pid and start time
on this host; on another host, files silent for --stale-after), marks it interrupted with the
reason and its last committed checkpoint, and its metrics and checkpoint rows match the
files. A run resumed from its final checkpoint (killed after that commit) writes no metric
row twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from registry_testlib import cli_main, write_run
from tunix_rt.process import process_identity, start_ticks
from tunix_rt.registry import queries
from tunix_rt.registry.record import record_run, sync_home
from tunix_rt.train import checkpoint
from tunix_rt.train.metrics import read_jsonl

SMOKE = ["--config", "smoke", "save_interval=2", "keep_checkpoints=2"]


def _train(home, args: list[str], fault: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TUNIX_RT_HOME": str(home.root), "OMP_NUM_THREADS": "1"}
    env.pop("TUNIX_RT_FAULT", None)
    if fault:
        env["TUNIX_RT_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "tunix_rt.cli", "train", *args], env=env,
                          capture_output=True, text=True, timeout=600)


def _cli(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    code, out, _ = cli_main(monkeypatch, capsys, *args)
    return code, out


def _show(monkeypatch, capsys, run_id: str) -> dict:
    code, out = _cli(monkeypatch, capsys, "runs", "show", run_id)
    assert code == 0, out
    return json.loads(out)


def _manifest(run) -> dict:
    return json.loads((run / "run_manifest.json").read_text())


def _agrees_with_disk(shown: dict, run) -> None:
    lines = read_jsonl(run / "metrics.jsonl")
    assert shown["metrics"]["lines"] == len(lines) and shown["metrics"]["last"] == lines[-1]
    assert shown["checkpoints"] == [int(p.name.split("-")[1]) for p in checkpoint.committed(run)]


def test_sync_after_sigkill_marks_the_run_interrupted_and_matches_the_disk(home, monkeypatch, capsys):
    r = _train(home, SMOKE, fault="step@8")  # SIGKILL after step 8, before its checkpoint
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    run = next(p for p in home.runs.iterdir() if not p.name.startswith("."))
    assert _manifest(run)["status"] == "running" and _manifest(run)["process"]["pid"] > 0
    assert [p.name for p in checkpoint.committed(run)] == ["step-000004", "step-000006"]
    assert _show(monkeypatch, capsys, run.name)["status"] == "running"  # the lie, before sync

    code, out = _cli(monkeypatch, capsys, "registry", "sync")
    assert code == 0 and f"run {run.name}: marked interrupted" in out and "is gone" in out, out
    shown = _show(monkeypatch, capsys, run.name)
    assert shown["status"] == "interrupted" and shown["finished_at"], shown
    assert "is gone" in shown["error"] and "step-000006" in shown["error"] and "--resume" in shown["error"]
    _agrees_with_disk(shown, run)
    assert len(read_jsonl(run / "metrics.jsonl")) == 9  # steps 1..8 and the eval at 6
    assert _manifest(run)["status"] == "interrupted"  # the files say it too: they stay the truth
    code, out = _cli(monkeypatch, capsys, "registry", "sync")
    assert code == 0 and "marked interrupted" not in out  # once

    r = _train(home, ["--resume", run.name])
    assert r.returncode == 0, r.stderr[-2000:]
    code, out = _cli(monkeypatch, capsys, "registry", "sync")
    shown = _show(monkeypatch, capsys, run.name)
    assert shown["status"] == "succeeded" and shown["error"] is None, shown
    _agrees_with_disk(shown, run)
    steps = [m["step"] for m in read_jsonl(run / "metrics.jsonl") if "loss" in m]
    assert steps == list(range(1, 13))


def _rows(run) -> list[tuple[int, str]]:
    """(step, kind) of every metrics line: a training row or an eval row."""
    return [(m["step"], "train" if "loss" in m else "eval") for m in read_jsonl(run / "metrics.jsonl")]


def test_resume_from_the_final_checkpoint_writes_no_row_twice(home, monkeypatch, capsys):
    r = _train(home, SMOKE, fault="export@1")  # SIGKILL after the final checkpoint's commit
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    run = next(p for p in home.runs.iterdir() if not p.name.startswith("."))
    assert checkpoint.latest(run).name == "step-000012" and _manifest(run)["status"] == "running"
    before = _rows(run)
    assert before.count((12, "eval")) == 1

    r = _train(home, ["--resume", run.name])
    assert r.returncode == 0, r.stderr[-2000:]
    rows = _rows(run)
    assert rows == before and len(set(rows)) == len(rows) == 12 + 2, rows  # 12 steps, evals at 6 and 12
    final_row = read_jsonl(run / "metrics.jsonl")[-1]
    assert _manifest(run)["final"]["eval_loss"] == final_row["eval_loss"]
    record_run(run, strict=True)
    assert [(m.step, m.values) for m in queries.run_metrics(run.name)] == \
        [(m["step"], m) for m in read_jsonl(run / "metrics.jsonl")]


# --- liveness without training: runs written as the trainer writes them ---------------------

def _running(home, run_id: str, process: dict | None):
    run = write_run(home, run_id, status="running", steps=4, ckpts=(2,))
    m = _manifest(run)
    if process is not None:
        m["process"] = process
    (run / "run_manifest.json").write_text(json.dumps(m))
    return run


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _zombie() -> subprocess.Popen:
    """A child that exited and was not waited for: its pid still answers signal 0."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.05)
    return p


def _age(run, seconds: float) -> None:
    old = time.time() - seconds
    for p in [run, *run.rglob("*")]:
        os.utime(p, (old, old), follow_symlinks=False)


def test_sync_asks_the_process_on_this_host_and_the_clock_elsewhere(home):
    me = process_identity()
    alive = _running(home, "alive", me)
    dead = _running(home, "dead", {**me, "pid": _dead_pid()})
    reused = _running(home, "reused", {**me, "start": me["start"] - 1})  # the pid is someone else now
    other_fresh = _running(home, "other-fresh", {"host": "elsewhere", "pid": 1, "start": 1})
    other_silent = _running(home, "other-silent", {"host": "elsewhere", "pid": 1, "start": 1})
    container = _running(home, "container", {**me, "pid": _dead_pid(), "pidns": "pid:[1]"})  # same host name
    zombie = _zombie()
    _running(home, "zombie", {**me, "pid": zombie.pid, "start": start_ticks(zombie.pid)})
    before_record = _running(home, "no-record", None)
    _age(other_silent, 7200)
    _age(before_record, 7200)
    done = write_run(home, "done")
    (home.runs / ".tmp-never-appeared").mkdir()

    told: list[str] = []
    counts = sync_home(home, report=told.append)
    zombie.wait()
    assert counts["runs"] == 9 and all(".tmp-" not in r.id for r in queries.list_runs())
    status = {r.id: r.status for r in queries.list_runs()}
    assert status == {"alive": "running", "other-fresh": "running", "container": "running", "done": "succeeded",
                      "dead": "interrupted", "zombie": "interrupted",
                      "reused": "interrupted", "other-silent": "interrupted", "no-record": "interrupted"}
    assert sorted(line.split(":")[0] for line in told) == [
        "run dead", "run no-record", "run other-silent", "run reused", "run zombie"]
    assert "is gone (killed?)" in queries.get_run("dead").error
    assert "another process" in queries.get_run("reused").error
    assert "presumed gone" in queries.get_run("other-silent").error
    assert "step-000002" in queries.get_run("dead").error
    assert _manifest(dead)["finished_at"] and _manifest(alive)["status"] == "running"
    assert _manifest(other_fresh)["status"] == "running" and _manifest(done)["status"] == "succeeded"
    assert _manifest(container)["status"] == "running"  # its pid means nothing here: its files are fresh


def test_stale_after_is_an_option_of_registry_sync(home, monkeypatch, capsys):
    run = _running(home, "other", {"host": "elsewhere", "pid": 1, "start": 1})
    _age(run, 120)
    code, out = _cli(monkeypatch, capsys, "registry", "sync")
    assert code == 0 and queries.get_run("other").status == "running"
    code, out = _cli(monkeypatch, capsys, "registry", "sync", "--stale-after", "60")
    assert code == 0 and "run other: marked interrupted" in out, out
    assert queries.get_run("other").status == "interrupted"
    code, _ = _cli(monkeypatch, capsys, "registry", "sync", "--stale-after", "0")
    assert code == 2


@pytest.fixture(autouse=True)
def _restore_signals():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)
