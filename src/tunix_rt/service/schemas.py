"""Response and request bodies (Public/Create), built from ORM rows with from_attributes."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from tunix_rt.registry.jobs import TrainParams, request_fields
from tunix_rt.traces.schema import json_problems


class Public(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class RealUnicode(BaseModel):
    """A request body whose every string and key is real Unicode: a lone surrogate
    ("\\ud800" in JSON) cannot be encoded, tokenized, stored or sent back, so it is refused
    at the door (422; 400 on /v1), naming the field it is in."""

    @model_validator(mode="before")
    @classmethod
    def _real_unicode(cls, data: Any) -> Any:
        if problems := json_problems(data):
            field, why = problems[0]
            raise ValueError(f"{field}: {why}")
        return data


def validation_422(e: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 body, its JSON ASCII-escaped: an error that echoes a lone surrogate
    of the request is still a clean 422, never a 500 while encoding the answer."""
    return _AsciiJSON({"detail": jsonable_encoder(e.errors())}, status_code=422)


class _AsciiJSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


class DatasetPublic(Public):
    name: str
    version: str
    sha256: str | None
    count: int | None
    importer: str | None
    source: str | None
    created_at: dt.datetime


class DatasetDetail(DatasetPublic):
    manifest: dict[str, Any]


class UploadAccepted(BaseModel):
    job_id: int
    dataset: str
    records: int
    format: str


class ModelVersionPublic(Public):
    sha256: str
    name: str
    preset: str | None
    source: str | None
    created_at: dt.datetime


class ModelVersionDetail(ModelVersionPublic):
    manifest: dict[str, Any]


class RunPublic(Public):
    id: str
    status: str
    engine: str | None
    device: str | None
    model: str | None
    dataset: str | None
    job_id: int | None
    error: str | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    created_at: dt.datetime


class CheckpointPublic(Public):
    step: int
    created_at: dt.datetime


class EvalPublic(Public):
    id: str
    run_id: str | None
    model: str | None
    adapter: str | None
    engine: str | None
    device: str | None
    dataset: str | None
    split: str | None
    n: int | None
    accuracy: float | None
    format_rate: float | None
    metrics: dict[str, Any]
    finished_at: dt.datetime | None
    created_at: dt.datetime


class EvalDetail(EvalPublic):
    summary: dict[str, Any]


class RunDetail(RunPublic):
    config: dict[str, Any]
    manifest: dict[str, Any]
    checkpoints: list[CheckpointPublic] = Field(default_factory=list)
    evaluations: list[EvalPublic] = Field(default_factory=list)


class MetricPoint(Public):
    step: int | None
    loss: float | None
    lr: float | None
    values: dict[str, Any]


class PredictionPublic(Public):
    seq: int
    item_id: str
    question: str | None
    gold: str | None
    completion: str | None
    reasoning: str | None
    answer: str | None
    correct: bool
    format_ok: bool
    n_tokens: int | None
    finish_reason: str | None


class PredictionPage(BaseModel):
    total: int
    items: list[PredictionPublic]


class FlippedItem(BaseModel):
    item_id: str
    question: str | None
    gold: str | None
    a: PredictionPublic
    b: PredictionPublic


class Comparison(BaseModel):
    a: EvalPublic
    b: EvalPublic
    common: int
    delta: dict[str, float]
    fixed: list[FlippedItem]
    """Wrong in A, right in B."""
    broken: list[FlippedItem]
    """Right in A, wrong in B."""
    mcnemar_p: float
    """Two-sided exact McNemar p-value of the flips (is the difference more than chance?)."""
    pass1: dict[str, Any] | None = None
    """When either side is a sampled eval (`eval --samples K`): pass@1 on the shared items and
    the exact paired sign-flip test over per-item pass rates (eval.compare.pass1_test), read
    from the eval dirs; None when neither is sampled or their files are not readable here."""


class Board(BaseModel):
    """A leaderboard: the evaluations of one dataset and split."""

    dataset: str
    split: str
    evaluations: int
    latest: dt.datetime


class JobPublic(Public):
    id: int
    kind: str
    params: dict[str, Any]
    status: str
    attempts: int
    max_attempts: int
    cancel_requested: bool
    run_id: str | None
    result: dict[str, Any] | None
    error: str | None
    lease_owner: str | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None


class JobCreate(RealUnicode):
    model_config = ConfigDict(extra="forbid")
    kind: str
    params: dict[str, Any] = Field(default_factory=dict)


class StrictBody(RealUnicode):
    """A request body with no fields but its own (422 on any other)."""

    model_config = ConfigDict(extra="forbid")


#: POST /api/runs: the train job's parameter model (TrainParams: a shipped preset plus
#: overrides of TrainConfig) as a body; the queue checks it as the job's (400 on bad values)
TrainSubmit = create_model("TrainSubmit", __base__=StrictBody, __module__=__name__,
                           __doc__="POST /api/runs: a shipped preset plus overrides (see TrainConfig); "
                                   "becomes a train job.",
                           **request_fields(TrainParams))


class Artifact(BaseModel):
    path: str
    size: int


class SweepSummary(BaseModel):
    name: str
    created_at: str
    trials_requested: int
    trials_asked: int
    best_value: float | None
    objective: str
    """The held-out metric the trials are scored by (eval_loss unless the space chose another)."""
    direction: str
    """minimize or maximize."""
    params: list[str]


class SweepTrial(BaseModel):
    """One trial job of a sweep; trial, value and times stay null until a worker asks for it."""

    job_id: int
    job_status: str
    attempts: int
    trial: int | None
    state: str
    value: float | None
    params: dict[str, Any]
    last_step: int | None
    intermediate: dict[str, float]
    run_id: str | None
    started_at: str | None
    finished_at: str | None


class SweepBest(BaseModel):
    trial: int
    value: float
    params: dict[str, Any]
    run_id: str | None
    job_id: int | None
    config: dict[str, Any]


class SweepDetail(BaseModel):
    name: str
    created_at: str
    objective: str
    direction: str
    trials_requested: int
    counts: dict[str, int]
    base: dict[str, Any]
    space: dict[str, Any]
    trials: list[SweepTrial]
    best: SweepBest | None
