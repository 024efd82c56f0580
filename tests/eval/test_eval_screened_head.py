"""The int8-screened greedy head (tunix_rt.eval.screened_head): the int8 kernel is exact
integer arithmetic, the screen never drops a token that can win (adversarial near-ties,
rows of very different norms, outlier activations, Gemma 2's softcap), it actually screens,
and greedy generation through it gives the same ids as full fp32 logits."""

from __future__ import annotations

import pytest
import torch

from eval_testlib import QUESTIONS
from tunix_rt.eval.generate import DecodeConfig, TorchGenerator
from tunix_rt.eval.runner import load_model
from tunix_rt.eval.screened_head import ScreenedArgmax
from tunix_rt.render import prompt_ids


def test_int8_matmul_is_exact_integer_arithmetic():
    """The bound assumes exact int32 sums: no int16 saturation (AVX2's vpmaddubsw saturates
    pairs of products above 32767) for the most extreme int8 values, nor for random ones."""
    d, v = 640, 4096
    for xv, wv in [(127, 127), (-127, 127), (-128, -128), (127, -128), (-127, -127)]:
        xq = torch.full((16, d), xv, dtype=torch.int8)
        wq = torch.full((v, d), wv, dtype=torch.int8)
        assert torch.equal(torch._int_mm(xq, wq.t()), torch.full((16, v), xv * wv * d, dtype=torch.int32))
    g = torch.Generator().manual_seed(0)
    xq = torch.randint(-128, 128, (16, d), dtype=torch.int8, generator=g)
    wq = torch.randint(-128, 128, (v, d), dtype=torch.int8, generator=g)
    assert torch.equal(torch._int_mm(xq, wq.t()).long(), xq.long() @ wq.long().t())


def _head(vocab: int, dim: int, seed: int) -> torch.Tensor:
    """Rows of very different norms (log-normal scales, as real embeddings), a few zero rows,
    and near-copies of some rows: logits that differ by ~1e-4, far below the int8 error."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(vocab, dim, generator=g) * torch.exp(torch.randn(vocab, 1, generator=g))
    w[7] = 0.0
    w[vocab // 2] = 0.0
    for i in range(0, 40, 4):
        w[vocab - 1 - i] = w[i] * (1 + 1e-4)  # a later near-copy, slightly larger
        w[vocab - 2 - i] = w[i + 1] * (1 - 1e-4)  # a later near-copy, slightly smaller
    return w


def _inputs(head: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """Hidden states aimed at the near-copies (so the top two logits nearly tie), plus
    random ones with an outlier dimension (coarse activation quantisation)."""
    g = torch.Generator().manual_seed(seed)
    aimed = head[torch.arange(0, 40, 2)][: n // 2] * 3 + 0.05 * torch.randn(n // 2, head.shape[1], generator=g)
    rand = torch.randn(n - n // 2, head.shape[1], generator=g)
    rand[:, 3] *= 40.0
    return torch.cat([aimed, rand])


@pytest.mark.parametrize("softcap", [None, 30.0])
@pytest.mark.parametrize("vocab,groups", [(5003, 8), (4096, 64)])
def test_screen_picks_the_full_argmax(softcap, vocab, groups):
    head = _head(vocab, 64, seed=vocab)
    screen = ScreenedArgmax(head, softcap=softcap, groups=groups, pad_cols=1)
    x = _inputs(head, 16, seed=1)
    full = x @ head.t()
    if softcap is not None:
        full = torch.tanh(full / softcap) * softcap
    for b in range(0, 16, 4):  # batches of 4 rows
        assert torch.equal(screen.argmax(x[b: b + 4]), full[b: b + 4].argmax(1))


def test_every_token_near_the_top_survives_the_screen_and_few_others_do():
    """Soundness: every token within 1e-3 of a row's best logit is a candidate (the true
    argmax always is). Usefulness: the candidates are a small part of the vocabulary."""
    head = _head(20000, 128, seed=3)
    screen = ScreenedArgmax(head, groups=16)
    x = _inputs(head, 8, seed=4)
    cand = set(screen.candidates_of(x).tolist())
    logits = x @ head.t()
    near = (logits >= logits.amax(1, keepdim=True) - 1e-3).any(0).nonzero().squeeze(1).tolist()
    assert set(near) <= cand
    assert len(cand) < 0.05 * head.shape[0]


def test_wide_hidden_sizes_do_not_overflow_the_integer_screen():
    """At D = 1152 (Gemma 3 1B) 127*acc1 + acc2 can pass 2^31: flat activations against a
    flat row reach it; the screen must still find that row (it wrapped negative once)."""
    head = torch.randn(2048, 1152, generator=torch.Generator().manual_seed(5)) * 0.01
    head[1234] = 1.0
    x = torch.ones(2, 1152)
    screen = ScreenedArgmax(head, groups=8, pad_cols=1)
    assert screen.wide
    assert screen.argmax(x).tolist() == (x @ head.t()).argmax(1).tolist() == [1234, 1234]


def test_non_finite_hidden_states_fall_back_to_full_logits():
    head = _head(4096, 32, seed=6)
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(7))
    x[1, 4] = float("nan")
    x[2, 0] = float("inf")
    screen = ScreenedArgmax(head, groups=8)
    assert torch.equal(screen.argmax(x), (x @ head.t()).argmax(1))


def test_the_machine_probe_of_the_int8_kernel_passes_here():
    """build() turns the screen off where the probe fails (an int8 kernel that saturates);
    this machine's kernel is exact (test_int8_matmul_is_exact_integer_arithmetic)."""
    from tunix_rt.eval.screened_head import int8_matmul_is_exact

    assert int8_matmul_is_exact(640) and int8_matmul_is_exact(1152)


def test_build_applies_to_large_cpu_fp32_heads_only():
    assert ScreenedArgmax.build(torch.randn(4096, 16)) is not None
    assert ScreenedArgmax.build(torch.randn(300, 16)) is None  # small vocabulary: plain matmul
    assert ScreenedArgmax.build(torch.randn(4096, 16).double()) is None


@pytest.fixture(scope="module", params=["tiny-gemma3", "tiny-gemma2"])
def model_and_tok(request, tiny_dirs):
    from tunix_rt.models.tokenizer import ChatTokenizer

    d = tiny_dirs[request.param]
    return load_model(d, None, "cpu"), ChatTokenizer.from_file(d)


def test_greedy_generation_through_the_screen_equals_full_logits(model_and_tok):
    """The tiny vocabularies are below build()'s size floor, so the screen is forced on
    (4 groups, no column padding): same ids as the plain transformers path (Gemma 2 with
    its final softcap included), and the screen did the work."""
    model, tok = model_and_tok
    prompts = [prompt_ids(q, tok) for q in QUESTIONS]
    cfg = DecodeConfig(max_new_tokens=24, batch_size=len(prompts))
    screened, plain = TorchGenerator(model, tok), TorchGenerator(model, tok, lean=False)
    screened.lean._screen = ScreenedArgmax(screened.lean.head.detach(), screened.lean.final_softcap,
                                           groups=4, pad_cols=1)
    assert [g.ids for g in screened.generate(prompts, cfg)] == [g.ids for g in plain.generate(prompts, cfg)]
    assert screened.lean._screen.steps > 0


def test_default_screen_on_the_tiny_vocabulary_decodes_the_same(model_and_tok):
    """build()'s defaults (64 groups, 256-column rescoring) apply to the tiny models too;
    turning the screen off (`_screen = None`: full logits, then argmax) changes no id."""
    model, tok = model_and_tok
    prompts = [prompt_ids(q, tok) for q in QUESTIONS]
    cfg = DecodeConfig(max_new_tokens=16, batch_size=len(prompts))
    on, off = TorchGenerator(model, tok), TorchGenerator(model, tok)
    assert isinstance(on.lean.screen(), ScreenedArgmax)
    off.lean._screen = None
    assert [g.ids for g in on.generate(prompts, cfg)] == [g.ids for g in off.generate(prompts, cfg)]
    assert on.lean._screen.steps > 0 and off.lean.screen() is None
