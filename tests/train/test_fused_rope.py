"""The one-op RoPE (train.fused_rope): transformers' apply_rotary_pos_emb to the bit, forward and
backward, on the layouts Gemma's attention hands it; the engine's loss and gradients the same
to the bit with it and without it; transformers' own rope for whatever it does not take."""

from __future__ import annotations

import pytest
import torch
from transformers.models.gemma3 import modeling_gemma3

from tunix_rt.train import cpu_kernels, fused_rope
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.data import collate, weighted
from test_torch_loss import _engine, _examples, _loss_and_grads
from train_testlib import one_torch_thread  # noqa: E402,F401 (autouse fixture)



def _transformers_rope(x, cos, sin):
    """apply_rotary_pos_emb's body for one tensor, with transformers' rotate_half (the module's
    function itself may be train.recompute's wrapper by now, which calls the fused op)."""
    return (x * cos.unsqueeze(1)) + (modeling_gemma3.rotate_half(x) * sin.unsqueeze(1))


def _trig(b, t, d, base=10000.0):
    """cos, sin [b, t, d] as Gemma's rotary embedding makes them (cat(freqs, freqs))."""
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    pos = torch.arange(t, dtype=torch.float32)[None, :, None] + 7 * torch.arange(b)[:, None, None]
    emb = torch.cat([pos * inv, pos * inv], dim=-1)
    return emb.cos(), emb.sin()


@pytest.mark.parametrize("layout", ["transposed", "contiguous"])
@pytest.mark.parametrize("shared", [False, True])
def test_rope_is_transformers_to_the_bit_forward_and_backward(layout, shared):
    torch.manual_seed(0)
    b, h, t, d = 3, 4, 37, 64
    if layout == "transposed":  # q_proj's output viewed [B, T, H, D], transposed as Gemma does
        x = torch.randn(b, t, h, d).transpose(1, 2)
    else:
        x = torch.randn(b, h, t, d)
    cos, sin = _trig(1 if shared else b, t, d)
    assert fused_rope.applies(x, cos, sin)
    x1, x2 = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    ours = fused_rope.rope(x1, cos, sin)
    theirs = _transformers_rope(x2, cos, sin)
    assert torch.equal(ours, theirs)
    grad = torch.randn(b, h, t, d)
    ours.backward(grad)
    theirs.backward(grad)
    assert torch.equal(x1.grad, x2.grad)
    ours2 = fused_rope.rope(x.detach().clone().requires_grad_(), cos, sin)
    ours2.backward(grad.transpose(1, 2).contiguous().transpose(1, 2))  # the gradient in another layout
    assert torch.equal(ours2, ours)


def test_what_it_does_not_take():
    x = torch.randn(2, 3, 5, 8)
    cos, sin = _trig(2, 5, 8)
    assert fused_rope.applies(x, cos, sin)
    assert not fused_rope.applies(x, cos, sin, unsqueeze_dim=2)
    assert not fused_rope.applies(x.double(), cos.double(), sin.double())
    assert not fused_rope.applies(torch.randn(2, 3, 5, 7), *_trig(2, 5, 7)[:1], _trig(2, 5, 7)[0])
    assert not fused_rope.applies(x, *_trig(2, 6, 8))  # another length
    assert not fused_rope.applies(x[..., ::2], *_trig(2, 5, 4))  # rows not contiguous


@pytest.mark.parametrize("remat", [False, True])
def test_the_engine_gives_the_same_loss_and_gradients_with_and_without_it(home, tiny_tok, monkeypatch, remat):
    """With train.recompute's recipes and under gradient checkpointing alike."""
    from tunix_rt.models.store import ensure_model

    assert cpu_kernels.library() is not None, cpu_kernels.WHY
    cfg = TrainConfig(model="tiny-gemma3", dataset="unused.jsonl", finetune="full", device="cpu",
                      gradient_checkpointing=remat)
    engine = _engine(cfg, ensure_model("tiny-gemma3", home), tiny_tok)
    batch = weighted([collate([[ex] for ex in _examples(tiny_tok)], tiny_tok.pad_id)])[0]
    calls = []
    real = fused_rope.Rope.forward

    def counted(ctx, *a):
        calls.append(1)
        return real(ctx, *a)

    monkeypatch.setattr(fused_rope.Rope, "forward", staticmethod(counted))
    with_it = _loss_and_grads(engine, batch)
    assert calls  # it ran
    monkeypatch.setattr(fused_rope, "applies", lambda *a, **k: False)  # transformers' rope
    without = _loss_and_grads(engine, batch)
    assert with_it[0] == without[0]
    for name in without[1]:
        assert torch.equal(with_it[1][name], without[1][name]), name
