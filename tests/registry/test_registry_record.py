"""record_* and `registry sync`: files on disk → rows, idempotently, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from sqlalchemy import func, inspect, select

from registry_testlib import seed_home, write_eval, write_run
from tunix_rt.registry import db, queries
from tunix_rt.registry.models import Base, Checkpoint, Metric, Prediction
from tunix_rt.registry.record import record_dataset, record_eval, record_model, record_run, sync_home


def _count(url, model) -> int:
    with db.session(url) as s:
        return s.scalar(select(func.count()).select_from(model))


def test_record_run_reads_the_files_and_is_idempotent(home, db_url):
    run = write_run(home, "r1")
    write_eval(run / "eval" / "dev-1")
    assert record_run(run, strict=True) == "r1"
    counts = [_count(db_url, m) for m in (Metric, Checkpoint, Prediction)]
    assert record_run(run, strict=True) == "r1"
    assert [_count(db_url, m) for m in (Metric, Checkpoint, Prediction)] == counts == [12, 2, 6]
    r = queries.get_run("r1")
    assert (r.status, r.engine, r.device, r.model, r.dataset) == ("succeeded", "torch", "cpu 1", "tiny-gemma3", "tiny")
    assert r.config["lr"] == 0.003 and r.finished_at is not None
    assert [c.step for c in queries.run_checkpoints("r1")] == [5, 10]  # step-000099 has no COMMIT
    losses = [m.loss for m in queries.run_metrics("r1") if m.loss is not None]
    assert len(losses) == 10 and losses[0] > losses[-1]
    ev = queries.get_eval("r1.dev-1")
    assert ev.run_id == "r1" and ev.n == 6 and abs(ev.accuracy - 0.5) < 1e-9 and ev.dataset == "tiny@v1"
    total, wrong = queries.predictions("r1.dev-1", wrong_only=True)
    assert total == 3 and {p.item_id for p in wrong} == {"q2", "q4", "q6"}
    assert {p.item_id for p in queries.predictions("r1.dev-1", format_violations=True)[1]} == {"q4", "q5"}


def test_an_eval_written_elsewhere_links_the_run_its_summary_names(home, db_url):
    record_run(write_run(home, "r3"), strict=True)
    for name, named in (("out-known", "r3"), ("out-unknown", "no-such-run"), ("out-base", "not a run (base model)")):
        d = write_eval(home.root / "evals" / name)
        summary = json.loads((d / "eval_summary.json").read_text())
        (d / "eval_summary.json").write_text(json.dumps({**summary, "run_id": named}))
        record_eval(d, strict=True)
    assert [queries.get_eval(n).run_id for n in ("out-known", "out-unknown", "out-base")] == ["r3", None, None]


def test_metrics_follow_a_growing_then_rewound_file(home, db_url):
    run = write_run(home, "r2", status="running", steps=4)
    record_run(run, strict=True)
    assert len(queries.run_metrics("r2")) == 4
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 5, "loss": 1.0, "lr": 0.001}) + "\n")
        fh.write('{"step": 6, "loss": 0.9')  # still being written: not indexed yet
    record_run(run, strict=True)
    assert [m.step for m in queries.run_metrics("r2")][-1] == 5
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 3.0, "lr": 0.1}) + "\n")  # resumed, rewound
    record_run(run, strict=True)
    assert [(m.step, m.loss) for m in queries.run_metrics("r2")] == [(1, 3.0)]


def test_sync_indexes_the_whole_home(home, db_url):
    ids = seed_home(home)
    counts = sync_home(home)
    assert counts == {"datasets": 1, "models": 0, "runs": 2, "evaluations": 2}
    assert sync_home(home) == counts
    assert {r.id for r in queries.list_runs()} == {ids["run"], "tiny-gemma3-20261122-050000-cd34"}
    assert [r.status for r in queries.list_runs(status="failed")] == ["failed"]
    assert queries.get_dataset("tiny", "v1").count == 8
    board = queries.leaderboard("accuracy")
    assert [(e.id, round(e.accuracy, 3)) for e in board] == [(ids["eval_base"], 0.5), (ids["eval_run"], 0.333)]
    assert [e.id for e in queries.leaderboard("mean_completion_tokens")][0] in (ids["eval_base"], ids["eval_run"])
    cmp = queries.compare(ids["eval_base"], ids["eval_run"])
    assert cmp["common"] == 6
    assert {a.item_id for a, _ in cmp["fixed"]} == {"q2", "q4"} and {a.item_id for a, _ in cmp["broken"]} == {"q1", "q3", "q5"}


def test_model_versions_are_content_addressed(home, db_url):
    m = home.models / "tiny"
    m.mkdir(parents=True)
    (m / "config.json").write_text("{}")
    (m / "model.safetensors").write_bytes(b"weights-1")
    sha1 = record_model(m, strict=True)
    assert record_model(m, strict=True) == sha1
    (m / "model.safetensors").write_bytes(b"weights-2")
    sha2 = record_model(m, strict=True)
    assert sha2 != sha1 and len(sha2) == 64
    assert {v.sha256 for v in queries.list_models(name="tiny")} == {sha1, sha2}


def test_record_never_fails_the_caller(home, caplog, monkeypatch):
    run = write_run(home, "r3")
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=1")
    with caplog.at_level(logging.WARNING, logger="tunix_rt.registry"):
        assert record_run(run) is None
        assert record_dataset(home.datasets / "missing") is None
        assert record_eval(home.root / "nothing") is None
    assert "could not record run" in caplog.text


def test_migration_matches_the_models(home, db_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    engine = db.get_engine()
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []
    assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())


MIGRATE = """
import sys
from sqlalchemy import text
from tunix_rt.registry import db
e = db.get_engine(sys.argv[1])
with e.connect() as c:
    print(c.execute(text("select version_num from alembic_version")).scalar())
"""


def test_migrations_run_once_when_processes_race(home, db_url):
    procs = [subprocess.Popen([sys.executable, "-c", MIGRATE, db_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    assert {o[0].strip() for o in outs} == {"0001"}
    engine = db.get_engine(db_url)
    from sqlalchemy import text

    with engine.connect() as c:
        assert c.execute(text("select count(*) from alembic_version")).scalar() == 1
