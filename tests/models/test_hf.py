"""Loading model dirs: safetensors only, eval mode, clear errors."""

from __future__ import annotations

import pytest

from tunix_rt.errors import BadInput
from tunix_rt.models.hf import load_causal_lm, model_facts


def test_loads_a_catalog_name_in_eval_mode_fp32(home):
    import torch

    model = load_causal_lm("tiny-gemma2", home=home)  # built on first use
    assert not model.training and next(model.parameters()).dtype == torch.float32
    assert model.config.model_type == "gemma2"
    bf16 = load_causal_lm(home.models / "tiny-gemma2", dtype="bf16")
    assert next(bf16.parameters()).dtype == torch.bfloat16


def test_refuses_pickles_and_bad_choices(home, tmp_path):
    path = load_causal_lm("tiny-gemma3", home=home).name_or_path
    with pytest.raises(BadInput, match="dtype must be one of fp32, bf16"):
        load_causal_lm(path, dtype="fp16")
    with pytest.raises(BadInput, match="attn must be one of"):
        load_causal_lm(path, attn="flash")
    with pytest.raises(BadInput, match="no such model directory"):
        load_causal_lm(tmp_path / "nowhere")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((home.models / "tiny-gemma3" / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04 not loaded")
    with pytest.raises(BadInput, match="no \\*.safetensors weights"):
        load_causal_lm(pickled)


def test_model_facts_without_a_manifest_count_the_stored_tensors(home, tmp_path):
    import shutil

    src = home.models / "tiny-gemma3"
    load_causal_lm("tiny-gemma3", home=home)
    bare = tmp_path / "bare"
    shutil.copytree(src, bare)
    (bare / "tunix_rt_model.json").unlink()
    facts = model_facts(bare)
    assert facts["param_count"] == 410_880 and facts["preset"] is None
    assert facts["source"]["kind"] == "unregistered-dir" and facts["model_type"] == "gemma3_text"
