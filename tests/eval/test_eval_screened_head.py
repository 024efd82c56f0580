"""The int8-screened head (tunix_rt.eval.screened_head), greedy: the probe of the int8 kernel
tells the truth at the shapes the screen serves, the screen never drops a token that can win
(adversarial near-ties, rows of very different norms, outlier activations, Gemma 2's
softcap), it takes full logits wherever no bound holds (non-finite weights or activations,
logits near fp32 overflow, NaN bounds, a saturating kernel, a head changed in place), it
actually screens where the kernel is exact, and greedy generation through it gives the same
ids as full fp32 logits. Sampling through it: test_eval_sampling.py.

Nothing here assumes this machine's int8 kernel is exact: where it is not, the tests check
that the screen is off and the ids still equal full logits (and
test_a_saturating_int8_kernel_turns_the_screen_off runs oneDNN's saturating AVX2 kernel on
every machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eval_testlib import QUESTIONS, aimed_inputs, assert_screened, near_tie_head, stop_early
from tunix_rt.eval.generate import DecodeConfig, TorchGenerator
from tunix_rt.eval.runner import load_model
from tunix_rt.eval.screened_head import PROBED, ScreenedArgmax, int8_matmul_is_exact, int8_matmul_is_fast, int_thresholds
from tunix_rt.render import prompt_ids

SRC = Path(__file__).resolve().parents[2] / "src"


def _exact_on_extremes(rows: int, d: int, v: int) -> bool:
    """The product the screen takes (`int_mm`: our VNNI kernel where it serves, else
    torch._int_mm) checked directly, not through the probe's code: the int8 extremes whose
    pair sums overflow int16, and random values against an int64 reference."""
    from tunix_rt.eval.int8_kernel import int_mm

    for xv, wv in [(127, 127), (-127, 127), (127, -127), (-127, -127)]:
        xq = torch.full((rows, d), xv, dtype=torch.int8)
        wq = torch.full((v, d), wv, dtype=torch.int8)
        if not torch.equal(int_mm(xq, wq), torch.full((rows, v), xv * wv * d, dtype=torch.int32)):
            return False
    g = torch.Generator().manual_seed(1)
    xq = torch.randint(-127, 128, (rows, d), dtype=torch.int8, generator=g)
    wq = torch.randint(-127, 128, (v, d), dtype=torch.int8, generator=g)
    return torch.equal(int_mm(xq, wq).long(), xq.long() @ wq.long().t())


def test_the_probe_tells_whether_the_int8_kernel_is_exact():
    """The bound assumes exact int32 sums; the probe's verdict at decode shapes (2B rows,
    the screen's padded columns) equals a direct check, whatever this CPU's kernel does."""
    for rows, d, v in [(2, 640, 4096), (6, 640, 2560), (16, 1152, 1024)]:
        assert int8_matmul_is_exact(rows, d, v) == _exact_on_extremes(rows, d, v)
        assert PROBED[(rows, d, v)] == int8_matmul_is_exact(rows, d, v)


@pytest.mark.parametrize("softcap", [None, 30.0])
@pytest.mark.parametrize("vocab,groups", [(5003, 8), (4096, 64)])
def test_screen_picks_the_full_argmax(softcap, vocab, groups):
    head = near_tie_head(vocab, 64, seed=vocab)
    screen = ScreenedArgmax(head, softcap=softcap, groups=groups, pad_cols=1)
    x = aimed_inputs(head, 16, seed=1)
    full = x @ head.t()
    if softcap is not None:
        full = torch.tanh(full / softcap) * softcap
    for b in range(0, 16, 4):  # batches of 4 rows
        assert torch.equal(screen.argmax(x[b: b + 4]), full[b: b + 4].argmax(1))
    assert_screened(screen, 4)


def test_every_token_near_the_top_survives_the_screen_and_few_others_do():
    """Soundness: every token within 1e-3 of a row's best logit is a candidate (the true
    argmax always is). Usefulness: the candidates are a small part of the vocabulary."""
    head = near_tie_head(20000, 128, seed=3)
    screen = ScreenedArgmax(head, groups=16)
    x = aimed_inputs(head, 8, seed=4)
    cand = set(screen.candidates_of(x).tolist())
    logits = x @ head.t()
    near = (logits >= logits.amax(1, keepdim=True) - 1e-3).any(0).nonzero().squeeze(1).tolist()
    assert set(near) <= cand
    assert len(cand) < 0.05 * head.shape[0] if screen.kernel_exact(8) else len(cand) == head.shape[0]


def test_wide_hidden_sizes_do_not_overflow_the_integer_screen():
    """At D = 1152 (Gemma 3 1B) 127*acc1 + acc2 can pass 2^31: flat activations against a
    flat row reach it; the screen must still find that row (it wrapped negative once)."""
    head = torch.randn(2048, 1152, generator=torch.Generator().manual_seed(5)) * 0.01
    head[1234] = 1.0
    x = torch.ones(2, 1152)
    screen = ScreenedArgmax(head, groups=8, pad_cols=1)
    assert screen.wide
    assert screen.argmax(x).tolist() == (x @ head.t()).argmax(1).tolist() == [1234, 1234]
    assert_screened(screen, 2)


def test_non_finite_hidden_states_fall_back_to_full_logits():
    head = near_tie_head(4096, 32, seed=6)
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(7))
    x[1, 4] = float("nan")
    x[2, 0] = float("inf")
    screen = ScreenedArgmax(head, groups=8)
    assert torch.equal(screen.argmax(x), (x @ head.t()).argmax(1))
    assert screen.steps == 0 and screen.full_rows == 3


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_head_with_a_non_finite_weight_gets_no_screen(bad, tiny_dirs):
    """No bound holds for a NaN or infinite weight: build() refuses (full logits), the class
    refuses to be built by hand, and the lean decode step keeps full logits."""
    head = near_tie_head(4096, 32, seed=8)
    head[100, 3] = bad
    assert ScreenedArgmax.build(head) is None
    with pytest.raises(ValueError, match="non-finite"):
        ScreenedArgmax(head)
    model = load_model(tiny_dirs["tiny-gemma3"], None, "cpu")
    with torch.no_grad():
        model.lm_head.weight[5, 0] = bad  # tied: the embedding row of a token no prompt uses
    from tunix_rt.eval.fast_gemma import LeanGemma

    assert LeanGemma.for_model(model).screen() is None


def test_nan_and_infinite_bounds_keep_every_token():
    """The integer thresholds never cast a NaN (undefined behaviour): a NaN or infinite bound
    keeps every token of that row and group, i.e. full logits there."""
    low = torch.tensor([5.0, float("nan"), float("inf"), 5.0], dtype=torch.float64)
    err = torch.tensor([[1.0, 2.0], [1.0, 1.0], [1.0, 1.0], [float("inf"), float("nan")]], dtype=torch.float64)
    step = torch.full((4, 2), 0.5, dtype=torch.float64)
    for dtype in (torch.int32, torch.int64):
        thr = int_thresholds(low, err, step, dtype)
        assert thr.dtype == dtype
        assert thr.tolist() == [[8, 6]] + [[-(2**31)] * 2] * 3


def _overflowing_head(partial_sums: bool) -> torch.Tensor:
    head = torch.randn(4096, 64, generator=torch.Generator().manual_seed(9))
    if partial_sums:  # exact sum 0 against flat x, but the partial sums pass FLT_MAX
        head[200] = torch.tensor([3.0e19, 3.0e19, -3.0e19, -3.0e19] * 16)
    else:
        head[100] = 1.0e19  # x·w = 6.4e38 against x = 1e18: +inf in fp32
        head[3000] = 2.0e19  # 1.28e39 in exact arithmetic, also +inf: the first one must win
    return head


def test_logits_near_fp32_overflow_take_full_logits():
    """Where |x|·|w| nears FLT_MAX the reference matmul's products or partial sums round to
    inf and the rounding bound fails: two tokens whose fp32 logits are both +inf go to the
    first one (argmax), which an exact-arithmetic screen had dropped; a row whose exact sum is
    0 becomes inf or NaN, which the screen had dropped too. The screen now takes full logits
    there, and keeps screening ordinary rows."""
    head = _overflowing_head(partial_sums=False)
    screen = ScreenedArgmax(head, groups=8, pad_cols=1)
    x = torch.full((1, 64), 1.0e18)
    full = x @ head.t()
    assert full[0, 100] == full[0, 3000] == float("inf")
    assert screen.argmax(x).tolist() == full.argmax(1).tolist() == [100]
    assert screen.full_rows == 1 and screen.steps == 0
    normal = torch.randn(2, 64, generator=torch.Generator().manual_seed(10)) * 1e-19
    assert torch.equal(screen.argmax(normal), (normal @ head.t()).argmax(1))
    assert (screen.steps, screen.full_rows) == ((2, 1) if screen.kernel_exact(2) else (0, 3))

    head = _overflowing_head(partial_sums=True)
    screen = ScreenedArgmax(head, groups=8, pad_cols=1)
    x = torch.full((1, 64), 1.0e19)
    full = x @ head.t()
    assert not torch.isfinite(full[0, 200])
    assert screen.argmax(x).tolist() == full.argmax(1).tolist() == [200]
    assert screen.full_rows == 1


def test_build_applies_to_large_cpu_fp32_heads_only():
    head = torch.randn(4096, 16)
    assert (ScreenedArgmax.build(head) is not None) == (int8_matmul_is_exact(2, 16, 4096) and int8_matmul_is_fast())
    assert ScreenedArgmax.build(torch.randn(300, 16)) is None  # small vocabulary: plain matmul
    assert ScreenedArgmax.build(torch.randn(4096, 16).double()) is None


def test_the_speed_probe_trusts_our_kernel_and_measures_torchs_at_two_batch_sizes(monkeypatch):
    """Where our int8 kernel serves the head's width the screen is taken as fast without a probe
    (int_mm is not called); where torch's product would serve, it is timed at 2 and at 16 rows
    and must beat fp32 at both (a reference kernel that grows with the rows fails the second)."""
    from tunix_rt.eval import int8_kernel, screened_head

    saved = list(screened_head.FAST)
    calls = []

    def counted(lhs, w, sums=None, vnni=False):
        calls.append(lhs.shape[0])
        return torch._int_mm(lhs, w.t()) if lhs.shape[0] > 16 else (lhs.double() @ w.double().t()).to(torch.int32)

    try:
        monkeypatch.setattr(screened_head, "int_mm", counted)
        screened_head.FAST.clear()
        if int8_kernel.serves(640):
            assert int8_matmul_is_fast() and calls == []
        screened_head.FAST.clear()
        monkeypatch.setattr(screened_head, "serves", lambda k: False)
        int8_matmul_is_fast()
        assert 2 in calls and (16 in calls or not screened_head.FAST[0])
    finally:
        screened_head.FAST[:] = saved


def _child(code: str, *args: str, **env: str) -> dict:
    """Run `code` in a fresh interpreter (oneDNN reads its ISA limit once, at start-up);
    it prints one JSON object."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(Path(__file__).parent)]), **env}
    out = subprocess.run([sys.executable, "-c", code, *args], env=full_env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


SATURATING = """
import json, sys, torch
torch.set_num_threads(1)
from eval_testlib import QUESTIONS
from tunix_rt.eval.generate import DecodeConfig, TorchGenerator
from tunix_rt.eval.runner import load_model
from tunix_rt.eval.screened_head import ScreenedArgmax, int8_matmul_is_exact
from tunix_rt.models.tokenizer import ChatTokenizer
from tunix_rt.render import prompt_ids

d = sys.argv[1]
model, tok = load_model(d, None, "cpu"), ChatTokenizer.from_file(d)
dim, vocab = model.config.hidden_size, model.config.vocab_size
ones = torch.full((2, dim), 127, dtype=torch.int8)
want = torch.full((2, 2), 127 * 127 * dim, dtype=torch.int32)


def avx2_int_mm(a, b):
    # What oneDNN's AVX2 s8s8 kernel computes (vpmaddubsw): a + 128 as u8 times b, adjacent
    # pairs summed into int16 with saturation, then int32 sums minus the 128 * sum(b)
    # compensation. Used where the forced kernel of this CPU happens to be exact (seen on
    # some AMD EPYC machines), so the guard is still tested against a saturating kernel.
    u, w = a.to(torch.int32) + 128, b.to(torch.int32)
    prod = u[:, None, :] * w.t()[None, :, :]  # [m, n, k]
    if prod.shape[-1] % 2:
        prod = torch.nn.functional.pad(prod, (0, 1))
    pairs = prod.view(*prod.shape[:2], -1, 2).sum(-1).clamp(-32768, 32767)
    return (pairs.sum(-1) - 128 * w.sum(0)[None, :]).to(torch.int32)


real_saturates = not torch.equal(torch._int_mm(ones, ones.t()), want)
if not real_saturates:
    torch._int_mm = avx2_int_mm
res = {"real_saturates": real_saturates, "saturates": not torch.equal(torch._int_mm(ones, ones.t()), want),
       "probe": int8_matmul_is_exact(2, dim, vocab)}
default, forced, plain = TorchGenerator(model, tok), TorchGenerator(model, tok), TorchGenerator(model, tok, lean=False)
res["built"] = default.lean.screen() is not None
forced.lean._screen = ScreenedArgmax(forced.lean.head.detach(), forced.lean.final_softcap, groups=4, pad_cols=1)
prompts = [prompt_ids(q, tok) for q in QUESTIONS[:4]]
res["same"] = []
for cfg in (DecodeConfig(max_new_tokens=12, batch_size=4),
            DecodeConfig(max_new_tokens=12, batch_size=4, temperature=1.0, top_p=0.9, seed=3)):
    ids = [[g.ids for g in gen.generate(prompts, cfg)] for gen in (default, forced, plain)]
    res["same"].append(ids[0] == ids[1] == ids[2])
res["forced"] = [forced.lean._screen.steps, forced.lean._screen.full_rows]
head = torch.randn(2048, 640, generator=torch.Generator().manual_seed(5)) * 0.01
head[1234] = 1.0  # int8 pairs that overflow int16: a saturating kernel reads ~5 for its 640
head[99] = 0.5  # pairs just inside int16: read exactly, 320
res["unit"] = ScreenedArgmax(head, groups=8, pad_cols=1).argmax(torch.ones(2, 640)).tolist()
print(json.dumps(res))
"""


def test_a_saturating_int8_kernel_turns_the_screen_off(tiny_dirs):
    """oneDNN's AVX2 int8 kernel (forced with ONEDNN_MAX_CPU_ISA=AVX2, as on a CPU without
    VNNI) saturates int16 pair sums: the probe says so, build() gives no screen, a screen
    made by hand finds the kernel inexact at every shape it serves and takes full logits,
    and greedy and sampled ids equal full logits (lean step and transformers). A head whose
    best row saturates (read as ~5 instead of 640) still gives its argmax. Where the forced
    kernel is exact on this CPU, the child stands in a computation of what that kernel does
    (`avx2_int_mm`) for `torch._int_mm`; our own VNNI kernel (tunix_rt.eval.int8_kernel) is
    switched off there, so the products go through torch's."""
    res = _child(SATURATING, str(tiny_dirs["tiny-gemma3"]), ONEDNN_MAX_CPU_ISA="AVX2", TUNIX_RT_INT8_KERNEL="torch")
    assert res["saturates"], "the forced AVX2 kernel should saturate: the test would prove nothing"
    assert res["probe"] is False and res["built"] is False
    assert res["same"] == [True, True]
    steps, full_rows = res["forced"]
    assert steps == 0 and full_rows > 0
    assert res["unit"] == [1234, 1234]


SLOW_KERNEL = """
import json, sys, time, torch
torch.set_num_threads(1)
real = torch._int_mm


def slow_int_mm(a, b):  # exact, as a reference kernel is, and far slower than fp32
    time.sleep(0.2)
    return real(a, b)


torch._int_mm = slow_int_mm
from tunix_rt.eval.screened_head import ScreenedArgmax, int8_matmul_is_exact, int8_matmul_is_fast
head = torch.randn(4096, 16, generator=torch.Generator().manual_seed(0))
print(json.dumps({"exact": int8_matmul_is_exact(2, 16, 4096), "fast": int8_matmul_is_fast(),
                  "built": ScreenedArgmax.build(head) is not None}))
"""


def test_an_int8_kernel_slower_than_fp32_turns_the_screen_off():
    """An exact int8 kernel that is slower than the fp32 matmul it would replace (oneDNN's
    reference kernel on a CPU it has no fast one for: 12x slower on one AMD EPYC here) gives
    no screen: build() measures once and keeps full logits. (Our VNNI kernel is switched off
    in the child: the products go through the slowed torch._int_mm.)"""
    res = _child(SLOW_KERNEL, TUNIX_RT_INT8_KERNEL="torch")
    assert res == {"exact": True, "fast": False, "built": False}


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
    assert_screened(screened.lean._screen, len(prompts))


def test_default_screen_on_the_tiny_vocabulary_decodes_the_same(model_and_tok):
    """build()'s defaults (64 groups, 256-column rescoring) apply to the tiny models too;
    turning the screen off (`_screen = None`: full logits, then argmax) changes no id."""
    model, tok = model_and_tok
    prompts = [prompt_ids(q, tok) for q in QUESTIONS]
    cfg = DecodeConfig(max_new_tokens=16, batch_size=len(prompts))
    on, off = TorchGenerator(model, tok), TorchGenerator(model, tok)
    off.lean._screen = None
    assert [g.ids for g in on.generate(prompts, cfg)] == [g.ids for g in off.generate(prompts, cfg)]
    screen = on.lean.screen()
    assert off.lean.screen() is None
    if int8_matmul_is_exact(2, model.config.hidden_size, 1024) and int8_matmul_is_fast():
        assert isinstance(screen, ScreenedArgmax) and screen.steps > 0
    else:
        assert screen is None


def test_a_head_changed_in_place_gets_a_new_screen(tiny_dirs):
    """After a decode built the screen, a weight changes in place (as an optimizer step or
    load_state_dict changes it): the next decode rebuilds the screen rather than bound the
    old weights (which dropped the now-favoured token), and still equals full logits."""
    from tunix_rt.models.tokenizer import ChatTokenizer

    d = tiny_dirs["tiny-gemma3"]
    model, tok = load_model(d, None, "cpu"), ChatTokenizer.from_file(d)
    prompts = [prompt_ids(q, tok) for q in QUESTIONS]
    cfg = DecodeConfig(max_new_tokens=12, batch_size=len(prompts))
    gen, plain = TorchGenerator(model, tok), TorchGenerator(model, tok, lean=False)
    gen.generate(prompts, cfg)
    before = gen.lean.screen()
    with torch.no_grad():
        model.get_input_embeddings().weight[500] *= 10.0  # tied: token 500's logits x10
    want = [g.ids for g in plain.generate(prompts, cfg)]
    assert sum(ids.count(500) for ids in want) > 10
    assert [g.ids for g in gen.generate(prompts, cfg)] == want
    assert gen.lean.screen() is not before if before is not None else gen.lean.screen() is None


def test_every_shape_the_int8_kernel_serves_is_probed_first(tiny_dirs):
    """Rows stop at different steps, so the batch shrinks and the int8 matmul sees new row
    counts: each (2B rows, D, padded vocabulary) it served was probed, and the ids equal full
    logits."""
    from tunix_rt.models.tokenizer import ChatTokenizer

    d = tiny_dirs["tiny-gemma3"]
    model, tok = load_model(d, None, "cpu"), ChatTokenizer.from_file(d)
    prompts = [prompt_ids(q, tok, "" if i % 2 else "Think, then answer.") for i, q in enumerate(QUESTIONS)]
    stop_early(model, tok, prompts)
    cfg = DecodeConfig(max_new_tokens=12, batch_size=len(prompts))
    gen, plain = TorchGenerator(model, tok), TorchGenerator(model, tok, lean=False)
    gen.lean._screen = ScreenedArgmax(gen.lean.head.detach(), None, groups=4, pad_cols=1)
    PROBED.clear()
    want = [g.ids for g in plain.generate(prompts, cfg)]
    assert [g.ids for g in gen.generate(prompts, cfg)] == want
    alive = {sum(len(w) > s for w in want) for s in range(1, 12)} - {0}  # rows per decode step
    assert len(alive) > 1, "the batch should shrink"
    assert {(2 * b, model.config.hidden_size, 1024) for b in alive} == PROBED.keys()


def test_a_model_loaded_under_inference_mode_still_gets_its_screen(tiny_dirs):
    """Weights made under torch.inference_mode keep no version counter (reading it raises):
    the screen is built once and decodes as full logits do."""
    from tunix_rt.models.tokenizer import ChatTokenizer

    d = tiny_dirs["tiny-gemma3"]
    tok = ChatTokenizer.from_file(d)
    with torch.inference_mode():
        model = load_model(d, None, "cpu")
    prompts = [prompt_ids(q, tok) for q in QUESTIONS[:3]]
    cfg = DecodeConfig(max_new_tokens=8, batch_size=3)
    gen, plain = TorchGenerator(model, tok), TorchGenerator(model, tok, lean=False)
    assert [g.ids for g in gen.generate(prompts, cfg)] == [g.ids for g in plain.generate(prompts, cfg)]
    assert (gen.lean.screen() is not None) == (int8_matmul_is_exact(2, model.config.hidden_size, 1024) and int8_matmul_is_fast())


def test_rows_over_counts_a_rows_kept_tokens_exactly():
    """The screen's wide-row test: the rows with more than n kept tokens, whether a row's
    8-byte words decide it (a width a multiple of 8) or every row is counted byte by byte."""
    from tunix_rt.eval.screened_head import _rows_over

    g = torch.Generator().manual_seed(4)
    for width in (4096, 4099):
        keep = torch.rand(6, width, generator=g) < 0.01
        keep[1, :600] = True  # 600+ kept
        keep[4, ::8] = True  # 512+ kept, one a word: words x 8 overstate it 8 times
        keep[5] = False
        keep[5, :501] = True  # just over 500
        want = [r for r in range(6) if int(keep[r].sum()) > 500]
        assert _rows_over(keep, 500) == want and 5 in want and 1 in want
        assert _rows_over(keep, width) == []
