"""The tools contract (tunix_rt.tools): closed_call finds the call the newest text closed,
respond writes the result, segments splits a finished turn the way decoding builds it."""

from __future__ import annotations

import random
import sys

import pytest

from tunix_rt.errors import BadInput
from tunix_rt.tools import Call, ToolResult, calls, check_tools, closed_call, respond, segments

CALC = ["calculator"]
TURN = ("<reasoning>\nNatalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "In all 48+24 = <<48+24=72.00>>72 clips.\n</reasoning>\n<answer>72</answer>")


def test_closed_call_finds_the_first_call_closed_after_since():
    text = "half is <<48/2="
    assert closed_call(text, CALC) == (len(text), Call("calculator", "48/2"))
    assert closed_call(text, CALC, since=len(text) - 1) == (len(text), Call("calculator", "48/2"))
    assert closed_call(text, CALC, since=len(text)) is None  # already answered
    assert closed_call(text, []) is None and closed_call(text, ["python"]) is None
    answered = text + "24>> then <<24*3="
    assert closed_call(answered, CALC, since=len(text) + 4) == (len(answered), Call("calculator", "24*3"))
    assert closed_call(text + "24>> so 24 =", CALC, since=len(text)) is None  # that `=` closes nothing


def test_a_shift_followed_by_equals_reads_as_a_call():
    text = "a << b = c"  # `<<BODY=` is the whole rule: the calculator then answers `error: syntax>>`
    assert closed_call(text, CALC) == (text.index("=") + 1, Call("calculator", " b "))


@pytest.mark.parametrize("text", [
    "a << b", "x >> 2 = 1", "<<2\n+3=", "<<2<3=", "<<1>0=", "no call = here",
    "<python>print(1 << 3 == 8)",  # inside an open python block, with python on
])
def test_not_a_calculator_call(text):
    assert closed_call(text, ["calculator", "python"]) is None


def test_python_calls_and_which_comes_first():
    text = "x <python>print(1<<3 == 8)</python>"
    assert closed_call(text, ["calculator", "python"]) == (len(text), Call("python", "print(1<<3 == 8)"))
    both = "<<2+2= and <python>print(1)</python>"
    assert closed_call(both, ["python", "calculator"])[1] == Call("calculator", "2+2")
    assert closed_call(both, ["python"])[1] == Call("python", "print(1)")
    closing = "<python>print(2)</pyth"
    assert closed_call(closing, ["python"]) is None
    done = closing + "on>"
    assert closed_call(done, ["python"], since=len(closing)) == (len(done), Call("python", "print(2)"))
    assert closed_call("</python>", ["python"]) is None  # nothing opened


def test_respond_calculator_and_its_errors():
    assert respond(Call("calculator", "48/2")) == ToolResult("24>>", False)
    assert respond(Call("calculator", "10/3")) == ToolResult("3.3333>>", False)
    assert respond(Call("calculator", "5/0")) == ToolResult("error: division by zero>>", True)
    assert respond(Call("calculator", "")) == ToolResult("error: empty>>", True)
    with pytest.raises(BadInput, match="unknown tool"):
        respond(Call("abacus", "1"))


def test_respond_python_without_its_module_is_an_error_result(monkeypatch):
    monkeypatch.setitem(sys.modules, "tunix_rt.tools.python", None)  # as if not installed
    assert respond(Call("python", "print(1)")) == ToolResult(
        "<output>error: the python tool is not available</output>", True)


def test_segments_replace_each_result_by_what_the_tool_writes_now():
    got = segments(TURN, CALC)
    assert got == [
        ("<reasoning>\nNatalia sold 48/2 = <<48/2=", False), ("24>>", True),
        ("24 clips in May.\nIn all 48+24 = <<48+24=", False), ("72>>", True),  # GSM8K wrote 72.00
        ("72 clips.\n</reasoning>\n<answer>72</answer>", False),
    ]
    assert segments(TURN, []) == [(TURN, False)]
    assert segments("", CALC) == [("", False)]
    assert segments("<<1+1=2>>", CALC) == [("<<1+1=", False), ("2>>", True)]


def test_a_call_without_its_result_is_bad_input():
    with pytest.raises(BadInput, match="no result ending in '>>'"):
        segments("a <<2+2=4\n>>", CALC)
    with pytest.raises(BadInput, match="not followed at once by <output>"):
        calls("<python>print(1)</python>\n<output>1</output>", ["python"])
    assert [(c.tool, c.body) for _, c, _ in calls("<python>print(1)</python><output>1\n</output>", ["python"])] == [
        ("python", "print(1)")]


def _decode(turn: str, tools: list[str], rng: random.Random) -> list[tuple[str, bool]]:
    """The decoding rule of tools-api.md on text: the model writes `turn`'s model text in
    random chunks (tokens); when a chunk closes a call the chunk is cut at the call's end,
    the tool's result is forced, and the model resumes after the result in `turn`."""
    text, pieces, at = "", [], 0
    results = {end: rend for end, _, rend in calls(turn, tools)}  # where the model resumes
    while at < len(turn):
        since = len(text)
        chunk = turn[at:at + rng.randrange(1, 6)]
        text += chunk
        found = closed_call(text, tools, since)
        if found is None:
            pieces.append((chunk, False))
            at += len(chunk)
            continue
        end, call = found
        pieces.append((text[since:end], False))
        text = text[:end]
        forced = respond(call).text
        text += forced
        pieces.append((forced, True))
        at = results[at + (end - since)]
    return pieces


def _merged(pieces: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = []
    for text, tool in pieces:
        if out and out[-1][1] == tool == False:  # noqa: E712
            out[-1] = (out[-1][0] + text, False)
        elif text or tool:
            out.append((text, tool))
    return out


def test_decoding_token_by_token_builds_exactly_the_segments():
    rng = random.Random(0)
    turns = [TURN, "<<1+1=2>> and <<2*3=6>>", "a << b\n<<5/0=err>>!", "<<10/3=3.33>>3.33 <<1,000*2=2000>>"]
    for turn in turns:
        for _ in range(50):
            assert _merged(_decode(turn, CALC, rng)) == _merged(segments(turn, CALC)), turn


def test_check_tools():
    assert check_tools(["calculator"]) == ["calculator"]
    with pytest.raises(BadInput, match="tools"):
        check_tools(["calculator", "calculator"])
    with pytest.raises(BadInput, match="--tools"):
        check_tools(["abacus"], "--tools")
