"""The registry told about a live run: training calls the on_update hook it is given after
every metrics line (nothing by default: training imports no registry), and the registry's
LiveIndex, which the entry points pass in, indexes the run at most every REGISTRY_EVERY_S."""

from __future__ import annotations

import pytest

from registry_testlib import write_run
from tunix_rt.registry import queries
from tunix_rt.registry.live import LiveIndex
from tunix_rt.registry.queries import NotFound
from tunix_rt.train.metrics import MetricsLog


def _row(step: int) -> dict:
    return {"step": step, "loss": 5.0 - step, "lr": 0.001}


def test_the_live_index_shows_a_running_run_at_most_every_interval(home, monkeypatch):
    run = write_run(home, "live-1", status="running")
    (run / "metrics.jsonl").unlink()
    with MetricsLog(run) as log:  # no hook: nobody is told
        log.log(_row(1))
    with pytest.raises(NotFound):
        queries.get_run("live-1")
    with MetricsLog(run, 1, LiveIndex()) as log:
        log.log(_row(2))  # indexed at once
        log.log(_row(3))  # within REGISTRY_EVERY_S: not yet
    assert queries.get_run("live-1").status == "running"
    assert [m.step for m in queries.run_metrics("live-1")] == [1, 2]
    monkeypatch.setattr(LiveIndex, "REGISTRY_EVERY_S", 0.0)
    with MetricsLog(run, 3, LiveIndex()) as log:
        log.log(_row(4))
    assert [m.step for m in queries.run_metrics("live-1")] == [1, 2, 3, 4]


def test_the_live_index_leaves_a_run_outside_a_home_alone(home):
    (home.root / "elsewhere").mkdir()  # <home>/elsewhere/<run>: its home's registry would be this one
    run = write_run(home, "elsewhere-1", status="running").rename(home.root / "elsewhere" / "elsewhere-1")
    with MetricsLog(run, 10, LiveIndex()) as log:
        log.log(_row(11))
    with pytest.raises(NotFound):
        queries.get_run("elsewhere-1")
