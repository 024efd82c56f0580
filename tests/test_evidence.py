"""Evidence helpers: the environment snapshot holds real values only, hashes and atomic
writes behave, and the placeholder finder catches every kind of hole."""

from __future__ import annotations

import hashlib
import json
import math
import os

import pytest

from tunix_rt import evidence, files
from tunix_rt.errors import TunixRtError


def test_environment_snapshot_is_complete_and_real(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    monkeypatch.setenv("TPU_NAME", "local")
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://tunix:s3cret@db:5432/tunix")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    snap = evidence.environment_snapshot()
    assert evidence.find_placeholders(snap) == []
    json.dumps(snap, allow_nan=False)  # serialisable as strict JSON
    assert set(evidence.PACKAGES) <= set(snap["packages"])
    assert snap["packages"]["torch"] != "not installed"
    assert snap["cpu"]["cores_logical"] >= 1 and snap["cpu"]["ram_total_bytes"] > 0
    assert snap["gpu"]["count"] == len(snap["gpu"].get("devices", []))
    env = snap["env"]
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=4"
    assert env["TPU_NAME"] == "local"
    assert env["DATABASE_URL"] == "postgresql+psycopg://tunix:***@db:5432/tunix"
    assert "s3cret" not in json.dumps(snap)
    assert "CUDA_VISIBLE_DEVICES" not in env  # set but empty: not reported as ""


def test_missing_package_is_reported_not_null():
    versions = evidence.package_versions(["torch", "surely-not-a-package-xyz"])
    assert versions["surely-not-a-package-xyz"] == "not installed"
    assert versions["torch"][0].isdigit()


def test_git_sha_is_never_empty():
    sha = evidence.git_sha()
    assert sha and evidence.find_placeholders(sha) == []
    if (evidence.repo_root() / ".git").exists():
        assert len(sha.split("+")[0]) == 40


def test_sha256_file_streams(tmp_path):
    p = tmp_path / "x.bin"
    data = os.urandom(3 * 1024 + 7)
    p.write_bytes(data)
    assert files.sha256_file(p, chunk=1024) == hashlib.sha256(data).hexdigest()


def test_write_json_atomic_replaces_and_leaves_no_temp(tmp_path):
    p = tmp_path / "sub" / "a.json"
    files.write_json_atomic(p, {"a": 1})
    files.write_json_atomic(p, {"a": 2, "ü": "ß"})
    assert json.loads(p.read_text(encoding="utf-8")) == {"a": 2, "ü": "ß"}
    assert [x.name for x in p.parent.iterdir()] == ["a.json"]


def test_write_json_atomic_refuses_nan_and_keeps_old_file(tmp_path):
    p = tmp_path / "a.json"
    files.write_json_atomic(p, {"a": 1})
    with pytest.raises(ValueError):
        files.write_json_atomic(p, {"a": math.nan})
    assert json.loads(p.read_text()) == {"a": 1}
    assert [x.name for x in tmp_path.iterdir()] == ["a.json"]


@pytest.mark.parametrize("value", [None, math.nan, math.inf, "", "  ", "TODO", "tbd", "N/A",
                                   "<placeholder>", "Mock", "unknown", "null", "None", "nan", "[TBD]"])
def test_placeholders_found(value):
    tree = {"ok": 1, "deep": [{"x": "fine"}, {"y": value}]}
    assert evidence.find_placeholders(tree) == ["$.deep[1].y"]
    with pytest.raises(TunixRtError, match=r"eval_summary.json: .*\$\.deep\[1\]\.y"):
        evidence.assert_real_values(tree, "eval_summary.json")


@pytest.mark.parametrize("value", [0, 0.0, False, [], {}, "0", "unknown words in a question",
                                   "none of them", "N/A-ish answer 42", 3.5])
def test_real_values_pass(value):
    assert evidence.find_placeholders({"v": value}) == []


def test_allow_patterns_exempt_paths():
    rec = {"reasoning": "", "answer": "", "gold": ""}
    assert evidence.find_placeholders(rec, allow=["$.reasoning", "$.answer"]) == ["$.gold"]
    tree = {"items": [{"a": None}, {"a": None, "b": None}]}
    assert evidence.find_placeholders(tree, allow=["$.items[*].a"]) == ["$.items[1].b"]


# ---------------------------------------------------------------- on real demo output

from demo_support import tiny_demo  # noqa: E402


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return tiny_demo(tmp_path_factory)


def test_demo_evidence_has_no_null_or_placeholder(demo):
    """The DESIGN.md promise, checked file by file on what `tunix-rt demo` wrote."""
    run = demo.run_dir
    state = json.loads((run / "demo.json").read_text())
    tuned = evidence.Path(state["tuned_eval"])
    assert evidence.check_file(run / "run_manifest.json", evidence.RUN_FACTS, evidence.SUCCEEDED_RUN_KEYS) == []
    assert evidence.check_file(run / "environment.json", evidence.ENVIRONMENT_FACTS, ("python", "packages")) == []
    assert evidence.check_eval_evidence(tuned) == []
    assert evidence.check_run_evidence(run, tuned) == []


def test_check_catches_a_hole_in_each_file(demo, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(demo.run_dir, run)
    tuned = run / evidence.Path(json.loads((run / "demo.json").read_text())["tuned_eval"]).relative_to(demo.run_dir)
    env = json.loads((run / "environment.json").read_text())
    env["cpu"]["model"] = "unknown"
    (run / "environment.json").write_text(json.dumps(env))
    lines = (tuned / "predictions.jsonl").read_text().splitlines()
    rec = json.loads(lines[2])
    rec["n_tokens"] = None  # recorded by the program: a hole
    rec["gold"] = None  # the dataset's value, not the program's: not judged here
    del rec["finish_reason"]
    lines[2] = json.dumps(rec)
    (tuned / "predictions.jsonl").write_text("\n".join(lines) + "\n")
    (run / "config.yaml").write_text((run / "config.yaml").read_text().replace("seed: 0", "seed: null"))
    manifest = json.loads((run / "run_manifest.json").read_text())
    manifest["model"]["sha256"] = ""
    (run / "run_manifest.json").write_text(json.dumps(manifest))
    problems = evidence.check_run_evidence(run, tuned)
    assert "environment.json: $.cpu.model" in problems
    assert "predictions.jsonl:3: $.n_tokens" in problems
    assert "predictions.jsonl:3: $.finish_reason missing" in problems
    assert "run_manifest.json: $.model.sha256" in problems
    assert len(problems) == 4, problems  # a user's value (config.yaml's seed) is never judged
