"""`tunix-rt submit`: a package round-trips through --verify; a tampered, truncated,
extended or incomplete package fails naming the file; so does a hostile one whose manifest
was regenerated (unsafe names, links, duplicates, data in folder entries), and --expect pins
the manifest itself; bad runs are refused."""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
import struct
import warnings
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


# ----------------------------------------------------------------- hostile packages
# Each is what an attacker hands over: the package's own files plus one hostile entry, with
# MANIFEST.sha256 regenerated over every file entry, so only verify's own checks can catch it.

def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _entry(name: str, mode: int | None = None) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    if mode is not None:
        info.external_attr = mode << 16
    return info


def _repack(src, dst, extra=(), manifest_extra=""):
    """The package's files plus `extra` (ZipInfo, bytes) entries, under a regenerated manifest."""
    with zipfile.ZipFile(src) as zin:
        entries = [(_entry(i.filename), zin.read(i)) for i in zin.infolist() if i.filename != submit.MANIFEST]
    entries += list(extra)
    lines = [f"{_sha(data)}  {info.filename}" for info, data in entries if not info.is_dir()]
    with warnings.catch_warnings(), zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        warnings.simplefilter("ignore", UserWarning)  # zipfile warns of a duplicate name: on purpose
        for info, data in entries:
            zout.writestr(info, data)
        zout.writestr(submit.MANIFEST, "\n".join(lines) + "\n" + manifest_extra)
    return dst


HOSTILE = {
    "dotdot": ([(_entry("../evil.sh"), b"rm -rf ~")], r"a path with '\.\.'"),
    "dotdot-inside": ([(_entry("adapter/../../evil.sh"), b"x")], r"a path with '\.\.'"),
    "absolute": ([(_entry("/tmp/evil.sh"), b"x")], "an absolute path"),
    "backslash": ([(_entry("adapter\\..\\..\\evil.sh"), b"x")], "a backslash"),
    "drive-letter": ([(_entry("C:/Windows/evil.dll"), b"x")], r"a ':' in its name \(a drive letter"),
    "symlink": ([(_entry("adapter/link", stat.S_IFLNK | 0o777), b"/etc/passwd")], "a symbolic link"),
    "fifo": ([(_entry("adapter/pipe", stat.S_IFIFO | 0o644), b"")], "not a regular file"),
    "duplicate": ([(_entry("adapter/adapter_config.json"), b"{}")], "listed twice in the zip"),
    "duplicate-but-case": ([(_entry("Adapter/adapter_config.json"), b"{}")], "listed twice in the zip"),
    "folder-with-data": ([(_entry("adapter/sub/", stat.S_IFDIR | 0o755), b"hidden")], "a folder entry carrying data"),
}


@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_hostile_entries_fail_verify(package, tmp_path, attack):
    """Each attack verified `ok` before (its manifest is regenerated); now verify refuses it,
    naming the entry, and the CLI exits 1 without a traceback."""
    extra, why = HOSTILE[attack]
    bad = _repack(package, tmp_path / "bad.zip", extra)
    with pytest.raises(TunixRtError, match=f"entry .*: {why}"):
        submit.verify(bad)
    done = tunix(tmp_path / "home", "submit", "--verify", str(bad), check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert repr(extra[0][0].filename)[1:-1] in done.stderr, done.stderr


def test_manifest_must_list_exactly_the_files(package, tmp_path):
    ghost = _repack(package, tmp_path / "ghost.zip", manifest_extra=f"{_sha(b'x')}  adapter/ghost.bin\n")
    with pytest.raises(TunixRtError, match="adapter/ghost.bin listed in MANIFEST.sha256 but missing"):
        submit.verify(ghost)
    twice = _repack(package, tmp_path / "twice.zip", manifest_extra=f"{_sha(b'x')}  REPORT.md\n")
    with pytest.raises(TunixRtError, match="REPORT.md listed twice"):
        submit.verify(twice)
    itself = _repack(package, tmp_path / "self.zip", manifest_extra=f"{_sha(b'x')}  {submit.MANIFEST}\n")
    with pytest.raises(TunixRtError, match="lists itself"):
        submit.verify(itself)


def _data_offset(path, name) -> int:
    """Where `name`'s (compressed) bytes start in the zip: after its local header."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(name)
    raw = path.read_bytes()
    n, m = struct.unpack("<HH", raw[info.header_offset + 26: info.header_offset + 30])
    return info.header_offset + 30 + n + m


@pytest.mark.parametrize("victim,patch", [
    ("REPORT.md", lambda b: bytes([0x07]) + b[1:]),  # deflate block type 3 (reserved): zlib.error
    (submit.MANIFEST, lambda b: bytes([0x07]) + b[1:]),
    ("loss.png", lambda b: b[:40] + bytes([b[40] ^ 0xFF]) + b[41:]),  # stored: a CRC-32 mismatch
])
def test_corrupt_member_is_file_altered(package, tmp_path, victim, patch):
    """A flipped byte inside a member's stored data: "file altered: NAME", exit 1, never a
    traceback (a broken deflate stream raised zlib.error through verify before)."""
    raw = bytearray(package.read_bytes())
    at = _data_offset(package, victim)
    raw[at: at + 64] = patch(bytes(raw[at: at + 64]))
    bad = tmp_path / "bad.zip"
    bad.write_bytes(bytes(raw))
    with pytest.raises(TunixRtError, match=f"file altered: {victim}"):
        submit.verify(bad)
    done = tunix(tmp_path / "home", "submit", "--verify", str(bad), check=False)
    assert done.returncode == 1 and f"file altered: {victim}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_manifest_digest_printed_and_expected(demo, package, tmp_path):
    """`submit` and `submit --verify` print the manifest's sha256; --expect fails on another
    one, which catches an edited file under a regenerated manifest (every other check passes)."""
    with zipfile.ZipFile(package) as zf:
        digest = _sha(zf.read(submit.MANIFEST))
    out = tmp_path / "again.zip"
    wrote = tunix(demo.home, "submit", demo.run_dir.name, "--out", str(out))
    assert f"manifest sha256 {submit.manifest_sha256(out)}" in wrote.stdout
    done = tunix(tmp_path / "home", "submit", "--verify", str(package), "--expect", digest.upper())
    assert f"manifest sha256 {digest} (as expected)" in done.stdout

    def edit(name, data):
        return data + b"\nThis adapter reaches 100%.\n" if name == "REPORT.md" else data

    edited = _repack(_rewrite(package, tmp_path / "e.zip", edit), tmp_path / "edited.zip")
    assert submit.verify(edited).manifest_sha256 != digest  # self-consistent: only the digest tells
    with pytest.raises(TunixRtError, match=f"expected {digest}"):
        submit.verify(edited, expect=digest)
    done = tunix(tmp_path / "home", "submit", "--verify", str(edited), "--expect", digest, check=False)
    assert done.returncode == 1 and "not the package that was published" in done.stderr
    for args in (("--verify", str(package), "--expect", "abc"), (demo.run_dir.name, "--out", str(out), "--expect", digest)):
        done = tunix(tmp_path / "home", "submit", *args, check=False)
        assert done.returncode == 2 and "--expect" in done.stderr, done.stderr
