"""Submission packages: one zip that holds a fine-tuned run and the evidence for it.

    tunix-rt submit RUN --out FILE.zip [--merged]
    tunix-rt submit --verify FILE.zip

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

import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Iterable, Optional

import typer

from tunix_rt import evidence, files, rundir
from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.home import Home

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
        evidence.write_report(run_dir, eval_dir, baseline)


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


def verify(path: str | os.PathLike) -> int:
    """Check every hash in MANIFEST.sha256, that no file is unlisted and that the required
    files exist. Returns the number of files checked; raises TunixRtError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such file")
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile as e:
        raise TunixRtError(f"{path}: not a valid zip ({e})") from e
    with zf:
        names = {i.filename for i in zf.infolist() if not i.is_dir()}
        if MANIFEST not in names:
            raise TunixRtError(f"{path}: {MANIFEST} missing")
        listed = _parse_manifest(path, zf.read(MANIFEST).decode("utf-8"))
        for name in REQUIRED:
            if name not in names:
                raise TunixRtError(f"{path}: required file {name} missing")
        for name in sorted(names - set(listed) - {MANIFEST}):
            raise TunixRtError(f"{path}: {name} is not listed in {MANIFEST}")
        for name, want in listed.items():
            if name not in names:
                raise TunixRtError(f"{path}: {name} listed in {MANIFEST} but missing")
            if _member_sha(zf, name) != want:
                raise TunixRtError(f"{path}: {name}: sha256 mismatch (file altered)")
    return len(listed)


def _parse_manifest(path: Path, text: str) -> dict[str, str]:
    listed = {}
    for n, line in enumerate(text.splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name:
            raise TunixRtError(f"{path}: {MANIFEST}:{n}: not a sha256sum line: {line!r}")
        listed[name] = digest
    return listed


def _member_sha(zf: zipfile.ZipFile, name: str) -> str:
    h = hashlib.sha256()
    try:
        with zf.open(name) as f:
            while block := f.read(1 << 20):
                h.update(block)
    except (zipfile.BadZipFile, OSError) as e:  # a CRC error is tampering too
        raise TunixRtError(f"{zf.filename}: {name}: unreadable ({e})") from e
    return h.hexdigest()


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
    verify_zip: Annotated[Optional[Path], typer.Option("--verify", help="Check a package's hashes and required files instead.")] = None,
    baseline: Annotated[Optional[Path], typer.Option("--baseline", help="A base-model evaluation dir: REPORT.md gets the before/after table.")] = None,
) -> None:
    """Package a run into a verifiable zip (adapter, eval, report, evidence), or --verify one.

    The zip holds MANIFEST.sha256 (sha256sum format) over every other file; --verify
    checks each hash and the required files, exit 1 naming the first bad file."""
    from rich.console import Console

    console = Console()
    if verify_zip is not None:
        if run or out or merged or baseline:
            raise BadInput("submit --verify FILE.zip takes no RUN, --out, --merged or --baseline")
        n = verify(verify_zip)
        console.print(f"[green]ok[/green] {verify_zip}: {n} files, every sha256 matches")
        return
    if not run or out is None:
        raise BadInput("usage: tunix-rt submit RUN --out FILE.zip [--merged] | tunix-rt submit --verify FILE.zip")
    path = build(run, out, merged=merged, baseline=baseline)
    size = path.stat().st_size / 1e6
    console.print(f"[green]wrote[/green] {path} ({size:.1f} MB); check it with "
                  f"`tunix-rt submit --verify {path}`")
