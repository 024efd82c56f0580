"""Every malformed input of issue 2 through the real CLI: `data validate` prints
`FILE:LINE: FIELD: reason` and exits 2; `data import` exits 2 and leaves no dataset."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from trace_testlib import DROP, leftovers, line, record, write

from tunix_rt.errors import BadInput
from tunix_rt.traces.reader import read_traces, scan

GOOD = line(record("a"))

# name → (file bytes, expected "LINE: FIELD: reason-prefix" after "FILE:")
CASES = {
    "invalid_json": (GOOD + b'{"id": "b", "question": }\n', "2: <line>: invalid JSON: Expecting value"),
    "truncated_line": (GOOD + b'{"id": "b", "question": "How m', "2: <line>: truncated line (last line, no newline)"),
    "truncated_object": (GOOD + b'{"id": "b", "question": "q"\n', "2: <line>: truncated line"),
    "non_object_row": (GOOD + b"[1, 2, 3]\n", "2: <line>: expected a JSON object, got array"),
    "bom": (b"\xef\xbb\xbf" + GOOD, "1: <line>: UTF-8 byte order mark (BOM)"),
    "invalid_utf8": (GOOD + line(record("b", question="caf\udce9?")).replace(b"\\udce9", b"\xe9"), "2: <line>: invalid UTF-8 at byte"),
    "missing_question": (GOOD + line(record("b", question=DROP)), "2: question: missing"),
    "empty_question": (GOOD + line(record("b", question="")), "2: question: empty string"),
    "blank_question": (GOOD + line(record("b", question="  \t")), "2: question: empty string"),
    "missing_answer": (GOOD + line(record("b", answer=DROP)), "2: answer: missing"),
    "empty_answer": (GOOD + line(record("b", answer="")), "2: answer: empty string"),
    "steps_not_a_list": (GOOD + line(record("b", steps="Think. Done.")), "2: steps: expected an array, got string"),
    "steps_empty_list": (GOOD + line(record("b", steps=[])), "2: steps: empty list"),
    "empty_step": (GOOD + line(record("b", steps=["Think.", ""])), "2: steps[1]: empty string"),
    "step_wrong_type": (GOOD + line(record("b", steps=["Think.", 3])), "2: steps[1]: expected a string, got integer"),
    "question_wrong_type": (GOOD + line(record("b", question=42)), "2: question: expected a string, got integer"),
    "answer_wrong_type": (GOOD + line(record("b", answer=18)), "2: answer: expected a string, got integer"),
    "id_wrong_type": (GOOD + line(record(17)), "2: id: expected a string, got integer"),
    "meta_wrong_type": (GOOD + line(record("b", meta=["x"])), "2: meta: expected an object, got array"),
    "unknown_field": (GOOD + line(record("b", reasoning="x")), "2: reasoning: unknown field"),
    "duplicate_ids": (GOOD + line(record("b")) + line(record("a")), "3: id: duplicate id 'a' (first on line 1)"),
    "duplicate_key": (GOOD + b'{"id": "b", "id": "c", "question": "q", "steps": ["s"], "answer": "1"}\n', "2: id: duplicate key in object"),
    "nan": (GOOD + b'{"id": "b", "question": "q", "steps": ["s"], "answer": "1", "meta": {"x": NaN}}\n', "2: <line>: invalid JSON: NaN"),
    "blank_line": (GOOD + b"\n" + line(record("b")), "2: <line>: blank line"),
    "empty_file": (b"", "1: <file>: empty file, no records"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_names_file_line_field(case, cli, tmp_path, home):
    content, expected = CASES[case]
    src = write(tmp_path / f"{case}.jsonl", content)
    r = cli("data", "validate", src, "--format", "record")
    assert r.code == 2, r
    out = r.out.splitlines()
    assert len(out) == 1 and out[0].startswith(f"{src}:{expected}"), r.out  # one problem, one line
    assert leftovers(home) == []  # validate writes nothing


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_fails_and_leaves_nothing(case, cli, tmp_path, home):
    content, expected = CASES[case]
    src = write(tmp_path / f"{case}.jsonl", content)
    r = cli("data", "import", "record", src, "--name", "bad")
    assert r.code == 2, r
    assert any(ln.startswith(f"{src}:{expected}") for ln in r.err.splitlines()), r.err
    assert "nothing imported" in r.err
    assert leftovers(home) == []


def test_ten_megabyte_line_is_rejected_in_bounded_memory(cli, tmp_path, home):
    big = json.dumps(record("big", question="x" * 10_000_000)).encode() + b"\n"
    src = write(tmp_path / "big.jsonl", line(record("a")), big, line(record("c")))
    tracemalloc.start()
    result = scan(src, "record")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 3 * 2**20  # the file is 10 MB, f"peak {peak} bytes: the line was held in memory"
    assert [str(e) for e in result.errors] == [
        f"{src}:2: <line>: line is {len(big) - 1:,} bytes, over the limit of {2**20:,} (max_line_bytes)"
    ]
    assert [t.id for t in result.records] == ["a", "c"]  # reading went on after it
    r = cli("data", "import", "record", src, "--name", "big")
    assert r.code == 2 and f"{src}:2: <line>: line is" in r.err
    assert leftovers(home) == []
    # the limit is configurable
    assert cli("data", "validate", src, "--max-line-bytes", str(20_000_000)).code == 0


def test_line_limit_is_exact(tmp_path):
    body = json.dumps(record("a"))
    limit = len(body.encode())
    src = write(tmp_path / "edge.jsonl", body.encode() + b"\r\n", body.replace('"a"', '"bb"').encode() + b"\n")
    result = scan(src, "record", max_line_bytes=limit)
    assert [t.id for t in result.records] == ["a"]  # exactly at the limit, CRLF not counted
    assert [e.line for e in result.errors] == [2]


def test_crlf_is_accepted_and_gives_identical_data(cli, tmp_path, home):
    lf = write(tmp_path / "lf.jsonl", line(record("a")), line(record("b", steps=["x", "y"])))
    crlf = write(tmp_path / "crlf.jsonl", lf.read_bytes().replace(b"\n", b"\r\n"))
    assert cli("data", "validate", crlf).out.startswith("OK: 2 records")
    assert cli("data", "import", "record", lf, "--name", "lf").code == 0
    assert cli("data", "import", "record", crlf, "--name", "crlf").code == 0
    a = (home.datasets / "lf" / "v1" / "data.jsonl").read_bytes()
    b = (home.datasets / "crlf" / "v1" / "data.jsonl").read_bytes()
    assert a == b and b"\r" not in b


def test_every_bad_line_is_reported_in_one_pass(cli, tmp_path):
    src = write(
        tmp_path / "many.jsonl",
        line(record("a")),
        line(record("b", question="")),
        b"not json\n",
        line(record("c", steps=["ok", " "], answer=5)),
        line(record("a")),
    )
    r = cli("data", "validate", src)
    assert r.code == 2
    assert r.out.splitlines() == [
        f"{src}:2: question: empty string",
        f"{src}:3: <line>: invalid JSON: Expecting value at column 1",
        f"{src}:4: steps[1]: empty string",
        f"{src}:4: answer: expected a string, got integer",
        f"{src}:5: id: duplicate id 'a' (first on line 1)",
    ]
    assert "4 bad line(s) of 5" in r.err


def test_read_traces_raises_one_badinput_capped_at_50(tmp_path):
    src = write(tmp_path / "bad.jsonl", *[b"{}\n"] * 30)  # 4 missing fields per line
    with pytest.raises(BadInput) as exc:
        read_traces(src)
    lines = str(exc.value).splitlines()
    assert lines[0] == f"{src}: 30 bad line(s) of 30; nothing read"
    assert lines[1] == f"{src}:1: id: missing"
    assert len(lines) == 1 + 50 + 1 and lines[-1] == "... and 70 more error(s)"


def test_missing_file_and_unknown_format(cli, tmp_path):
    r = cli("data", "validate", tmp_path / "nope.jsonl")
    assert r.code == 2 and "no such file" in r.err
    r = cli("data", "validate", write(tmp_path / "a.jsonl", GOOD), "--format", "csv")
    assert r.code == 2 and "--format 'csv'" in r.err
    r = cli("data", "import", "csv", tmp_path / "a.jsonl", "--name", "x")
    assert r.code == 2 and "unknown format 'csv'" in r.err
