"""`tunix-rt submit`: a package round-trips through --verify; a tampered, truncated,
extended or incomplete package fails naming the file; bad runs are refused."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile

import pytest

from demo_support import tiny_demo, tunix
from tunix_rt import evidence, submit
from tunix_rt.errors import BadInput, TunixRtError


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return tiny_demo(tmp_path_factory)


@pytest.fixture(scope="module")
def package(demo, tmp_path_factory):
    """The CLI's package of the demo run, then verified by the CLI."""
    out = tmp_path_factory.mktemp("pkg") / "sub.zip"
    tunix(demo.home, "submit", demo.run_dir.name, "--out", str(out))
    return out


def test_round_trip(demo, package):
    done = tunix(demo.home, "submit", "--verify", str(package))
    assert "every sha256 matches" in done.stdout
    with zipfile.ZipFile(package) as zf:
        names = set(zf.namelist())
        assert set(submit.REQUIRED) <= names
        lines = zf.read(submit.MANIFEST).decode().splitlines()
        listed = dict(reversed(line.split("  ", 1)) for line in lines)
        assert set(listed) == names - {submit.MANIFEST}
        for name, digest in listed.items():
            assert hashlib.sha256(zf.read(name)).hexdigest() == digest
        adapter = demo.run_dir / "final" / "adapter" / "adapter_model.safetensors"
        assert zf.read("adapter/adapter_model.safetensors") == adapter.read_bytes()
        readme = zf.read("README.md").decode()
        assert "PeftModel.from_pretrained" in readme and "tunix-rt eval" in readme
        info = json.loads(zf.read(submit.SUBMISSION_JSON))
    assert info["run_id"] == demo.run_dir.name
    assert evidence.find_placeholders(info) == []
    assert not list(package.parent.glob(".*.tmp"))  # the temp file was renamed away


def test_package_evidence_is_real(package, tmp_path):
    """Every evidence file inside the package: no null, no placeholder (DESIGN.md)."""
    with zipfile.ZipFile(package) as zf:
        zf.extractall(tmp_path)
    problems = evidence.check_file(tmp_path / "run_manifest.json", evidence.RUN_FACTS, evidence.SUCCEEDED_RUN_KEYS)
    problems += evidence.check_file(tmp_path / "environment.json", evidence.ENVIRONMENT_FACTS, ("python", "packages"))
    problems += evidence.check_eval_evidence(tmp_path / "eval")
    problems += evidence.find_placeholders(json.loads((tmp_path / submit.SUBMISSION_JSON).read_text()))
    assert problems == []


def _rewrite(src, dst, change):
    """Copy a zip member by member, letting `change(name, data)` alter the bytes."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = change(item.filename, zin.read(item.filename))
            if data is not None:
                zout.writestr(item.filename, data)
        return dst


@pytest.mark.parametrize("victim", ["eval/predictions.jsonl", "adapter/adapter_model.safetensors", "REPORT.md"])
def test_tampered_file_fails_verify_naming_it(package, tmp_path, victim):
    def flip(name, data):
        if name != victim:
            return data
        return data[:-1] + bytes([data[-1] ^ 1])

    bad = _rewrite(package, tmp_path / "bad.zip", flip)
    with pytest.raises(TunixRtError, match=f"{victim}: sha256 mismatch"):
        submit.verify(bad)
    done = tunix(tmp_path / "home", "submit", "--verify", str(bad), check=False)
    assert done.returncode == 1 and victim in done.stderr


def test_missing_required_and_unlisted_files_fail(package, tmp_path):
    missing = _rewrite(package, tmp_path / "m.zip", lambda n, d: None if n == "loss.png" else d)
    with pytest.raises(TunixRtError, match="required file loss.png missing"):
        submit.verify(missing)

    extra = tmp_path / "x.zip"
    shutil.copy(package, extra)
    with zipfile.ZipFile(extra, "a") as zf:
        zf.writestr("adapter/extra.bin", b"sneaked in")
    with pytest.raises(TunixRtError, match="adapter/extra.bin is not listed"):
        submit.verify(extra)

    broken = tmp_path / "b.zip"
    broken.write_bytes(package.read_bytes()[: package.stat().st_size // 2])
    with pytest.raises(TunixRtError, match="not a valid zip"):
        submit.verify(broken)


def test_refuses_run_with_placeholder_evidence(demo, tmp_path):
    run = tmp_path / "runs" / demo.run_dir.name
    shutil.copytree(demo.run_dir, run)
    manifest = json.loads((run / "run_manifest.json").read_text())
    manifest["git_sha"] = "TODO"
    (run / "run_manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "out.zip"
    with pytest.raises(TunixRtError, match=r"run_manifest.json: \$\.git_sha"):
        submit.build(run, out)
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))


def test_bad_usage(demo, tmp_path):
    with pytest.raises(BadInput, match="must be a .zip"):
        submit.build(demo.run_dir, tmp_path / "x.tar")
    with pytest.raises(BadInput, match="final/merged"):
        submit.build(demo.run_dir, tmp_path / "x.zip", merged=True)
    assert not (tmp_path / "x.zip").exists()
    done = tunix(demo.home, "submit", "no-such-run", "--out", str(tmp_path / "y.zip"), check=False)
    assert done.returncode == 2 and "no-such-run" in done.stderr
    done = tunix(demo.home, "submit", check=False)
    assert done.returncode == 2 and "usage" in done.stderr
