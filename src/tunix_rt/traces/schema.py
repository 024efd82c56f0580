"""The trace record (DESIGN.md §2): the one shape every importer produces and every stage
after it reads.

    {"id": "gsm8k-train-00017", "question": "...", "steps": ["...", "..."], "answer": "18",
     "source": "gsm8k", "meta": {"category": "arithmetic"}}

Strict on purpose: no coercion (an integer question is an error, not "42"), no unknown
fields (a generic-format row fed to the trace reader fails loudly instead of losing its
"reasoning"), and blank strings count as empty. Importers of foreign formats may be more
lenient before they build a Trace (the generic format accepts a numeric answer and turns
it into its JSON text); the Trace itself never is.

Strings must be real Unicode: a lone surrogate ("\\ud800" as a JSON escape) is refused in
every field, meta keys and values included, because it cannot be written as UTF-8 and
would fail later (writing data.jsonl, a log line, a JSON response). Numbers must be finite
(in meta, or a numeric answer of the generic format): 1e400 parses to infinity, which
data.jsonl could only store as `Infinity`, not JSON. `json_problems` is that rule for any parsed JSON value; the reader applies it to
each raw row before an importer sees it (so FIELD names the input's own field), and the
Trace applies it again to whatever it is built from.

The format's own tags are refused where they would corrupt a rendered example, see
REFUSED_TAGS.

Tool calls (tunix_rt.tools) may appear in the steps: GSM8K's `<<48/2=24>>` and
`<python>…</python><output>…</output>`. What a record may hold is what renders under any set
of tools (see `tool_syntax_problems`): each calculator call `<<EXPR=` is followed by its
result `…>>` in the same step, each python call by `<output>…</output>` at once, and the
answer holds no call. Text that is not a call (`a << b`, a lone `>>`) stays plain text.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Iterator

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from tunix_rt.errors import BadInput
from tunix_rt.tools import calls, closed_call

FORMAT_TAGS = ("<reasoning>", "</reasoning>", "<answer>", "</answer>")
"""The tags of the model turn (render.target_body writes them, parse_completion reads them)."""
TURN_MARKERS = ("<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>")
"""Gemma's control tokens, spelled as text."""
REFUSED_TAGS = {
    "question": TURN_MARKERS,
    "steps": TURN_MARKERS + FORMAT_TAGS,
    "answer": TURN_MARKERS + FORMAT_TAGS,
}
"""Which tags each rendered field may not contain (case-sensitive, as the parser matches).

- Turn markers, in every rendered field: the tokenizer keeps them as plain text (a user
  cannot forge a control token), but a record that spells them teaches the model to write
  turn structure as text, and parse_completion strips "<end_of_turn>" out of what it reads,
  so a target containing one is not the text that gets scored.
- <reasoning>/<answer> tags, in steps and the answer: those fields are the model turn,
  where parse_completion wants each tag exactly once; "2</answer><answer>3" or a step
  holding "</reasoning><answer>9</answer>" renders a target that breaks the very format it
  teaches and is scored against the wrong answer.
- The question may mention <reasoning>/<answer>: it sits in the user turn, which is never
  supervised nor parsed, and a question about the format ("what goes in <answer>?") is
  legitimate text.
"""


def shown(text: str) -> str:
    """Text safe to print and to encode as UTF-8: a lone surrogate becomes "\\ud800"."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


_SURROGATE = re.compile("[\ud800-\udfff]")


def text_problem(value: str) -> str | None:
    """Why a string is not real Unicode (a lone surrogate), or None. A JSON pair of
    surrogate escapes decodes to one astral character, so any surrogate left is lone."""
    found = _SURROGATE.search(value)
    if found is None:
        return None
    return f"lone surrogate U+{ord(found.group()):04X} at character {found.start() + 1} (not valid Unicode)"


def _walk(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(path, value) of every key and scalar inside a JSON value; iterative, so a deeply
    nested row cannot exhaust the stack. A key is yielded with its own path."""
    stack = [(path, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, dict):
            for k, item in reversed(list(v.items())):
                sub = f"{where}.{shown(k)}" if where else shown(k)
                yield sub, k
                stack.append((sub, item))
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", item) for i, item in reversed(list(enumerate(v))))
        else:
            yield where, v


def json_problems(value: Any, path: str = "") -> list[tuple[str, str]]:
    """(field, reason) for every string that is not real Unicode and every number that is
    not finite inside a parsed JSON value; [] when it is clean."""
    problems = []
    for where, v in _walk(value, path):
        if isinstance(v, str) and (why := text_problem(v)):
            problems.append((where or "<record>", why))
        elif isinstance(v, float) and not math.isfinite(v):
            problems.append((where or "<record>", f"{v} is not a finite number (out of range of a double)"))
    return problems


def _fail(kind: str, reason: str) -> PydanticCustomError:
    return PydanticCustomError(kind, "{reason}", {"reason": reason})  # reason is not a template


def _non_blank(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("blank", "empty string")
    return value


def _real_unicode(value: str) -> str:
    if why := text_problem(value):
        raise _fail("unicode", why)
    return value


def _clean_json(value: dict[str, Any]) -> dict[str, Any]:
    if problems := json_problems(value, "meta"):
        raise _fail("json_value", "; ".join(f"{f}: {r}" for f, r in problems[:3]))
    return value


def _no_tags(field: str) -> AfterValidator:
    tags = REFUSED_TAGS[field]

    def check(value: str) -> str:
        found = [t for t in tags if t in value]
        if found:
            tag = min(found, key=value.find)  # the first one in the text
            where = "in the question, steps or answer" if tag in TURN_MARKERS else "in steps or the answer"
            raise _fail("format_tag", f"contains {tag!r}, a tag of the rendered format (not allowed {where})")
        return value

    return AfterValidator(check)


Text = Annotated[str, AfterValidator(_real_unicode)]
NonBlank = Annotated[Text, AfterValidator(_non_blank)]


NO_STEPS = "no_steps"
"""The error of empty steps in a record that names no scorer (reported on `steps`)."""


class Trace(BaseModel):
    """One reasoning trace: a question, the steps that solve it, and the final answer."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    id: NonBlank
    """Unique within its dataset; the train/dev split is a hash of it."""
    question: Annotated[NonBlank, _no_tags("question")]
    steps: list[Annotated[NonBlank, _no_tags("steps")]]
    """The worked solution, one step per item; becomes the <reasoning> block. Empty only in a
    verifier record (meta.scorer names its scorer, e.g. a reasoning-gym task): a question
    with a checkable answer, for RL and evaluation; SFT refuses it (train.common)."""
    answer: Annotated[NonBlank, _no_tags("answer")]
    """The final answer as text ("18", "cba"); becomes the <answer> block."""
    source: Text | None = None
    """Where the record came from ("gsm8k", "generic", …); provenance only."""
    meta: Annotated[dict[str, Any], AfterValidator(_clean_json)] = Field(default_factory=dict)
    """Free-form facts about the record (category, original index, …): any JSON, with
    real-Unicode strings and finite numbers only."""

    @model_validator(mode="after")
    def _steps_unless_verifier(self) -> "Trace":
        if not self.steps and not (isinstance(self.meta.get("scorer"), str) and self.meta["scorer"].strip()):
            raise PydanticCustomError(NO_STEPS, "empty list")
        return self

    @model_validator(mode="after")
    def _tool_syntax(self) -> "Trace":
        if problems := tool_syntax_problems(list(self.steps), self.answer):
            raise ValidationError.from_exception_data("Trace", [
                InitErrorDetails(type=_fail("tool_syntax", reason), loc=loc, input=None) for loc, reason in problems
            ])
        return self

    def tools(self) -> list[str]:
        """The tools whose calls the steps hold ("calculator", "python"), in NAMES order."""
        text = "\n".join(self.steps)
        return [t for t in ("calculator", "python") if closed_call(text, [t]) is not None]

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


def tool_syntax_problems(steps: list[str], answer: str) -> list[tuple[tuple, str]]:
    """(loc, reason) for each malformed tool call: checked with each tool alone and with
    both, as rendering with any `tools` setting would read the turn (tools.calls)."""
    problems: list[tuple[tuple, str]] = []
    for k, step in enumerate(steps):  # a calculator call lies within one line, so one step
        if "<<" in step and (why := _calls_problem(step, ["calculator"])) is not None:
            problems.append((("steps", k), why))
    text = "\n".join(steps)
    if not problems and "</python>" in text:
        for tools in (["python"], ["calculator", "python"]):
            if (why := _calls_problem(text, tools)) is not None:
                problems.append((("steps",), why))
                break
    if closed_call(answer, ["calculator"]) or "<python>" in answer or "</python>" in answer:
        problems.append((("answer",), "contains a tool call (<<EXPR= or a <python> tag); calls belong in the steps"))
    return problems


def _calls_problem(text: str, tools: list[str]) -> str | None:
    try:
        calls(text, tools)
    except BadInput as e:
        return str(e)
    return None


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
        part = part if isinstance(part, int) else shown(str(part))
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
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
    return [(field_path(prefix + (("steps",) if e["type"] == NO_STEPS else tuple(e["loc"]))), _reason(e))
            for e in exc.errors()]


def make_trace(where: dict[str, str] | None = None, **fields: Any) -> Trace:
    """Build a Trace or raise RecordError naming every bad field.

    where: the input's own name for a Trace field path, for importers whose input is shaped
    otherwise ({"question": "prompt", "steps[0]": "steps[3].content"}): a problem found in
    the Trace is then reported on the field the user wrote."""
    try:
        return Trace(**fields)
    except ValidationError as exc:
        names = where or {}
        raise RecordError([(names.get(f, f), r) for f, r in problems_of(exc)]) from None


def validate_trace(obj: dict[str, Any]) -> Trace:
    """A JSON object in the trace format itself → Trace (RecordError otherwise)."""
    try:
        return Trace.model_validate(obj)
    except ValidationError as exc:
        raise RecordError(problems_of(exc)) from None
