"""What runs each job kind. A job is one of a fixed set of kinds with validated
parameters (registry.jobs): never a command line, never a path. Files a job reads are named relative to the
home (an upload by its sha256, a dataset by name, a model by catalog name, a run by id).

Each handler calls the stage function the CLI calls, so a job does exactly what the command
does (a `trial` runs one trial of a sweep: tunix_rt.sweep.trial). Side effects are idempotent under retries: an import writes the dataset version
`job<ID>` (atomic rename; a retry that finds it reuses it), a retried train resumes from the
last committed checkpoint of its own earlier attempt. A train job returns only when its run
succeeded (manifest status and final outputs); a run stopped on request raises RunStopped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tunix_rt.errors import BadInput
from tunix_rt.home import Home
from tunix_rt.registry.jobs import (PARAMS, UPLOADS_DIR, EvalParams, ImportParams, JobContext, JobKind, TrainParams,
                                    TrialParams, home_run, parse_params)
from tunix_rt.registry.train_job import require_succeeded, train_for_job
from tunix_rt.rundir import MANIFEST


@dataclass(frozen=True)
class Kind:
    params: type[BaseModel]
    run: Callable[[JobContext, Any], dict[str, Any]]


def handle_import(ctx: JobContext, p: ImportParams) -> dict[str, Any]:
    from tunix_rt.registry.record import record_dataset

    version = f"job{ctx.job_id}"
    target = ctx.home.datasets / p.name / version
    if not (target / "manifest.json").is_file():
        src = ctx.home.root / UPLOADS_DIR / p.upload
        if not src.is_file():
            raise BadInput(f"upload {p.upload} is not in the home (upload it first)")
        _import_dataset(src, p.format, p.name, version, ctx.home, p.filename)
    record_dataset(target, strict=True)
    return {"dataset": f"{p.name}@{version}", "path": str(target)}


def _import_dataset(src: Path, fmt: str, name: str, version: str, home: Home, source_name: str | None) -> None:
    """The `data import` stage. Two attempts racing on one version: the loser finds it done."""
    from tunix_rt.traces.dataset import ImportRequest, import_dataset

    try:
        import_dataset(ImportRequest(fmt=fmt, source=str(src), name=name, version=version, source_name=source_name), home)
    except Exception:
        if not (home.datasets / name / version / "manifest.json").is_file():
            raise


def handle_train(ctx: JobContext, p: TrainParams) -> dict[str, Any]:
    from tunix_rt.registry.record import record_run

    cfg = p.config()
    cfg.run_name = ctx.run_prefix
    run_dir = train_for_job(ctx, cfg, ctx.should_stop)
    require_succeeded(run_dir)
    record_run(run_dir, strict=True, job_id=ctx.job_id)
    result: dict[str, Any] = {"run_id": run_dir.name}
    if p.evaluate:
        if ctx.should_stop():  # the retry finds the run succeeded and only evaluates
            from tunix_rt.train.run import RunStopped

            raise RunStopped(f"run {run_dir.name} trained; stopped on request before its evaluation")
        result["eval_id"] = _evaluate(ctx, None, run_dir, cfg.dataset, cfg.eval_split, p.eval_limit, p.max_new_tokens)
    return result


def handle_eval(ctx: JobContext, p: EvalParams) -> dict[str, Any]:
    adapter = home_run("adapter_run", p.adapter_run, ctx.home) if p.adapter_run else None
    return {"eval_id": _evaluate(ctx, p.model, adapter, p.dataset, p.split, p.limit, p.max_new_tokens)}


def _evaluate(ctx: JobContext, model: str | None, adapter: Path | None, dataset: str, split: str,
              limit: int | None, max_new_tokens: int) -> str:
    """The `eval` stage (tunix_rt.eval.runner.run_eval); returns the evaluation's registry id."""
    from tunix_rt.eval.generate import DecodeConfig
    from tunix_rt.eval.runner import EvalRequest, run_eval
    from tunix_rt.registry.record import record_eval, record_run

    req = EvalRequest(dataset=dataset, model=model, adapter=str(adapter) if adapter else None, split=split,
                      limit=limit, decode=DecodeConfig(max_new_tokens=max_new_tokens))
    eval_dir = Path(run_eval(req, ctx.home))
    eval_id = record_eval(eval_dir, strict=True)
    if adapter is not None and (adapter / MANIFEST).is_file():
        record_run(adapter, strict=True)
    return str(eval_id)


def handle_trial(ctx: JobContext, p: TrialParams) -> dict[str, Any]:
    from tunix_rt.sweep.trial import run_trial

    return run_trial(ctx, p)


KINDS: dict[str, Kind] = {
    JobKind.import_.value: Kind(PARAMS[JobKind.import_.value], handle_import),
    JobKind.train.value: Kind(PARAMS[JobKind.train.value], handle_train),
    JobKind.eval.value: Kind(PARAMS[JobKind.eval.value], handle_eval),
    JobKind.trial.value: Kind(PARAMS[JobKind.trial.value], handle_trial),
}


def run_job(ctx: JobContext, kind: str, params: dict[str, Any]) -> dict[str, Any]:
    return KINDS[kind].run(ctx, parse_params(kind, params))
