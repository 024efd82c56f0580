"""Loading an HF-layout model directory with transformers, and reading its facts.

Safetensors only (`use_safetensors=True`), never remote code: a model directory in the
home is data, not a program.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.home import Home
from tunix_rt.devices import TORCH
from tunix_rt.models.auto import auto_causal_lm
from tunix_rt.models.catalog import PRESETS
from tunix_rt.models.store import MODEL_MANIFEST, ensure_model

DTYPES = ("fp32", "bf16")
DEVICES = TORCH  # the torch engine's devices (tunix_rt.devices)
ATTENTION = ("eager", "sdpa")


def resolve_dir(model: str | Path, home: Home | None = None) -> Path:
    """A model directory, or a catalog name resolved (and imported when offline-able)."""
    path = Path(model)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise BadInput(f"{path}: not an HF-layout model directory (no config.json)")
        return path
    if str(model) not in PRESETS and (path.is_absolute() or len(path.parts) > 1):
        raise BadInput(f"{path}: no such model directory")
    return ensure_model(str(model), home)


def load_causal_lm(
    model_dir: str | Path,
    dtype: str = "fp32",
    device: str = "cpu",
    attn: str = "eager",
    home: Home | None = None,
):
    """The transformers causal LM of a model dir (or catalog name), in eval mode.

    fp32 is the default because CPUs here have no fast bf16; eager attention is the
    reference Gemma 3 implementation (its sliding window and soft-capping are exact there),
    sdpa is the faster choice on CUDA."""
    _check_choice("dtype", dtype, DTYPES)
    _check_choice("device", device, DEVICES)
    _check_choice("attn", attn, ATTENTION)
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise TunixRtError("device cuda requested but torch sees no CUDA device")
    path = resolve_dir(model_dir, home)
    if not list(path.glob("*.safetensors")):
        raise BadInput(f"{path}: no *.safetensors weights")
    model = auto_causal_lm().from_pretrained(
        path,
        dtype=torch.float32 if dtype == "fp32" else torch.bfloat16,
        use_safetensors=True,
        trust_remote_code=False,
        attn_implementation=attn,
    )
    return model.to(device).eval()


def model_facts(model_dir: str | Path) -> dict[str, Any]:
    """What a run manifest or `model list` needs to say about a model dir, read from its
    config.json and model manifest (no weights are loaded)."""
    from tunix_rt.models.importer import read_manifest, safetensors_param_count

    path = Path(model_dir)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise BadInput(f"{path}: not an HF-layout model directory (no config.json)")
    config = json.loads(config_path.read_text())
    text = config.get("text_config", config)  # multimodal Gemma 3 nests the text model
    manifest = read_manifest(path)
    preset = manifest.get("preset")
    params = manifest.get("param_count")
    return {
        "name": manifest.get("name", path.name),
        "path": str(path.resolve()),
        "preset": preset,
        "family": manifest.get("family") or (PRESETS[preset].family if preset in PRESETS else None),
        "model_type": text.get("model_type"),
        "param_count": params if params is not None else safetensors_param_count(path),
        "dtype": manifest.get("dtype") or config.get("dtype") or config.get("torch_dtype"),
        "vocab_size": text.get("vocab_size"),
        "hidden_size": text.get("hidden_size"),
        "num_layers": text.get("num_hidden_layers"),
        "tied_embeddings": text.get("tie_word_embeddings", config.get("tie_word_embeddings", True)),
        "source": manifest.get("source", {"kind": "unregistered-dir", "path": str(path.resolve())}),
        "files": manifest.get("files", {}),
    }


def _check_choice(what: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise BadInput(f"{what} must be one of {', '.join(allowed)}, not {value!r}")
