"""The trace schema and the three importers (GSM8K, the older trace format, generic)."""

from __future__ import annotations

import json

import pytest
from trace_testlib import DATA, GSM8K, line, record, write

from tunix_rt.traces.importers import GSM8KImporter, content_id, detect_format
from tunix_rt.traces.reader import scan
from tunix_rt.traces.schema import RecordError, Trace, make_trace, validate_trace


# --- schema ---------------------------------------------------------------------------


def test_trace_is_strict_no_coercion():
    ok = validate_trace(record("a", source="x", meta={"b": 1, "a": [2]}))
    assert ok.steps == ["Think.", "Done."] and ok.meta == {"b": 1, "a": [2]}
    with pytest.raises(RecordError) as e:
        validate_trace(record(5, question=5, steps=[1], answer=5.0, source=3, meta="m", extra=True))
    assert dict(e.value.problems) == {
        "id": "expected a string, got integer",
        "question": "expected a string, got integer",
        "steps[0]": "expected a string, got integer",
        "answer": "expected a string, got number",
        "source": "expected a string, got integer",
        "meta": "expected an object, got string",
        "extra": "unknown field",
    }


def test_to_record_is_canonical():
    t = make_trace(id="a", question="q", steps=["s"], answer="1", meta={"z": {"b": 1, "a": 2}, "m": 0})
    rec = t.to_record()
    assert list(rec) == ["id", "question", "steps", "answer", "source", "meta"]
    assert json.dumps(rec["meta"]) == '{"m": 0, "z": {"a": 2, "b": 1}}'
    assert Trace.model_validate(rec) == t


# --- GSM8K ----------------------------------------------------------------------------


def test_gsm8k_vendored_first_rows():
    result = scan(GSM8K, "gsm8k")
    assert not result.errors and len(result.records) == 7473
    first = result.records[0]
    assert first.id == "gsm8k-train-00000" and first.source == "gsm8k" and first.answer == "72"
    assert first.steps == [
        "Natalia sold 48/2 = 24 clips in May.",
        "Natalia sold 48+24 = 72 clips altogether in April and May.",
    ]
    assert result.records[17].id == "gsm8k-train-00017"
    assert not any("<<" in s or ">>" in s for t in result.records for s in t.steps)
    assert all("," not in t.answer for t in result.records)


def test_gsm8k_answer_commas_and_errors(tmp_path):
    rows = [
        {"question": "How much?", "answer": "It is 1000+234 = <<1000+234=1234>>1,234 dollars.\n\n#### 1,234"},
        {"question": "No final?", "answer": "Just work."},
        {"question": "Empty final?", "answer": "Work.\n#### "},
        {"question": "Only final?", "answer": "#### 3"},
        {"question": "Extra?", "answer": "a\n#### 1", "id": "x"},
    ]
    src = write(tmp_path / "test.jsonl", *map(line, rows))
    result = scan(src, "gsm8k")
    assert [(t.id, t.steps, t.answer) for t in result.records] == [
        ("gsm8k-test-00000", ["It is 1000+234 = 1,234 dollars."], "1234")  # split named from the file
    ]
    assert [str(e) for e in result.errors] == [
        f"{src}:2: answer: expected exactly one '#### <final answer>' line",
        f"{src}:3: answer: nothing after '####'",
        f"{src}:4: answer: no solution line before '####'",
        f"{src}:5: id: unknown field",
    ]


def test_gsm8k_importer_split_prefix():
    t = GSM8KImporter(split="dev").convert({"question": "q", "answer": "a\n#### 2"}, 41)
    assert t.id == "gsm8k-dev-00041"


@pytest.mark.parametrize("name, first_id", [("gsm8k_test.jsonl", "gsm8k-test-00000"),
                                            ("GSM8K-test.jsonl", "gsm8k-test-00000"),
                                            ("gsm8k.jsonl", "gsm8k-train-00000"),
                                            ("gsm8kplus.jsonl", "gsm8k-gsm8kplus-00000")])
def test_gsm8k_ids_name_the_source_once(tmp_path, name, first_id):
    row = {"question": "q", "answer": "a\n#### 2"}
    assert scan(write(tmp_path / name, line(row)), "gsm8k").records[0].id == first_id


# --- the older trace format -----------------------------------------------------------


def test_older_trace_format_examples():
    result = scan(DATA / "older_trace_format.jsonl", "traces")
    assert not result.errors and len(result.records) == 5
    second = result.records[1]  # its steps are stored out of order in the file
    assert second.question == "Compute 72 - 21, showing your work."
    assert second.steps == ["Subtract 21 from 72.", "72 - 21 = 51"]
    assert second.meta["step_types"] == ["setup", "compute"]
    assert second.meta["category"] == "arithmetic" and second.source == "traces"
    assert result.records[4].answer == "10.5"
    assert second.id == content_id("trace", second.question, second.steps, second.answer)


def _older(**over) -> dict:
    row = {"trace_version": "1.0", "prompt": "p?", "final_answer": 3,
           "steps": [{"i": 0, "type": "setup", "content": "a"}, {"i": 1, "type": "compute", "content": "b"}]}
    row.update(over)
    return row


def test_older_trace_format_errors(tmp_path):
    rows = [
        _older(),  # numeric final_answer is accepted as its text
        _older(steps=[{"i": 0, "content": "a"}, {"i": 2, "content": "b"}]),
        _older(steps=[{"i": 0, "content": "a"}, {"i": 0, "content": "b"}]),
        _older(steps=[{"content": "a"}, {"i": "1", "content": ""}]),
        _older(trace_version="2.0"),
        _older(prompt=""),
        _older(steps="a, b"),
    ]
    src = write(tmp_path / "old.jsonl", *map(line, rows))
    result = scan(src, "traces")
    assert [t.answer for t in result.records] == ["3"]
    assert [str(e) for e in result.errors] == [
        f"{src}:2: steps: i must be 0..1; missing i=1",
        f"{src}:3: steps[1].i: duplicate i=0 (also steps[0])",
        f"{src}:4: steps[0].i: missing",
        f"{src}:4: steps[1].i: expected an integer, got string",
        f"{src}:4: steps[1].content: empty string",
        f"{src}:5: trace_version: unsupported '2.0' (known: 1, 1.0)",
        f"{src}:6: prompt: empty string",
        f"{src}:7: steps: expected an array, got string",
    ]


# --- generic --------------------------------------------------------------------------


def test_generic_examples():
    result = scan(DATA / "generic_format.jsonl", "generic")
    assert not result.errors
    a, b, c = result.records
    assert a.steps == ["A third of 12 is 4.", "12 - 4 = 8."] and a.answer == "8"
    assert a.id == content_id("generic", a.question, a.steps, a.answer) and a.id.startswith("generic-")
    assert b.id == "g-2" and b.steps == ["15% is 0.15.", "0.15 * 80 = 12."] and b.meta == {"category": "percent"}
    assert c.steps == ["Area is length times width: 7 * 3 = 21."]
    assert [t.id for t in scan(DATA / "generic_format.jsonl", "generic").records] == [a.id, b.id, c.id]  # stable


def test_generic_errors(tmp_path):
    rows = [
        {"question": "q", "reasoning": "one\n\n two ", "answer": 12.5},
        {"question": "q", "reasoning": "x", "steps": ["x"], "answer": "1"},
        {"question": "q", "answer": "1"},
        {"question": "q", "reasoning": "\n \n", "answer": "1"},
        {"question": "q", "steps": ["a", ""], "answer": True},
        {"question": "q", "reasoning": "one\n\n two ", "answer": "12.5"},  # same content as line 1
    ]
    src = write(tmp_path / "g.jsonl", *map(line, rows))
    result = scan(src, "generic")
    assert [(t.steps, t.answer) for t in result.records] == [(["one", "two"], "12.5")]
    first = result.records[0].id
    assert [str(e) for e in result.errors] == [
        f"{src}:2: reasoning: give either 'reasoning' (text) or 'steps' (a list), not both",
        f"{src}:3: reasoning: missing (or 'steps')",
        f"{src}:4: reasoning: empty string",
        f"{src}:5: answer: expected a string, got boolean",
        f"{src}:6: id: duplicate id '{first}' (first on line 1)",
    ]


# --- auto detection -------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, fmt",
    [(GSM8K, "gsm8k"), (DATA / "older_trace_format.jsonl", "traces"), (DATA / "generic_format.jsonl", "generic")],
)
def test_auto_detects_each_format(path, fmt, cli):
    with path.open() as f:
        assert detect_format(json.loads(f.readline())) == fmt
    r = cli("data", "validate", path)
    assert r.code == 0 and f"(format {fmt};" in r.out and r.out.startswith("OK: ")


def test_auto_detects_the_record_format(tmp_path, cli):
    src = write(tmp_path / "r.jsonl", line(record("a")), line(record("b")))
    assert cli("data", "validate", src).out.startswith("OK: 2 records (format record;")
