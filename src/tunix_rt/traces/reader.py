"""The strict JSONL reader: bytes in, Traces out, every bad line named.

Each problem is reported as `FILE:LINE: FIELD: reason` with the 1-based physical line
(lines end at b"\\n"). FIELD is a record field (`question`, `steps[2]`, `steps[0].i`) or,
for problems with the line itself, `<line>` (and `<file>` for an empty file).

Decisions, so they hold everywhere:
- The file is read as bytes, one line at a time, and a line over `max_line_bytes` (default
  1 MiB) is skipped without being held in memory: a 10 MB line costs a 1 MiB buffer.
- CRLF line endings are accepted: a trailing b"\\r" is removed before decoding, so a CRLF
  file gives exactly the records (and the dataset bytes) of its LF twin.
- A UTF-8 byte order mark at the start of the file is an error (it is not JSON, and tools
  that write it usually change other things too); the message says to remove it.
- Invalid UTF-8, blank lines, NaN/Infinity, integers over Python's 4300-digit limit,
  duplicate keys in an object and rows that are not objects are errors. A last line
  without a newline is fine if it parses; if it does not, it is reported as truncated.
- Every parsed row then passes schema.json_problems before its importer sees it: a lone
  surrogate ("\\ud800") in any string or key, or a number that overflows to infinity
  (1e400), is an error on the field that holds it, in the input's own field names.
- Duplicate ids are reported on the later line, naming the first.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from tunix_rt.errors import BadInput
from tunix_rt.traces.importers import Importer, detect_format, get_importer, gsm8k_split_name
from tunix_rt.traces.schema import RecordError, Trace, json_problems, json_type, shown

DEFAULT_MAX_LINE_BYTES = 1 << 20
MAX_SHOWN = 50
BOM = b"\xef\xbb\xbf"
LINE, FILE = "<line>", "<file>"
RAW_KEEP = 4096  # bytes of an over-long line kept for the rejects file
SKIP_READ = 1 << 16  # read size while skipping the rest of an over-long line


@dataclass(frozen=True)
class LineError:
    """One problem on one line; `raw` is the line's bytes (cut for over-long lines)."""

    file: str
    line: int
    field: str
    reason: str
    raw: bytes = b""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.field}: {self.reason}"


@dataclass
class Scan:
    """What reading a file found: the good records (with their lines) and every problem."""

    file: str
    format: str
    records: list[Trace] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    n_lines: int = 0

    @property
    def bad_lines(self) -> int:
        return len({e.line for e in self.errors})

    @property
    def summary(self) -> str:
        return f"{self.bad_lines} bad line(s) of {self.n_lines}" if self.n_lines else "empty file"

    def message(self, action: str) -> str:
        """A header line, then one line per error (the first MAX_SHOWN), then a count."""
        head = f"{self.file}: {self.summary}; {action}"
        shown = [str(e) for e in self.errors[:MAX_SHOWN]]
        more = len(self.errors) - len(shown)
        tail = [f"... and {more} more error(s)"] if more > 0 else []
        return "\n".join([head, *shown, *tail])

    def raise_if_bad(self, action: str = "nothing read") -> None:
        if self.errors:
            raise BadInput(self.message(action))


class _Reject(Exception):
    def __init__(self, field: str, reason: str):
        super().__init__(reason)
        self.field, self.reason = field, reason


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Reject(shown(key), "duplicate key in object")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise _Reject(LINE, f"invalid JSON: {name} is not a JSON number")


def parse_line(raw: bytes, lineno: int, last: bool) -> dict[str, Any]:
    """One physical line (newline removed) → a JSON object, or _Reject."""
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    if lineno == 1 and raw.startswith(BOM):
        raise _Reject(LINE, "UTF-8 byte order mark (BOM) at the start of the file; save it without a BOM")
    if not raw.strip():
        raise _Reject(LINE, "blank line")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Reject(LINE, f"invalid UTF-8 at byte {e.start + 1} of the line (0x{raw[e.start]:02x})") from None
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        if e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string"):
            hint = " (last line, no newline)" if last else ""
            raise _Reject(LINE, f"truncated line{hint}: invalid JSON: {e.msg} at column {e.colno}") from None
        raise _Reject(LINE, f"invalid JSON: {e.msg} at column {e.colno}") from None
    except RecursionError:
        raise _Reject(LINE, "invalid JSON: nested too deeply") from None
    except ValueError:  # int(): over sys.get_int_max_str_digits() digits
        raise _Reject(LINE, "invalid JSON: an integer with too many digits") from None
    if not isinstance(obj, dict):
        raise _Reject(LINE, f"expected a JSON object, got {json_type(obj)}")
    return obj


def iter_lines(f: BinaryIO, max_line_bytes: int) -> Iterator[tuple[int, bytes, bool, int]]:
    """(line number, bytes without b"\\n", ended with a newline, length without the line
    ending) per physical line. A line over the limit yields only its first RAW_KEEP bytes;
    the rest is skipped in bounded reads."""
    limit = max_line_bytes + 2  # room for b"\r\n"
    lineno = 0
    while True:
        chunk = f.readline(limit)
        if not chunk:
            return
        lineno += 1
        if chunk.endswith(b"\n"):
            body = chunk[:-1]
            yield lineno, body, True, len(body) - body.endswith(b"\r")
        elif len(chunk) < limit:  # the last line, without a newline
            yield lineno, chunk, False, len(chunk) - chunk.endswith(b"\r")
        else:  # over the limit: skip the rest of the line in bounded reads
            size, ended = len(chunk), False
            while more := f.readline(SKIP_READ):
                size += len(more)
                if more.endswith(b"\n"):
                    size, ended = size - 1, True
                    break
            yield lineno, chunk[:RAW_KEEP], ended, size


@dataclass
class _Auto:
    """`--format auto`: picks the importer from the file's first JSON object."""

    split: str
    chosen: Importer | None = None
    name: str = "auto"

    def convert(self, obj: dict[str, Any], index: int) -> Trace:
        if self.chosen is None:
            self.chosen = get_importer(detect_format(obj), self.split)
        return self.chosen.convert(obj, index)


def _to_trace(raw: bytes, lineno: int, ended: bool, size: int, max_line_bytes: int,
              importer: Importer) -> Trace | list[tuple[str, str]]:
    """One physical line → a Trace, or its (field, reason) problems."""
    if size > max_line_bytes:
        return [(LINE, f"line is {size:,} bytes, over the limit of {max_line_bytes:,} (max_line_bytes)")]
    try:
        obj = parse_line(raw, lineno, last=not ended)
        if problems := json_problems(obj):
            return problems
        return importer.convert(obj, lineno - 1)
    except _Reject as r:
        return [(r.field, r.reason)]
    except RecordError as r:
        return r.problems


def _open(path: Path, label: str) -> BinaryIO:
    if not path.exists():
        raise BadInput(f"{label}: no such file")
    if not path.is_file():
        raise BadInput(f"{label}: not a regular file")
    try:
        return path.open("rb")
    except OSError as e:
        raise BadInput(f"{label}: cannot read ({e.strerror})") from None


def scan(
    path: str | os.PathLike,
    fmt: str | Importer = "record",
    *,
    label: str | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    on_progress: Callable[[int], None] | None = None,
) -> Scan:
    """Read every line of a JSONL file; collect the records and every problem.

    fmt: a format name from importers.FORMATS, "auto" (guessed from the first object), or
    an Importer. label: the FILE shown in messages (default: the path as given)."""
    path = Path(path)
    label = label or str(path)
    split = gsm8k_split_name(path.stem)
    importer = _Auto(split) if fmt == "auto" else get_importer(fmt, split) if isinstance(fmt, str) else fmt
    result = Scan(file=label, format=importer.name)
    first_line: dict[str, int] = {}
    with _open(path, label) as f:
        for lineno, raw, ended, size in iter_lines(f, max_line_bytes):
            result.n_lines = lineno
            if on_progress and lineno % 1000 == 0:
                on_progress(f.tell())
            got = _to_trace(raw, lineno, ended, size, max_line_bytes, importer)
            if not isinstance(got, list) and got.id in first_line:  # a trace or a pair
                got = [("id", f"duplicate id {got.id!r} (first on line {first_line[got.id]})")]
            if isinstance(got, list):
                result.errors.extend(LineError(label, lineno, fld, why, raw) for fld, why in got)
                continue
            first_line[got.id] = lineno
            result.records.append(got)
            result.lines.append(lineno)
    if on_progress:
        on_progress(path.stat().st_size)
    if result.n_lines == 0:
        result.errors.append(LineError(label, 1, FILE, "empty file, no records"))
    if isinstance(importer, _Auto):  # "record" when no line parsed at all
        result.format = importer.chosen.name if importer.chosen else "record"
    return result


def read_traces(
    path: str | os.PathLike,
    importer: str | Importer = "record",
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> list[Trace]:
    """All records of a JSONL file, or BadInput listing every bad line (fail-fast on the
    file, not on the first line: one pass reports everything)."""
    result = scan(path, importer, max_line_bytes=max_line_bytes)
    result.raise_if_bad("nothing read")
    return result.records
