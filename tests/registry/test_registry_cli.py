"""`tunix-rt registry sync`, `runs list|show`, `registry jobs`, `worker` through the real entry point."""

from __future__ import annotations

import json

import pytest

from registry_testlib import cli_main, seed_home


def test_sync_then_runs_list_and_show(home, monkeypatch, capsys):
    ids = seed_home(home)
    code, out, _ = cli_main(monkeypatch, capsys, "registry", "sync")
    assert code == 0 and "datasets=1 models=0 runs=2 evaluations=2" in out
    code, out, _ = cli_main(monkeypatch, capsys, "runs", "list", "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and {r["id"] for r in rows} == {ids["run"], "tiny-gemma3-20261122-050000-cd34"}
    code, out, _ = cli_main(monkeypatch, capsys, "runs", "list", "--status", "failed", "--json")
    assert [json.loads(line)["status"] for line in out.splitlines()] == ["failed"]
    code, out, _ = cli_main(monkeypatch, capsys, "runs", "list")
    assert code == 0 and "succeeded" in out
    code, out, _ = cli_main(monkeypatch, capsys, "runs", "show", ids["run"])
    shown = json.loads(out)
    assert code == 0 and shown["checkpoints"] == [5, 10] and shown["metrics"]["lines"] == 12
    assert shown["evaluations"][0]["id"] == ids["eval_run"]
    code, _, err = cli_main(monkeypatch, capsys, "runs", "show", "no-such-run")
    assert code == 2 and "no run 'no-such-run'" in err


def test_worker_command_drains_the_queue(home, monkeypatch, capsys):
    from tunix_rt.registry import queue

    jid = queue.enqueue("import", {"upload": "c" * 64 + ".jsonl", "name": "x"})
    code, out, _ = cli_main(monkeypatch, capsys, "worker", "--max-idle", "0.3", "--poll", "0.05")
    assert code == 0 and "1 job(s) handled" in out
    assert queue.get_job(jid).status == "dead"
    code, out, _ = cli_main(monkeypatch, capsys, "registry", "jobs")
    assert code == 0 and "dead" in out
    code, _, err = cli_main(monkeypatch, capsys, "worker", "--lease", "0.1")
    assert code == 2 and "lease" in err


@pytest.fixture(autouse=True)
def _restore_signals():
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)
