"""Tools the model calls inside its reasoning; the tool, not the model, writes each result.

    calculator  GSM8K's annotation: the model writes `<<48/2=`, the tool writes `24>>`
                (tools.calculator documents the accepted syntax, the result text and its errors)
    python      the model writes `<python>CODE</python>`, the tool writes `<output>OUT</output>`
                (tools.python, a sandboxed process)

Tool-written tokens are observations, not actions: they are not in the SFT loss, nor in the RL
policy loss or KL, and decoding forces them into the row that closed the call.

The contract (every generator and the renderer use these, nothing else):
- closed_call(text, tools, since) finds the call the newest model text closed;
- respond(call) runs the tool and returns exactly what it writes, an error included;
- segments(turn, tools) splits a model turn into model- and tool-written pieces, each result
  replaced by what respond() writes now, so training sees what decoding forces;
- calls(turn, tools) lists a finished turn's calls and where their results lie (no tool runs:
  the trace schema checks a record's tool syntax with it).

A calculator call is `<<BODY=` where BODY holds no newline, `<`, `>` or `=` (so `a << b`, a
`>>` or a second `=` never make one), and it is not inside an open `<python>` block when the
python tool is on. A python call is `<python>BODY</python>` with no other `<python>` tag in
BODY. Whether a call is closed depends only on the text up to its closing marker, so decoding
(token by token) and rendering (a whole turn) find the same calls.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Sequence

from tunix_rt.errors import BadInput
from tunix_rt.tools.calculator import calculate

#: every tool a config, an eval or a server may name
NAMES = ("calculator", "python")

CALC_OPEN, CALC_CLOSE, CALC_END = "<<", "=", ">>"
PY_OPEN, PY_CLOSE = "<python>", "</python>"
OUT_OPEN, OUT_CLOSE = "<output>", "</output>"
_CALC_BODY_BANNED = ("\n", "<", ">", "=")


@dataclass(frozen=True)
class Call:
    """One closed call: ("calculator", "48/2") or ("python", "print(2)")."""

    tool: str
    body: str


@dataclass(frozen=True)
class ToolResult:
    """text = exactly what the tool writes, closing marker included ("24>>")."""

    text: str
    error: bool


def check_tools(tools: Sequence[str], where: str = "tools") -> list[str]:
    """The names, validated: known and distinct."""
    tools = list(tools)
    unknown = [t for t in tools if t not in NAMES]
    if unknown or len(set(tools)) != len(tools):
        raise BadInput(f"{where}: must be distinct names from {list(NAMES)}, got {tools!r}")
    return tools


def closed_call(text: str, tools: Sequence[str], since: int = 0) -> tuple[int, Call] | None:
    """The first call of an enabled tool whose closing marker ends at an index > since in
    `text`: (end, call), end = the index just past the marker; None when there is none."""
    found = []
    if "calculator" in tools:
        found.append(_calculator_call(text, since, "python" in tools))
    if "python" in tools:
        found.append(_python_call(text, since))
    found = [f for f in found if f is not None]
    return min(found, key=lambda f: f[0]) if found else None


def _calculator_call(text: str, since: int, python_on: bool) -> tuple[int, Call] | None:
    i = text.find(CALC_CLOSE, max(since, 0))
    while i != -1:
        line_start = text.rfind("\n", 0, i) + 1
        opened = text.rfind(CALC_OPEN, line_start, i)
        if opened != -1:
            body = text[opened + len(CALC_OPEN): i]
            if not any(b in body for b in _CALC_BODY_BANNED) and not (python_on and _in_python(text, opened)):
                return i + 1, Call("calculator", body)
        i = text.find(CALC_CLOSE, i + 1)
    return None


def _in_python(text: str, at: int) -> bool:
    """Whether `at` lies inside a <python> block not yet closed before it."""
    opened = text.rfind(PY_OPEN, 0, at)
    return opened != -1 and text.find(PY_CLOSE, opened, at) == -1


def _python_call(text: str, since: int) -> tuple[int, Call] | None:
    j = text.find(PY_CLOSE, max(since - len(PY_CLOSE) + 1, 0))
    while j != -1:
        opened = text.rfind(PY_OPEN, 0, j)
        if opened != -1 and text.find(PY_CLOSE, opened, j) == -1:
            return j + len(PY_CLOSE), Call("python", text[opened + len(PY_OPEN): j])
        j = text.find(PY_CLOSE, j + 1)
    return None


def respond(call: Call) -> ToolResult:
    """What the tool writes for `call`; never raises for bad input (an error is a result)."""
    if call.tool == "calculator":
        value, error = calculate(call.body)
        return ToolResult(value + CALC_END, error)
    if call.tool == "python":
        try:
            python = importlib.import_module("tunix_rt.tools.python")
        except ModuleNotFoundError as err:
            if err.name != "tunix_rt.tools.python":
                raise
            return ToolResult(f"{OUT_OPEN}error: the python tool is not available{OUT_CLOSE}", True)
        return python.run(call.body)
    raise BadInput(f"tools: unknown tool {call.tool!r}, not in {list(NAMES)}")


def calls(turn: str, tools: Sequence[str]) -> list[tuple[int, Call, int]]:
    """Every call in a finished model turn, in order, as (end, call, result_end): the call
    closes at `end` and its result in `turn` spans end..result_end. Runs no tool. A call must
    be followed by its result (`…>>` on the same line, `<output>…</output>` right after
    `</python>`): BadInput otherwise."""
    out = []
    cursor = 0
    while (found := closed_call(turn, tools, cursor)) is not None:
        end, call = found
        cursor = _result_end(turn, end, call)
        out.append((end, call, cursor))
    return out


def segments(turn: str, tools: Sequence[str]) -> list[tuple[str, bool]]:
    """Consecutive (text, tool_written) pieces of a model turn; each call's result in `turn`
    is replaced by what respond() writes now (calls() says what a call must look like)."""
    out: list[tuple[str, bool]] = []
    cursor = 0
    for end, call, result_end in calls(turn, tools):
        out.append((turn[cursor:end], False))
        out.append((respond(call).text, True))
        cursor = result_end
    if cursor < len(turn) or not out:
        out.append((turn[cursor:], False))
    return out


def _result_end(turn: str, end: int, call: Call) -> int:
    """The index just past the result written after a call that ends at `end`."""
    if call.tool == "calculator":
        close = turn.find(CALC_END, end)
        newline = turn.find("\n", end)
        if close == -1 or (newline != -1 and newline < close):
            raise BadInput(f"calculator call '<<{call.body}=' has no result ending in '>>' on its line "
                           "(write <<EXPR=RESULT>>)")
        return close + len(CALC_END)
    if not turn.startswith(OUT_OPEN, end) or turn.find(OUT_CLOSE, end) == -1:
        raise BadInput(f"python call ending at character {end} is not followed at once by <output>…</output>")
    return turn.find(OUT_CLOSE, end) + len(OUT_CLOSE)
