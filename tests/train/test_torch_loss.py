"""The fused chunked linear cross-entropy equals the plain loss over full logits: the loss
value and every gradient, for LoRA (frozen head) and full fine-tuning (head trained through
the tied embedding), on Gemma 3 and on Gemma 2 (final-logit soft-capping)."""

from __future__ import annotations

import pytest
import torch

from tunix_rt.render import render_example
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.data import collate
from tunix_rt.train.loss import FusedLinearCrossEntropy, chunked_linear_ce, plain_ce, supervised_rows
from tunix_rt.train import torch_engine as te
from train_testlib import one_torch_thread  # noqa: E402,F401 (autouse fixture)


def _examples(tok, n=3):
    qs = ["What is 2 + 3?", "Tom has 7 apples and eats 2. How many are left?", "Double 21."]
    steps = [["2 + 3 = 5"], ["7 - 2 = 5", "So 5 apples are left."], ["21 * 2 = 42"]]
    answers = ["5", "5", "42"]
    return [render_example(f"ex{i}", qs[i], steps[i], answers[i], tok, "Be brief.") for i in range(n)]


def _loss_and_grads(model, head, batch, cfg):
    model.zero_grad(set_to_none=True)
    loss = te.batch_loss_sum(model, head, batch, cfg) / batch.n_supervised
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return float(loss.detach()), grads


@pytest.mark.parametrize("preset", ["tiny-gemma3", "tiny-gemma2"])
@pytest.mark.parametrize("method", ["lora", "full"])
def test_chunked_equals_plain_on_tiny_models(home, tiny_tok, preset, method):
    from tunix_rt.models.store import ensure_model

    cfg = TrainConfig(model=preset, dataset="unused.jsonl", method=method, loss_chunk_tokens=7)
    model, head = te.load_model(cfg, ensure_model(preset, home), torch.device("cpu"))
    if method == "lora":  # B starts at zero; make both LoRA factors carry gradient
        torch.manual_seed(1)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.02)
    assert (head.softcap is not None) == (preset == "tiny-gemma2")
    batch = collate([[ex] for ex in _examples(tiny_tok)], tiny_tok.pad_id)
    chunked = _loss_and_grads(model, head, batch, cfg)
    plain = _loss_and_grads(model, head, batch, TrainConfig(**{**cfg.to_dict(), "loss_impl": "plain"}))
    assert chunked[0] == pytest.approx(plain[0], abs=1e-5)
    assert chunked[1].keys() == plain[1].keys() and len(chunked[1]) > 0
    for name in plain[1]:
        torch.testing.assert_close(chunked[1][name], plain[1][name], atol=1e-5, rtol=1e-5, msg=name)
    if method == "full":  # the head's (tied embedding's) gradient went through the fused loss
        emb = dict(model.named_parameters())["model.embed_tokens.weight"]
        assert emb.requires_grad and plain[1]["model.embed_tokens.weight"].abs().sum() > 0


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
        got = FusedLinearCrossEntropy.apply(h, w, y, 4, cap)
        fh, fw = torch.autograd.grad(got * 2.0, (h, w))  # backward scales by the incoming gradient
        assert float(got.detach()) == pytest.approx(float(ref.detach()), rel=1e-6)
        torch.testing.assert_close(fh, 2 * gh, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(fw, 2 * gw, atol=1e-6, rtol=1e-6)


def test_no_grad_path_gives_the_same_loss():
    torch.manual_seed(0)
    h, w = torch.randn(9, 8), torch.randn(30, 8)
    y = torch.randint(0, 30, (9,))
    with torch.no_grad():
        a = chunked_linear_ce(h, w, y, chunk=4, softcap=5.0)
    ref = torch.nn.functional.cross_entropy(5.0 * torch.tanh((h @ w.t()) / 5.0), y, reduction="sum")
    assert float(a) == pytest.approx(float(ref), rel=1e-6)


def test_supervised_rows_only_keeps_labelled_positions():
    hidden = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)
    labels = torch.tensor([[5, -100, 7], [-100, -100, 9]])
    h, y = supervised_rows(hidden, labels)
    assert y.tolist() == [5, 7, 9]
    assert h.tolist() == [[0, 1], [4, 5], [10, 11]]


def _plain64_loss_and_grads(model, head, batch):
    """The plain loss with the full [B, L, V] logits in float64: the exact reference. (fp32
    F.cross_entropy is off by ~6e-5 on Gemma 3 270M, whose logits reach ~100.)"""
    model.zero_grad(set_to_none=True)
    hidden = te.decoder(model)(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False)
    logits = hidden.last_hidden_state.double() @ head.weight.double().t()
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
    cfg = TrainConfig(model=str(gemma3_270m), dataset="unused.jsonl", loss_chunk_tokens=32)
    model, head = te.load_model(cfg, gemma3_270m, torch.device("cpu"))
    torch.manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.01)
    batch = te.on_device(collate([[ex] for ex in _examples(tok, 2)], tok.pad_id))  # numpy → tensors
    chunked = _loss_and_grads(model, head, batch, cfg)
    exact, exact_grads, plain32 = _plain64_loss_and_grads(model, head, batch)
    assert chunked[0] == pytest.approx(exact, abs=1e-5)
    assert abs(chunked[0] - exact) <= abs(plain32 - exact)  # at least as exact as fp32 logits
    for name in exact_grads:
        torch.testing.assert_close(chunked[1][name], exact_grads[name], atol=1e-5, rtol=1e-4, msg=name)
