"""The JAX generator decodes exactly what the torch generator decodes (greedy, same tiny
checkpoint, prompts of different lengths, past the sliding window), and a PEFT adapter is
merged in before decoding."""

from __future__ import annotations

import numpy as np
import pytest
from requires import require_module

pytestmark = pytest.mark.jax

require_module("jax")


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-gemma2"])
def test_greedy_matches_torch(name, tmp_path, tiny_tok):
    from tunix_rt.eval.generate import DecodeConfig, TorchGenerator
    from tunix_rt.eval.jax_generate import load_generator
    from tunix_rt.home import Home
    from tunix_rt.models.hf import load_causal_lm
    from tunix_rt.models.store import ensure_model
    from tunix_rt.render import prompt_ids

    model_dir = ensure_model(name, Home.resolve(tmp_path / "home").ensure())
    prompts = [prompt_ids(q, tiny_tok, "Be brief.") for q in
               ("What is 2 plus 2?", "A much longer question about apples, pears and the price of both?", "Hi")]
    cfg = DecodeConfig(max_new_tokens=20, batch_size=2)
    want = TorchGenerator(load_causal_lm(model_dir), tiny_tok).generate(prompts, cfg)
    counted = []
    got = load_generator(model_dir, None, tiny_tok, "cpu").generate(prompts, cfg, on_tokens=counted.append)
    assert [g.ids for g in got] == [w.ids for w in want]
    assert [g.finish_reason for g in got] == [w.finish_reason for w in want]
    assert sum(counted) == sum(g.n_tokens for g in got)
    assert max(len(p) + 20 for p in prompts) > 16  # decoding crosses the sliding window


def test_a_generator_on_new_weights_reuses_the_compiled_decode(tmp_path, tiny_tok):
    """A GRPO step builds a generator on its current weights each step: the prefill and the
    decode step compile once for the model, not once per generator."""
    from tunix_rt.eval import jax_generate
    from tunix_rt.eval.generate import DecodeConfig
    from tunix_rt.home import Home
    from tunix_rt.models.store import ensure_model
    from tunix_rt.render import prompt_ids

    model_dir = ensure_model("tiny-gemma3", Home.resolve(tmp_path / "home").ensure())
    prompts = [prompt_ids("What is 2 plus 2?", tiny_tok, "")]
    cfg = DecodeConfig(max_new_tokens=6)
    gen = jax_generate.load_generator(model_dir, None, tiny_tok, "cpu")
    a = gen.generate(prompts, cfg)
    sizes = [f._cache_size() for f in (gen._prefill, gen._step)]
    model = gen.model
    emb = model.embedder.input_embedding
    emb[...] = emb[...] * 3.0 + 1.0  # other weights, the same model
    b = gen.load(model).generate(prompts, cfg)
    assert [f._cache_size() for f in (gen._prefill, gen._step)] == sizes == [1, 1]
    assert a[0].ids != b[0].ids  # it decodes the new weights
