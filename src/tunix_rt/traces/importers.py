"""One importer per input format; each maps one parsed JSON object onto a Trace.

Formats (names used by `data import`, `data validate --format` and `read_traces`):

- `record`  the trace record itself (DESIGN.md §2), what a dataset's data.jsonl holds.
- `gsm8k`   `{"question", "answer"}`; the answer is the worked solution with `<<a*b=c>>`
            calculator notes and a final `#### 18` line. Steps are the solution lines without
            the notes; the answer is what follows `####`, commas removed. With the
            calculator tool (`--tools calculator`) the notes stay in the steps as calls the
            model writes (`<<48/2=`) and results the tool writes (`24>>`, tunix_rt.tools). With
            the python tool (`--tools python`) each note whose expression is plain arithmetic
            becomes a python call and what it prints (`<python>print(48/2)</python><output>24.0
            </output>`, tools.python.print_arithmetic); other notes are stripped. The id is
            `gsm8k-<split>-<0-based line index, 5 digits>`, <split> named after the source:
            its file name without the extension, lower-cased, runs of other characters than
            a-z0-9 as "-" (train.jsonl → gsm8k-train-00017; hf:openai/gsm8k@test → test).
            An upload through the API keeps the uploaded file's own name for this, so the
            same file gets the same ids, hence the same id-hash train/dev split, whether it
            came through `data import` or the API (the vendored train.jsonl: gsm8k-train-…).
- `traces`  the older trace format `{"trace_version", "prompt", "steps": [{"i", "type",
            "content"}], "final_answer", "meta"}`; steps are ordered by `i`, which must be
            exactly 0..N-1.
- `generic` `{"question", "reasoning" | "steps", "answer", ["id", "source", "meta"]}`;
            reasoning text is split into steps on newlines.

The two foreign formats without ids (`traces`, `generic`) derive one from the content
(sha256 of question, steps and answer), so re-importing gives the same ids and two copies
of one record show up as a duplicate id. A numeric `answer`/`final_answer` in those two
formats is accepted and stored as its JSON text (10.5 → "10.5"); the trace record and
GSM8K require strings.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

from tunix_rt.errors import BadInput
from tunix_rt.traces.schema import RecordError, Trace, json_type, make_trace, validate_trace

FORMATS = ("record", "gsm8k", "traces", "generic", "pairs")
"""The input formats; "pairs" is prompt/chosen/rejected preference pairs for method=dpo
(traces.pairs), the others trace formats."""


class Importer(Protocol):
    """Maps one JSON object (and its 0-based line index) to a Trace, or raises RecordError."""

    name: str

    def convert(self, obj: dict[str, Any], index: int) -> Trace: ...


def _check_keys(obj: dict[str, Any], allowed: set[str], required: set[str]) -> None:
    problems = [(k, "missing") for k in sorted(required - obj.keys())]
    problems += [(k, "unknown field") for k in obj if k not in allowed]
    if problems:
        raise RecordError(problems)


def _string(obj: dict[str, Any], key: str, numeric_ok: bool = False) -> str:
    """A required non-blank string field; numbers become their JSON text when allowed."""
    value = obj[key]
    if numeric_ok and isinstance(value, (int, float)) and not isinstance(value, bool):
        return json.dumps(value)
    if not isinstance(value, str):
        raise RecordError.one(key, f"expected a string, got {json_type(value)}")
    if not value.strip():
        raise RecordError.one(key, "empty string")
    return value


def content_id(prefix: str, question: str, steps: list[str], answer: str) -> str:
    """A stable id from the content, for formats that carry none."""
    blob = json.dumps([question, steps, answer], ensure_ascii=False, separators=(",", ":"))
    return f"{prefix}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class RecordImporter:
    """The trace record format, validated as is."""

    name: str = "record"

    def convert(self, obj: dict[str, Any], index: int) -> Trace:
        return validate_trace(obj)


_CALC_NOTE = re.compile(r"<<.*?>>")


@dataclass(frozen=True)
class GSM8KImporter:
    """GSM8K rows; `split` names the id prefix (gsm8k-train-00017)."""

    split: str = "train"
    name: str = "gsm8k"
    tools: tuple[str, ...] = ()
    """With "calculator" the `<<a*b=c>>` notes are kept (tool calls); with "python" each becomes
    `<python>print(a*b)</python><output>…</output>` where a*b is plain arithmetic; else stripped."""

    def convert(self, obj: dict[str, Any], index: int) -> Trace:
        _check_keys(obj, {"question", "answer"}, {"question", "answer"})
        question = _string(obj, "question")
        solution = _string(obj, "answer")
        if solution.count("####") != 1:
            raise RecordError.one("answer", "expected exactly one '#### <final answer>' line")
        work, final = solution.split("####")
        if "calculator" in self.tools:
            lines = work.splitlines()
        elif "python" in self.tools:
            lines = [_CALC_NOTE.sub(_python_call, line) for line in work.splitlines()]
        else:
            lines = [_CALC_NOTE.sub("", line) for line in work.splitlines()]
        steps = [s for s in (line.strip() for line in lines) if s]
        final = final.strip().replace(",", "")
        problems = []
        if not steps:
            problems.append(("answer", "no solution line before '####'"))
        if not final:
            problems.append(("answer", "nothing after '####'"))
        if problems:
            raise RecordError(problems)
        where = {f"steps[{k}]": "answer" for k in range(len(steps))} | {"answer": "answer"}
        return make_trace(
            where, id=f"gsm8k-{self.split}-{index:05d}", question=question, steps=steps, answer=final,
            source="gsm8k", meta={},
        )


def _python_call(note: re.Match) -> str:
    """A GSM8K note `<<EXPR=RESULT>>` as the python call printing EXPR and its output, or ""
    (EXPR not plain arithmetic, or failing: no output known without running it)."""
    from tunix_rt.tools import OUT_CLOSE, OUT_OPEN, PY_CLOSE, PY_OPEN
    from tunix_rt.tools.python import print_arithmetic

    expr, eq, _result = note.group(0)[2:-2].partition("=")
    out = print_arithmetic(expr) if eq and "\n" not in expr else None
    return "" if out is None else f"{PY_OPEN}print({expr.strip()}){PY_CLOSE}{OUT_OPEN}{out}{OUT_CLOSE}"


_TRACE_VERSIONS = ("1", "1.0")


@dataclass(frozen=True)
class OlderTraceImporter:
    """The older trace format (trace_version 1.0)."""

    name: str = "traces"

    def convert(self, obj: dict[str, Any], index: int) -> Trace:
        _check_keys(
            obj,
            {"trace_version", "prompt", "steps", "final_answer", "meta", "id"},
            {"trace_version", "prompt", "steps", "final_answer"},
        )
        version = obj["trace_version"]
        if version not in _TRACE_VERSIONS:
            raise RecordError.one("trace_version", f"unsupported {version!r} (known: {', '.join(_TRACE_VERSIONS)})")
        question = _string(obj, "prompt")
        answer = _string(obj, "final_answer", numeric_ok=True)
        meta = obj.get("meta", {})
        if not isinstance(meta, dict):
            raise RecordError.one("meta", f"expected an object, got {json_type(meta)}")
        steps, types, order = _ordered_steps(obj["steps"])
        rid = obj["id"] if "id" in obj else content_id("trace", question, steps, answer)
        where = {"question": "prompt", "answer": "final_answer"}
        where |= {f"steps[{i}]": f"steps[{k}].content" for i, k in enumerate(order)}
        return make_trace(
            where, id=rid, question=question, steps=steps, answer=answer, source="traces",
            meta={**meta, "trace_version": version, "step_types": types},
        )


def _ordered_steps(raw: Any) -> tuple[list[str], list[str | None], list[int]]:
    """Steps of the older format sorted by `i` (`i` must be exactly 0..N-1): their contents,
    their types, and the position in `raw` of each."""
    if not isinstance(raw, list):
        raise RecordError.one("steps", f"expected an array, got {json_type(raw)}")
    if not raw:
        raise RecordError.one("steps", "empty list")
    problems: list[tuple[str, str]] = []
    seen: dict[int, int] = {}
    for k, step in enumerate(raw):
        where = f"steps[{k}]"
        if not isinstance(step, dict):
            problems.append((where, f"expected an object, got {json_type(step)}"))
            continue
        for key in step.keys() - {"i", "type", "content"}:
            problems.append((f"{where}.{key}", "unknown field"))
        i, content, kind = step.get("i"), step.get("content"), step.get("type")
        if not isinstance(i, int) or isinstance(i, bool):
            problems.append((f"{where}.i", "missing" if i is None else f"expected an integer, got {json_type(i)}"))
        elif i in seen:
            problems.append((f"{where}.i", f"duplicate i={i} (also steps[{seen[i]}])"))
        else:
            seen[i] = k
        if not isinstance(content, str):
            problems.append((f"{where}.content", "missing" if content is None else f"expected a string, got {json_type(content)}"))
        elif not content.strip():
            problems.append((f"{where}.content", "empty string"))
        if kind is not None and not isinstance(kind, str):
            problems.append((f"{where}.type", f"expected a string, got {json_type(kind)}"))
    if not problems and sorted(seen) != list(range(len(raw))):
        missing = sorted(set(range(len(raw))) - seen.keys())
        problems.append(("steps", f"i must be 0..{len(raw) - 1}; missing i={missing[0]}"))
    if problems:
        raise RecordError(problems)
    order = [seen[i] for i in range(len(raw))]
    return [raw[k]["content"] for k in order], [raw[k].get("type") for k in order], order


@dataclass(frozen=True)
class GenericImporter:
    """`{"question", "reasoning" | "steps", "answer"}` with optional id, source and meta."""

    name: str = "generic"

    def convert(self, obj: dict[str, Any], index: int) -> Trace:
        _check_keys(obj, {"id", "question", "reasoning", "steps", "answer", "source", "meta"}, {"question", "answer"})
        has_r, has_s = "reasoning" in obj, "steps" in obj
        if has_r == has_s:
            raise RecordError.one("reasoning", "give either 'reasoning' (text) or 'steps' (a list), not both" if has_r else "missing (or 'steps')")
        question = _string(obj, "question")
        answer = _string(obj, "answer", numeric_ok=True)
        if has_r:
            text = _string(obj, "reasoning")
            steps = [line.strip() for line in text.splitlines() if line.strip()]
        else:
            steps = obj["steps"]  # checked by the Trace schema
        rid = obj["id"] if "id" in obj else content_id("generic", question, steps if isinstance(steps, list) else [], answer)
        where = {f"steps[{k}]": "reasoning" for k in range(len(steps))} if has_r else {}
        return make_trace(
            where, id=rid, question=question, steps=steps, answer=answer,
            source=obj.get("source", "generic"), meta=obj.get("meta", {}),
        )


def get_importer(fmt: str, split: str = "train", tools: tuple[str, ...] = ()) -> Importer:
    """The importer for a format name; `split` only names GSM8K ids, and `tools` only says
    whether GSM8K's calculator notes stay (the other formats keep their text as written)."""
    if fmt == "record":
        return RecordImporter()
    if fmt == "gsm8k":
        return GSM8KImporter(split=split, tools=tuple(tools))
    if fmt == "traces":
        return OlderTraceImporter()
    if fmt == "generic":
        return GenericImporter()
    if fmt == "pairs":
        from tunix_rt.traces.pairs import PairImporter

        return PairImporter()
    raise BadInput(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")


def detect_format(obj: dict[str, Any]) -> str:
    """Guess a file's format from its first object (for `--format auto`)."""
    keys = set(obj)
    if "trace_version" in keys:
        return "traces"
    if "chosen" in keys and "rejected" in keys:
        return "pairs"
    if keys == {"question", "answer"} and "####" in str(obj.get("answer")):
        return "gsm8k"
    if "id" in keys and "steps" in keys and keys <= set(Trace.model_fields):
        return "record"
    return "generic"


def gsm8k_split_name(stem: str) -> str:
    """The split part of GSM8K ids from a file or split name: 'train.jsonl' → 'train'. The id
    already starts with 'gsm8k-', so a leading 'gsm8k' of the file name is dropped
    ('gsm8k_test.jsonl' → 'test', ids gsm8k-test-NNNNN, never gsm8k-gsm8k-test-NNNNN)."""
    name = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")
    return re.sub(r"^gsm8k(?:-|$)", "", name) or "train"
