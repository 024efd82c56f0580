"""The LoRA merge, written once: W += (alpha / r) * B @ A for every adapted projection of an
HF model directory's weights.

Three callers: the driver's `init` (a run's adapter installed as a model of its own), the
JAX generator (an adapter decoded by the JAX engine) and the JAX export (final/merged). The
adapter is PEFT's format, whichever engine wrote it (lora_A [r, in], lora_B [out, r]).
numpy only: merging needs no framework.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tunix_rt.errors import BadInput
from tunix_rt.rundir import ADAPTER_CONFIG, ADAPTER_WEIGHTS

PEFT_PREFIX = "base_model.model."


def merge_lora(model_dir: Path, lora: dict[str, np.ndarray], scale: float) -> dict[str, np.ndarray]:
    """The directory's HF tensors (fp32) with W += scale * B @ A for every adapted projection."""
    from safetensors.numpy import load_file

    base: dict[str, np.ndarray] = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        base.update({k: v.astype(np.float32) for k, v in load_file(str(f)).items()})
    for key in [k for k in lora if k.endswith("lora_A.weight")]:
        name = key[len(PEFT_PREFIX):-len(".lora_A.weight")] + ".weight"
        A, B = lora[key], lora[key.replace("lora_A", "lora_B")]
        base[name] = base[name] + scale * (B @ A)
    return base


def read_adapter(adapter_dir: Path) -> tuple[dict[str, np.ndarray], float]:
    """A PEFT LoRA adapter's tensors (fp32, PEFT's ".default." adapter name dropped) and its
    scale alpha / r. Anything but plain LoRA is refused: rsLoRA scales by alpha / sqrt(r)."""
    from safetensors.numpy import load_file

    adapter_dir = Path(adapter_dir)
    conf_path = adapter_dir / ADAPTER_CONFIG
    if not conf_path.is_file():
        raise BadInput(f"{adapter_dir}: no {ADAPTER_CONFIG} (not a PEFT adapter)")
    conf = json.loads(conf_path.read_text())
    if conf.get("peft_type") != "LORA" or conf.get("use_rslora"):
        raise BadInput(f"{adapter_dir}: only plain LoRA adapters can be merged (got {conf.get('peft_type')})")
    lora = {k.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B."): v.astype(np.float32)
            for k, v in load_file(str(adapter_dir / ADAPTER_WEIGHTS)).items()}
    return lora, float(conf["lora_alpha"]) / float(conf["r"])


def merge_adapter(model_dir: Path, adapter_dir: Path) -> dict[str, np.ndarray]:
    """model_dir's HF tensors with the PEFT LoRA adapter in adapter_dir merged in."""
    lora, scale = read_adapter(adapter_dir)
    return merge_lora(model_dir, lora, scale)
