"""Tiny random models of the real architectures, for tests: built from the catalog's HF
config, seeded, saved by transformers as an HF-layout safetensors directory with the
project's tiny tokenizer. Both engines load them exactly as they load a real checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tunix_rt.models.catalog import Preset
from tunix_rt.models.layout import TINY_TOKENIZER


def hf_config(preset: Preset):
    """The transformers config object of a preset."""
    from transformers import AutoConfig

    cfg = {k: v for k, v in preset.hf_config.items() if not k.startswith("_")}
    model_type = cfg.pop("model_type")
    cfg.pop("architectures", None)
    return AutoConfig.for_model(model_type, **cfg)


def build_tiny(preset: Preset, out: Path, seed: int = 0) -> Path:
    """Write a random-weight model of the preset's shape into `out` (fp32 safetensors)."""
    import torch

    from tunix_rt.models.auto import auto_causal_lm

    torch.manual_seed(seed)
    model = auto_causal_lm().from_config(hf_config(preset), dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    shutil.copyfile(TINY_TOKENIZER, out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "add_bos_token": False, "add_eos_token": False,
    }, indent=2))
    return out
