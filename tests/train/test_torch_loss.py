"""The fused chunked linear cross-entropy equals the plain loss over full logits: the loss
value and every gradient, for LoRA (frozen head) and full fine-tuning (head trained through
the tied embedding), on Gemma 3 and on Gemma 2 (final-logit soft-capping)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tunix_rt.render import render_example
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.data import collate, weighted
from tunix_rt.train.engine import NLL, Objective
from tunix_rt.train.loss import (FusedTokenObjective, chunked_linear_ce, chunked_logprobs, phi, plain_ce,
                                 sequence_logprobs, supervised_rows)
from tunix_rt.train import torch_engine as te
from train_testlib import one_torch_thread  # noqa: E402,F401 (autouse fixture)

POLICY = Objective("policy", eps_low=0.2, eps_high=0.28, beta=0.04)


def _examples(tok, n=3):
    qs = ["What is 2 + 3?", "Tom has 7 apples and eats 2. How many are left?", "Double 21."]
    steps = [["2 + 3 = 5"], ["7 - 2 = 5", "So 5 apples are left."], ["21 * 2 = 42"]]
    answers = ["5", "5", "42"]
    return [render_example(f"ex{i}", qs[i], steps[i], answers[i], tok, "Be brief.") for i in range(n)]


def _engine(cfg, model_dir, tok):
    engine = te.TorchEngine(cfg)
    engine.devices()
    engine.setup(model_dir, tok)
    if cfg.finetune == "lora":  # B starts at zero; make both LoRA factors carry gradient
        torch.manual_seed(1)
        with torch.no_grad():
            for n, p in engine.model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.02)
    return engine


def _loss_and_grads(engine, batch, objective=NLL):
    engine.model.zero_grad(set_to_none=True)
    loss, _ = engine.objective_sum(batch, objective)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in engine.model.named_parameters() if p.requires_grad}
    return float(loss.detach()), grads


def _policy_aux(batch, seed=0):
    """Random old/ref log-probs and advantages on every labelled position: ratios on both sides
    of both clip bounds, positive and negative advantages."""
    rng = np.random.default_rng(seed)
    shape = batch.labels.shape
    batch.aux = {"old_logp": rng.normal(-3.0, 1.0, shape).astype(np.float32),
                 "ref_logp": rng.normal(-3.0, 1.0, shape).astype(np.float32),
                 "adv": rng.normal(0.0, 1.0, shape).astype(np.float32)}
    return batch


@pytest.mark.parametrize("preset", ["tiny-gemma3", "tiny-gemma2"])
@pytest.mark.parametrize("finetune", ["lora", "full"])
@pytest.mark.parametrize("objective", [NLL, POLICY], ids=["nll", "policy"])
def test_chunked_equals_plain_on_tiny_models(home, tiny_tok, preset, finetune, objective):
    from tunix_rt.models.store import ensure_model

    cfg = TrainConfig(model=preset, dataset="unused.jsonl", finetune=finetune, device="cpu",
                      loss_chunk_bytes=7 * 1024 * 4)  # 7-token chunks of the 1024 vocabulary
    engine = _engine(cfg, ensure_model(preset, home), tiny_tok)
    assert (engine.softcap is not None) == (preset == "tiny-gemma2")
    batch = weighted([collate([[ex] for ex in _examples(tiny_tok)], tiny_tok.pad_id)])[0]
    if objective.kind == "policy":
        batch = _policy_aux(batch)
    chunked = _loss_and_grads(engine, batch, objective)
    engine.cfg = TrainConfig(**{**cfg.to_dict(), "loss_impl": "plain"})
    plain = _loss_and_grads(engine, batch, objective)
    assert chunked[0] == pytest.approx(plain[0], abs=1e-5)
    assert chunked[1].keys() == plain[1].keys() and len(chunked[1]) > 0
    for name in plain[1]:
        torch.testing.assert_close(chunked[1][name], plain[1][name], atol=1e-5, rtol=1e-5, msg=name)
    if finetune == "full":  # the head's (tied embedding's) gradient went through the fused loss
        emb = dict(engine.model.named_parameters())["model.embed_tokens.weight"]
        assert emb.requires_grad and plain[1]["model.embed_tokens.weight"].abs().sum() > 0


def test_policy_phi_derivative_matches_autograd_on_both_clip_sides():
    """phi'(logp) as the fused kernel forms it equals autograd through phi's value, at ratios
    below, inside and above the clip range, for both signs of the advantage."""
    torch.manual_seed(0)
    n = 400
    logp = torch.randn(n, dtype=torch.float64) - 2.0
    old = logp + torch.empty(n, dtype=torch.float64).uniform_(-0.6, 0.6)  # ratios from 0.55 to 1.8
    aux = torch.stack([old, logp + torch.randn(n, dtype=torch.float64), torch.randn(n, dtype=torch.float64)], -1)
    x = logp.clone().requires_grad_(True)
    value, grad, stats = phi(POLICY, x, aux)
    (auto,) = torch.autograd.grad(value.sum(), x)
    torch.testing.assert_close(grad, auto, atol=1e-12, rtol=1e-12)
    clipped, _kl, _ratio, tokens = stats.tolist()
    assert 0 < clipped < tokens == n  # both branches exercised


def test_logprobs_match_log_softmax():
    torch.manual_seed(0)
    h, w = torch.randn(11, 8), torch.randn(40, 8)
    y = torch.randint(0, 40, (11,))
    for cap in (None, 4.0):
        z = h @ w.t()
        z = cap * torch.tanh(z / cap) if cap else z
        ref = torch.log_softmax(z, -1).gather(1, y[:, None])[:, 0]
        torch.testing.assert_close(chunked_logprobs(h, w, y, 4 * 40 * 4, cap), ref, atol=1e-6, rtol=1e-6)


def test_function_matches_reference_with_softcap_and_odd_chunks():
    torch.manual_seed(0)
    h = torch.randn(13, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 50, (13,))
    for cap in (None, 3.0):
        z = h @ w.t()
        if cap:
            z = cap * torch.tanh(z / cap)
        ref = torch.nn.functional.cross_entropy(z, y, reduction="sum")
        gh, gw = torch.autograd.grad(ref, (h, w))
        got, _ = FusedTokenObjective.apply(h, w, y, torch.ones(13, dtype=torch.float64), None, 4, cap, NLL)  # chunk: 4 rows
        fh, fw = torch.autograd.grad(got * 2.0, (h, w))  # backward scales by the incoming gradient
        assert float(got.detach()) == pytest.approx(float(ref.detach()), rel=1e-6)
        torch.testing.assert_close(fh, 2 * gh, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(fw, 2 * gw, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])  # fp32: one logits buffer for all chunks
def test_sequence_logprobs_and_their_gradient_match_log_softmax(dtype):
    """The one-pass log-probs of a sequence objective: values and the gradient of any weighting
    of them (per-row coefficients learnt after the forward) equal autograd through the full
    logits, with and without the cap, over chunks that do not divide the rows; a training head
    is refused (its gradient needs the coefficients before the pass)."""
    torch.manual_seed(0)
    h = torch.randn(13, 16, dtype=dtype, requires_grad=True)
    w = torch.randn(50, 16, dtype=dtype)
    y = torch.randint(0, 50, (13,))
    coef = torch.randn(13, dtype=dtype)
    for cap in (None, 3.0):
        z = h @ w.t()
        if cap:
            z = cap * torch.tanh(z / cap)
        ref = torch.log_softmax(z, -1).gather(1, y[:, None])[:, 0]
        (gh,) = torch.autograd.grad((coef * ref).sum(), (h,))
        got = sequence_logprobs(h, w, y, 4 * 50 * 4, cap)  # 4 rows a chunk
        assert got.requires_grad
        torch.testing.assert_close(got.to(dtype), ref.detach(), atol=1e-5, rtol=1e-5)
        (fh,) = torch.autograd.grad((coef * got.to(dtype)).sum(), (h,))
        torch.testing.assert_close(fh, gh, atol=1e-5, rtol=1e-5)
        with torch.no_grad():
            assert not sequence_logprobs(h, w, y, 4 * 50 * 4, cap).requires_grad
    with pytest.raises(ValueError, match="head trains"):
        sequence_logprobs(h, w.clone().requires_grad_(True), y)


def test_no_grad_path_gives_the_same_loss():
    torch.manual_seed(0)
    h, w = torch.randn(9, 8), torch.randn(30, 8)
    y = torch.randint(0, 30, (9,))
    with torch.no_grad():
        a = chunked_linear_ce(h, w, y, chunk_bytes=4 * 30 * 4, softcap=5.0)  # 4 tokens a chunk
    ref = torch.nn.functional.cross_entropy(5.0 * torch.tanh((h @ w.t()) / 5.0), y, reduction="sum")
    assert float(a) == pytest.approx(float(ref), rel=1e-6)


@pytest.mark.parametrize("trained", [False, True])
def test_no_grad_loss_equals_the_training_pass_to_the_bit(trained):
    """token_objective without autograd (an evaluation's loss) takes the training pass's chunks
    and log-prob rule, so its total equals the training pass's to the bit: a frozen head in
    FROZEN_ROWS times taller chunks, the vocabulary in VOCAB_PARTS slices, and a trained one;
    both equal the fp64 reference."""
    from tunix_rt.train.chunking import FROZEN_ROWS, VOCAB_PARTS, balanced, rows_per_chunk
    from tunix_rt.train.loss import token_objective

    torch.manual_seed(0)
    h, w = torch.randn(37, 8), torch.randn(50, 8).requires_grad_(trained)
    y, coef = torch.randint(0, 50, (37,)), torch.rand(37)
    budget = 2 * 50 * 4  # a trained head's chunk: 2 rows
    assert rows_per_chunk(37, budget, 50) == 2 and VOCAB_PARTS > 1
    assert rows_per_chunk(37, budget, 50, frozen=True) == balanced(37, 2 * FROZEN_ROWS) < 37
    with torch.no_grad():
        a, _ = token_objective(h, w, y, coef, chunk_bytes=budget)
    b, _ = token_objective(h.clone().requires_grad_(True), w, y, coef, chunk_bytes=budget)
    assert torch.equal(a, b.detach())
    ref = -(coef.double() * torch.log_softmax((h @ w.detach().t()).double(), -1)[torch.arange(37), y]).sum()
    assert float(a) == pytest.approx(float(ref), rel=1e-6)


def test_supervised_rows_only_keeps_labelled_positions():
    hidden = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)
    labels = torch.tensor([[5, -100, 7], [-100, -100, 9]])
    h, y = supervised_rows(hidden, labels)
    assert y.tolist() == [5, 7, 9]
    assert h.tolist() == [[0, 1], [4, 5], [10, 11]]


def _plain64_loss_and_grads(model, head, batch):  # batch of torch tensors
    """The plain loss with the full [B, L, V] logits in float64: the exact reference. (fp32
    F.cross_entropy is off by ~6e-5 on Gemma 3 270M, whose logits reach ~100.)"""
    model.zero_grad(set_to_none=True)
    hidden = model.get_base_model().model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False)
    logits = hidden.last_hidden_state.double() @ head.double().t()
    flat, labels = logits.reshape(-1, logits.shape[-1]), batch.labels.reshape(-1)
    loss = torch.nn.functional.cross_entropy(flat, labels, ignore_index=-100, reduction="sum") / batch.n_supervised
    loss32 = plain_ce(logits.float(), batch.labels) / batch.n_supervised  # plain_ce works in fp32
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return float(loss.detach()), grads, float(loss32.detach())


@pytest.mark.slow
def test_chunked_equals_plain_on_gemma3_270m(gemma3_270m, tmp_path):
    """The real 262K vocabulary, LoRA on all projections, a small batch, against the plain
    loss computed exactly (float64 logits)."""
    from tunix_rt.models.tokenizer import ChatTokenizer

    tok = ChatTokenizer.from_file(gemma3_270m)
    cfg = TrainConfig(model=str(gemma3_270m), dataset="unused.jsonl", device="cpu",
                      loss_chunk_bytes=32 * 262144 * 4)  # 32-token chunks
    engine = _engine(cfg, gemma3_270m, tok)
    batch = weighted([collate([[ex] for ex in _examples(tok, 2)], tok.pad_id)])[0]
    chunked = _loss_and_grads(engine, batch)
    t = te.tensors(batch, "cpu")
    tb = type("B", (), {"input_ids": t["input_ids"], "position_ids": t["position_ids"], "labels": t["labels"],
                        "n_supervised": batch.n_supervised})
    exact, exact_grads, plain32 = _plain64_loss_and_grads(engine.model, engine.head_weight, tb)
    assert chunked[0] == pytest.approx(exact, abs=1e-5)
    assert abs(chunked[0] - exact) <= abs(plain32 - exact)  # at least as exact as fp32 logits
    for name in exact_grads:
        torch.testing.assert_close(chunked[1][name], exact_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_the_policy_objective_keeps_every_tensor_on_the_logits_device():
    """On "meta" (no data, like a GPU a CPU-made tensor cannot mix with) phi's statistics stack
    without a device error: the first CUDA GRPO step failed there ('Expected all tensors to be
    on the same device')."""
    import torch

    from tunix_rt.train.engine import Objective
    from tunix_rt.train.loss import phi

    logp = torch.zeros(5, device="meta")
    aux = torch.zeros(5, 3, device="meta")
    for obj in (Objective(kind="policy", beta=0.04), Objective(kind="policy", on_policy=True)):
        value, grad, stats = phi(obj, logp, aux)
        assert value.device.type == grad.device.type == stats.device.type == "meta" and stats.shape == (4,)


@pytest.mark.parametrize("matmul", ["mkl", "onednn"])
@pytest.mark.parametrize("parts", [1, 2, 3, 16])
@pytest.mark.parametrize("cap", [None, 3.0])
def test_frozen_head_rows_in_vocabulary_slices(parts, cap, matmul, monkeypatch):
    """A frozen head's rows, the vocabulary in slices (an online softmax): log p(y) and
    ((onehot - softmax) * cap') @ W equal autograd through the full fp64 logits, on a
    vocabulary the slices do not divide; the no-gradient pass gives the same log-probs to
    the bit, and the whole-vocabulary path (a training head) the same to rounding (the bits
    of one [c, V] matmul and of its slices' may differ with the threads' split)."""
    from tunix_rt.train import cpu_matmul
    from tunix_rt.train.loss import _chunk_logits, _target_logp, frozen_head_rows, logits_buffer

    monkeypatch.setenv(cpu_matmul.ENV, matmul)  # either library's products (train.cpu_matmul)
    cpu_matmul.backend.cache_clear()
    monkeypatch.setattr(cpu_matmul, "SLICE_ROWS", 7)  # the whole-vocabulary block filled in slices
    torch.manual_seed(0)
    v = 50 if parts < 16 else 16 * 40 + 7  # slices at least 17 wide (narrower ones take other matmul kernels)
    h = torch.randn(13, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(v, 16, dtype=torch.float64)
    y = torch.randint(0, v, (13,))
    z = h @ w.t()
    if cap:
        z = cap * torch.tanh(z / cap)
    ref = torch.log_softmax(z, dim=-1)[torch.arange(13), y]
    (ref_g,) = torch.autograd.grad(ref.sum(), h)
    h32, w32 = h.detach().float(), w.float()
    buf = logits_buffer(13, 13, w32, parts)
    if parts > 1 and matmul == "onednn":
        assert buf is None  # each slice's block is oneDNN's own, small and freed before the next
    else:
        assert buf.numel() == 13 * -(-v // parts)
    logp, g = frozen_head_rows(h32, w32, y, cap, buf, parts)
    torch.testing.assert_close(logp.double(), ref.detach(), atol=2e-6, rtol=1e-6)  # fp32 of |logp| ~ 23
    torch.testing.assert_close(g.double(), ref_g, atol=2e-6, rtol=0)
    assert torch.equal(frozen_head_rows(h32, w32, y, cap, None, parts, want_grad=False)[0], logp)
    whole = logits_buffer(13, 13, w32)
    zz, tt = _chunk_logits(h32, w32, cap, whole)
    assert (zz if cap is None else tt).data_ptr() == whole.data_ptr()  # the block is the buffer, either library
    torch.testing.assert_close(_target_logp(zz, y, False, parts)[1], logp, atol=1e-5, rtol=0)
    cpu_matmul.backend.cache_clear()
