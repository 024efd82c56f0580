"""The one-op Gemma RMSNorm (train.fused_norm): the torch engine's models get it, with the loss
and gradients of transformers' norms to fp32 rounding (to the bit where the switch keeps
torch's ops), each input's gradient only where asked for, and transformers' own forward for
whatever the library does not take."""

from __future__ import annotations

import pytest
import torch

from tunix_rt.train import cpu_kernels
from tunix_rt.train.fused_norm import GEMMA_NORMS, RMSNorm, fuse_norms
from test_fused_mlp import fused_and_plain
from train_testlib import one_torch_thread  # noqa: E402,F401 (autouse fixture)


def _norms(model):
    return [m for m in model.modules() if type(m).__name__ in GEMMA_NORMS]


def _fused_and_plain(home, tiny_tok, preset, finetune):
    fused, plain, engine, norms = fused_and_plain(home, tiny_tok, preset, finetune, GEMMA_NORMS)
    per_layer = 6 if preset == "tiny-gemma3" else 4  # Gemma 3's q/k norms
    assert len(norms) == engine.module.base().config.num_hidden_layers * per_layer + 1
    assert fuse_norms(engine.model) == len(norms) and fuse_norms(engine.model) == 0  # once each
    return fused, plain


@pytest.mark.parametrize("preset", ["tiny-gemma3", "tiny-gemma2"])
@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_fused_norms_give_transformers_loss_and_gradients(home, tiny_tok, preset, finetune):
    assert cpu_kernels.library() is not None, cpu_kernels.WHY
    fused, plain = _fused_and_plain(home, tiny_tok, preset, finetune)
    assert fused[0] == pytest.approx(plain[0], rel=1e-6)
    differ = 0
    for name in plain[1]:
        torch.testing.assert_close(fused[1][name], plain[1][name], rtol=1e-4, atol=1e-6, msg=name)
        differ += not torch.equal(fused[1][name], plain[1][name])
    assert differ  # the library ran
    if finetune == "full":
        assert any("norm" in n for n in plain[1])  # the norms' own weights were compared too


def test_with_the_switch_off_the_norms_are_transformers_to_the_bit(home, tiny_tok, monkeypatch):
    monkeypatch.setenv(cpu_kernels.ENV, "torch")
    fused, plain = _fused_and_plain(home, tiny_tok, "tiny-gemma3", "full")
    assert fused[0] == plain[0]
    for name in plain[1]:
        assert torch.equal(fused[1][name], plain[1][name]), name


@pytest.mark.parametrize("need", [(True, False), (False, True), (True, True)])
def test_each_gradient_only_where_asked_for(need):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 24).requires_grad_(need[0])
    w = torch.randn(24).requires_grad_(need[1])
    y = RMSNorm.apply(x, w, 1e-6)
    grad = torch.randn_like(y)
    y.backward(grad)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w64) * grad.double()).sum().backward()
    assert (x.grad is not None, w.grad is not None) == need
    if need[0]:
        torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-5)
    if need[1]:
        torch.testing.assert_close(w.grad.double(), w64.grad, rtol=1e-5, atol=1e-5)


def test_what_the_library_does_not_take_runs_transformers_forward(home):
    from tunix_rt.models.hf import load_causal_lm
    from tunix_rt.models.store import ensure_model

    model = load_causal_lm(ensure_model("tiny-gemma3", home))
    norm = _norms(model)[0]
    x = torch.randn(2, 3, norm.weight.shape[0], dtype=torch.float64)
    want = norm.to(torch.float64)(x)
    assert fuse_norms(model) > 0
    assert torch.equal(norm(x), want)  # fp64: transformers' own ops, their bits
    x32 = torch.randn(2, 3, norm.weight.shape[0])
    norm.float()
    assert not torch.equal(norm(x32), type(norm).forward(norm, x32))  # fp32: the library's (other) bits
    torch.testing.assert_close(norm(x32), type(norm).forward(norm, x32))
