"""The job contract: the fixed set of job kinds, each kind's parameter model (validated,
never a command line, never a path), `validate_params`, and the `JobContext` a handler gets.

The queue validates what it stores here and the sweep builds its trials' parameters here;
what runs each kind lives above, in registry.handlers.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tunix_rt.errors import BadInput
from tunix_rt.eval.generate import DecodeConfig
from tunix_rt.home import Home
from tunix_rt.rundir import MANIFEST

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


Leaf = str | int | float | bool | None
Scalar = Leaf | list[str] | list[float] | dict[str, Leaf | dict[str, Leaf]]
"""An override's value: what TrainConfig's fields hold (lists for tools and filter_pass_rate,
mappings for rewards, rft_accept, curriculum and mesh), nested at most two deep."""


class ImportParams(BaseModel):
    """Import an uploaded JSONL (stored as <home>/uploads/<sha256>.jsonl) as a dataset."""

    model_config = ConfigDict(extra="forbid")
    upload: Annotated[str, Field(pattern=UPLOAD)]
    name: Annotated[str, Field(pattern=NAME)]
    format: Literal["record", "gsm8k", "traces", "generic", "pairs"] = "record"
    """The upload's format; pairs: prompt/chosen/rejected preference pairs (method=dpo)."""
    filename: Annotated[str | None, Field(pattern=FILENAME)] = None
    """The uploaded file's own name (reduced to a safe basename; a label, never opened): GSM8K
    ids are named after it, as `data import FILE` names them after FILE (traces.importers)."""


class TrainParams(BaseModel):
    """A shipped preset (smoke, cpu-demo, cpu-simpo, gpu-dpo, …: src/tunix_rt/configs) plus
    key=value overrides of TrainConfig: any method (sft, grpo, dpo, rft, distill) and its
    fields, checked by TrainConfig as on the command line."""

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
        from tunix_rt.train.rewards import is_user_reward

        if any(is_user_reward(name) for name in cfg.rewards):
            raise ValueError("rewards: a module:function reward runs user code, which the job API refuses; "
                             "use the registered rewards (tunix-rt train on the command line takes user rewards)")
        check_home_names(cfg)
        return cfg


RUN_ID = NAME
"""A run by its id: the name of its directory under <home>/runs."""
HOME_NAMES = {"model": (REF, "name"), "dataset": (REF, "name"), "init": (RUN_ID, "run id"),
              "teacher": (RUN_ID, "catalog model or run id")}
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
    if not (target / MANIFEST).is_file():
        raise BadInput(f"{key}: no run {name!r} in this home")
    # the run lookup the stages share (train.run.resolve_run) tries the id as a path first
    if (Path(name) / MANIFEST).is_file() and Path(name).resolve() != target:
        raise BadInput(f"{key}: {name!r} also names a run in the current directory; run the worker elsewhere")
    return target


def check_home_runs(cfg, home: Home) -> None:
    """The fields of a job's config that may name a run, checked where the files are: `init`
    a run of this home; `teacher` a catalog model, else a run of this home (never a directory:
    distillation's teacher lookup would take a directory the worker's working directory holds).
    BadInput otherwise."""
    if cfg.init is not None:
        home_run("init", cfg.init, home)
    if cfg.teacher is not None:
        from tunix_rt.models.catalog import PRESETS

        name = str(cfg.teacher)
        target = None if name in PRESETS else home_run("teacher", name, home)
        if Path(name).is_dir() and (target is None or Path(name).resolve() != target):
            raise BadInput(f"teacher: {name!r} also names a directory in the current directory, which the teacher "
                           "lookup reads first; run the worker elsewhere")


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


def request_fields(model: type[BaseModel]) -> dict[str, Any]:
    """A parameter model's fields as a request body declares them (`pydantic.create_model`
    arguments): the same names, types and defaults, so a field added to the model is in the
    body. The model's limits (pattern, ge/le), its mappings' value types and its validators
    are left to the model, which checks the parameters when the job is queued: a malformed
    body is refused at the door (422), a well-formed one with bad values by the queue (400)."""
    out: dict[str, Any] = {}
    for name, f in model.model_fields.items():
        annotation = dict[str, Any] if get_origin(f.annotation) is dict else f.annotation
        default = Field(default_factory=f.default_factory) if f.default_factory else f.default
        out[name] = (annotation, default)
    return out


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


#: job kind -> its parameter model
PARAMS: dict[str, type[BaseModel]] = {
    JobKind.import_.value: ImportParams,
    JobKind.train.value: TrainParams,
    JobKind.eval.value: EvalParams,
    JobKind.trial.value: TrialParams,
}


def validate_params(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters as the kind's model accepts them (BadInput with the reasons otherwise)."""
    return parse_params(kind, params).model_dump(mode="json")


def parse_params(kind: str, params: dict[str, Any]) -> BaseModel:
    """The kind's parameter model of `params`; BadInput with the reasons otherwise (a job the
    worker claims is checked again: its row may not have come through enqueue)."""
    model = PARAMS.get(kind)
    if model is None:
        raise BadInput(f"unknown job kind {kind!r}; kinds: {', '.join(PARAMS)}")
    try:
        return model.model_validate(params)
    except ValidationError as e:
        why = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'params'}: {err['msg']}" for err in e.errors())
        raise BadInput(f"{kind} job parameters: {why}") from None
    except (ValueError, BadInput) as e:
        raise BadInput(f"{kind} job parameters: {e}") from None
