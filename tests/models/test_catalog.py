"""The catalog's architecture arithmetic agrees with transformers' own models."""

from __future__ import annotations

import math

import pytest

from tunix_rt.models.catalog import PRESETS
from tunix_rt.models.importer import expected_shapes


@pytest.mark.parametrize("name", list(PRESETS))
def test_param_count_equals_transformers_on_the_meta_device(name):
    import torch
    from transformers import AutoModelForCausalLM

    from tunix_rt.models.tiny import hf_config

    preset = PRESETS[name]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(preset))
    assert sum(p.numel() for p in model.parameters()) == preset.param_count()
    # the tensors a checkpoint must hold add up to the same count (a tied head stored once)
    shapes, tied = expected_shapes(preset)
    assert tied == ({"lm_head.weight"} if preset.tied_embeddings else set())
    assert sum(math.prod(s) for k, s in shapes.items() if k not in tied) == preset.param_count()


def test_gemma3_270m_facts():
    assert PRESETS["gemma3-270m"].param_count() == 268_098_176
