"""Evaluations: list, leaderboard, show, predictions (filters: wrong only, format
violations, text search) and the comparison of two evaluations."""

from __future__ import annotations

from fastapi import APIRouter, Query

from tunix_rt.errors import TunixRtError
from tunix_rt.eval.compare import mcnemar_exact, sampled_pass1
from tunix_rt.registry import queries
from tunix_rt.service.deps import SettingsDep, limited, paged
from tunix_rt.service.schemas import Board, Comparison, EvalDetail, EvalPublic, FlippedItem, PredictionPage, PredictionPublic

router = APIRouter(prefix="/api/evaluations", tags=["evaluations"])
EvalPage = paged(100, 1000)
BoardLimit = limited(100, 1000)
PredictionsPage = paged(50, 500)


@router.get("", response_model=list[EvalPublic])
def list_evaluations(settings: SettingsDep, page: EvalPage, run_id: str | None = None):
    return queries.list_evals(run_id=run_id, limit=page.limit, offset=page.offset, url=settings.database_url)


@router.get("/leaderboard", response_model=list[EvalPublic])
def leaderboard(settings: SettingsDep, limit: BoardLimit, metric: str = "accuracy", dataset: str | None = None,
                split: str | None = None):
    return queries.leaderboard(metric, dataset=dataset, split=split, limit=limit, url=settings.database_url)


@router.get("/boards", response_model=list[Board])
def boards(settings: SettingsDep):
    """One leaderboard per dataset and split (evaluations of different data never rank
    together), the most recently evaluated first."""
    seen: dict[tuple, Board] = {}
    for e in queries.list_evals(limit=100_000, url=settings.database_url):  # newest first
        key = (e.dataset or "", e.split or "")
        if key not in seen:
            seen[key] = Board(dataset=key[0], split=key[1], evaluations=0, latest=e.created_at)
        seen[key].evaluations += 1
    return list(seen.values())


@router.get("/compare", response_model=Comparison)
def compare(settings: SettingsDep, a: str = Query(...), b: str = Query(...)):
    c = queries.compare(a, b, url=settings.database_url)
    ma, mb = c["a"].metrics or {}, c["b"].metrics or {}
    delta = {k: mb[k] - ma[k] for k in ma if isinstance(ma.get(k), (int, float)) and isinstance(mb.get(k), (int, float))}
    return Comparison(a=EvalPublic.model_validate(c["a"]), b=EvalPublic.model_validate(c["b"]), common=c["common"],
                      delta=delta, mcnemar_p=mcnemar_exact(len(c["broken"]), len(c["fixed"])), fixed=[_flip(x, y) for x, y in c["fixed"]], broken=[_flip(x, y) for x, y in c["broken"]],
                      pass1=_pass1(c["a"].path, c["b"].path))


def _pass1(path_a: str, path_b: str) -> dict | None:
    """The paired pass@1 test of sampled evals, from their files (None where this server
    cannot read them: the registry may index dirs of another machine)."""
    try:
        return sampled_pass1(path_a, path_b)
    except (OSError, TunixRtError):
        return None


def _flip(x, y) -> FlippedItem:
    return FlippedItem(item_id=x.item_id, question=x.question, gold=x.gold,
                       a=PredictionPublic.model_validate(x), b=PredictionPublic.model_validate(y))


@router.get("/{eval_id}", response_model=EvalDetail)
def show_evaluation(eval_id: str, settings: SettingsDep):
    return queries.get_eval(eval_id, url=settings.database_url)


@router.get("/{eval_id}/predictions", response_model=PredictionPage)
def predictions(eval_id: str, settings: SettingsDep, page: PredictionsPage, wrong_only: bool = False,
                format_violations: bool = False, q: str | None = None):
    queries.get_eval(eval_id, url=settings.database_url)
    total, rows = queries.predictions(eval_id, wrong_only=wrong_only, format_violations=format_violations,
                                      search=q, limit=page.limit, offset=page.offset, url=settings.database_url)
    return PredictionPage(total=total, items=[PredictionPublic.model_validate(r) for r in rows])
