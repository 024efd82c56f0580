"""Where a model's files lie: its folder in the home, the model manifest's file name, and the
tiny models' tokenizer asset. The floor of models/: the store, the importer and the tiny
builder all read these names here."""

from __future__ import annotations

from pathlib import Path

from tunix_rt.files import MODEL_MANIFEST
from tunix_rt.home import Home

__all__ = ["MODEL_MANIFEST", "TINY_TOKENIZER", "installed_dir"]

TINY_TOKENIZER = Path(__file__).resolve().parents[1] / "assets" / "tiny_tokenizer.json"


def installed_dir(name: str, home: Home) -> Path:
    return home.models / name
