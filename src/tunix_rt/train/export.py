"""What a run leaves in final/: a PEFT-format LoRA adapter (final/adapter/) and an HF-layout
merged model (final/merged/), for both engines.

Every directory is built in a temp dir and renamed into place (files.atomic_dir) by
`publish`, after the fence says this process still owns the run. The torch engine writes
through PEFT's and transformers' own save_pretrained; the JAX engine converts qwix LoRA
factors and Tunix parameters to the same names and layouts (`lora_tensors`, `export_adapter`,
`export_merged`), so eval, serving and transformers load either the same way.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tunix_rt import fence
from tunix_rt.errors import TunixRtError
from tunix_rt.files import atomic_dir

#: files of a model dir an exported HF dir carries along
MODEL_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                    "special_tokens_map.json")


def publish(target: Path, write: Callable[[Path], Any]) -> Path:
    """Write a final/ directory atomically; it is renamed into place only once the fence
    confirms this process still owns the run. Temp dirs of dead writers are removed, a live
    writer's are left alone."""
    import shutil as _shutil

    target.parent.mkdir(parents=True, exist_ok=True)
    for p in target.parent.glob(f"{fence.TMP_PREFIX}{target.name}{fence.SEP}*"):
        if fence.may_delete(p.name):
            _shutil.rmtree(p, ignore_errors=True)
    return atomic_dir(target, write, tmp_name=fence.tmp_name(target.name),
                      before_publish=lambda: fence.guard(f"export {target}"))


def save_hf(model, model_dir: Path, target: Path, state_dict: dict | None = None) -> None:
    """A transformers model saved as safetensors, with the model dir's config/tokenizer files
    (`state_dict`: its weights gathered elsewhere, as from FSDP2 shards)."""
    model.save_pretrained(target, safe_serialization=True, state_dict=state_dict)
    copy_side_files(model_dir, target)


def copy_side_files(model_dir: Path, target: Path) -> None:
    for name in MODEL_SIDE_FILES:
        if (Path(model_dir) / name).is_file() and not (target / name).is_file():
            shutil.copyfile(Path(model_dir) / name, target / name)


# --------------------------------------------------------------------------- JAX (qwix/Tunix)

def lora_tensors(model) -> dict[str, np.ndarray]:
    """The trained LoRA weights in PEFT names and HF layout (lora_A [r, in], lora_B [out, r])."""
    from flax import nnx

    out: dict[str, np.ndarray] = {}
    for path, mod in nnx.iter_modules(model):
        names = [str(p) for p in path]
        if len(names) < 4 or names[0] != "layers":
            continue
        i, kind = names[1], names[-1]
        pairs = _lora_pairs(mod)
        if not pairs:
            continue
        a, b = pairs
        out.update(_to_peft(i, kind, np.asarray(a, np.float32), np.asarray(b, np.float32)))
    if not out:
        raise TunixRtError("no LoRA weights found in the trained model")
    return out


def _lora_pairs(mod):
    for w in ("w", "kernel"):
        a, b = getattr(mod, f"{w}_lora_a", None), getattr(mod, f"{w}_lora_b", None)
        if a is not None and b is not None:
            return a[...], b[...]
    return None


def _to_peft(i: str, kind: str, a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """qwix LoRA factors of one Tunix module → PEFT tensors of the HF projections it holds."""
    pre = f"base_model.model.model.layers.{i}"
    r = a.shape[-1] if kind != "attn_vec_einsum" else b.shape[0]

    def pair(proj, A, B):
        sub = "self_attn" if proj.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
        return {f"{pre}.{sub}.{proj}.lora_A.weight": np.ascontiguousarray(A),
                f"{pre}.{sub}.{proj}.lora_B.weight": np.ascontiguousarray(B)}

    if kind == "q_einsum":  # a [D, r], b [r, N, H]
        return pair("q_proj", a.T, b.reshape(r, -1).T)
    if kind == "kv_einsum":  # a [D, r], b [r, 2, K, H]: k and v share A
        return {**pair("k_proj", a.T, b[:, 0].reshape(r, -1).T), **pair("v_proj", a.T, b[:, 1].reshape(r, -1).T)}
    if kind == "qkv_einsum":  # a [D, r], b [r, 3, N, H]
        return {**pair("q_proj", a.T, b[:, 0].reshape(r, -1).T), **pair("k_proj", a.T, b[:, 1].reshape(r, -1).T),
                **pair("v_proj", a.T, b[:, 2].reshape(r, -1).T)}
    if kind == "attn_vec_einsum":  # a [N, H, r], b [r, D]
        return pair("o_proj", a.reshape(-1, r).T, b.T)
    if kind in ("gate_proj", "up_proj", "down_proj"):  # a [in, r], b [r, out]
        return pair(kind, a.T, b.T)
    raise TunixRtError(f"LoRA on an unknown Tunix module {kind!r}")


def export_adapter(model, model_dir: Path, target: Path, rank: int, alpha: float, dropout: float,
                   targets: list[str], weight_qtype: str | None = None) -> None:
    """final/adapter: adapter_model.safetensors + adapter_config.json, loadable by
    `peft.PeftModel.from_pretrained` (and so by the torch eval).

    QLoRA (`weight_qtype` set): the factors were trained on the quantised base, but PEFT
    adds them to the full-precision base in model_dir (as final/merged/ does): the exported
    model is the trained one with the base's quantisation error taken out. Its logits equal
    the JAX model's with the same factors on the unquantised base; they differ from the QLoRA
    model's by that error (nf4 on the tiny test model: ~9% relative RMS per weight, ~0.17 of
    the largest logit), and equal them on the dequantised base. tunix_rt_adapter.json records
    the qtype."""
    from safetensors.numpy import save_file

    save_file(lora_tensors(model), str(target / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(model_dir),
        "r": rank, "lora_alpha": alpha, "lora_dropout": dropout,
        "target_modules": sorted(targets), "bias": "none", "fan_in_fan_out": False,
        "inference_mode": True, "use_rslora": False, "init_lora_weights": True,
        "modules_to_save": None, "layers_to_transform": None, "revision": None,
    }
    (target / "adapter_config.json").write_text(json.dumps(config, indent=2))
    (target / "tunix_rt_adapter.json").write_text(json.dumps(
        {"engine": "jax", "note": "exported from qwix LoRA; Tunix fuses k/v (and q/k/v) projections, "
                                  "so their lora_A matrices are equal copies",
         **({"weight_qtype": weight_qtype,
             "qlora_note": f"trained on a {weight_qtype}-quantised base; PEFT applies it to the "
                           "full-precision base (differences of the order of the quantisation error)"}
            if weight_qtype else {})}, indent=2))


def export_merged(model, family: str, model_dir: Path, target: Path, lora_scale: float | None = None) -> None:
    """HF-layout safetensors transformers loads: base + scale * B @ A for a LoRA model
    (lora_scale = alpha / r), or every trained weight after full fine-tuning; config.json
    and the tokenizer files are copied from the model directory."""
    from safetensors.numpy import save_file

    from tunix_rt.models.jax_loader import hf_state
    from tunix_rt.models.lora import merge_lora

    model_dir = Path(model_dir)
    if lora_scale is not None:
        tensors = merge_lora(model_dir, lora_tensors(model), lora_scale)
    else:
        tensors = hf_state(model, family)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    copy_side_files(model_dir, target)
