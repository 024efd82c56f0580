"""Files of a run directory, served only from inside it.

A requested path is refused before touching the disk when it is absolute, holds `..`, a
backslash, a NUL, a `%` (an encoded form that survived one decoding: double encoding) or an
empty segment; what remains is joined to the run directory, resolved (following symlinks)
and must still lie inside the resolved run directory, as a regular file."""

from __future__ import annotations

import os
from pathlib import Path

from tunix_rt.errors import BadInput

FORBIDDEN = ("\x00", "\\", "%", ":")
MAX_LISTED = 2000


class Refused(BadInput):
    """A path that may not be served (the API answers 400; 404 when simply absent)."""


def run_root(run_path: str, runs_dir: Path) -> Path:
    """The run directory as recorded, which must itself lie inside <home>/runs."""
    root = Path(run_path).resolve()
    if not root.is_relative_to(runs_dir.resolve()) or not root.is_dir():
        raise Refused("run directory is not inside the home's runs/")
    return root


def resolve_artifact(root: Path, rel: str) -> Path:
    """`root / rel` if it is a regular file inside `root` (see the module docstring)."""
    if not rel or len(rel) > 1024 or any(c in rel for c in FORBIDDEN) or any(ord(c) < 32 for c in rel):
        raise Refused("bad artifact path")
    if rel.startswith("/") or rel.startswith("~"):
        raise Refused("absolute artifact path")
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise Refused("artifact path must be a plain relative path")
    candidate = (root / rel).resolve()
    if not candidate.is_relative_to(root) or candidate == root:
        raise Refused("artifact path leaves the run directory")
    if not candidate.is_file():
        raise FileNotFoundError(rel)
    return candidate


def list_artifacts(root: Path) -> list[tuple[str, int]]:
    """(relative path, size) of the regular files under root, symlinks leaving it skipped."""
    out: list[tuple[str, int]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".tmp"))
        for name in sorted(filenames):
            p = Path(dirpath) / name
            real = p.resolve()
            if real.is_relative_to(root) and real.is_file():
                out.append((p.relative_to(root).as_posix(), real.stat().st_size))
            if len(out) >= MAX_LISTED:
                return out
    return out
