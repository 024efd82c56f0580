"""The trace record (DESIGN.md §2): the one shape every importer produces and every stage
after it reads.

    {"id": "gsm8k-train-00017", "question": "...", "steps": ["...", "..."], "answer": "18",
     "source": "gsm8k", "meta": {"category": "arithmetic"}}

Strict on purpose: no coercion (an integer question is an error, not "42"), no unknown
fields (a generic-format row fed to the trace reader fails loudly instead of losing its
"reasoning"), and blank strings count as empty. Importers of foreign formats may be more
lenient before they build a Trace (the generic format accepts a numeric answer and turns
it into its JSON text); the Trace itself never is.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError


def _non_blank(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("blank", "empty string")
    return value


NonBlank = Annotated[str, AfterValidator(_non_blank)]


class Trace(BaseModel):
    """One reasoning trace: a question, the steps that solve it, and the final answer."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    id: NonBlank
    """Unique within its dataset; the train/dev split is a hash of it."""
    question: NonBlank
    steps: Annotated[list[NonBlank], Field(min_length=1)]
    """The worked solution, one step per item; becomes the <reasoning> block."""
    answer: NonBlank
    """The final answer as text ("18", "cba"); becomes the <answer> block."""
    source: str | None = None
    """Where the record came from ("gsm8k", "generic", …); provenance only."""
    meta: dict[str, Any] = Field(default_factory=dict)
    """Free-form facts about the record (category, original index, …)."""

    def to_record(self) -> dict[str, Any]:
        """The canonical JSON object: fields in schema order, meta keys sorted."""
        return {
            "id": self.id,
            "question": self.question,
            "steps": list(self.steps),
            "answer": self.answer,
            "source": self.source,
            "meta": _sorted(self.meta),
        }


def _sorted(value: Any) -> Any:
    """Nested dicts with sorted keys, so equal meta serialises to equal bytes."""
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


class RecordError(Exception):
    """One row that is not a valid record: a list of (field, reason) pairs.

    Importers raise it; the reader adds the file and the line."""

    def __init__(self, problems: list[tuple[str, str]]):
        super().__init__("; ".join(f"{f}: {r}" for f, r in problems))
        self.problems = problems

    @classmethod
    def one(cls, field: str, reason: str) -> "RecordError":
        return cls([(field, reason)])


def json_type(value: Any) -> str:
    """The JSON name of a Python value's type, for messages about wrong types."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def field_path(loc: tuple) -> str:
    """('steps', 2) → 'steps[2]'; ('meta', 'k') → 'meta.k'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<record>"


_EXPECTED = {
    "string_type": "a string",
    "list_type": "an array",
    "dict_type": "an object",
    "int_type": "an integer",
}


def _reason(err: dict) -> str:
    kind = err["type"]
    if kind == "missing":
        return "missing"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "too_short":
        return "empty list"
    if kind == "blank":
        return "empty string"
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {json_type(err['input'])}"
    if kind == "model_type":
        return f"expected an object, got {json_type(err['input'])}"
    return str(err["msg"])


def problems_of(exc: ValidationError, prefix: tuple = ()) -> list[tuple[str, str]]:
    """A pydantic ValidationError as (field, reason) pairs in our words."""
    return [(field_path(prefix + tuple(e["loc"])), _reason(e)) for e in exc.errors()]


def make_trace(**fields: Any) -> Trace:
    """Build a Trace or raise RecordError naming every bad field."""
    try:
        return Trace(**fields)
    except ValidationError as exc:
        raise RecordError(problems_of(exc)) from None


def validate_trace(obj: dict[str, Any]) -> Trace:
    """A JSON object in the trace format itself → Trace (RecordError otherwise)."""
    try:
        return Trace.model_validate(obj)
    except ValidationError as exc:
        raise RecordError(problems_of(exc)) from None
