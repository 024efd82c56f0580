"""Read-side queries shared by the CLI and the REST API. Each returns ORM rows detached from
their session (expire_on_commit is off), so callers can read attributes freely."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, func, select

from tunix_rt.errors import BadInput
from tunix_rt.registry import db
from tunix_rt.registry.models import Checkpoint, Dataset, Evaluation, Metric, ModelVersion, Prediction, Run



class NotFound(BadInput):
    """A name or id that is not in the registry (the API answers 404)."""


LEADERBOARD_METRICS = ("accuracy", "format_rate", "answer_found_rate", "mean_completion_tokens", "truncated_rate")


def _all(q: Select, url: str | None) -> list[Any]:
    with db.session(url) as s:
        return list(s.scalars(q))


def list_runs(*, status: str | None = None, engine: str | None = None, model: str | None = None,
              dataset: str | None = None, limit: int = 100, offset: int = 0, url: str | None = None) -> list[Run]:
    q = select(Run).order_by(Run.created_at.desc(), Run.id.desc()).limit(limit).offset(offset)
    for col, value in ((Run.status, status), (Run.engine, engine), (Run.model, model), (Run.dataset, dataset)):
        if value:
            q = q.where(col == value)
    return _all(q, url)


def get_run(run_id: str, *, url: str | None = None) -> Run:
    with db.session(url) as s:
        run = s.get(Run, run_id)
    if run is None:
        raise NotFound(f"no run {run_id!r} in the registry (try `tunix-rt registry sync`)")
    return run


def run_metrics(run_id: str, *, url: str | None = None) -> list[Metric]:
    return _all(select(Metric).where(Metric.run_id == run_id).order_by(Metric.seq), url)


def run_checkpoints(run_id: str, *, url: str | None = None) -> list[Checkpoint]:
    return _all(select(Checkpoint).where(Checkpoint.run_id == run_id).order_by(Checkpoint.step), url)


def list_evals(*, run_id: str | None = None, limit: int = 100, offset: int = 0, url: str | None = None) -> list[Evaluation]:
    q = select(Evaluation).order_by(Evaluation.created_at.desc()).limit(limit).offset(offset)
    if run_id:
        q = q.where(Evaluation.run_id == run_id)
    return _all(q, url)


def leaderboard(metric: str = "accuracy", *, dataset: str | None = None, split: str | None = None,
                limit: int = 100, url: str | None = None) -> list[Evaluation]:
    """Evaluations best first by `metric` (lower is better for token counts and truncation);
    a sampled eval's pass@K and maj@K rank too (evaluations without that metric last)."""
    from tunix_rt.eval.passk import is_sampled_metric

    if metric not in LEADERBOARD_METRICS and not is_sampled_metric(metric):
        raise BadInput(f"metric must be one of {', '.join(LEADERBOARD_METRICS)}, pass@K or maj@K")
    q = select(Evaluation)
    if dataset:
        q = q.where(Evaluation.dataset == dataset)
    if split:
        q = q.where(Evaluation.split == split)
    rows = _all(q, url)
    lower_better = metric in ("mean_completion_tokens", "truncated_rate")

    def key(e: Evaluation) -> tuple:
        v = e.metrics.get(metric) if isinstance(e.metrics, dict) else None
        if not isinstance(v, (int, float)):
            return (1, 0.0, e.id)
        return (0, v if lower_better else -v, e.id)

    return sorted(rows, key=key)[:limit]


def get_eval(eval_id: str, *, url: str | None = None) -> Evaluation:
    with db.session(url) as s:
        ev = s.get(Evaluation, eval_id)
    if ev is None:
        raise NotFound(f"no evaluation {eval_id!r} in the registry")
    return ev


def predictions(eval_id: str, *, wrong_only: bool = False, format_violations: bool = False,
                search: str | None = None, limit: int = 100, offset: int = 0,
                url: str | None = None) -> tuple[int, list[Prediction]]:
    """(total matching, one page) of an evaluation's items, in file order."""
    q = select(Prediction).where(Prediction.eval_id == eval_id)
    if wrong_only:
        q = q.where(Prediction.correct.is_(False))
    if format_violations:
        q = q.where(Prediction.format_ok.is_(False))
    if search:
        like = f"%{search}%"
        q = q.where(Prediction.question.ilike(like) | Prediction.item_id.ilike(like))
    with db.session(url) as s:
        total = s.scalar(select(func.count()).select_from(q.subquery()))
        rows = list(s.scalars(q.order_by(Prediction.seq).limit(limit).offset(offset)))
    return int(total or 0), rows


def compare(a: str, b: str, *, url: str | None = None) -> dict[str, Any]:
    """Two evaluations item by item: the metrics side by side and the items whose
    correctness flipped (matched by item id)."""
    ea, eb = get_eval(a, url=url), get_eval(b, url=url)
    pa = {p.item_id: p for p in _all(select(Prediction).where(Prediction.eval_id == a), url)}
    pb = {p.item_id: p for p in _all(select(Prediction).where(Prediction.eval_id == b), url)}
    common = [i for i in pa if i in pb]
    fixed = [i for i in common if not pa[i].correct and pb[i].correct]
    broken = [i for i in common if pa[i].correct and not pb[i].correct]
    return {"a": ea, "b": eb, "common": len(common), "fixed": [(pa[i], pb[i]) for i in fixed],
            "broken": [(pa[i], pb[i]) for i in broken]}


def list_datasets(*, name: str | None = None, url: str | None = None) -> list[Dataset]:
    q = select(Dataset).order_by(Dataset.name, Dataset.created_at.desc())
    if name:
        q = q.where(Dataset.name == name)
    return _all(q, url)


def get_dataset(name: str, version: str | None = None, *, url: str | None = None) -> Dataset:
    rows = list_datasets(name=name, url=url)
    for d in rows:
        if version is None or d.version == version:
            return d
    raise NotFound(f"no dataset {name}{'@' + version if version else ''} in the registry")


def list_models(*, name: str | None = None, url: str | None = None) -> list[ModelVersion]:
    q = select(ModelVersion).order_by(ModelVersion.name, ModelVersion.created_at.desc())
    if name:
        q = q.where(ModelVersion.name == name)
    return _all(q, url)
