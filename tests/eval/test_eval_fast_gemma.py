"""The lean Gemma decode step against transformers' own forward, step by step: same logits
with left padding, mixed prompt lengths and the sliding window (16 on the tiny models)
overrun, for Gemma 3 (q/k norms, two RoPE bases) and Gemma 2 (softcaps, 2 KV heads)."""

from __future__ import annotations

import pytest
import torch

from eval_testlib import QUESTIONS
from tunix_rt.eval.fast_gemma import LeanGemma
from tunix_rt.eval.generate import DecodeConfig, TorchGenerator, left_pad, position_ids
from tunix_rt.eval.runner import load_model
from tunix_rt.render import prompt_ids
from tunix_rt.train.torch_engine import decode_model


@pytest.fixture(scope="module", params=["tiny-gemma3", "tiny-gemma2"])
def model_and_tok(request, tiny_dirs):
    from tunix_rt.models.tokenizer import ChatTokenizer

    d = tiny_dirs[request.param]
    return load_model(d, None, "cpu"), ChatTokenizer.from_file(d)


def _prompts(tok):
    return [prompt_ids(q, tok, "" if i % 2 else "Think, then answer.") for i, q in enumerate(QUESTIONS)]


def test_lean_step_logits_match_transformers(model_and_tok):
    """Feed the same tokens to both for 30 steps (past the window of 16): the lean logits
    equal transformers' to float rounding, and the argmax is the same everywhere."""
    model, tok = model_and_tok
    lean = LeanGemma.for_model(model)
    assert lean is not None and not lean.lora
    _match_transformers(model, lean, tok)


def _match_transformers(model, lean, tok, steps: int = 30) -> None:
    from transformers import DynamicCache

    prompts = _prompts(tok)
    ids, mask = left_pad(prompts, tok.pad_id, "cpu")
    pos = position_ids(mask)
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
        state = lean.start(cache, mask, pos[:, -1] + 1, steps)
        ref_cache = DynamicCache(config=model.config)
        model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=ref_cache, use_cache=True, logits_to_keep=1)
        gen = torch.Generator().manual_seed(0)
        nxt_pos = pos[:, -1] + 1
        for _ in range(steps):
            feed = torch.randint(6, tok.vocab_size, (len(prompts),), generator=gen)
            ours = lean.step(feed, state)
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            ref = model(input_ids=feed[:, None], attention_mask=mask, position_ids=nxt_pos[:, None],
                        past_key_values=ref_cache, use_cache=True, logits_to_keep=1).logits[:, -1]
            nxt_pos = nxt_pos + 1
            torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
            assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def _with_lora(model, **extra):
    """A copy of `model` with PEFT LoRA on all seven projections, every B factor random (a
    trained adapter: with B = 0 it would change nothing)."""
    import copy

    from peft import LoraConfig, get_peft_model

    from tunix_rt.train.config import ALL_LORA_TARGETS

    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(
        r=4, lora_alpha=8, target_modules=list(ALL_LORA_TARGETS), lora_dropout=0.0, **extra))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return peft_model.eval()


def test_lean_step_applies_live_lora_adapters_as_peft_does(model_and_tok):
    """A training run's rollouts decode the PEFT model's base model with its LoRA layers in
    place (torch_engine.decode_model): the lean step applies every adapter as PEFT's forward
    does (no merged copy of any weight), and its logits equal PEFT's forward through
    transformers step by step, the adapters visibly moving them; with the adapters disabled
    the base weights alone are used."""
    from tunix_rt.eval.fast_gemma import LoraWeight

    model, tok = model_and_tok
    peft_model = _with_lora(model)
    base = decode_model(peft_model)
    lean = LeanGemma.for_model(base)
    assert lean is not None and lean.lora
    lyr = lean.layers[0]
    assert isinstance(lyr.wq, LoraWeight) and lyr.wq.base is base.model.layers[0].self_attn.q_proj.base_layer.weight
    _match_transformers(base, lean, tok)
    x = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        assert not torch.allclose(lean.linear(x, lyr.wq), torch.nn.functional.linear(x, lyr.wq.base), atol=1e-4)
    with peft_model.disable_adapter():
        plain = LeanGemma.for_model(base)
        assert plain is not None and not plain.lora
        assert plain.layers[0].wq is base.model.layers[0].self_attn.q_proj.base_layer.weight
        _match_transformers(base, plain, tok, steps=4)


@pytest.mark.parametrize("adapted", [False, True])
def test_the_f32_kernel_step_matches_transformers_to_rounding(model_and_tok, adapted, monkeypatch):
    """An RL run's rollouts (f32_kernel): every projection of the step, adapter included, goes
    through the kernel library's fp32 product, and so does the head (a vocabulary this small
    has no screen), the norms, RoPE and gelu·up through train.cpu_kernels' C passes, and the
    logits still equal transformers' (PEFT's forward with live adapters) to float rounding
    step by step, the argmax everywhere the same."""
    from tunix_rt.eval import int8_kernel
    from tunix_rt.train import cpu_kernels

    kernel = int8_kernel.f32_library() is not None  # else the same step on torch's product
    model, tok = model_and_tok
    target = decode_model(_with_lora(model)) if adapted else model
    calls = []
    real = int8_kernel.f32_linear
    monkeypatch.setattr(int8_kernel, "f32_linear", lambda *a, **k: calls.append(len(a)) or real(*a, **k))
    elementwise = {"rms_norm": 0, "rope": 0, "gelu_tanh_mul": 0}
    inside = [False]  # counted inside the lean step only (transformers' rope may be ours too: train.recompute)
    for name in elementwise:
        def counted(*a, _fn=getattr(cpu_kernels, name), _name=name, **k):
            elementwise[_name] += inside[0]
            return _fn(*a, **k)
        monkeypatch.setattr(cpu_kernels, name, counted)
    lean = LeanGemma.for_model(target, f32_kernel=True)
    assert lean is not None and lean.f32_kernel and lean.lora == adapted
    hidden = lean._hidden

    def flagged(*a, **k):
        inside[0] = True
        try:
            return hidden(*a, **k)
        finally:
            inside[0] = False

    lean._hidden = flagged
    _match_transformers(target, lean, tok)
    per_step = 7 * target.config.num_hidden_layers + 1  # the projections and the head
    assert len(calls) == (30 * per_step if kernel else 0)
    assert set(calls) == (({5, 2} if adapted else {2}) if kernel else set())
    layers = target.config.num_hidden_layers
    norms = 6 if lean.gemma3 else 4  # each layer's four, and Gemma 3's q and k norms
    c = cpu_kernels.library() is not None
    assert elementwise == ({"rms_norm": 30 * (norms * layers + 1), "rope": 30 * 2 * layers, "gelu_tanh_mul": 30 * layers}
                           if c else {"rms_norm": 0, "rope": 0, "gelu_tanh_mul": 0})
    assert not LeanGemma.for_model(target).f32_kernel  # eval, serving, chat: transformers' bits


def test_other_adapter_kinds_keep_the_transformers_path(model_and_tok):
    """DoRA (a LoRA variant the lean step does not apply) and an adapter merged in place are
    not served by the lean step: None, so the generator decodes through PEFT's forward."""
    model, _ = model_and_tok
    assert LeanGemma.for_model(decode_model(_with_lora(model, use_dora=True))) is None
    merged = _with_lora(model)
    merged.get_base_model().model.layers[0].self_attn.q_proj.merge()
    assert LeanGemma.for_model(decode_model(merged)) is None


def test_lean_and_transformers_paths_decode_the_same(model_and_tok):
    model, tok = model_and_tok
    prompts = _prompts(tok)
    cfg = DecodeConfig(max_new_tokens=24, batch_size=len(prompts))
    fast, plain = TorchGenerator(model, tok), TorchGenerator(model, tok, lean=False)
    assert fast.lean is not None and plain.lean is None
    assert [g.ids for g in fast.generate(prompts, cfg)] == [g.ids for g in plain.generate(prompts, cfg)]


def test_other_architectures_keep_the_transformers_path():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    assert LeanGemma.for_model(LlamaForCausalLM(cfg)) is None


def test_chunked_head_is_bit_identical_to_one_matmul(model_and_tok):
    """Greedy equality with HF rests on this: chunking the vocabulary changes no sum."""
    import tunix_rt.eval.fast_gemma as fg

    model, _ = model_and_tok
    lean = LeanGemma.for_model(model)
    x = torch.randn(8, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    before = fg.HEAD_CHUNK
    try:
        fg.HEAD_CHUNK = 100  # several chunks on the tiny vocabulary, the last one partial
        with torch.inference_mode():
            assert torch.equal(lean._head(x), torch.nn.functional.linear(x, model.lm_head.weight))
    finally:
        fg.HEAD_CHUNK = before


def test_select_moves_kept_rows_down_in_place_as_index_select_would():
    """Finished rows leave the batch in place: after two selections (rows 1 and 3 of 5, then
    the first of the three left) every written cache entry, the mask and the positions equal
    what index_select gives, and the buffers are views of their first storage (nothing past
    `cur` copied, nothing reallocated)."""
    from tunix_rt.eval.fast_gemma import DecodeState

    gen = torch.Generator().manual_seed(0)
    b, t, cur = 5, 12, 7
    keys = [torch.randn(b, 2, t, 4, generator=gen) for _ in range(3)]
    values = [torch.randn(b, 2, t, 4, generator=gen) for _ in range(3)]
    mask, pos = torch.randn(b, 1, 1, t, generator=gen), torch.arange(10, 10 + b)
    ref = DecodeState([k.clone() for k in keys], [v.clone() for v in values], mask.clone(), pos.clone(), cur)
    st = DecodeState(keys, values, mask, pos, cur)
    storage = [k.data_ptr() for k in st.keys + st.values]
    for keep in (torch.tensor([0, 2, 4]), torch.tensor([1, 2])):
        st.select(keep)
        ref = DecodeState([k.index_select(0, keep) for k in ref.keys], [v.index_select(0, keep) for v in ref.values],
                          ref.mask.index_select(0, keep), ref.pos.index_select(0, keep), cur)
        for ours, theirs in zip(st.keys + st.values, ref.keys + ref.values):
            assert ours.shape == theirs.shape
            assert torch.equal(ours[:, :, :cur], theirs[:, :, :cur])
        assert torch.equal(st.mask, ref.mask) and torch.equal(st.pos, ref.pos)
    assert [k.data_ptr() for k in st.keys + st.values] == storage
    assert st.pos.tolist() == [12, 14]


def test_lean_step_in_bf16_tracks_transformers_bf16(model_and_tok):
    """bf16 weights (the GPU path; the first CUDA run failed here with 'expected mat1 and mat2 to
    have the same dtype'): the lean step keeps the residual stream in bf16 with fp32 norms as
    transformers does, so its logits stay within bf16 rounding of transformers' bf16 forward and
    a batched greedy decode runs."""
    import copy

    from transformers import DynamicCache

    model, tok = model_and_tok
    model = copy.deepcopy(model).to(torch.bfloat16)
    lean = LeanGemma.for_model(model)
    assert lean is not None
    prompts = _prompts(tok)
    ids, mask = left_pad(prompts, tok.pad_id, "cpu")
    pos = position_ids(mask)
    with torch.inference_mode():
        cache, ref_cache = DynamicCache(config=model.config), DynamicCache(config=model.config)
        for c in (cache, ref_cache):
            model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=c, use_cache=True,
                  logits_to_keep=1)
        state = lean.start(cache, mask, pos[:, -1] + 1, 8)
        gen = torch.Generator().manual_seed(0)
        nxt_pos = pos[:, -1] + 1
        for _ in range(8):
            feed = torch.randint(6, tok.vocab_size, (len(prompts),), generator=gen)
            ours = lean.step(feed, state)
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            ref = model(input_ids=feed[:, None], attention_mask=mask, position_ids=nxt_pos[:, None],
                        past_key_values=ref_cache, use_cache=True, logits_to_keep=1).logits[:, -1]
            nxt_pos = nxt_pos + 1
            scale = ref.float().abs().max()
            assert (ours.float() - ref.float()).abs().max() <= 0.05 * scale
    outs = TorchGenerator(model, tok).generate(prompts, DecodeConfig(max_new_tokens=6, batch_size=4))
    assert all(0 < o.n_tokens <= 6 for o in outs)
