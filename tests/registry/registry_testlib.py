"""Helpers for registry and service tests: run and evaluation directories written exactly as
DESIGN.md §2 lays them out (the files the stages write), a tiny dataset imported by the real
importer, and a PostgreSQL schema of our own on 127.0.0.1:5432 (requires.missing() when it
does not answer: a skip here, a failure under CI)."""

from __future__ import annotations

import json
import math
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from requires import missing
from cli_testlib import cli_main  # noqa: F401 (the tests import it from here)

from tunix_rt.home import Home

PG_HOST, PG_PORT = "127.0.0.1", 5432
PG_USERS = ("postgres", "root")


def write_run(home: Home, run_id: str, *, status: str = "succeeded", steps: int = 10, ckpts=(5, 10)) -> Path:
    """A finished (or running) run directory with config, manifest, metrics and checkpoints."""
    d = home.runs / run_id
    (d / "final" / "adapter").mkdir(parents=True)
    config = {"model": "tiny-gemma3", "dataset": "tiny", "method": "lora", "lr": 0.003, "max_steps": steps, "seed": 0}
    (d / "config.yaml").write_text(yaml.safe_dump(config))
    manifest = {"run_id": run_id, "command": "tunix-rt train", "engine": "torch", "config": config,
                "device": {"platform": "cpu", "count": 1}, "started_at": "2026-11-22T06:00:00+00:00", "status": status}
    if status != "running":
        manifest["finished_at"] = "2026-11-22T06:01:00+00:00"
    if status == "failed":
        manifest["error"] = "RuntimeError: boom"
    (d / "run_manifest.json").write_text(json.dumps(manifest))
    lines = []
    for step in range(1, steps + 1):
        lines.append({"step": step, "loss": 7.0 * math.exp(-step / 6), "lr": 0.003 * (1 - step / (steps + 1)), "grad_norm": 1.0})
        if step % 5 == 0:
            lines.append({"step": step, "eval_loss": 7.5 * math.exp(-step / 7)})
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    for step in ckpts:
        c = d / "checkpoints" / f"step-{step:06d}"
        c.mkdir(parents=True)
        (c / "COMMIT").write_text("ok\n")
    (d / "checkpoints" / "step-000099").mkdir()  # no COMMIT: an interrupted save, never listed
    (d / "final" / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 8}))
    (d / "loss.png").write_bytes(b"\x89PNG\r\n\x1a\nfake-but-harmless")
    return d


ITEMS = [  # (id, question, gold, answer, correct, format_ok)
    ("q1", "What is 2+2?", "4", "4", True, True),
    ("q2", "What is 3*3?", "9", "6", False, True),
    ("q3", "Apples: 5 minus 2?", "3", "3", True, True),
    ("q4", "What is 10/2?", "5", None, False, False),
    ("q5", "What is 7+1?", "8", "8", True, False),
    ("q6", "What is 9-9?", "0", "1", False, True),
]


def write_eval(d: Path, *, flip: bool = False, model: str = "tiny-gemma3", adapter: str | None = None) -> Path:
    """eval_summary.json and predictions.jsonl; flip=True inverts correctness of q1..q5."""
    d.mkdir(parents=True)
    rows = []
    for i, (rid, q, gold, ans, ok, fmt) in enumerate(ITEMS):
        if flip and i < 5:
            ok, ans = not ok, (gold if not ok else "wrong")
        reasoning = None if ans is None else f"step for {rid}"
        completion = f"<reasoning>{reasoning}</reasoning>\n<answer>{ans}</answer>" if ans else "rambling"
        rows.append({"id": rid, "question": q, "gold": gold, "completion": completion, "reasoning": reasoning,
                     "answer": ans, "correct": ok, "format_ok": fmt, "n_tokens": 20 + i, "finish_reason": "stop"})
    (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    n = len(rows)
    metrics = {"accuracy": sum(r["correct"] for r in rows) / n, "format_rate": sum(r["format_ok"] for r in rows) / n,
               "answer_found_rate": sum(r["answer"] is not None for r in rows) / n,
               "mean_completion_tokens": sum(r["n_tokens"] for r in rows) / n, "truncated_rate": 0.0, "n": n}
    summary = {"model": model, "adapter": adapter, "engine": "torch", "device": "cpu",
               "dataset": {"name": "tiny", "version": "v1", "split": "dev", "sha256": "0" * 64, "n": n},
               "decoding": {"greedy": True, "max_new_tokens": 64}, "metrics": metrics, "by_category": {},
               "started_at": "2026-11-22T06:02:00+00:00", "finished_at": "2026-11-22T06:03:00+00:00",
               "duration_s": 60.0, "tokens_per_s": 12.5}
    (d / "eval_summary.json").write_text(json.dumps(summary))
    return d


def write_dataset_file(path: Path, n: int, tag: str = "x") -> Path:
    path.write_text("".join(json.dumps({"id": f"{tag}-{i}", "question": f"What is {i}+1?", "steps": [f"{i}+1={i + 1}"],
                                        "answer": str(i + 1)}) + "\n" for i in range(n)))
    return path


def upload(home: Home, n: int = 3, tag: str = "x") -> str:
    """A valid trace JSONL stored as the API stores uploads: <home>/uploads/<sha256>.jsonl."""
    import hashlib

    from tunix_rt.registry.jobs import UPLOADS_DIR

    up = home.root / UPLOADS_DIR
    up.mkdir(exist_ok=True)
    src = write_dataset_file(home.root / f"{tag}.jsonl", n, tag)
    name = hashlib.sha256(src.read_bytes()).hexdigest() + ".jsonl"
    src.rename(up / name)
    return name


def import_tiny_dataset(home: Home, name: str = "tiny", version: str = "v1", n: int = 8) -> Path:
    """A real dataset directory, written by the real importer."""
    from tunix_rt.traces.dataset import ImportRequest, import_dataset

    src = write_dataset_file(home.root / f"{name}-src.jsonl", n)
    return import_dataset(ImportRequest(fmt="record", source=str(src), name=name, version=version), home).dataset.path


def seed_home(home: Home) -> dict[str, str]:
    """Two runs (one with an evaluation), a base-model evaluation outside runs, a dataset."""
    run = write_run(home, "tiny-gemma3-20261122-060000-ab12")
    write_run(home, "tiny-gemma3-20261122-050000-cd34", status="failed", steps=4, ckpts=(2,))
    write_eval(run / "eval" / "dev-1", flip=True, adapter=str(run / "final" / "adapter"))
    write_eval(home.root / "evals" / "base-dev-1")
    import_tiny_dataset(home)
    return {"run": run.name, "eval_run": f"{run.name}.dev-1", "eval_base": "base-dev-1"}


def start_worker(home: Home, log: Path, *args: str, fault: str | None = None) -> subprocess.Popen:
    """A real `tunix-rt worker` process on the home (DATABASE_URL inherited), output to `log`;
    one torch thread, so its training is bit-exact with an in-process run. `fault`: a
    TUNIX_RT_FAULT spec (train/faults.py fault_point)."""
    env = dict(os.environ, TUNIX_RT_HOME=str(home.root), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("TUNIX_RT_FAULT", None)
    if fault:
        env["TUNIX_RT_FAULT"] = fault
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "tunix_rt.cli", "worker", *args],
                                env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_for(pred, timeout: float, what: str, proc=None, log: Path | None = None):
    """Poll pred() until it is truthy (returned), or fail naming `what` with the worker's log
    tail; fails at once if `proc` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"worker exited: {log.read_text()[-3000:] if log else ''}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: {log.read_text()[-3000:] if log else ''}")


def pg_reachable() -> bool:
    try:
        with socket.create_connection((PG_HOST, PG_PORT), timeout=1):
            return True
    except OSError:
        return False


def pg_admin_url() -> str | None:
    """A URL for database `test` with a user that exists (trust auth), or None."""
    import psycopg

    for user in PG_USERS:
        try:
            with psycopg.connect(host=PG_HOST, port=PG_PORT, user=user, dbname="test", connect_timeout=3):
                return f"postgresql+psycopg://{user}@{PG_HOST}:{PG_PORT}/test"
        except psycopg.OperationalError:
            continue
    return None


def require_postgresql() -> str:
    """The admin URL of database `test` on 127.0.0.1:5432, or missing() saying what is wrong."""
    if not pg_reachable():
        missing(f"PostgreSQL not reachable on {PG_HOST}:{PG_PORT} (.ci/run starts one)")
    admin = pg_admin_url()
    if admin is None:
        missing(f"PostgreSQL on {PG_HOST}:{PG_PORT}: no database `test` that user postgres or root may "
                "open with trust auth")
    return admin


@contextmanager
def pg_database(monkeypatch) -> Iterator[str]:
    """DATABASE_URL set, for one test, to a fresh schema in PostgreSQL's `test`; dropped after."""
    admin = require_postgresql()
    url, schema = pg_schema_url(admin)
    monkeypatch.setenv("DATABASE_URL", url)
    try:
        yield url
    finally:
        from tunix_rt.registry import db

        db.dispose_all()
        pg_drop_schema(admin, schema)


def pg_schema_url(admin: str) -> tuple[str, str]:
    """(URL whose search_path is a fresh schema, schema name)."""
    import psycopg

    schema = f"tunix_test_{secrets.token_hex(4)}"
    with psycopg.connect(admin.replace("postgresql+psycopg", "postgresql"), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return f"{admin}?options=-csearch_path%3D{schema}", schema


def pg_drop_schema(admin: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(admin.replace("postgresql+psycopg", "postgresql"), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
