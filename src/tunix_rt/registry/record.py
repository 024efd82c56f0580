"""Index what the stages wrote on disk. Each `record_*` reads the files (the source of truth,
DESIGN.md §2) and upserts rows, so calling it twice, or after `registry sync`, changes nothing.

The stages call these after they finish (`data import`, `model import`, `train`, `eval`).
A registry problem must never fail the caller's command: the public functions log a warning
and return None unless `strict=True` (used by `registry sync` and the tests). The one
exception is a fence refusal (fence.LeaseLost, only inside a worker's job): the writer lost
the job and must stop, so it always propagates.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tunix_rt import fence, rundir
from tunix_rt.errors import BadInput
from tunix_rt.files import MODEL_MANIFEST, weights_sha256
from tunix_rt.registry import db
from tunix_rt.registry.liveness import STALE_AFTER_S, STEP_DIR, mark_if_gone
from tunix_rt.registry.models import Checkpoint, Dataset, Evaluation, Metric, ModelVersion, Prediction, Run

log = logging.getLogger("tunix_rt.registry")
T = TypeVar("T")


def record_dataset(dataset_dir: str | Path, *, url: str | None = None, strict: bool = False) -> str | None:
    """Index `<home>/datasets/<name>/<version>/` from its manifest.json; returns "name@version"."""
    return _safely(lambda: _record_dataset(Path(dataset_dir), url), "dataset", dataset_dir, strict)


def record_model(model_dir: str | Path, *, url: str | None = None, strict: bool = False) -> str | None:
    """Index a model directory as a content-addressed model version; returns its sha256
    (files.weights_sha256, the identity a run's manifest records for its model)."""
    return _safely(lambda: _record_model(Path(model_dir), url), "model", model_dir, strict)


def record_run(run_dir: str | Path, *, url: str | None = None, strict: bool = False,
               job_id: int | None = None) -> str | None:
    """Index a run directory: manifest, config, metrics, committed checkpoints and its
    evaluations; returns the run id."""
    return _safely(lambda: _record_run(Path(run_dir), url, job_id), "run", run_dir, strict)


def record_eval(eval_dir: str | Path, *, url: str | None = None, strict: bool = False) -> str | None:
    """Index an evaluation directory (eval_summary.json, predictions.jsonl); returns its id."""
    return _safely(lambda: _record_eval(Path(eval_dir), url), "evaluation", eval_dir, strict)


def _safely(fn: Callable[[], T], what: str, path: Any, strict: bool) -> T | None:
    """Run `fn` once the fence allows the write, retrying once on a unique-key race with
    another process."""
    fence.guard(f"registry write of {what} {path}")
    for attempt in (1, 2):
        try:
            return fn()
        except IntegrityError:
            if attempt == 2:
                if strict:
                    raise
                log.warning("registry: could not record %s %s (conflicting writers)", what, path)
        except Exception as e:  # noqa: BLE001 — the caller's command must not fail here
            if strict:
                raise
            log.warning("registry: could not record %s %s: %s", what, path, e)
            return None
    return None


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise BadInput(f"{path}: cannot read JSON: {e}") from e
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a JSON object")
    return data


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Complete lines only: a line still being written (no newline yet) is left for later."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True):
        if not line.endswith("\n") or not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            rows.append(obj)
    return rows


def parse_time(value: Any) -> dt.datetime | None:
    """ISO strings or epoch seconds → naive UTC."""
    if value in (None, ""):
        return None
    try:
        if isinstance(value, (int, float)):
            t = dt.datetime.fromtimestamp(float(value), dt.timezone.utc)
        else:
            t = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except (ValueError, OverflowError, OSError):
        return None
    if t.tzinfo is not None:
        t = t.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return t


def _upsert(s: Session, model: type, key: dict[str, Any], values: dict[str, Any]):
    row = s.scalars(select(model).filter_by(**key)).first()
    if row is None:
        row = model(**key, **values)
        s.add(row)
    else:
        for k, v in values.items():
            setattr(row, k, v)
    s.flush()
    return row


# --- datasets ---------------------------------------------------------------------------

def _record_dataset(path: Path, url: str | None) -> str:
    m = read_json(path / "manifest.json")
    name, version = str(m.get("name") or path.parent.name), str(m.get("version") or path.name)
    with db.session(url) as s:
        _upsert(s, Dataset, {"name": name, "version": version}, {
            "path": str(path.resolve()), "sha256": m.get("sha256"), "count": m.get("count"),
            "importer": m.get("importer"), "source": _text(m.get("source")), "manifest": m,
            "created_at": parse_time(m.get("created_at")) or _mtime(path / "manifest.json"),
        })
    return f"{name}@{version}"


# --- models -----------------------------------------------------------------------------

def _record_model(path: Path, url: str | None) -> str:
    if not (path / "config.json").is_file():
        raise BadInput(f"{path}: not a model directory (no config.json)")
    m = read_json(path / MODEL_MANIFEST) if (path / MODEL_MANIFEST).is_file() else {}
    try:
        sha = weights_sha256(path)  # the one identity: a run's manifest and checkpoints name it too
    except FileNotFoundError as e:
        raise BadInput(f"{path}: not a model directory ({e})") from None
    with db.session(url) as s:
        _upsert(s, ModelVersion, {"sha256": sha}, {
            "name": str(m.get("name") or path.name), "preset": m.get("preset"),
            "path": str(path.resolve()), "source": _text(m.get("source")), "manifest": m,
        })
    return sha


# --- runs -------------------------------------------------------------------------------

def _record_run(path: Path, url: str | None, job_id: int | None) -> str:
    if not path.is_dir():
        raise BadInput(f"{path}: no such run directory")
    manifest = read_json(path / rundir.MANIFEST) if (path / rundir.MANIFEST).is_file() else {}
    config = _read_config(path)
    run_id = path.name
    with db.session(url) as s:
        row = s.get(Run, run_id)
        values = _run_values(path, manifest, config)
        if job_id is not None:
            values["job_id"] = job_id
        if row is None:
            s.add(Run(id=run_id, **values))
        else:
            for k, v in values.items():
                setattr(row, k, v)
        s.flush()
        _sync_metrics(s, run_id, read_jsonl(path / rundir.METRICS))
        _sync_checkpoints(s, run_id, path / rundir.CHECKPOINTS)
    for eval_dir in sorted((path / rundir.EVALS).glob(f"*/{rundir.SUMMARY}")):
        _record_eval(eval_dir.parent, url)
    return run_id


def _read_config(path: Path) -> dict[str, Any]:
    cfg = path / rundir.CONFIG
    if not cfg.is_file():
        return {}
    data = yaml.safe_load(cfg.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _run_values(path: Path, m: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    cfg = m.get("config") if isinstance(m.get("config"), dict) else config
    device = m.get("device")
    if isinstance(device, dict):
        device = " ".join(str(device[k]) for k in ("platform", "count") if device.get(k) is not None)
    status = m.get("status") or ("running" if (path / rundir.METRICS).exists() else "created")
    return {
        "status": str(status), "engine": m.get("engine") or cfg.get("engine"),
        "device": _text(device), "model": _text(cfg.get("model")), "dataset": _text(cfg.get("dataset")),
        "path": str(path.resolve()), "config": cfg or config, "manifest": m,
        "error": _text(m.get("error")), "started_at": parse_time(m.get("started_at") or m.get("started")),
        "finished_at": parse_time(m.get("finished_at") or m.get("finished")),
    }


def _sync_metrics(s: Session, run_id: str, lines: list[dict[str, Any]]) -> None:
    """Append new lines; rewrite all when the file no longer extends what we stored
    (a resumed run may have rewound it)."""
    stored = s.scalars(select(Metric).where(Metric.run_id == run_id).order_by(Metric.seq.desc()).limit(1)).first()
    start = 0
    if stored is not None:
        if stored.seq < len(lines) and lines[stored.seq] == stored.values:
            start = stored.seq + 1
        else:
            s.execute(delete(Metric).where(Metric.run_id == run_id))
    for seq in range(start, len(lines)):
        row = lines[seq]
        s.add(Metric(run_id=run_id, seq=seq, step=_num(row.get("step"), int), loss=_num(row.get("loss"), float),
                     lr=_num(row.get("lr"), float), values=row))


def _sync_checkpoints(s: Session, run_id: str, ckpt_root: Path) -> None:
    """Only committed checkpoints (COMMIT marker written last) count."""
    steps = {}
    for d in ckpt_root.glob("*/COMMIT"):
        match = STEP_DIR.match(d.parent.name)
        if match:
            steps[int(match.group(1))] = d.parent
    s.execute(delete(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.step.not_in(list(steps) or [-1])))
    have = set(s.scalars(select(Checkpoint.step).where(Checkpoint.run_id == run_id)))
    for step, d in sorted(steps.items()):
        if step not in have:
            s.add(Checkpoint(run_id=run_id, step=step, path=str(d.resolve()), created_at=_mtime(d / "COMMIT")))


# --- evaluations --------------------------------------------------------------------------

def eval_id_for(path: Path) -> str:
    """`<run_id>.<eval_name>` for runs/<run_id>/eval/<eval_name>/, else the directory name."""
    if path.parent.name == rundir.EVALS:
        return f"{path.parent.parent.name}.{path.name}"
    return path.name


def _record_eval(path: Path, url: str | None) -> str:
    summary = read_json(path / rundir.SUMMARY)
    eval_id = eval_id_for(path)
    metrics = summary.get("metrics") if isinstance(summary.get("metrics"), dict) else {}
    ds = summary.get("dataset") if isinstance(summary.get("dataset"), dict) else {}
    device = summary.get("device")
    values = {
        "path": str(path.resolve()), "model": _text(summary.get("model")),
        "adapter": _text(summary.get("adapter")), "engine": _text(summary.get("engine")),
        "device": _text(device.get("platform") if isinstance(device, dict) else device),
        "dataset": "@".join(str(ds[k]) for k in ("name", "version") if ds.get(k)) or None,
        "split": _text(ds.get("split")), "n": _num(metrics.get("n", ds.get("n")), int),
        "accuracy": _num(metrics.get("accuracy"), float), "format_rate": _num(metrics.get("format_rate"), float),
        "metrics": metrics, "summary": summary,
        "finished_at": parse_time(summary.get("finished_at")),
        "created_at": parse_time(summary.get("started_at")) or _mtime(path / rundir.SUMMARY),
    }
    with db.session(url) as s:
        values["run_id"] = _eval_run(path, summary, s)
        _upsert(s, Evaluation, {"id": eval_id}, values)
        s.execute(delete(Prediction).where(Prediction.eval_id == eval_id))
        for seq, p in enumerate(read_jsonl(path / rundir.PREDICTIONS)):
            s.add(_prediction(eval_id, seq, p))
    return eval_id


def _eval_run(path: Path, summary: dict[str, Any], s: Session) -> str | None:
    """The run an eval scored: its folder (runs/<run_id>/eval/<name>/), else the summary's
    `run_id` when that run is in this registry (an eval written elsewhere with --out)."""
    if path.parent.name == rundir.EVALS:
        return path.parent.parent.name
    named = summary.get("run_id")
    return named if isinstance(named, str) and s.get(Run, named) is not None else None


def _prediction(eval_id: str, seq: int, p: dict[str, Any]) -> Prediction:
    return Prediction(
        eval_id=eval_id, seq=seq, item_id=str(p.get("id", seq)), question=_text(p.get("question")),
        gold=_text(p.get("gold")), completion=_text(p.get("completion")), reasoning=_text(p.get("reasoning")),
        answer=_text(p.get("answer")), correct=bool(p.get("correct")), format_ok=bool(p.get("format_ok")),
        n_tokens=_num(p.get("n_tokens"), int), finish_reason=_text(p.get("finish_reason")),
    )


# --- the whole home -----------------------------------------------------------------------

def sync_home(home, url: str | None = None, progress: Callable[[str], None] | None = None,
              report: Callable[[str], None] | None = None, stale_after_s: float = STALE_AFTER_S) -> dict[str, int]:
    """Index every dataset, model and run directory (with its evaluations) under `home`,
    plus evaluations kept outside runs (`<home>/evals/*`). Strict: a broken directory raises.
    A run still `created`/`running` whose process is gone (killed: liveness.py) is first
    marked `interrupted` in its manifest, told to `report`; its rows then follow its files.
    `.tmp-*` directories are runs that never appeared (RunDir.create), not runs."""
    counts = {"datasets": 0, "models": 0, "runs": 0, "evaluations": 0}
    note = progress or (lambda _msg: None)
    tell = report or (lambda _msg: None)
    for manifest in sorted(home.datasets.glob("*/*/manifest.json")):
        note(f"dataset {manifest.parent}")
        _record_dataset(manifest.parent, url)
        counts["datasets"] += 1
    for config in sorted(home.models.glob("*/config.json")):
        note(f"model {config.parent}")
        _record_model(config.parent, url)
        counts["models"] += 1
    for run_dir in sorted(p for p in home.runs.glob("*") if p.is_dir() and not p.name.startswith(".")):
        note(f"run {run_dir}")
        gone = mark_if_gone(run_dir, stale_after_s)
        if gone:
            tell(f"run {run_dir.name}: marked interrupted: {gone}")
        _record_run(run_dir, url, None)
        counts["runs"] += 1
        counts["evaluations"] += len(list((run_dir / rundir.EVALS).glob(f"*/{rundir.SUMMARY}")))
    for summary in sorted((home.root / "evals").glob(f"*/{rundir.SUMMARY}")):
        note(f"evaluation {summary.parent}")
        _record_eval(summary.parent, url)
        counts["evaluations"] += 1
    return counts


# --- helpers ----------------------------------------------------------------------------

def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _num(value: Any, kind: type) -> Any:
    if value is None or isinstance(value, bool):
        return None
    try:
        out = kind(value)
    except (TypeError, ValueError):
        return None
    return None if isinstance(out, float) and out != out else out  # NaN → None


def _mtime(path: Path) -> dt.datetime:
    try:
        return dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc).replace(tzinfo=None)
    except OSError:
        return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
