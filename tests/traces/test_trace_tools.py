"""Tool calls in traces: `data import gsm8k --tools calculator` keeps GSM8K's notes as calls
(and says so in the manifest), `--tools python` makes them python calls whose stored output is
what the sandbox prints, without --tools they are stripped as before; a user's traces may carry
the same syntax, and a malformed call is refused naming the field."""

from __future__ import annotations

import json

from trace_testlib import line, write

from tunix_rt.traces.dataset import VENDORED_GSM8K

ROWS = [
    {"question": "How many clips?", "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
                                              "Natalia sold 48+24 = <<48+24=72>>72 clips altogether.\n#### 72"},
    {"question": "How much?", "answer": "It is 1000+234 = <<1000+234=1234>>1,234 dollars.\n\n#### 1,234"},
]


def _records(home, name):
    ds = home.datasets / name / "v1"
    return ([json.loads(x) for x in (ds / "data.jsonl").read_text().splitlines()],
            json.loads((ds / "manifest.json").read_text()))


def test_gsm8k_import_keeps_the_notes_only_with_the_calculator(cli, home, tmp_path):
    src = write(tmp_path / "train.jsonl", *(line(r) for r in ROWS))
    assert cli("data", "import", "gsm8k", src, "--name", "plain").code == 0
    r = cli("data", "import", "gsm8k", src, "--name", "calc", "--tools", "calculator")
    assert r.code == 0, r.err
    plain, plain_manifest = _records(home, "plain")
    calc, calc_manifest = _records(home, "calc")
    assert plain[0]["steps"] == ["Natalia sold 48/2 = 24 clips in May.", "Natalia sold 48+24 = 72 clips altogether."]
    assert calc[0]["steps"] == ["Natalia sold 48/2 = <<48/2=24>>24 clips in May.",
                                "Natalia sold 48+24 = <<48+24=72>>72 clips altogether."]
    assert [r["answer"] for r in calc] == ["72", "1234"] and [r["id"] for r in calc] == [r["id"] for r in plain]
    assert calc_manifest["tools"] == ["calculator"] and "tools" not in plain_manifest
    assert calc_manifest["importer"] == plain_manifest["importer"] == "gsm8k"


def test_the_whole_vendored_split_imports_with_the_calculator(home):
    from tunix_rt.traces.dataset import ImportRequest, import_dataset

    ds = import_dataset(ImportRequest("gsm8k", str(VENDORED_GSM8K), "calc", tools=("calculator",)), home).dataset
    assert len(ds.records) == 7473 and ds.manifest["tools"] == ["calculator"]
    assert sum("<<" in s for t in ds.records for s in t.steps) > 20_000


def test_gsm8k_import_with_python_writes_calls_and_their_printed_output(cli, home, tmp_path):
    rows = ROWS + [{"question": "Odd notes?", "answer": "Half is <<1/0=inf>>0, then <<x*2=4>>4 and <<7//2=3>>3.\n#### 3"}]
    src = write(tmp_path / "train.jsonl", *(line(r) for r in rows))
    r = cli("data", "import", "gsm8k", src, "--name", "py", "--tools", "python")
    assert r.code == 0, r.err
    py, manifest = _records(home, "py")
    assert py[0]["steps"] == ["Natalia sold 48/2 = <python>print(48/2)</python><output>24.0\n</output>24 clips in May.",
                              "Natalia sold 48+24 = <python>print(48+24)</python><output>72\n</output>72 clips altogether."]
    # a note that fails (1/0) or is not plain arithmetic is stripped, as without tools
    assert py[2]["steps"] == ["Half is 0, then 4 and <python>print(7//2)</python><output>3\n</output>3."]
    assert manifest["tools"] == ["python"] and [r["answer"] for r in py] == ["72", "1234", "3"]
    # rendering runs each call in the sandbox: what it writes is what the import stored
    from requires import require_bwrap

    from tunix_rt.render import END_OF_TURN, target_body

    require_bwrap()
    r = cli("data", "render", "py", "--model", "tiny-gemma3", "--split", "all", "--json", "--tools", "python")
    assert r.code == 0, r.err
    rendered = {ex["id"]: ex for ex in json.loads(r.out)}
    for rec in py:
        ex = rendered[rec["id"]]
        assert ex["target_text"] == target_body(rec["steps"], rec["answer"]) + END_OF_TURN
        assert ex["supervised_text"] == ex["model_text"] and "<output>" not in ex["model_text"]


def test_tools_is_one_tool_and_only_for_gsm8k(cli, home, tmp_path):
    src = write(tmp_path / "train.jsonl", line(ROWS[0]))
    for args in (["gsm8k", src, "--tools", "calculator,python"], ["gsm8k", src, "--tools", "abacus"],
                 ["generic", src, "--tools", "calculator"]):
        r = cli("data", "import", *args, "--name", "x")
        assert r.code == 2 and "--tools" in r.err and "one of 'calculator', 'python', and only for gsm8k" in r.err
    assert not (home.datasets / "x").exists()


def test_a_users_traces_may_carry_calls_but_not_malformed_ones(cli, home, tmp_path):
    good = {"question": "q", "reasoning": "Half of 48 is <<48/2=24>>24.\n<python>print(2)</python><output>2\n</output>",
            "answer": "24"}
    bad_result = {"question": "q", "reasoning": "Half of 48 is <<48/2=24.", "answer": "24"}
    in_answer = {"question": "q", "reasoning": "Half of 48 is 24.", "answer": "<<48/2=24>>"}
    no_output = {"question": "q", "reasoning": "<python>print(2)</python>\nso 2", "answer": "2"}
    src = write(tmp_path / "good.jsonl", line(good))
    r = cli("data", "import", "generic", src, "--name", "mine")
    assert r.code == 0, r.err
    records, manifest = _records(home, "mine")
    assert manifest["tools"] == ["calculator", "python"]
    for row, field, why in [(bad_result, "reasoning", "calculator call '<<48/2=' has no result ending in '>>'"),
                            (in_answer, "answer", "contains a tool call"),
                            (no_output, "steps", "not followed at once by <output>")]:
        path = write(tmp_path / "bad.jsonl", line(row))
        r = cli("data", "validate", path, "--format", "generic")
        assert r.code == 2 and f"bad.jsonl:1: {field}: " in r.out and why in r.out, r.out


def test_render_with_the_calculator_through_the_cli(cli, home, tmp_path):
    src = write(tmp_path / "train.jsonl", *(line(r) for r in ROWS))
    assert cli("data", "import", "gsm8k", src, "--name", "calc", "--tools", "calculator").code == 0
    r = cli("data", "render", "calc", "--model", "tiny-gemma3", "--split", "all", "--json", "--tools", "calculator")
    assert r.code == 0, r.err
    for ex in json.loads(r.out):
        assert ex["supervised_text"] == ex["model_text"] != ex["target_text"]
        assert 0 in ex["loss_mask"][ex["prompt_len"]:]
    r = cli("data", "render", "calc", "--model", "tiny-gemma3", "--split", "all", "--json")
    assert all(ex["supervised_text"] == ex["target_text"] for ex in json.loads(r.out))  # no tools: all trained
    r = cli("data", "render", "calc", "--model", "tiny-gemma3", "--tools", "abacus")
    assert r.code == 2 and "--tools" in r.err
