"""Datasets on disk: import a source into `<home>/datasets/<name>/<version>/`, list them,
load them back, and split them.

    <home>/datasets/<name>/<version>/data.jsonl     canonical trace records, one per line
    <home>/datasets/<name>/<version>/manifest.json  name, version, source, importer,
        created_at, count, sha256 (of data.jsonl), split rule, per-split counts, and
        `tools` when the records carry tool calls (["calculator"])
    <home>/datasets/<name>/<version>/rejects.jsonl  only with --quarantine and rejects

data.jsonl is serialised canonically (fields in schema order, meta keys sorted, UTF-8,
"\\n" endings) and holds nothing time-dependent, so importing the same source twice gives
the same bytes and the same sha256; created_at lives only in the manifest.

The split is a pure function of the record id: `sha256(id) mod 10000 < dev_fraction *
10000` → dev. A record never moves between train and dev when the dataset grows. Such a
dataset has no test split. A dataset built from records that carry their own split
(`import_records`, e.g. reasoning-gym tasks drawn from one seed per split) says so in its
split rule (RECORD_SPLIT_METHOD): each record's `meta.split` is train, dev or test.

An import is written to a temp dir beside its version, fsynced, and renamed into place
last (files.atomic_dir): on any error nothing is left behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import tunix_rt
from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.files import atomic_dir
from tunix_rt.home import Home
from tunix_rt.tools import NAMES as TOOL_NAMES
from tunix_rt.traces.importers import FORMATS, get_importer, gsm8k_split_name
from tunix_rt.traces.reader import DEFAULT_MAX_LINE_BYTES, Scan, scan
from tunix_rt.traces.schema import Trace

DEFAULT_DEV_FRACTION = 0.05
DEFAULT_MAX_REJECT_RATE = 0.001
SPLIT_BUCKETS = 10_000
SPLIT_METHOD = "int(sha256(id utf-8).hexdigest(), 16) % 10000 < round(dev_fraction * 10000) -> dev, else train"
SPLITS = ("train", "dev", "test", "all")
RECORD_SPLIT_METHOD = "meta.split of each record (train | dev | test)"
RECORD_SPLITS = ("train", "dev", "test")
DATA, MANIFEST, REJECTS = "data.jsonl", "manifest.json", "rejects.jsonl"
VENDORED_GSM8K = Path(tunix_rt.__file__).resolve().parent / "assets" / "gsm8k" / "train.jsonl"
"""GSM8K's train split (MIT), shipped inside the package so a wheel install has it too."""
VENDORED_NAMES = {"gsm8k": (), "gsm8k-calc": ("calculator",), "gsm8k-python": ("python",)}
"""Names load_dataset imports from the vendored GSM8K split on first use, and the tools the
import keeps (gsm8k-calc: the calculator notes as tool calls, `data import gsm8k --tools calculator`;
gsm8k-python: as python calls, `--tools python`)."""
GSM8K_TOOLS = tuple(t for tools in VENDORED_NAMES.values() for t in tools)
"""The tools `data import gsm8k --tools` writes GSM8K's notes as (one of them): VENDORED_NAMES' own."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_FILE_NAME = re.compile(r"[^/\\\x00]{1,255}")


# ---------------------------------------------------------------------------------------
# Splits and canonical bytes


def split_of(record_id: str, dev_fraction: float) -> str:
    """"train" or "dev", from the id alone (see SPLIT_METHOD)."""
    bucket = int(hashlib.sha256(record_id.encode("utf-8")).hexdigest(), 16) % SPLIT_BUCKETS
    return "dev" if bucket < round(dev_fraction * SPLIT_BUCKETS) else "train"


def split_rule(dev_fraction: float) -> dict[str, Any]:
    return {"method": SPLIT_METHOD, "dev_fraction": dev_fraction, "buckets": SPLIT_BUCKETS}


def split_counts(records: list[Trace], dev_fraction: float) -> dict[str, int]:
    dev = sum(split_of(r.id, dev_fraction) == "dev" for r in records)
    return {"train": len(records) - dev, "dev": dev}


def canonical_bytes(records: list[Trace]) -> bytes:
    """data.jsonl's exact bytes: one canonical JSON object per line."""
    return b"".join(json.dumps(r.to_record(), ensure_ascii=False).encode("utf-8") + b"\n" for r in records)


# ---------------------------------------------------------------------------------------
# The loaded dataset


@dataclass
class Dataset:
    """A dataset version in memory: its manifest and its records in file order."""

    name: str
    version: str
    path: Path  # the version directory, or the JSONL file for a path reference
    manifest: dict[str, Any]
    sha256: str
    records: list[Trace]

    @property
    def dev_fraction(self) -> float:
        return float(self.manifest["split"]["dev_fraction"])

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def split(self, which: str) -> list[Trace]:
        """The records of "train", "dev", "test" (records with their own split only) or "all",
        in file order."""
        if which not in SPLITS:
            raise BadInput(f"unknown split {which!r}; use one of {', '.join(SPLITS)}")
        if which == "all":
            return list(self.records)
        if self.manifest["split"].get("method") == RECORD_SPLIT_METHOD:
            return [r for r in self.records if r.meta.get("split") == which]
        if which not in ("train", "dev"):
            raise BadInput(f"{self.ref} has no {which} split (its records split by id hash: train, dev)")
        return [r for r in self.records if split_of(r.id, self.dev_fraction) == which]


def _read_manifest(vdir: Path) -> dict[str, Any]:
    try:
        return json.loads((vdir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TunixRtError(f"{vdir / MANIFEST}: unreadable manifest ({e})") from None


def open_version(vdir: Path) -> Dataset:
    """Load a dataset directory, checking data.jsonl against the manifest's sha256."""
    manifest = _read_manifest(vdir)
    data = (vdir / DATA).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != manifest.get("sha256"):
        raise TunixRtError(f"{vdir / DATA}: sha256 {digest[:12]}… differs from the manifest's; the file changed after import")
    result = scan(vdir / DATA, "pairs" if manifest.get("importer") == "pairs" else "record")
    result.raise_if_bad("the dataset is corrupt")
    return Dataset(manifest["name"], manifest["version"], vdir, manifest, digest, result.records)


def _from_file(path: Path) -> Dataset:
    """A JSONL path used directly as a dataset: read strictly, split by the default rule."""
    from tunix_rt.traces.pairs import PairImporter, looks_like_pairs

    result = scan(path, PairImporter() if looks_like_pairs(path) else "auto")  # pairs: method=dpo
    result.raise_if_bad("nothing read")
    data = canonical_bytes(result.records)
    manifest = _manifest(path.stem, "file", str(path.resolve()), result, hashlib.sha256(data).hexdigest(),
                         DEFAULT_DEV_FRACTION, created_at=None)
    return Dataset(path.stem, "file", path, manifest, manifest["sha256"], result.records)


# ---------------------------------------------------------------------------------------
# Versions


def _version_key(version: str) -> tuple:
    """Natural order: v2 < v10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", version))


def list_versions(home: Home, name: str) -> list[dict[str, Any]]:
    """Manifests of a dataset's versions, oldest first (created_at, then version)."""
    root = home.datasets / name
    if not root.is_dir():
        return []
    found = [_read_manifest(d) for d in root.iterdir() if (d / MANIFEST).is_file() and not d.name.startswith(".")]
    return sorted(found, key=lambda m: (m.get("created_at") or "", _version_key(m["version"])))


def list_datasets(home: Home) -> list[dict[str, Any]]:
    """Every dataset version's manifest, by name then age."""
    if not home.datasets.is_dir():
        return []
    return [m for d in sorted(home.datasets.iterdir()) if not d.name.startswith(".") for m in list_versions(home, d.name)]


def _next_version(existing: list[dict[str, Any]]) -> str:
    numbers = [int(m["version"][1:]) for m in existing if re.fullmatch(r"v\d+", m["version"])]
    return f"v{max(numbers, default=0) + 1}"


def load_dataset(ref: str, home: Home | None = None) -> Dataset:
    """NAME (latest version), NAME@VERSION, or a path to a JSONL file (any known format,
    read strictly). The names of VENDORED_NAMES (gsm8k, gsm8k-calc, gsm8k-python) import the vendored GSM8K
    train split on first use."""
    home = home or Home.resolve()
    if ref.endswith(".jsonl") or os.sep in ref:
        return _from_file(Path(ref))
    name, _, version = ref.partition("@")
    versions = list_versions(home, name)
    if not versions and name in VENDORED_NAMES and version in ("", "v1"):
        return _import_vendored_gsm8k(home, name)
    if not versions:
        known = ", ".join(sorted({m["name"] for m in list_datasets(home)})) or "none"
        raise BadInput(f"no dataset {name!r} under {home.datasets} (known: {known}); run `tunix-rt data import`")
    if not version:
        version = versions[-1]["version"]
    if version not in {m["version"] for m in versions}:
        raise BadInput(f"{name} has no version {version!r} (known: {', '.join(m['version'] for m in versions)})")
    return open_version(home.datasets / name / version)


def _import_vendored_gsm8k(home: Home, name: str = "gsm8k") -> Dataset:
    if not VENDORED_GSM8K.is_file():
        raise BadInput(f"dataset {name} is not imported and the vendored copy is missing ({VENDORED_GSM8K})")
    tools = VENDORED_NAMES[name]
    print(f"importing the vendored GSM8K train split from {VENDORED_GSM8K} as {name}@v1"
          + (f" (--tools {','.join(tools)})" if tools else ""), file=sys.stderr)
    return import_dataset(ImportRequest("gsm8k", str(VENDORED_GSM8K), name, version="v1", tools=tools), home).dataset


# ---------------------------------------------------------------------------------------
# Import


@dataclass(frozen=True)
class ImportRequest:
    """Everything `data import` needs; defaults live here and nowhere else."""

    fmt: str
    """Input format: record | gsm8k | traces | generic."""
    source: str
    """A local JSONL path, or hf:OWNER/NAME[/CONFIG][@SPLIT] (needs allow_network)."""
    name: str
    version: str | None = None
    """None: reuse a version with identical content, else the next free vN."""
    dev_fraction: float = DEFAULT_DEV_FRACTION
    quarantine: bool = False
    """Keep going past bad lines (written to rejects.jsonl) up to max_reject_rate."""
    max_reject_rate: float = DEFAULT_MAX_REJECT_RATE
    """Bad lines / all lines above which a quarantined import still fails."""
    allow_network: bool = False
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    source_name: str | None = None
    """The file's own name when `source` is a stored copy of it (an API upload is kept as
    uploads/<sha256>.jsonl): GSM8K ids take their split part from this name, as they do from
    the path's name otherwise, so an upload and `data import` of one file give the same ids."""
    tools: tuple[str, ...] = ()
    """("calculator",): GSM8K's calculator notes stay in the steps as tool calls; ("python",):
    they become python calls (importers.GSM8KImporter)."""

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise BadInput(f"unknown format {self.fmt!r}; known: {', '.join(FORMATS)}")
        if self.tools and (self.fmt != "gsm8k" or len(self.tools) != 1 or self.tools[0] not in GSM8K_TOOLS):
            raise BadInput(f"--tools {','.join(self.tools)}: one of {', '.join(map(repr, GSM8K_TOOLS))}, and only for "
                           "gsm8k (other formats keep their tool calls as written)")
        check_names(self.name, self.version)
        if not 0.0 <= self.dev_fraction < 1.0:
            raise BadInput(f"--dev-fraction {self.dev_fraction}: must be in [0, 1)")
        if not 0.0 <= self.max_reject_rate <= 1.0:
            raise BadInput(f"--max-reject-rate {self.max_reject_rate}: must be in [0, 1]")
        if self.max_line_bytes < 1:
            raise BadInput("max_line_bytes must be positive")
        if self.source_name is not None and not _FILE_NAME.fullmatch(self.source_name):
            raise BadInput(f"source name {self.source_name!r}: a bare file name (no path), 1-255 characters")


def check_names(name: str, version: str | None) -> None:
    """A dataset name and version (None: the next one) usable as directory names."""
    for what, value in (("--name", name), ("--version", version)):
        if value is not None and not _NAME.fullmatch(value):
            raise BadInput(f"{what} {value!r}: use letters, digits, '.', '_' or '-' (not starting with '.' or '-')")


@dataclass
class ImportResult:
    dataset: Dataset
    reused: bool
    """True when identical content already existed as this (or the only) version."""
    rejected_lines: int = 0
    errors: list = field(default_factory=list)


def parse_hf_uri(uri: str) -> tuple[str, str | None, str]:
    """hf:OWNER/NAME[/CONFIG][@SPLIT] → (repo, config, split); openai/gsm8k defaults to
    config "main", every repo to split "train"."""
    body, _, split = uri[len("hf:"):].partition("@")
    parts = body.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise BadInput(f"{uri}: expected hf:OWNER/NAME[/CONFIG][@SPLIT], e.g. hf:openai/gsm8k")
    repo = "/".join(parts[:2])
    config = parts[2] if len(parts) == 3 else ("main" if repo == "openai/gsm8k" else None)
    return repo, config, split or "train"


def fetch_hf(uri: str, dest: Path, cache_dir: Path) -> str:
    """Download a hub dataset split into a JSONL file (one row per line); returns the split.
    Network access only behind --allow-network; tests point it at a local dataset folder
    (the `datasets` library resolves OWNER/NAME to a local directory first)."""
    repo, config, split = parse_hf_uri(uri)
    try:
        from datasets import load_dataset as hf_load_dataset  # heavy, and only here
    except ImportError:
        raise BadInput(f"{uri}: needs the `datasets` package (pip install 'tunix-rt[hub]')") from None
    try:
        rows = hf_load_dataset(repo, config, split=split, cache_dir=str(cache_dir))
    except Exception as e:  # network, auth, unknown repo/config/split: all end the import here
        raise TunixRtError(f"{uri}: could not load {repo} (config {config}, split {split}): {e}") from None
    with dest.open("wb") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False).encode("utf-8") + b"\n")
    return split


def _resolve_source(req: ImportRequest, home: Home, staging: Path) -> tuple[Path, str, str]:
    """(file to read, FILE label for messages, GSM8K split name)."""
    if req.source.startswith("hf:"):
        if not req.allow_network:
            raise BadInput(
                f"{req.source} downloads from the Hugging Face hub; pass --allow-network to allow it "
                f"(offline, import the vendored copy: tunix-rt data import gsm8k {VENDORED_GSM8K} --name gsm8k)"
            )
        parse_hf_uri(req.source)
        dest = staging / "source.jsonl"
        split = fetch_hf(req.source, dest, home.root / "cache" / "huggingface")
        return dest, req.source, gsm8k_split_name(split)
    path = Path(req.source)
    if not path.is_file():
        raise BadInput(f"{req.source}: no such file")
    return path, req.source, gsm8k_split_name(Path(req.source_name or path.name).stem)


def _manifest(name: str, version: str, source: str, result: Scan, digest: str, dev_fraction: float,
              created_at: str | None) -> dict[str, Any]:
    return {
        "name": name,
        "version": version,
        "source": source,
        "importer": result.format,
        "created_at": created_at,
        "count": len(result.records),
        "sha256": digest,
        "split": split_rule(dev_fraction),
        "splits": split_counts(result.records, dev_fraction),
        "input_lines": result.n_lines,
        "rejected_lines": result.bad_lines,
        "tunix_rt_version": tunix_rt.__version__,
    }


def _check_rejects(req: ImportRequest, result: Scan) -> None:
    """Fail-fast by default; with quarantine, fail only above the reject rate."""
    if not result.errors:
        return
    if not req.quarantine:
        raise BadInput(result.message("nothing imported (--quarantine keeps the good lines)"))
    rate = result.bad_lines / max(result.n_lines, 1)
    if not result.records or rate > req.max_reject_rate:
        raise BadInput(result.message(
            f"reject rate {rate:.4%} is over --max-reject-rate {req.max_reject_rate:.4%}; nothing imported"
        ))


def _write_file(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _rejects_bytes(result: Scan) -> bytes:
    rows = (
        {"file": e.file, "line": e.line, "field": e.field, "reason": e.reason,
         "raw": e.raw.decode("utf-8", errors="backslashreplace")}
        for e in result.errors
    )
    return b"".join(json.dumps(r, ensure_ascii=False).encode("utf-8") + b"\n" for r in rows)


def _reusable(version: str | None, existing: list[dict[str, Any]], digest: str,
              same_split: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    """An existing version with the same bytes and split rule, if this request may reuse it."""
    for m in existing:
        same = m.get("sha256") == digest and same_split(m.get("split", {}))
        if same and version in (None, m["version"]):
            return m
    return None


def import_dataset(req: ImportRequest, home: Home | None = None,
                   on_progress: Callable[[int], None] | None = None) -> ImportResult:
    """Read, validate and store a dataset version; see the module docstring. A downloaded
    source is staged in a temp dir beside the datasets, removed on the way out whatever
    happens; the version itself is published by _commit."""
    home = (home or Home.resolve()).ensure()
    with _staging(home, req.name) as staging:
        return _store(req, home, _read_source(req, home, staging, on_progress), staging)


@contextmanager
def _staging(home: Home, name: str) -> Iterator[Path]:
    """A hidden temp dir beside the datasets for one import, removed on the way out whatever
    happens (and the dataset's own dir with it when the import left it empty)."""
    root = home.datasets / name
    staging = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=home.datasets))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if root.is_dir() and not any(root.iterdir()):
            root.rmdir()


def import_records(records: list[Trace], name: str, version: str | None, source: str, importer: str,
                   extra: dict[str, Any], home: Home | None = None) -> ImportResult:
    """Store records that carry their own split (meta.split: train | dev | test) as a dataset
    version, the way import_dataset stores a file's (same versions, reuse of identical
    content, atomic publish). `extra` goes into the manifest (what the importer drew, how)."""
    check_names(name, version)
    if bad := [r.id for r in records if r.meta.get("split") not in RECORD_SPLITS]:
        raise BadInput(f"record {bad[0]}: meta.split must be one of {', '.join(RECORD_SPLITS)}")
    rule = {"method": RECORD_SPLIT_METHOD}
    counts = {s: sum(r.meta["split"] == s for r in records) for s in RECORD_SPLITS}

    def manifest_of(version: str, digest: str, created: str) -> dict[str, Any]:
        return {"name": name, "version": version, "source": source, "importer": importer, "created_at": created,
                "count": len(records), "sha256": digest, "split": rule, "splits": counts,
                "input_lines": len(records), "rejected_lines": 0, "tunix_rt_version": tunix_rt.__version__, **extra}

    home = (home or Home.resolve()).ensure()
    with _staging(home, name) as staging:
        ds, reused = _publish(home, name, version, records, staging, manifest_of, lambda r: r == rule, {})
    return ImportResult(ds, reused)


def _read_source(req: ImportRequest, home: Home, staging: Path,
                 on_progress: Callable[[int], None] | None) -> Scan:
    src, label, split = _resolve_source(req, home, staging)
    result = scan(src, get_importer(req.fmt, split, req.tools), label=label, max_line_bytes=req.max_line_bytes,
                  on_progress=on_progress)
    _check_rejects(req, result)
    (staging / "source.jsonl").unlink(missing_ok=True)  # a downloaded hf: source
    return result


def _store(req: ImportRequest, home: Home, result: Scan, staging: Path) -> ImportResult:
    """Reuse an identical version, or publish a new one."""
    source = req.source if req.source.startswith("hf:") else str(Path(req.source).resolve())
    rejects = {REJECTS: _rejects_bytes(result)} if req.quarantine and result.errors else {}

    def manifest_of(version: str, digest: str, created: str) -> dict[str, Any]:
        manifest = _manifest(req.name, version, source, result, digest, req.dev_fraction, created)
        if tools := [t for t in TOOL_NAMES if any(t in r.tools() for r in result.records if isinstance(r, Trace))]:
            manifest["tools"] = tools  # the records carry calls of these tools (tunix_rt.tools)
        return {**manifest, "rejects": REJECTS} if rejects else manifest

    ds, reused = _publish(home, req.name, req.version, result.records, staging, manifest_of,
                          lambda rule: rule.get("dev_fraction") == req.dev_fraction, rejects)
    return ImportResult(ds, reused, result.bad_lines, result.errors)


def _publish(home: Home, name: str, version: str | None, records: list[Trace], staging: Path,
             manifest_of: Callable[[str, str, str], dict[str, Any]],
             same_split: Callable[[dict[str, Any]], bool], extra_files: dict[str, bytes]) -> tuple[Dataset, bool]:
    """(the dataset, reused): an existing version with identical content and split rule, or a
    new one (`version`, else the next vN) published by _commit."""
    root = home.datasets / name
    data = canonical_bytes(records)
    digest = hashlib.sha256(data).hexdigest()
    existing = list_versions(home, name)
    if (same := _reusable(version, existing, digest, same_split)) is not None:  # same bytes: same records
        return Dataset(name, same["version"], root / same["version"], same, digest, records), True
    version = version or _next_version(existing)
    if (root / version).exists():
        raise BadInput(f"{name}@{version} already exists with different content; choose another --version")
    created = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    manifest = manifest_of(version, digest, created)
    files = {DATA: data, **extra_files,
             MANIFEST: (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8")}
    _commit(root / version, files, staging)
    return Dataset(name, version, root / version, manifest, digest, records), False


def _commit(target: Path, files: dict[str, bytes], staging: Path) -> None:
    """Publish the version directory with its files (files.atomic_dir: every file fsynced,
    then one rename, never over a version another import took meanwhile). It is built inside
    this import's staging dir, so an import killed mid-write leaves nothing beside the
    dataset's versions (only its hidden staging dir, never listed as a version)."""
    def write(tmp: Path) -> None:
        for name, data in files.items():
            _write_file(tmp / name, data)

    try:
        atomic_dir(target, write, tmp_name="version", tmp_parent=staging, replace=False)
    except OSError as e:  # e.g. another import took this version meanwhile
        raise TunixRtError(f"{target}: could not move the dataset into place ({e}); nothing imported") from None
