"""The LoRA merge is written once (models.lora): the driver's `init`, the JAX generator and
the JAX export give the same merged tensors for one adapter on a tiny model, and those are
the base plus (alpha / r) * B @ A."""

from __future__ import annotations

import json

import numpy as np
import pytest
from requires import require_module

pytestmark = pytest.mark.jax

jax = require_module("jax")

RANK, ALPHA = 4, 8.0


def _lora_model(model_dir, cfg):
    """The tiny JAX model with qwix LoRA factors that are not zero (B starts at zero)."""
    from flax import nnx

    from tunix_rt.models.jax_loader import load_model, make_mesh
    from tunix_rt.train.jax_engine import apply_lora

    mesh = make_mesh()
    with jax.set_mesh(mesh):
        jm, tcfg = load_model(model_dir, mesh, "fp32")
        jm = apply_lora(jm, cfg, tcfg)
        rng = np.random.default_rng(3)
        for _, var in nnx.to_flat_state(nnx.state(jm, nnx.LoRAParam)):
            var[...] = jax.numpy.asarray(rng.normal(0, 0.05, var[...].shape), jax.numpy.float32)
    return jm


def test_driver_init_jax_generator_and_export_merge_the_same_tensors(home, tmp_path):
    from safetensors.numpy import load_file

    from tunix_rt import rundir
    from tunix_rt.eval.jax_generate import write_merged
    from tunix_rt.files import MODEL_MANIFEST
    from tunix_rt.models.store import ensure_model
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.driver import install_merged_adapter
    from tunix_rt.train.export import export_adapter, export_merged
    from tunix_rt.train.run import RunDir

    model_dir = ensure_model("tiny-gemma2", home)  # GQA: k and v share one fused LoRA A
    cfg = TrainConfig(dataset="x", model=str(model_dir), lora_rank=RANK, lora_alpha=ALPHA)
    jm = _lora_model(model_dir, cfg)
    run = home.runs / "sft-tiny"  # a finished LoRA run as `init` reads it: its config and final/adapter
    adapter = rundir.adapter_dir(run)
    adapter.mkdir(parents=True)
    (run / rundir.CONFIG).write_text(cfg.to_yaml())
    export_adapter(jm, model_dir, adapter, RANK, ALPHA, 0.0, cfg.lora_targets)

    exported, generated = tmp_path / "exported", tmp_path / "generated"
    exported.mkdir(), generated.mkdir()
    export_merged(jm, "gemma2", model_dir, exported, ALPHA / RANK)
    write_merged(model_dir, adapter, generated)
    installed = home.models / "init-sft-tiny"
    install_merged_adapter(RunDir(run, {}), installed, home)

    ex, gen, init = (load_file(str(d / "model.safetensors")) for d in (exported, generated, installed))
    assert ex.keys() == gen.keys() == init.keys()
    for k in ex:
        np.testing.assert_array_equal(gen[k], ex[k], err_msg=k)
        np.testing.assert_array_equal(init[k], ex[k], err_msg=k)

    base, lora = load_file(str(model_dir / "model.safetensors")), load_file(str(adapter / "adapter_model.safetensors"))
    pre = "base_model.model.model.layers.0.self_attn.k_proj"
    want = base["model.layers.0.self_attn.k_proj.weight"].astype(np.float32) + ALPHA / RANK * (
        lora[f"{pre}.lora_B.weight"] @ lora[f"{pre}.lora_A.weight"])
    np.testing.assert_allclose(ex["model.layers.0.self_attn.k_proj.weight"], want, rtol=1e-6, atol=1e-7)
    assert not np.allclose(want, base["model.layers.0.self_attn.k_proj.weight"])  # the adapter changes it
    assert json.loads((installed / MODEL_MANIFEST).read_text())["source"]["run_id"] == "sft-tiny"


def test_only_plain_lora_adapters_are_merged(tmp_path):
    from tunix_rt.errors import BadInput
    from tunix_rt.models.lora import read_adapter

    with pytest.raises(BadInput, match="not a PEFT adapter"):
        read_adapter(tmp_path)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "use_rslora": True, "r": 4}))
    with pytest.raises(BadInput, match="only plain LoRA"):
        read_adapter(tmp_path)
