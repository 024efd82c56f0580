"""Weight-only int8 and int4 inference (tunix_rt.eval.int8_weights): the quantisations' error
bounds, the quantised step computing the dequantised model, its logits tracking fp32's, and the
refusals."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cpu_testlib import decode_isas, using_isa
from tunix_rt.errors import BadInput
from tunix_rt.eval import int8_kernel
from tunix_rt.eval.fast_gemma import LeanGemma
from tunix_rt.eval.generate import DecodeConfig, TorchGenerator, left_pad, position_ids
from tunix_rt.eval.int8_weights import (Int8Gemma, int4_linear, int8_linear, quantize, quantize4, quantize_model,
                                       use_weights)
from tunix_rt.eval.runner import load_model
from tunix_rt.models.tokenizer import ChatTokenizer
from tunix_rt.render import prompt_ids

QUESTIONS = ["What is 2 plus 3?", "Name a prime number bigger than ten.", "Count to five."]
KERNELS = ["int_mm", "dequant"]


@pytest.fixture(params=decode_isas())
def isa(request):
    """The test once per instruction set of the decode kernels this CPU runs ("none": no kernel)."""
    with using_isa(request.param):
        yield request.param


def test_round_trip_error_is_at_most_half_a_step_per_element():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 200, generator=g) * torch.logspace(-3, 1, 96)[:, None]  # rows of very different size
    w[7] = 0.0
    w[9, 3] = 50.0  # an outlier row
    ql = quantize(w)
    assert ql.q.dtype == torch.int8 and int(ql.q.abs().max()) <= 127 and ql.scale.shape == (96,)
    err = (w - ql.dequantize()).abs()
    assert bool((err <= ql.scale[:, None] / 2 * (1 + 1e-6)).all())
    assert float(err[7].max()) == 0.0 and int(ql.q[7].abs().max()) == 0  # a zero row stays exact
    assert bool((ql.q.abs().amax(1)[torch.arange(96) != 7] == 127).all())  # every row uses its full range


def test_int4_round_trip_error_is_half_a_step_plus_the_fp16_rounding():
    """Per row and group of 32: codes 0..15, |w − (scale·code + min)| ≤ scale/2 plus what
    rounding the min and the scale to fp16 adds (the min's own rounding, 15 × the scale's
    relative 2^-11); a constant group is exact up to its min's rounding."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 192, generator=g) * torch.logspace(-3, 1, 48)[:, None]
    w[5] = 0.0
    w[6, :32] = 0.25  # a constant group
    w[9, 3] = 50.0  # an outlier in one group only
    q4 = quantize4(w)
    assert q4.q.dtype == torch.uint8 and q4.q.shape == (48, 96) and q4.shape == (48, 192)
    scale, mn = q4.scales()
    lo = w.reshape(48, 6, 32).amin(-1)
    bound = (0.5 + 15 * 2.0 ** -11) * scale + (lo - mn).abs() + 1e-6 * w.reshape(48, 6, 32).abs().amax(-1)
    err = (w - q4.dequantize()).abs().reshape(48, 6, 32).amax(-1)
    assert bool((err <= bound).all()), float((err - bound).max())
    assert float((w[5] - q4.dequantize()[5]).abs().max()) == 0.0 and float((w[6, :32] - q4.dequantize()[6, :32]).abs().max()) == 0.0
    other = (w[9].reshape(6, 32) - q4.dequantize()[9].reshape(6, 32)).abs().amax(-1)
    assert float(other[1:].max()) < 0.05 * float(other[0])  # the outlier costs only its own group


def test_int4_refuses_what_its_layout_cannot_hold():
    with pytest.raises(BadInput, match="multiple of 16"):
        quantize4(torch.randn(40, 64))
    with pytest.raises(BadInput, match="multiple of 16"):
        quantize4(torch.randn(32, 48))
    with pytest.raises(BadInput, match="finite"):
        quantize4(torch.full((16, 32), float("nan")))
    with pytest.raises(BadInput, match="fp16"):
        quantize4(torch.full((16, 32), 1e6))


def test_int4_is_refused_without_its_kernel_or_off_the_cpu_before_a_weight_changes(tiny_dirs, monkeypatch):
    """Where the int4 kernel does not run (its torch twin is ~100x slower than fp32) or on
    another device, loading int4 fails with the reason and int8 named, the model untouched;
    a model with one weight the layout cannot hold is refused before any weight changes."""
    from tunix_rt.eval.int8_weights import int4_problem

    assert "CPU only, not cuda" in int4_problem("cuda")
    model = load_model(tiny_dirs["tiny-gemma3"], None, "cpu")
    before = [p.detach().clone() for p in model.parameters()]
    monkeypatch.setattr(int8_kernel, "decode_library", lambda: None)
    with pytest.raises(BadInput, match=r"weights int4 needs the int4 kernel .*; weights int8 runs everywhere"):
        Int8Gemma.for_model(model, weights="int4")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    monkeypatch.undo()
    two = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 40))  # weights [32, 64] and [40, 32]
    first = two[0].weight.detach().clone()
    with pytest.raises(BadInput, match=r"multiple of 16 .*\(40, 32\)"):
        quantize_model(two, "int4")
    assert torch.equal(two[0].weight, first)


def test_int4_linear_multiplies_by_the_dequantised_weights():
    """Against x @ dequantised(w).T in fp64, within the activations' two-level error (as int8's
    int_mm path), through the kernel where it runs, else its torch twin (the same bits)."""
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(3, 1, 640, generator=g), torch.randn(2048, 640, generator=g) * 0.05
    q4 = quantize4(w)
    deq = q4.dequantize().double()
    want = (x.double().reshape(3, 640) @ deq.t()).reshape(3, 1, 2048)
    got = int4_linear(x, q4)
    assert got.shape == (3, 1, 2048) and got.dtype == torch.float32
    xa = x.abs().amax(-1, keepdim=True).double()
    bound = (xa / (127 * 254)) * 640 ** 0.5 * deq.norm(dim=1) + 1e-5 * (x.double().norm(dim=-1, keepdim=True) * deq.norm(dim=1))
    assert bool(((got.double() - want).abs() <= bound).all())


@pytest.mark.parametrize("kernel", KERNELS)
def test_int8_linear_multiplies_by_the_dequantised_weights(kernel):
    """Against x @ dequantised(w).T in fp64: the dequant path to fp32 rounding; the int_mm path
    within its activations' two-level error (|x − x̂| ≤ max|x| / (127·254) per element)."""
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(3, 1, 640, generator=g), torch.randn(2048, 640, generator=g) * 0.05
    ql = quantize(w)
    want = (x.double().reshape(3, 640) @ ql.dequantize().double().t()).reshape(3, 1, 2048)
    got = int8_linear(x, ql, kernel)
    assert got.shape == (3, 1, 2048) and got.dtype == torch.float32
    xa = x.abs().amax(-1, keepdim=True).double()
    bound = (xa / (127 * 254)) * 640 ** 0.5 * ql.dequantize().double().norm(dim=1) if kernel == "int_mm" else 0
    bound = bound + 1e-5 * (x.double().norm(dim=-1, keepdim=True) * ql.dequantize().double().norm(dim=1))
    assert bool(((got.double() - want).abs() <= bound).all())


@pytest.fixture(scope="module", params=["tiny-gemma3", "tiny-gemma2"])
def tiny(request, tiny_dirs):
    return tiny_dirs[request.param], ChatTokenizer.from_file(tiny_dirs[request.param])


def _decode_both(d, tok, kernel, steps=24):
    """fp32 LeanGemma and Int8Gemma fed the same (the fp32 greedy) tokens: both logits per step."""
    from transformers import DynamicCache

    fp, q = load_model(d, None, "cpu"), load_model(d, None, "cpu")
    lean, lean8 = LeanGemma.for_model(fp), Int8Gemma.for_model(q, kernel)
    prompts = [prompt_ids(text, tok) for text in QUESTIONS]
    ids, mask = left_pad(prompts, tok.pad_id, "cpu")
    pos = position_ids(mask)
    out = []
    with torch.inference_mode():
        states = []
        for model, step in ((fp, lean), (q, lean8)):
            cache = DynamicCache(config=model.config)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                           use_cache=True, logits_to_keep=1).logits[:, -1].float()
            states.append((step, step.start(cache, mask, pos[:, -1] + 1, steps), logits))
        pairs = [(states[0][2], states[1][2])]
        for _ in range(steps - 1):
            tokens = pairs[-1][0].argmax(-1)
            pairs.append(tuple(s.step(tokens, st) for s, st, _ in states))
        out = pairs
    return fp, q, out


@pytest.mark.parametrize("kernel", KERNELS)
def test_int8_decoding_tracks_fp32(tiny, kernel):
    """Teacher-forced on fp32's greedy ids for 24 steps (past the tiny models' window of 16):
    every int8 logit within 2% of the step's logit range of fp32's, and the greedy pick the
    same on at least 90% of the steps."""
    d, tok = tiny
    _, _, pairs = _decode_both(d, tok, kernel)
    agree, n = 0, 0
    for ref, got in pairs:
        span = (ref.amax(-1) - ref.amin(-1))[:, None]
        assert bool(((got - ref).abs() <= 0.02 * span).all()), float(((got - ref).abs() / span).max())
        agree += int((got.argmax(-1) == ref.argmax(-1)).sum())
        n += ref.shape[0]
    assert agree >= 0.9 * n, (agree, n)


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_int8_step_computes_the_dequantised_model(tiny_dirs, weights):
    """The model's parameters hold the dequantised weights (so prefill and step agree), and
    the quantised step's logits equal transformers' forward on them: int8's dequant path to
    float rounding; int4 (whose activations are always the two int8 levels) to 1e-3 of the
    logits' range."""
    from transformers import DynamicCache

    d = tiny_dirs["tiny-gemma3"]
    tok = ChatTokenizer.from_file(d)
    ref = load_model(d, None, "cpu")
    model = load_model(d, None, "cpu")
    if weights == "int4" and int8_kernel.decode_library() is None:  # refused where its kernel does not run
        with pytest.raises(BadInput, match="needs the int4 kernel"):
            Int8Gemma.for_model(model, None, weights)
        return
    lean8 = Int8Gemma.for_model(model, "dequant" if weights == "int8" else None, weights)
    quant = quantize4 if weights == "int4" else quantize
    for (name, p), (_, p0) in zip(model.named_parameters(), ref.named_parameters()):
        if name.endswith("proj.weight") or name.endswith("embed_tokens.weight"):
            assert not torch.equal(p, p0) and torch.equal(p, quant(p0).dequantize()), name
        else:
            assert torch.equal(p, p0), name  # norms stay fp32, untouched
    prompts = [prompt_ids(text, tok) for text in QUESTIONS]
    ids, mask = left_pad(prompts, tok.pad_id, "cpu")
    pos = position_ids(mask)
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
        st = lean8.start(cache, mask, pos[:, -1] + 1, 8)
        full_ids, full_mask = ids, mask
        tokens = torch.tensor([5, 6, 7])
        for _ in range(6):
            got = lean8.step(tokens, st)
            full_ids = torch.cat([full_ids, tokens[:, None]], 1)
            full_mask = torch.cat([full_mask, torch.ones_like(tokens)[:, None]], 1)
            want = model(input_ids=full_ids, attention_mask=full_mask, position_ids=position_ids(full_mask)).logits[:, -1]
            if weights == "int8":
                assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), float((got - want).abs().max())
            else:
                span = (want.amax(-1) - want.amin(-1))[:, None]
                assert bool(((got - want).abs() <= 1e-3 * span).all()), float(((got - want).abs() / span).max())
            tokens = got.argmax(-1)


def test_generator_on_int8_weights_decodes_and_stays_close(tiny_dirs):
    d = tiny_dirs["tiny-gemma3"]
    tok = ChatTokenizer.from_file(d)
    prompts = [prompt_ids(text, tok) for text in QUESTIONS]
    cfg = DecodeConfig(max_new_tokens=12, batch_size=2)
    ref = TorchGenerator(load_model(d, None, "cpu"), tok).generate(prompts, cfg)
    gen = use_weights(TorchGenerator(load_model(d, None, "cpu"), tok), "int8")
    assert isinstance(gen.lean, Int8Gemma) and gen.lean.screen() is None
    out = gen.generate(prompts, cfg)
    assert all(o.n_tokens > 0 for o in out)
    same = sum(a == b for o, r in zip(out, ref) for a, b in zip(o.ids, r.ids))
    assert same >= 0.5 * sum(min(len(o.ids), len(r.ids)) for o, r in zip(out, ref))


def test_eval_records_the_weights_and_refuses_what_does_not_apply(cli, home, tiny_dirs, tmp_path):
    import json

    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {i}+{i}?", "steps": [f"{i}+{i}={2 * i}"],
                                        "answer": str(2 * i)}) + "\n" for i in range(3)))
    r = cli("eval", "--model", tiny_dirs["tiny-gemma3"], "--dataset", data, "--max-new-tokens", "4",
            "--device", "cpu", "--weights", "int8", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["decoding"]["weights"] == "int8"
    r = cli("eval", "--model", tiny_dirs["tiny-gemma3"], "--dataset", data, "--max-new-tokens", "4",
            "--device", "cpu", "--weights", "int4", "--json")
    if int8_kernel.decode_library() is None:  # refused, with the reason and int8 named
        assert r.code == 2 and "needs the int4 kernel" in r.err and "int8 runs everywhere" in r.err
    else:
        assert r.code == 0, r.err
        assert json.loads(r.out)["decoding"]["weights"] == "int4"
    r = cli("eval", "--model", tiny_dirs["tiny-gemma3"], "--dataset", data, "--weights", "int2", "--device", "cpu")
    assert r.code == 2 and "weights must be one of fp32|int8|int4" in r.err


def test_int8_is_refused_for_the_jax_engine_and_other_architectures():
    from tunix_rt.eval.runner import EvalRequest

    with pytest.raises(BadInput, match="weights int8 runs on the torch engine"):
        EvalRequest(dataset="d", model="tiny-gemma3", engine="jax", weights="int8")
    with pytest.raises(BadInput, match="weights must be one of"):
        EvalRequest(dataset="d", model="tiny-gemma3", engine="torch", weights="bf16")
    assert EvalRequest(dataset="d", model="tiny-gemma3", engine="torch", weights="int8").weights == "int8"

    class NotGemma(torch.nn.Module):
        config = type("C", (), {"model_type": "llama"})()

    with pytest.raises(BadInput, match="needs a Gemma 3 / Gemma 2 model"):
        Int8Gemma.for_model(NotGemma())


def test_training_has_no_weights_option():
    """int8 weights are for inference only: the training config has no such field."""
    from tunix_rt.train.config import TrainConfig

    assert "weights" not in {f.name for f in dataclasses.fields(TrainConfig)}


def test_quantize_model_quantises_tied_weights_once(tiny_dirs):
    model = load_model(tiny_dirs["tiny-gemma3"], None, "cpu")
    before = model.lm_head.weight.detach().clone()
    quant = quantize_model(model)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(quant[id(model.lm_head.weight)].dequantize(), model.lm_head.weight)
    assert torch.equal(quantize(before).dequantize(), model.lm_head.weight)  # quantised from the fp32 values, once


def test_serving_loads_int8_and_int4_weights_and_chat_refuses_an_unknown_format(cli, home):
    from tunix_rt.serving.models import ServeConfig, load

    served = load("tiny-gemma3", home, ServeConfig(device="cpu", max_batch=1, weights="int8"))
    try:
        assert isinstance(served.scheduler.gen.lean, Int8Gemma)
    finally:
        served.scheduler.close()
    if int8_kernel.decode_library() is not None:
        served = load("tiny-gemma3", home, ServeConfig(device="cpu", max_batch=1, weights="int4"))
        try:
            assert isinstance(served.scheduler.gen.lean, Int8Gemma) and served.scheduler.gen.lean.weights == "int4"
        finally:
            served.scheduler.close()
    with pytest.raises(BadInput, match="weights must be one of"):
        load("tiny-gemma3", home, ServeConfig(device="cpu", weights="int2"))
    r = cli("chat", "tiny-gemma3", "--weights", "int2", "--device", "cpu")
    assert r.code == 2 and "weights must be one of fp32|int8|int4" in r.err


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_fused_layers_equal_the_torch_ops_to_rounding(tiny, weights, isa):
    """The kernel library's whole-layer call (`Int8Gemma.fused`) against LeanGemma's torch ops
    on the same int8 projections: teacher-forced for 24 steps (past the window of 16; Gemma 2's
    attention softcap and two KV heads; left padding), with two rows leaving the batch half way
    (DecodeState.select). Logits within 1e-3 of the step's range (the two-level activation
    rounding may fall the other way after a last-bit difference in a norm), the greedy pick
    the same on at least 95% of the steps; on each instruction set's kernels. Where the library
    does not load, `fused` is off."""
    from transformers import DynamicCache

    d, tok = tiny
    model = load_model(d, None, "cpu")
    if int8_kernel.decode_library() is None:
        if weights == "int8":
            assert not Int8Gemma.for_model(model, weights=weights).fused
        return
    fused = Int8Gemma.for_model(model, weights=weights)
    assert fused.fused
    lyr = fused.layers[0]  # the layer call and the head read every int8 weight as panels
    if weights == "int8":
        assert fused.qhead.packed and lyr.wq.fused.packed and lyr.w_gate.fused.packed and lyr.wo.packed
        assert fused.qhead.vnni == lyr.w_down.vnni == (isa == "avx2")  # the broadcast layout where AVX2 decodes
    plain = Int8Gemma.for_model(load_model(d, None, "cpu"), weights=weights)
    plain.fused = False
    for a, b in zip(fused.model.parameters(), plain.model.parameters()):
        assert torch.equal(a, b)  # the same int8 model on both sides
    prompts = [prompt_ids(text, tok) for text in QUESTIONS]
    ids, mask = left_pad(prompts, tok.pad_id, "cpu")
    pos = position_ids(mask)
    agree = n = 0
    with torch.inference_mode():
        states = []
        for step in (fused, plain):
            cache = DynamicCache(config=step.model.config)
            logits = step.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                                use_cache=True, logits_to_keep=1).logits[:, -1].float()
            states.append(step.start(cache, mask, pos[:, -1] + 1, 24))
        tokens = logits.argmax(-1)
        for t in range(24):
            if t == 12:
                keep = torch.tensor([2])  # rows 0 and 1 finish: row 2 moves down over row 0
                for st in states:
                    st.select(keep)
                tokens = tokens[keep]
            got, want = fused.step(tokens, states[0]), plain.step(tokens, states[1])
            span = (want.amax(-1) - want.amin(-1))[:, None]
            assert bool(((got - want).abs() <= 1e-3 * span).all()), (t, float(((got - want).abs() / span).max()))
            agree += int((got.argmax(-1) == want.argmax(-1)).sum())
            n += want.shape[0]
            tokens = want.argmax(-1)
    assert agree >= 0.95 * n, (agree, n)


def test_a_state_the_layer_call_cannot_hold_takes_the_torch_ops(tiny_dirs):
    """The layer call writes the cache in place: a full cache (the index past its last entry)
    or a state of another shape goes to the torch ops, which refuse it, never to C code writing
    past the buffers."""
    from transformers import DynamicCache

    d = tiny_dirs["tiny-gemma3"]
    tok = ChatTokenizer.from_file(d)
    step = Int8Gemma.for_model(load_model(d, None, "cpu"))
    ids, mask = left_pad([prompt_ids(QUESTIONS[0], tok)], tok.pad_id, "cpu")
    pos = position_ids(mask)
    with torch.inference_mode():
        cache = DynamicCache(config=step.model.config)
        step.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                   logits_to_keep=1)
        st = step.start(cache, mask, pos[:, -1] + 1, 2)
        assert step._fits(1, st) == step.fused or not step.fused
        tokens = torch.tensor([5])
        step.step(tokens, st)
        step.step(tokens, st)  # the two entries made room for
        assert not step._fits(1, st) and st.cur == st.mask.shape[-1]
        with pytest.raises(RuntimeError, match="decode state full"):
            step.step(tokens, st)
        assert not step._fits(2, st)  # two tokens for a one-row state


def _vm_flags(ptr: int) -> set[str]:
    """The VmFlags of the mapping of this process that holds address `ptr` (/proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0] if line.strip() else ""
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= ptr < hi
        elif inside and line.startswith("VmFlags:"):
            return set(line.split()[1:])
    return set()


def test_quantised_weights_move_to_one_mapping_advised_for_huge_pages(tiny_dirs, monkeypatch):
    """`on_huge_pages` copies tensors bit for bit into one anonymous mapping that the kernel marks
    MADV_HUGEPAGE ("hg" in its VmFlags); Int8Gemma moves every quantised weight there (codes,
    scales, sums; a fused weight once) and decodes the same ids as with them where quantisation
    left them (TUNIX_RT_HUGE_PAGES=off); what it cannot hold is left as it was."""
    import mmap

    from tunix_rt.eval.int8_weights import on_huge_pages

    if not hasattr(mmap, "MADV_HUGEPAGE"):  # not Linux: nothing moves
        assert on_huge_pages([torch.zeros(4)]) is None
        return
    g = torch.Generator().manual_seed(0)
    ts = [torch.randn(1000, 640, generator=g), torch.randint(-128, 127, (33, 7), dtype=torch.int8, generator=g),
          torch.randn(5, generator=g).half(), torch.zeros(0, 3), torch.arange(9, dtype=torch.int32)]
    moved = on_huge_pages(ts)
    for a, b in zip(ts, moved):
        assert a.dtype == b.dtype and a.shape == b.shape and b.is_contiguous() and torch.equal(a, b)
        assert b.numel() == 0 or b.data_ptr() % 64 == 0
    base = moved[0].untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == base for t in moved)  # one mapping
    assert "hg" in _vm_flags(moved[0].data_ptr())
    assert on_huge_pages([torch.randn(4, 4).t()]) is None  # not contiguous
    monkeypatch.setenv("TUNIX_RT_HUGE_PAGES", "off")
    assert on_huge_pages(ts) is None

    d = tiny_dirs["tiny-gemma3"]
    tok = ChatTokenizer.from_file(d)
    gens = {}
    for mode in ("off", "on"):
        monkeypatch.setenv("TUNIX_RT_HUGE_PAGES", mode)
        model = load_model(d, None, "cpu")
        if int8_kernel.decode_library() is None:  # int4 is refused there: int8 moves the same way
            gens[mode] = use_weights(TorchGenerator(model, tok, "cpu"), "int8")
        else:
            gens[mode] = use_weights(TorchGenerator(model, tok, "cpu"), "int4")
    on, off = gens["on"].lean, gens["off"].lean
    assert on.huge_pages and not off.huge_pages
    base = on.qhead.q.untyped_storage().data_ptr()
    for lyr in on.layers:
        for w in (lyr.wq.fused, lyr.wo, lyr.w_gate.fused, lyr.w_down):
            assert w.q.untyped_storage().data_ptr() == base
    prompts = [prompt_ids(text, tok) for text in QUESTIONS]
    cfg = DecodeConfig(max_new_tokens=12, batch_size=3)
    assert [x.ids for x in gens["on"].generate(prompts, cfg)] == [x.ids for x in gens["off"].generate(prompts, cfg)]
