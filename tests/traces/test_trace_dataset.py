"""Dataset directories: import, versions, byte-identical re-imports, stable splits,
quarantine, atomicity, and load_dataset."""

from __future__ import annotations

import hashlib
import json

import pytest
from trace_testlib import DATA, GSM8K, leftovers, line, record, write

from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.traces import dataset as ds_mod
from tunix_rt.traces.dataset import (
    ImportRequest,
    import_dataset,
    list_datasets,
    load_dataset,
    parse_hf_uri,
    split_of,
)

MANIFEST_KEYS = {"name", "version", "source", "importer", "created_at", "count", "sha256", "split", "splits"}


def test_gsm8k_import_is_byte_identical_and_reused(cli, home):
    r = cli("data", "import", "gsm8k", GSM8K, "--name", "gsm8k")
    assert r.code == 0, r.err
    assert r.out.startswith("imported gsm8k@v1: 7473 records")
    vdir = home.datasets / "gsm8k" / "v1"
    manifest = json.loads((vdir / "manifest.json").read_text())
    data = (vdir / "data.jsonl").read_bytes()
    assert MANIFEST_KEYS <= manifest.keys()
    assert manifest["count"] == 7473 == data.count(b"\n")
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["importer"] == "gsm8k" and manifest["source"] == str(GSM8K)
    assert manifest["split"]["dev_fraction"] == 0.05
    assert manifest["splits"]["train"] + manifest["splits"]["dev"] == 7473
    assert 0.04 < manifest["splits"]["dev"] / 7473 < 0.06

    again = cli("data", "import", "gsm8k", GSM8K, "--name", "gsm8k")  # same content: no v2
    assert again.code == 0 and again.out.startswith("already imported as gsm8k@v1")
    assert sorted(p.name for p in (home.datasets / "gsm8k").iterdir()) == ["v1"]

    other = cli("data", "import", "gsm8k", GSM8K, "--name", "gsm8k-copy")
    assert other.code == 0
    copy = home.datasets / "gsm8k-copy" / "v1"
    assert (copy / "data.jsonl").read_bytes() == data
    assert json.loads((copy / "manifest.json").read_text())["sha256"] == manifest["sha256"]


def test_splits_are_a_hash_of_the_id_and_never_move(home, tmp_path):
    lines = GSM8K.read_bytes().splitlines(keepends=True)
    small = write(tmp_path / "train.jsonl", *lines[:3000])
    v1 = import_dataset(ImportRequest("gsm8k", str(small), "grow"), home).dataset
    v2 = import_dataset(ImportRequest("gsm8k", str(GSM8K), "grow"), home).dataset
    assert (v1.version, v2.version) == ("v1", "v2")
    assert load_dataset("grow", home).version == "v2"  # latest
    split2 = {t.id: split_of(t.id, 0.05) for t in v2.records}
    assert all(split2[t.id] == split_of(t.id, 0.05) for t in v1.records)
    assert {t.id for t in v1.split("dev")} <= {t.id for t in v2.split("dev")}
    assert {t.id for t in v1.split("train")} <= {t.id for t in v2.split("train")}
    # file order, and train + dev == all
    assert [t.id for t in v2.split("all")] == [t.id for t in v2.records]
    assert len(v2.split("train")) + len(v2.split("dev")) == len(v2.records)
    with pytest.raises(BadInput):
        v2.split("test")


def test_split_rule_is_the_documented_formula():
    for rid in ("gsm8k-train-00000", "a", "g-2"):
        bucket = int(hashlib.sha256(rid.encode()).hexdigest(), 16) % 10000
        assert split_of(rid, 0.05) == ("dev" if bucket < 500 else "train")
    assert split_of("a", 0.0) == "train"


def test_versions_explicit_and_conflicting(cli, home, tmp_path):
    a = write(tmp_path / "a.jsonl", line(record("a")))
    b = write(tmp_path / "b.jsonl", line(record("b")))
    assert cli("data", "import", "record", a, "--name", "n", "--version", "first").code == 0
    r = cli("data", "import", "record", b, "--name", "n", "--version", "first")
    assert r.code == 2 and "n@first already exists with different content" in r.err
    assert cli("data", "import", "record", b, "--name", "n").out.startswith("imported n@v1")
    assert cli("data", "import", "record", a, "--name", "n").out.startswith("already imported as n@first")
    # a different split rule is a different dataset version
    assert cli("data", "import", "record", a, "--name", "n", "--dev-fraction", "0.5").out.startswith("imported n@v2")
    assert cli("data", "import", "record", a, "--name", "../x").code == 2
    assert cli("data", "import", "record", a, "--name", "n", "--dev-fraction", "1.5").code == 2
    assert [m["version"] for m in list_datasets(home)] == ["first", "v1", "v2"]


def test_quarantine_keeps_good_lines_below_the_rate(cli, home, tmp_path):
    good = [line(record(f"r{i}")) for i in range(1000)]
    src = write(tmp_path / "q.jsonl", *good[:500], b'{"id": "bad", "question": ""}\n', *good[500:])
    r = cli("data", "import", "record", src, "--name", "q", "--quarantine")
    assert r.code == 0, r.err  # 1 bad of 1001 lines = 0.0999% <= 0.1%
    vdir = home.datasets / "q" / "v1"
    rejects = [json.loads(x) for x in (vdir / "rejects.jsonl").read_text().splitlines()]
    assert {(x["file"], x["line"], x["field"]) for x in rejects} == {
        (str(src), 501, "question"), (str(src), 501, "steps"), (str(src), 501, "answer")}
    assert all(x["raw"] == '{"id": "bad", "question": ""}' and x["reason"] for x in rejects)
    manifest = json.loads((vdir / "manifest.json").read_text())
    assert manifest["count"] == 1000 and manifest["rejected_lines"] == 1 and manifest["rejects"] == "rejects.jsonl"


def test_quarantine_fails_above_the_rate_and_keeps_nothing(cli, home, tmp_path):
    good = [line(record(f"r{i}")) for i in range(1000)]
    src = write(tmp_path / "q.jsonl", b"[]\n", *good, b"{}\n")
    r = cli("data", "import", "record", src, "--name", "q", "--quarantine")
    assert r.code == 2 and "over --max-reject-rate 0.1000%" in r.err
    assert f"{src}:1: <line>: expected a JSON object, got array" in r.err
    assert leftovers(home) == []
    r = cli("data", "import", "record", src, "--name", "q", "--quarantine", "--max-reject-rate", "0.01")
    assert r.code == 0 and "quarantined 2 bad line(s)" in r.err


def test_failure_while_writing_leaves_nothing(home, tmp_path, monkeypatch):
    def boom(*a):
        raise OSError("disk full")

    monkeypatch.setattr(ds_mod.os, "rename", boom)
    with pytest.raises(TunixRtError, match="disk full"):
        import_dataset(ImportRequest("generic", str(DATA / "generic_format.jsonl"), "g"), home)
    assert leftovers(home) == []


def test_hf_source_needs_the_network_flag(cli, home):
    r = cli("data", "import", "gsm8k", "hf:openai/gsm8k", "--name", "gsm8k")
    assert r.code == 2 and "pass --allow-network" in r.err
    assert leftovers(home) == []
    assert parse_hf_uri("hf:openai/gsm8k") == ("openai/gsm8k", "main", "train")
    assert parse_hf_uri("hf:openai/gsm8k/socratic@test") == ("openai/gsm8k", "socratic", "test")
    with pytest.raises(BadInput):
        parse_hf_uri("hf:gsm8k")


def test_hf_source_loads_through_datasets_from_a_local_folder(cli, home, tmp_path, monkeypatch):
    """The real hub code path, offline: `datasets` resolves OWNER/NAME to a local folder."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "acme" / "gsm8k-mini"
    folder.mkdir(parents=True)
    write(folder / "test.jsonl", *GSM8K.read_bytes().splitlines(keepends=True)[:20])
    r = cli("data", "import", "gsm8k", "hf:acme/gsm8k-mini@test", "--name", "mini", "--allow-network")
    assert r.code == 0, r.err
    ds = load_dataset("mini", home)
    assert len(ds.records) == 20 and ds.records[3].id == "gsm8k-test-00003"
    assert ds.manifest["source"] == "hf:acme/gsm8k-mini@test"
    local = import_dataset(ImportRequest("gsm8k", str(folder / "test.jsonl"), "mini-local"), home).dataset
    assert local.sha256 == ds.sha256  # same rows, same bytes, whichever way they came
    assert (home.root / "cache" / "huggingface").is_dir()  # the hub cache stays in the home


def test_load_dataset_refs(home, tmp_path):
    import_dataset(ImportRequest("traces", str(DATA / "older_trace_format.jsonl"), "old"), home)
    by_name = load_dataset("old", home)
    assert (by_name.name, by_name.version, len(by_name.records)) == ("old", "v1", 5)
    assert by_name.path == home.datasets / "old" / "v1" and by_name.manifest["importer"] == "traces"
    assert load_dataset("old@v1", home).records == by_name.records
    with pytest.raises(BadInput, match="no version 'v9'"):
        load_dataset("old@v9", home)
    with pytest.raises(BadInput, match="no dataset 'nope'"):
        load_dataset("nope", home)
    # a JSONL path is read strictly, in any known format, and split by the same rule
    by_path = load_dataset(str(by_name.path / "data.jsonl"), home)
    assert by_path.records == by_name.records and by_path.sha256 == by_name.sha256
    bad = write(tmp_path / "bad.jsonl", line(record("a")), b"{}\n")
    with pytest.raises(BadInput, match=r"bad.jsonl:2: id: missing"):
        load_dataset(str(bad), home)


def test_load_dataset_detects_a_modified_file(home):
    ds = import_dataset(ImportRequest("generic", str(DATA / "generic_format.jsonl"), "g"), home).dataset
    data = ds.path / "data.jsonl"
    data.write_bytes(data.read_bytes().replace(b'"8"', b'"9"'))
    with pytest.raises(TunixRtError, match="differs from the manifest"):
        load_dataset("g", home)


def test_gsm8k_name_imports_the_vendored_copy(home, capsys):
    ds = load_dataset("gsm8k", home)
    assert (ds.name, ds.version, len(ds.records)) == ("gsm8k", "v1", 7473)
    assert capsys.readouterr().err.count("\n") == 1  # one line says so
    assert load_dataset("gsm8k", home).sha256 == ds.sha256
    assert capsys.readouterr().err == ""
