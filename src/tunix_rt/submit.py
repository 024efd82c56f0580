"""Submission packages: one zip that holds a fine-tuned run and the evidence for it.

    tunix-rt submit RUN --out FILE.zip [--merged]
    tunix-rt submit --verify FILE.zip [--expect SHA256]

Layout inside the zip (paths are fixed; README.md inside says how to use them):

    README.md             how to reload the adapter and evaluate it
    REPORT.md, loss.png   the run's report and loss curve
    run_manifest.json, config.yaml, environment.json
    eval/eval_summary.json, eval/predictions.jsonl     the run's latest evaluation
    adapter/...           final/adapter/ (PEFT format, safetensors)
    merged/...            final/merged/ (HF layout), only with --merged
    submission.json       what was packaged, from which run, when, by which tunix-rt
    MANIFEST.sha256       `sha256sum` lines for every other file (`sha256sum -c` works)

Nothing is packaged whose evidence holds nulls or placeholders; the zip is written to a
temp file beside the target and renamed, so a failed packaging leaves no zip behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Annotated, Iterable, Iterator, Optional

import typer

from tunix_rt import evidence, files, rundir
from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.home import Home
from tunix_rt.train import report

MANIFEST = "MANIFEST.sha256"
SUBMISSION_JSON = "submission.json"
# Files every package must hold (the adapter is checked as a folder with weights in it).
REQUIRED = ("README.md", rundir.REPORT, rundir.LOSS_PLOT, rundir.MANIFEST, rundir.CONFIG,
            rundir.ENVIRONMENT, f"{rundir.EVALS}/{rundir.SUMMARY}", f"{rundir.EVALS}/{rundir.PREDICTIONS}",
            f"{rundir.ADAPTER}/{rundir.ADAPTER_CONFIG}", f"{rundir.ADAPTER}/{rundir.ADAPTER_WEIGHTS}", SUBMISSION_JSON)
# Already-compressed or huge binary files are stored, not deflated (deflating 1 GB of fp32
# weights costs a minute and saves ~7%).
STORED_SUFFIXES = (".safetensors", ".png", ".zip")


@dataclass(frozen=True)
class Member:
    """One file of a package: where it comes from and its path inside the zip."""

    source: Path | None
    arcname: str
    data: bytes | None = None


def resolve_run(ref: str | os.PathLike, home: Home | None = None) -> Path:
    """A run directory from a path or a run id under <home>/runs/."""
    from tunix_rt.train.run import resolve_run as resolve

    return resolve(str(ref), home or Home.resolve())


def latest_eval(run_dir: Path) -> Path:
    """The run's newest evaluation (by finished_at in its summary)."""
    evals = [p for p in rundir.Run(run_dir).evals() if (p / rundir.PREDICTIONS).is_file()]
    if not evals:
        raise BadInput(f"{run_dir}: no evaluation yet; run `tunix-rt eval --adapter {run_dir}` first")

    def finished(p: Path) -> str:
        return str(json.loads((p / rundir.SUMMARY).read_text()).get("finished_at", ""))

    return max(evals, key=lambda p: (finished(p), p.name))


def complete_evidence(run_dir: Path, eval_dir: Path, baseline: Path | None) -> None:
    """Write the run's environment.json and REPORT.md when the run has none yet (a run
    trained and evaluated by hand, not by `tunix-rt demo`); a baseline evaluation adds the
    before/after table."""
    evidence.ensure_environment(run_dir)
    if baseline is not None or not (run_dir / rundir.REPORT).is_file():
        report.write_report(run_dir, eval_dir, baseline)


def collect(run_dir: Path, eval_dir: Path, merged: bool) -> list[Member]:
    """Everything that goes into the package, checked for real values first."""
    problems = evidence.check_run_evidence(run_dir, eval_dir)
    if problems:
        raise TunixRtError(f"{run_dir}: evidence is incomplete, not packaging it:\n  "
                           + "\n  ".join(problems))
    members = [Member(run_dir / n, n) for n in
               (rundir.REPORT, rundir.LOSS_PLOT, rundir.MANIFEST, rundir.CONFIG, rundir.ENVIRONMENT)]
    members += [Member(eval_dir / n, f"{rundir.EVALS}/{n}") for n in (rundir.SUMMARY, rundir.PREDICTIONS)]
    members += _tree(rundir.adapter_dir(run_dir), rundir.ADAPTER)
    if merged:
        members += _tree(rundir.merged_dir(run_dir), rundir.MERGED)
    return members


def _tree(src: Path, prefix: str) -> list[Member]:
    if not src.is_dir():
        hint = " (train with merge=true, or merge the adapter first)" if prefix == rundir.MERGED else ""
        raise BadInput(f"{src}: missing{hint}")
    return [Member(p, f"{prefix}/{p.relative_to(src).as_posix()}")
            for p in sorted(src.rglob("*")) if p.is_file()]


def build(run_ref: str | os.PathLike, out: str | os.PathLike, merged: bool = False,
          home: Home | None = None, baseline: str | os.PathLike | None = None) -> Path:
    """Write the package for a run to `out` (atomically) and return its path."""
    run_dir = resolve_run(run_ref, home)
    out = Path(out)
    if out.suffix != ".zip":
        raise BadInput(f"--out {out}: the package must be a .zip file")
    eval_dir = latest_eval(run_dir)
    base_dir = _baseline_dir(baseline) if baseline else None
    complete_evidence(run_dir, eval_dir, base_dir)
    members = collect(run_dir, eval_dir, merged)
    manifest = rundir.Run(run_dir).manifest
    summary = json.loads((eval_dir / rundir.SUMMARY).read_text())
    members.append(Member(None, "README.md", readme(run_dir, manifest, summary, merged).encode()))
    members.append(Member(None, SUBMISSION_JSON, json.dumps(
        submission_info(run_dir, manifest, summary, members, merged), indent=2).encode()))
    _write_zip(out, members)
    verify(out)  # a package we write must pass our own check
    return out


def _baseline_dir(ref: str | os.PathLike) -> Path:
    """An evaluation directory (with eval_summary.json), or a run whose latest one to use."""
    path = Path(ref)
    if (path / rundir.SUMMARY).is_file():
        return path
    if (path / rundir.MANIFEST).is_file():
        return latest_eval(path)
    raise BadInput(f"--baseline {ref}: not an evaluation directory (no eval_summary.json) nor a run")


def submission_info(run_dir: Path, manifest: dict, summary: dict, members: list[Member],
                    merged: bool) -> dict:
    """submission.json: which run, which evaluation, which tool, when."""
    info = {
        "run_id": run_dir.name,
        "created_at": evidence.now_iso(),
        "tunix_rt_git_sha": evidence.git_sha(),
        "model": summary["model"],
        "adapter_of_eval": summary["adapter"],
        "engine": manifest["engine"],
        "eval_metrics": summary["metrics"],
        "eval_dataset": summary["dataset"],
        "merged_included": merged,
        "files": len(members) + 1,
    }
    evidence.assert_real_values(info, SUBMISSION_JSON)
    return info


def _write_zip(out: Path, members: Iterable[Member]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    lines = []
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as zf:
            for m in members:
                lines.append(f"{_add(zf, m)}  {m.arcname}")
            zf.writestr(MANIFEST, "\n".join(lines) + "\n")
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    files.fsync_dir(out.parent)


def _add(zf: zipfile.ZipFile, m: Member) -> str:
    """Add one member, hashing it as it streams in; returns its sha256."""
    method = zipfile.ZIP_STORED if m.arcname.endswith(STORED_SUFFIXES) else zipfile.ZIP_DEFLATED
    if m.data is not None:
        zf.writestr(zipfile.ZipInfo(m.arcname, date_time=(2020, 1, 1, 0, 0, 0)), m.data,
                    compress_type=method)
        return hashlib.sha256(m.data).hexdigest()
    h = hashlib.sha256()
    info = zipfile.ZipInfo.from_file(m.source, m.arcname)
    info.compress_type = method
    with open(m.source, "rb") as src, zf.open(info, "w", force_zip64=True) as dst:
        while block := src.read(1 << 20):
            h.update(block)
            dst.write(block)
    return h.hexdigest()


@dataclass(frozen=True)
class Verified:
    """A package that passed --verify: how many files it lists, and the sha256 of its
    MANIFEST.sha256 (which pins every other file: compare it with the published one)."""

    files: int
    manifest_sha256: str


def verify(path: str | os.PathLike, expect: str | None = None) -> Verified:
    """Check a package without trusting it: every entry a plain file (or an empty folder)
    under a safe relative name, once; MANIFEST.sha256 lists exactly the files there are,
    the required ones among them, with their hashes; `expect`, when given, is the manifest's
    own sha256 (a regenerated manifest passes every other check). Raises TunixRtError naming
    the first bad entry; any read or decompression error is "file altered"."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such file")
    want_manifest = _expected_digest(expect) if expect is not None else None
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as e:  # ValueError: a header zipfile cannot parse
        raise TunixRtError(f"{path}: not a valid zip ({e})") from e
    with zf:
        names = _check_entries(path, zf.infolist())
        if MANIFEST not in names:
            raise TunixRtError(f"{path}: {MANIFEST} missing")
        manifest = _read_manifest(zf)
        digest = hashlib.sha256(manifest).hexdigest()
        if want_manifest is not None and digest != want_manifest:
            raise TunixRtError(f"{path}: {MANIFEST} has sha256 {digest}, expected {want_manifest}: "
                               "not the package that was published")
        listed = _parse_manifest(path, manifest)
        _check_listing(path, names, listed)
        for name, want in listed.items():
            if _member_sha(zf, name) != want:
                raise TunixRtError(f"{path}: {name}: sha256 mismatch (file altered: {name})")
    return Verified(len(listed), digest)


def manifest_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a package's MANIFEST.sha256 (what `--expect` compares); the package is
    trusted here: for one just written by build(), which verified it."""
    with zipfile.ZipFile(path) as zf:
        return hashlib.sha256(_read_manifest(zf)).hexdigest()


def _expected_digest(expect: str) -> str:
    digest = expect.strip().lower()
    if len(digest) != 64 or not set(digest) <= set("0123456789abcdef"):
        raise BadInput(f"--expect {expect!r}: a sha256 is 64 hex digits (the manifest sha256 that "
                       "`submit` and `submit --verify` print)")
    return digest


def _check_entries(path: Path, infos: list[zipfile.ZipInfo]) -> set[str]:
    """The names of the package's files, after refusing any entry that unzip would turn into
    something other than a plain file or an empty folder inside the target directory."""
    seen: set[str] = set()
    for info in infos:
        name = info.filename
        twice = name.casefold() in seen  # equal but for case: one file on macOS and Windows
        problem = (_unsafe_name(info.orig_filename)  # the name as stored: zipfile cuts it at a NUL
                   or _entry_kind_problem(info) or ("listed twice in the zip" if twice else None))
        if problem:
            raise TunixRtError(f"{path}: entry {name!r}: {problem}")
        seen.add(name.casefold())
    return {i.filename for i in infos if not i.is_dir()}


def _unsafe_name(name: str) -> str | None:
    """Why `name` could land outside the folder it is unzipped into (or differ by system)."""
    if not name or "\\" in name or "\0" in name:
        return "a backslash or NUL in its name (a path on some systems, not on others)"
    if name.startswith("/"):
        return "an absolute path"
    if ":" in name:
        return "a ':' in its name (a drive letter, or a stream, on Windows)"
    parts = name.removesuffix("/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "a path with '..', '.' or an empty part"
    return None


def _entry_kind_problem(info: zipfile.ZipInfo) -> str | None:
    """A link, device or fifo (the Unix mode in the external attributes), an encrypted
    entry, or a folder entry that holds bytes."""
    kind = stat.S_IFMT(info.external_attr >> 16)
    if kind == stat.S_IFLNK:
        return "a symbolic link"
    if info.is_dir():
        empty = 2 if info.compress_type == zipfile.ZIP_DEFLATED else 0  # some tools deflate nothing to 2 bytes
        if info.file_size or info.compress_size > empty:
            return "a folder entry carrying data"
        if kind not in (0, stat.S_IFDIR):
            return "a folder name on a file that is not a folder"
        return None
    if kind not in (0, stat.S_IFREG):
        return "not a regular file" if kind != stat.S_IFDIR else "a folder without a trailing '/'"
    if info.flag_bits & 0x1:
        return "encrypted"
    return None


def _check_listing(path: Path, names: set[str], listed: dict[str, str]) -> None:
    """The manifest lists every file in the zip but itself, and no other."""
    for name in REQUIRED:
        if name not in names:
            raise TunixRtError(f"{path}: required file {name} missing")
    for name in sorted(names - set(listed) - {MANIFEST}):
        raise TunixRtError(f"{path}: {name} is not listed in {MANIFEST}")
    for name in listed:
        if name == MANIFEST:  # it cannot hold its own hash
            raise TunixRtError(f"{path}: {MANIFEST} lists itself")
        if name not in names:
            raise TunixRtError(f"{path}: {name} listed in {MANIFEST} but missing")


def _parse_manifest(path: Path, data: bytes) -> dict[str, str]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TunixRtError(f"{path}: {MANIFEST} is not UTF-8 text ({e})") from e
    listed: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not set(digest) <= set("0123456789abcdef") or not name:
            raise TunixRtError(f"{path}: {MANIFEST}:{n}: not a sha256sum line: {line!r}")
        if name in listed:
            raise TunixRtError(f"{path}: {MANIFEST}:{n}: {name} listed twice")
        listed[name] = digest
    return listed


#: a manifest larger than this is not one tunix-rt wrote (about 100 bytes a file)
MAX_MANIFEST_BYTES = 4 << 20


def _read_manifest(zf: zipfile.ZipFile) -> bytes:
    if zf.getinfo(MANIFEST).file_size > MAX_MANIFEST_BYTES:
        raise TunixRtError(f"{zf.filename}: {MANIFEST} is over {MAX_MANIFEST_BYTES >> 20} MiB: not a manifest")
    with _reading(zf, MANIFEST) as f:
        return f.read()


def _member_sha(zf: zipfile.ZipFile, name: str) -> str:
    h = hashlib.sha256()
    with _reading(zf, name) as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def _reading(zf: zipfile.ZipFile, name: str) -> Iterator[IO[bytes]]:
    """A member opened for reading; any error on the way (a CRC mismatch, a broken deflate
    stream, a truncated entry, an unsupported method) means it is not what was packaged."""
    try:
        with zf.open(name) as f:
            yield f
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, RuntimeError, NotImplementedError,
            ValueError) as e:
        raise TunixRtError(f"{zf.filename}: file altered: {name} (unreadable: {e})") from e


def readme(run_dir: Path, manifest: dict, summary: dict, merged: bool) -> str:
    """README.md of the package: what it is and how to reload and evaluate it."""
    model = summary["model"]
    m, ds = summary["metrics"], summary["dataset"]
    lines = [
        f"# tunix-rt submission: run `{run_dir.name}`",
        "",
        f"A LoRA adapter for `{model}` fine-tuned by tunix-rt to answer as "
        "`<reasoning>…</reasoning><answer>…</answer>`, with the evidence of what it learned.",
        "",
        f"Latest evaluation: {ds['name']}@{ds['version']} split `{ds['split']}`, "
        f"n={m['n']}: accuracy {100 * m['accuracy']:.1f}%, format rate "
        f"{100 * m['format_rate']:.1f}% (`eval/eval_summary.json`, per item in "
        "`eval/predictions.jsonl`). REPORT.md has the before/after table and the loss curve.",
        "",
        "## Check the package",
        "",
        "    tunix-rt submit --verify THIS.zip      # or: unzip, then sha256sum -c MANIFEST.sha256",
        "",
        "## Reload the adapter (PEFT)",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM",
        "from peft import PeftModel",
        f"base = AutoModelForCausalLM.from_pretrained(BASE_DIR)  # the `{model}` weights (HF layout)",
        "model = PeftModel.from_pretrained(base, 'adapter')     # this package's adapter/ folder",
        "```",
        "",
        f"`BASE_DIR` is the imported base model: `tunix-rt model import {model}` puts it in "
        f"`$TUNIX_RT_HOME/models/{model}/`. Prompts must use the training template and system "
        "prompt (`config.yaml: system_prompt`); `tunix_rt.render.prompt_ids` builds them.",
        "",
        "## Evaluate it",
        "",
        "    unzip THIS.zip -d submission",
        f"    tunix-rt eval --model {model} --adapter submission/adapter --dataset "
        f"{ds['name']} --split {ds['split']}",
        "",
    ]
    if merged:
        lines += ["## Merged weights", "",
                  "`merged/` is the adapter merged into the base model (HF layout, safetensors): "
                  "`AutoModelForCausalLM.from_pretrained('merged')`, or "
                  f"`tunix-rt eval --model submission/merged --dataset {ds['name']}`.", ""]
    lines += ["## Files", "",
              "- `run_manifest.json`: command, resolved config, engine, devices, package versions, "
              "git sha, dataset and model sha256, seed, timings, status",
              "- `config.yaml`: the resolved training config; `environment.json`: where it ran",
              "- `MANIFEST.sha256`: sha256 of every other file", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- CLI

def submit_command(
    run: Annotated[Optional[str], typer.Argument(help="Run id or run directory to package.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Zip file to write.")] = None,
    merged: Annotated[bool, typer.Option("--merged", help="Include final/merged/ (HF-layout merged weights).")] = False,
    verify_zip: Annotated[Optional[Path], typer.Option("--verify", help="Check a package's entries, hashes and required files instead.")] = None,
    expect: Annotated[Optional[str], typer.Option("--expect", help="With --verify: the published sha256 of the package's MANIFEST.sha256; fail when it differs.")] = None,
    baseline: Annotated[Optional[Path], typer.Option("--baseline", help="A base-model evaluation dir: REPORT.md gets the before/after table.")] = None,
) -> None:
    """Package a run into a verifiable zip (adapter, eval, report, evidence), or --verify one.

    The zip holds MANIFEST.sha256 (sha256sum format) over every other file; --verify
    refuses unsafe entries (paths out of the folder, links, duplicates), checks each hash
    and the required files, and prints the manifest's own sha256: compare it with the
    published one, or pass it as --expect. Exit 1 naming the first bad entry."""
    from rich.console import Console

    console = Console()
    if verify_zip is not None:
        if run or out or merged or baseline:
            raise BadInput("submit --verify FILE.zip takes no RUN, --out, --merged or --baseline")
        done = verify(verify_zip, expect)
        console.print(f"[green]ok[/green] {verify_zip}: {done.files} files, every sha256 matches; "
                      f"manifest sha256 {done.manifest_sha256}" + (" (as expected)" if expect else ""),
                      soft_wrap=True)
        return
    if expect is not None:
        raise BadInput("--expect goes with --verify FILE.zip")
    if not run or out is None:
        raise BadInput("usage: tunix-rt submit RUN --out FILE.zip [--merged] | "
                       "tunix-rt submit --verify FILE.zip [--expect SHA256]")
    path = build(run, out, merged=merged, baseline=baseline)
    size = path.stat().st_size / 1e6
    digest = manifest_sha256(path)
    console.print(f"[green]wrote[/green] {path} ({size:.1f} MB); manifest sha256 {digest} (publish it); "
                  f"check it with `tunix-rt submit --verify {path} --expect {digest}`", soft_wrap=True)
