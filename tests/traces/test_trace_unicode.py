"""Strings that are not real Unicode and numbers that are not finite, refused at the door
(issue 23 items 6 and 8's trace side): `data validate` and `data import` name
FILE:LINE: FIELD and exit 2 with no dataset and no traceback, and an upload is refused
before a job exists. Before, a lone surrogate validated "OK", then `data import` died with
a UnicodeEncodeError traceback (and an upload became a job that died the same way), and
1e400 imported as `Infinity`, leaving a dataset its own reader calls corrupt."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from trace_testlib import leftovers, line, record, write

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))

from service_testlib import make_client  # noqa: E402

from tunix_rt.traces.schema import RecordError, make_trace  # noqa: E402

GOOD = line(record("a"))
LONE = "\ud800"


def raw_line(obj) -> bytes:
    """One JSONL line as a file holds it: a lone surrogate as the six ASCII bytes \\ud800
    (json.dumps escapes it), a float overflow as the number 1e400 (not `Infinity`)."""
    text = json.dumps(obj).replace("Infinity", "1e400")
    return text.encode("ascii") + b"\n"


# name → (the second line's object, "FIELD: reason-prefix" expected on line 2)
RECORD_CASES = {
    "question": (record("b", question=f"caf{LONE}?"), "question: lone surrogate U+D800 at character 4"),
    "step": (record("b", steps=["ok", f"x{LONE}"]), "steps[1]: lone surrogate U+D800"),
    "answer": (record("b", answer=f"7{LONE}"), "answer: lone surrogate U+D800"),
    "id": (record(f"b{LONE}", question="q?"), "id: lone surrogate U+D800"),
    "source": (record("b", source=LONE), "source: lone surrogate U+D800"),
    "low_surrogate": (record("b", answer="\udc80"), "answer: lone surrogate U+DC80"),
    "meta_value": (record("b", meta={"category": f"geo{LONE}"}), "meta.category: lone surrogate"),
    "meta_key": (record("b", meta={f"k{LONE}": 1}), "meta.k\\ud800: lone surrogate"),
    "meta_nested": (record("b", meta={"a": [1, {"b": LONE}]}), "meta.a[1].b: lone surrogate"),
    "meta_infinity": (record("b", meta={"weight": 1e400}), "meta.weight: inf is not a finite number"),
    "meta_minus_infinity": (record("b", meta={"a": [-1e400]}), "meta.a[0]: -inf is not a finite number"),
}


def _file(tmp_path, case: str) -> Path:
    return write(tmp_path / f"{case}.jsonl", GOOD, raw_line(RECORD_CASES[case][0]))


@pytest.mark.parametrize("case", sorted(RECORD_CASES))
def test_validate_refuses_with_file_line_field(case, cli, tmp_path, home):
    src = _file(tmp_path, case)
    r = cli("data", "validate", src, "--format", "record")
    assert r.code == 2, r
    assert r.out.splitlines() == [ln for ln in r.out.splitlines() if ln.startswith(f"{src}:2: ")]
    assert r.out.startswith(f"{src}:2: {RECORD_CASES[case][1]}"), r.out
    assert "Traceback" not in r.err and leftovers(home) == []


@pytest.mark.parametrize("case", sorted(RECORD_CASES))
def test_import_refuses_and_writes_nothing(case, cli, tmp_path, home):
    src = _file(tmp_path, case)
    r = cli("data", "import", "record", src, "--name", "bad")
    assert r.code == 2, r
    assert f"{src}:2: {RECORD_CASES[case][1]}" in r.err and "nothing imported" in r.err, r.err
    assert "Traceback" not in r.err and leftovers(home) == []


def test_invalid_utf8_bytes_in_a_field_are_refused_on_the_line(cli, tmp_path, home):
    """Raw bytes that are no UTF-8 (an encoded surrogate, a stray 0xff) cannot be decoded,
    so no field can be named: the line is, with the byte."""
    for i, bad in enumerate((b"\xed\xa0\x80", b"\xff")):
        src = write(tmp_path / f"bytes{i}.jsonl", GOOD, line(record("b", answer="7!")).replace(b"7!", b"7" + bad))
        r = cli("data", "import", "record", src, "--name", "bad")
        assert r.code == 2 and f"{src}:2: <line>: invalid UTF-8 at byte" in r.err, r.err
        assert leftovers(home) == []


def test_foreign_formats_name_their_own_fields(cli, tmp_path, home):
    older = {"trace_version": "1.0", "prompt": "p", "final_answer": "1",
             "steps": [{"i": 1, "content": f"b{LONE}"}, {"i": 0, "content": "a"}]}
    generic = {"question": "q", "reasoning": "r", "answer": 1e400}
    gsm8k = {"question": "q", "answer": f"3+4=7{LONE}\n#### 7"}
    for fmt, obj, expected in (("traces", older, "steps[0].content: lone surrogate"),
                               ("generic", generic, "answer: inf is not a finite number"),
                               ("gsm8k", gsm8k, "answer: lone surrogate")):
        src = write(tmp_path / f"{fmt}.jsonl", raw_line(obj))
        r = cli("data", "import", fmt, src, "--name", "bad")
        assert r.code == 2 and f"{src}:1: {expected}" in r.err, (fmt, r.err)
        assert leftovers(home) == []


def test_an_integer_too_long_to_parse_is_a_line_error_not_a_traceback(cli, tmp_path, home):
    src = write(tmp_path / "digits.jsonl", GOOD, b'{"id": "b", "question": "q", "steps": ["s"], "answer": "1", '
                b'"meta": {"n": 1' + b"0" * 5000 + b"}}\n")
    r = cli("data", "import", "record", src, "--name", "bad")
    assert r.code == 2 and f"{src}:2: <line>: invalid JSON: an integer with too many digits" in r.err, r.err
    assert leftovers(home) == []


def test_quarantine_keeps_the_good_lines_and_a_printable_reject(cli, tmp_path, home):
    src = _file(tmp_path, "meta_key")
    r = cli("data", "import", "record", src, "--name", "q", "--quarantine", "--max-reject-rate", "0.5")
    assert r.code == 0, r.err
    rejects = (home.datasets / "q" / "v1" / "rejects.jsonl").read_text(encoding="utf-8")
    assert json.loads(rejects)["field"] == "meta.k\\ud800"
    assert (home.datasets / "q" / "v1" / "data.jsonl").read_bytes().count(b"\n") == 1


def test_finite_meta_numbers_still_import_and_read_back(cli, tmp_path, home):
    src = write(tmp_path / "ok.jsonl", line(record("a", meta={"w": 1e300, "n": -3, "x": [0.5, 1e-320], "s": "é😀"})))
    assert cli("data", "import", "record", src, "--name", "ok").code == 0
    shown = json.loads(cli("data", "show", "ok", "--json").out)["sample"][0]
    assert shown["meta"] == {"n": -3, "s": "é😀", "w": 1e300, "x": [0.5, 1e-320]}


def test_the_trace_itself_refuses_them_when_built_in_code():
    """The reader is the door for files; a Trace built from Python values checks the same
    rule (schema.json_problems), so no path around the reader stores one either."""
    with pytest.raises(RecordError) as bad:
        make_trace(id="a", question=f"q{LONE}", steps=["s", LONE], answer="1", meta={"x": float("nan")})
    fields = [f for f, _ in bad.value.problems]
    assert fields == ["question", "steps[1]", "meta"]
    assert "meta.x: nan is not a finite number" in bad.value.problems[2][1]


def test_an_upload_is_refused_before_a_job_exists(home):
    """The upload route validates through traces.reader.scan: a lone surrogate is a 422
    naming the line and field, nothing is kept under uploads/ and no job is queued."""
    content = GOOD + raw_line(record("b", question=f"q{LONE}")) + raw_line(record("c", meta={f"k{LONE}": "v"}))
    with make_client(home, home.database_url) as client:
        r = client.post("/api/datasets", files={"file": ("sur.jsonl", content)}, data={"name": "up"})
        assert r.status_code == 422, r.text
        errors = r.json()["detail"]["errors"]
        assert [(e["line"], e["field"]) for e in errors] == [(2, "question"), (3, "meta.k\\ud800")]
        assert errors[0]["message"].startswith("sur.jsonl:2: question: lone surrogate U+D800")
        assert client.get("/api/jobs").json() == []
        assert list((home.root / "uploads").iterdir()) == []
        ok = client.post("/api/datasets", files={"file": ("ok.jsonl", GOOD)}, data={"name": "up"})
        assert ok.status_code == 202 and len(client.get("/api/jobs").json()) == 1  # the route itself works


def test_an_import_job_for_such_a_file_is_dead_at_once_not_retried(home):
    """Behind the route (an upload stored before this rule, a job queued directly): the
    worker's import reads through the same reader, so the job ends `dead` on its first
    attempt with the FILE:LINE: FIELD message, where it used to fail with a
    UnicodeEncodeError, be retried as transient and end `dead` only after every attempt."""
    import hashlib

    from tunix_rt.registry import queue
    from tunix_rt.registry.worker import Worker, WorkerConfig

    content = GOOD + raw_line(record("b", steps=["ok", f"x{LONE}"]))
    digest = hashlib.sha256(content).hexdigest()
    (home.root / "uploads").mkdir(exist_ok=True)
    (home.root / "uploads" / f"{digest}.jsonl").write_bytes(content)
    job_id = queue.enqueue("import", {"upload": f"{digest}.jsonl", "name": "up", "format": "record",
                                      "filename": "old.jsonl"}, max_attempts=3, url=home.database_url)
    assert Worker(home, WorkerConfig(lease_s=5, poll_s=0.05, max_jobs=1, url=home.database_url)).run() == 1
    job = queue.get_job(job_id, url=home.database_url)
    assert (job.status, job.attempts) == (queue.DEAD, 1)
    assert f"{digest}.jsonl:2: steps[1]: lone surrogate U+D800" in job.error
    assert leftovers(home) == []
