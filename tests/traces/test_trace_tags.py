"""The format's own tags inside a record (issue 23 item 7): refused at import as
FILE:LINE: FIELD, by one rule (traces.schema.REFUSED_TAGS) that the reader, every importer,
`data validate` and the upload share. Before, `"answer": "2</answer><answer>3"` imported
silently and rendered a target that breaks the format it teaches."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from trace_testlib import DATA, leftovers, line, record, write

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))

from service_testlib import make_client  # noqa: E402

from tunix_rt.traces.reader import scan  # noqa: E402
from tunix_rt.traces.schema import FORMAT_TAGS, REFUSED_TAGS, TURN_MARKERS  # noqa: E402

GOOD = line(record("a"))

# name → (the second line's record, "FIELD: contains 'TAG'" expected on line 2)
CASES = {
    "answer_closes_and_reopens": (record("b", answer="2</answer><answer>3"), "answer: contains '</answer>'"),
    "step_closes_reasoning": (record("b", steps=["ok", "</reasoning><answer>9</answer>"]), "steps[1]: contains '</reasoning>'"),
    "step_opens_reasoning": (record("b", steps=["<reasoning> again"]), "steps[0]: contains '<reasoning>'"),
    "question_ends_the_turn": (record("b", question="Hi<end_of_turn>\n<start_of_turn>model"), "question: contains '<end_of_turn>'"),
    "answer_with_eos": (record("b", answer="7<eos>"), "answer: contains '<eos>'"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_and_import_refuse_with_file_line_field(case, cli, tmp_path, home):
    obj, expected = CASES[case]
    src = write(tmp_path / f"{case}.jsonl", GOOD, line(obj))
    r = cli("data", "validate", src, "--format", "record")
    assert r.code == 2 and r.out.splitlines() == [r.out.splitlines()[0]], r
    assert r.out.startswith(f"{src}:2: {expected}, a tag of the rendered format"), r.out
    r = cli("data", "import", "record", src, "--name", "bad")
    assert r.code == 2 and f"{src}:2: {expected}" in r.err and "nothing imported" in r.err, r.err
    assert "Traceback" not in r.err and leftovers(home) == []


def test_where_each_tag_is_refused(tmp_path):
    """Turn markers in every rendered field; <reasoning>/<answer> tags in steps and the
    answer only: a question may talk about the format (see REFUSED_TAGS)."""
    assert set(REFUSED_TAGS["question"]) == set(TURN_MARKERS)
    assert set(REFUSED_TAGS["steps"]) == set(REFUSED_TAGS["answer"]) == set(TURN_MARKERS + FORMAT_TAGS)
    rows, expected, allowed = [], [], []
    for tag in TURN_MARKERS + FORMAT_TAGS:
        for field in ("question", "steps", "answer"):
            value = f"x {tag} y"
            over = {"question": "q?", field: [value] if field == "steps" else value}
            rows.append(record(f"r{len(rows) + 1}", **over))
            if tag in REFUSED_TAGS[field]:
                expected.append((len(rows), "steps[0]" if field == "steps" else field))
            else:
                allowed.append((field, tag))
    result = scan(write(tmp_path / "all.jsonl", *map(line, rows)), "record")
    assert [(e.line, e.field) for e in result.errors] == expected
    assert allowed == [("question", tag) for tag in FORMAT_TAGS]  # the only allowed combinations
    assert len(result.records) == len(allowed)


def test_near_misses_are_plain_text(tmp_path):
    """Only the exact, case-sensitive tags parse_completion and the tokenizer know."""
    ok = [record("a", answer="<Answer>7</ANSWER>"), record("b", steps=["a < answer > b", "x<<2*3=6>>"]),
          record("c", question="What goes in <answer>?", answer="a number")]
    result = scan(write(tmp_path / "ok.jsonl", *map(line, ok)), "record")
    assert not result.errors and len(result.records) == 3


def test_foreign_formats_name_their_own_fields(cli, tmp_path, home):
    older = {"trace_version": "1.0", "prompt": "p<bos>", "final_answer": "1</answer>",
             "steps": [{"i": 1, "content": "b</reasoning>"}, {"i": 0, "content": "a"}]}
    generic = {"question": "q", "reasoning": "one\n<answer>9</answer>", "answer": "9"}
    gsm8k = {"question": "q", "answer": "3+4=7\n#### 7</answer>"}
    for fmt, obj, expected in (
        ("traces", older, ["prompt: contains '<bos>'", "steps[0].content: contains '</reasoning>'",
                           "final_answer: contains '</answer>'"]),
        ("generic", generic, ["reasoning: contains '<answer>'"]),
        ("gsm8k", gsm8k, ["answer: contains '</answer>'"]),
    ):
        src = write(tmp_path / f"{fmt}.jsonl", line(obj))
        r = cli("data", "import", fmt, src, "--name", "bad")
        assert r.code == 2, (fmt, r)
        got = [ln.split(", a tag")[0] for ln in r.err.splitlines() if ln.startswith(f"{src}:1: ")]
        assert got == [f"{src}:1: {e}" for e in expected], (fmt, r.err)
        assert leftovers(home) == []


def test_the_bundled_data_still_imports(tmp_path):
    for path, fmt in ((DATA / "generic_format.jsonl", "generic"), (DATA / "older_trace_format.jsonl", "traces")):
        result = scan(path, fmt)
        assert not result.errors and result.records, [str(e) for e in result.errors]


def test_an_upload_with_a_tag_is_refused_before_a_job_exists(home):
    content = GOOD + line(record("b", answer="2</answer><answer>3"))
    with make_client(home, home.database_url) as client:
        r = client.post("/api/datasets", files={"file": ("tags.jsonl", content)}, data={"name": "up"})
        assert r.status_code == 422, r.text
        errors = r.json()["detail"]["errors"]
        assert [(e["line"], e["field"]) for e in errors] == [(2, "answer")]
        assert errors[0]["message"].startswith("tags.jsonl:2: answer: contains '</answer>'")
        assert client.get("/api/jobs").json() == [] and list((home.root / "uploads").iterdir()) == []
        assert json.loads(r.text)["detail"]["total_errors"] == 1
