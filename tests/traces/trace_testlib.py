"""Plain helpers for the trace tests (a uniquely named module: importable from the test
files of this directory without clashing with other test directories)."""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
GSM8K = Path(__file__).resolve().parents[2] / "src" / "tunix_rt" / "assets" / "gsm8k" / "train.jsonl"
DROP = object()  # record(question=DROP) removes the field


def record(rid: str = "r1", **over) -> dict:
    """A valid trace record, with fields overridden."""
    rec = {"id": rid, "question": f"What is {rid}?", "steps": ["Think.", "Done."], "answer": "7"}
    rec.update(over)
    return {k: v for k, v in rec.items() if v is not DROP}


def line(obj) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def write(path: Path, *lines: bytes) -> Path:
    path.write_bytes(b"".join(lines))
    return path


def leftovers(home) -> list[str]:
    """Everything under <home>/datasets (empty after a failed import)."""
    return sorted(str(p.relative_to(home.datasets)) for p in home.datasets.rglob("*"))
