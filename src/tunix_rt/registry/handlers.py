"""Job kinds and what runs them. A job is one of a fixed set of kinds with validated
parameters: never a command line, never a path. Files a job reads are named relative to the
home (an upload by its sha256, a dataset by name, a model by catalog name, a run by id).

Each handler calls the stage function the CLI calls, so a job does exactly what the command
does (a `trial` runs one trial of a sweep: tunix_rt.sweep.trial). Side effects are idempotent under retries: an import writes the dataset version
`job<ID>` (atomic rename; a retry that finds it reuses it), a retried train resumes from the
last committed checkpoint of its own earlier attempt. A train job returns only when its run
succeeded (manifest status and final outputs); a run stopped on request raises RunStopped.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.eval.generate import DecodeConfig
from tunix_rt.home import Home

NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
REF = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}(@[A-Za-z0-9][A-Za-z0-9._-]{0,99})?$"
UPLOAD = r"^[0-9a-f]{64}\.jsonl$"
FILENAME = r"^[A-Za-z0-9._-]{1,255}$"
UPLOADS_DIR = "uploads"


class JobKind(str, Enum):
    train = "train"
    eval = "eval"
    import_ = "import"
    trial = "trial"


Scalar = str | int | float | bool | None | list[str]


class ImportParams(BaseModel):
    """Import an uploaded JSONL (stored as <home>/uploads/<sha256>.jsonl) as a dataset."""

    model_config = ConfigDict(extra="forbid")
    upload: Annotated[str, Field(pattern=UPLOAD)]
    name: Annotated[str, Field(pattern=NAME)]
    format: Literal["record", "gsm8k", "traces", "generic"] = "record"
    filename: Annotated[str | None, Field(pattern=FILENAME)] = None
    """The uploaded file's own name (reduced to a safe basename; a label, never opened): GSM8K
    ids are named after it, as `data import FILE` names them after FILE (traces.importers)."""


class TrainParams(BaseModel):
    """A shipped preset (smoke, cpu-demo, gpu) plus key=value overrides of TrainConfig."""

    model_config = ConfigDict(extra="forbid")
    preset: Annotated[str, Field(pattern=NAME)] = "smoke"
    overrides: dict[str, Scalar] = Field(default_factory=dict)
    evaluate: bool = True
    """After training, evaluate the adapter on the dev split (so it reaches the leaderboard)."""
    eval_limit: Annotated[int, Field(ge=1, le=100000)] = 32
    max_new_tokens: Annotated[int, Field(ge=1, le=4096)] = DecodeConfig.max_new_tokens

    @model_validator(mode="after")
    def _check(self) -> "TrainParams":
        self.config()
        return self

    def config(self):
        """The TrainConfig this job trains with; refuses paths for the model and dataset."""
        from tunix_rt.train.config import PRESET_DIR, TrainConfig

        if not (PRESET_DIR / f"{self.preset}.yaml").is_file():
            raise ValueError(f"preset {self.preset!r} is not a shipped preset")
        if "run_name" in self.overrides:
            raise ValueError("run_name is set by the job (job<ID>)")
        cfg = TrainConfig.load(self.preset, [f"{k}={_yaml_scalar(v)}" for k, v in self.overrides.items()])
        check_home_names(cfg)
        return cfg


RUN_ID = NAME
"""A run by its id: the name of its directory under <home>/runs."""
HOME_NAMES = {"model": (REF, "name"), "dataset": (REF, "name"), "init": (RUN_ID, "run id")}
"""The config fields a job names files with, each by a name from the home: never a path."""


def check_home_names(cfg) -> None:
    """A job's model and dataset are names from the home (any worker's), its `init` a run id
    of the home: never paths. (Where the home is at hand, home_run checks the run itself.)"""
    for key, (pattern, what) in HOME_NAMES.items():
        problem = _not_a_home_name(key, getattr(cfg, key), pattern, what)
        if problem:
            raise ValueError(problem)


def _not_a_home_name(key: str, value: Any, pattern: str, what: str) -> str | None:
    """What is wrong with `value` as field `key` (None: nothing; unset is fine)."""
    if value is None or re.fullmatch(pattern, str(value)):
        return None
    return f"{key} must be a {what} from the home, not a path: {value!r}"


def home_run(key: str, run_id: Any, home: Home) -> Path:
    """<home>/runs/<run_id> for a field that names a run (`init`, `adapter_run`): a run id
    (RUN_ID), whose directory really is in this home's runs/ (not a symlink there pointing
    out) and holds a run. BadInput otherwise."""
    problem = _not_a_home_name(key, run_id, RUN_ID, "run id")
    if problem:
        raise BadInput(problem)
    name = str(run_id)
    target = home.runs.resolve() / name
    if (home.runs / name).resolve() != target:
        raise BadInput(f"{key}: run {name!r} is a link out of this home's runs/; give a run id of this home")
    if not (target / "run_manifest.json").is_file():
        raise BadInput(f"{key}: no run {name!r} in this home")
    # the run lookup the stages share (train.run.resolve_run) tries the id as a path first
    if (Path(name) / "run_manifest.json").is_file() and Path(name).resolve() != target:
        raise BadInput(f"{key}: {name!r} also names a run in the current directory; run the worker elsewhere")
    return target


class TrialParams(BaseModel):
    """One trial of a sweep (tunix_rt.sweep): the study holds the base config and the search
    space; `fixed` pins some of the trial's parameters (the sweep's `enqueue` entries)."""

    model_config = ConfigDict(extra="forbid")
    study: Annotated[str, Field(pattern=NAME)]
    fixed: dict[str, str | int | float | bool | None] = Field(default_factory=dict)


class EvalParams(BaseModel):
    """Evaluate a catalog model, or a run's adapter (its base model by default), on a split."""

    model_config = ConfigDict(extra="forbid")
    model: Annotated[str | None, Field(pattern=NAME)] = None
    adapter_run: Annotated[str | None, Field(pattern=RUN_ID)] = None
    dataset: Annotated[str, Field(pattern=REF)]
    split: Literal["train", "dev", "all"] = "dev"
    limit: Annotated[int | None, Field(ge=1, le=100000)] = None
    max_new_tokens: Annotated[int, Field(ge=1, le=4096)] = DecodeConfig.max_new_tokens

    @model_validator(mode="after")
    def _check(self) -> "EvalParams":
        if not self.model and not self.adapter_run:
            raise ValueError("give model, adapter_run, or both")
        return self


def _yaml_scalar(v: Scalar) -> str:
    import json

    return json.dumps(v)  # JSON is YAML: types survive TrainConfig.load's parsing


@dataclass
class JobContext:
    """What a handler gets besides its parameters."""

    job_id: int
    attempt: int
    home: Home
    stop: threading.Event = field(default_factory=threading.Event)
    """Set when the job is cancelled, its lease is lost, or the worker shuts down."""
    cancelled: threading.Event = field(default_factory=threading.Event)
    run_dir: Path | None = None
    """The run directory a train job is writing (found by the worker's heartbeat)."""
    cooperative: bool = False
    """True when the running stage polls should_stop(); otherwise a cancel interrupts the
    worker's main thread (KeyboardInterrupt: the run is marked interrupted, its committed
    checkpoints stay)."""
    interruptible: bool = False
    """True while a stage that may be interrupted that way is running."""

    def should_stop(self) -> bool:
        """The cancellation hook stage loops poll between steps."""
        return self.stop.is_set()

    @property
    def run_prefix(self) -> str:
        return f"job{self.job_id}"

    def find_run_dir(self) -> Path | None:
        """Newest run directory named job<ID> or job<ID>-…"""
        p = self.run_prefix
        found = [d for d in self.home.runs.glob(f"{p}*") if d.is_dir() and (d.name == p or d.name[len(p)] in "-_.")]
        return max(found, key=lambda d: d.stat().st_mtime) if found else None


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


def train_for_job(ctx: JobContext, cfg, should_stop: Callable[[], bool], *, one_run: bool = False) -> Path:
    """The job's run (cfg.run_name starts with job<ID>): an earlier attempt's run that already
    succeeded as it is, else trained, resuming the earlier attempt's last committed checkpoint.
    one_run: resume the earlier attempt's run even before its first checkpoint (from step 0),
    so the job has exactly one run (a sweep trial's). `should_stop` is polled after every step
    (RunStopped once it says so)."""
    if cfg.init is not None:  # checked where the files are: a job row may come from anywhere
        home_run("init", cfg.init, ctx.home)
    earlier = ctx.find_run_dir()
    if earlier is not None and _run_status(earlier) == "succeeded":
        run_dir = earlier  # an earlier attempt finished training and died before reporting
    else:
        from tunix_rt.train.driver import train

        resumable = earlier is not None and (one_run or any(earlier.glob("checkpoints/*/COMMIT")))
        resume = earlier if resumable else None
        ctx.cooperative = True  # the driver polls should_stop after every step
        ctx.interruptible = True
        try:
            run_dir = Path(train(cfg, ctx.home, resume=str(resume) if resume else None, should_stop=should_stop))
        finally:
            ctx.interruptible = False
    ctx.run_dir = run_dir
    return run_dir


def require_succeeded(run_dir: Path) -> None:
    """A train job succeeds only with its run: manifest status succeeded and every final
    output it lists present and non-empty."""
    import json

    try:
        manifest = json.loads((run_dir / "run_manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise TunixRtError(f"run {run_dir.name}: cannot read its manifest: {e}") from e
    status, outputs = manifest.get("status"), manifest.get("outputs") or {}
    if status != "succeeded":
        raise TunixRtError(f"run {run_dir.name} ended {status!r}, not succeeded: {manifest.get('error', '')}")
    missing = [k for k in outputs if not (run_dir / "final" / k).is_dir() or not any((run_dir / "final" / k).iterdir())]
    if not outputs or missing:
        raise TunixRtError(f"run {run_dir.name} says succeeded but its final outputs are missing: "
                           f"{missing or 'none listed'}")


def _run_status(run_dir: Path) -> str | None:
    import json

    try:
        return json.loads((run_dir / "run_manifest.json").read_text()).get("status")
    except (OSError, ValueError):
        return None


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
    if adapter is not None and (adapter / "run_manifest.json").is_file():
        record_run(adapter, strict=True)
    return str(eval_id)


def handle_trial(ctx: JobContext, p: TrialParams) -> dict[str, Any]:
    from tunix_rt.sweep.trial import run_trial

    return run_trial(ctx, p)


KINDS: dict[str, Kind] = {
    JobKind.import_.value: Kind(ImportParams, handle_import),
    JobKind.train.value: Kind(TrainParams, handle_train),
    JobKind.eval.value: Kind(EvalParams, handle_eval),
    JobKind.trial.value: Kind(TrialParams, handle_trial),
}


def validate_params(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters as the kind's model accepts them (BadInput with the reasons otherwise)."""
    return parse_params(kind, params).model_dump(mode="json")


def parse_params(kind: str, params: dict[str, Any]) -> BaseModel:
    """The kind's parameter model of `params`; BadInput with the reasons otherwise (a job the
    worker claims is checked again: its row may not have come through enqueue)."""
    spec = KINDS.get(kind)
    if spec is None:
        raise BadInput(f"unknown job kind {kind!r}; kinds: {', '.join(KINDS)}")
    try:
        return spec.params.model_validate(params)
    except ValidationError as e:
        why = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'params'}: {err['msg']}" for err in e.errors())
        raise BadInput(f"{kind} job parameters: {why}") from None
    except (ValueError, BadInput) as e:
        raise BadInput(f"{kind} job parameters: {e}") from None


def run_job(ctx: JobContext, kind: str, params: dict[str, Any]) -> dict[str, Any]:
    return KINDS[kind].run(ctx, parse_params(kind, params))
