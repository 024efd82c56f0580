"""Gemma's rotary position embedding as one op forward and one backward on the CPU (PyTorch
engine, fp32), with transformers' bits.

transformers' apply_rotary_pos_emb computes (x · cos) + (rotate_half(x) · sin) for q and k:
a slice, a negation, a concatenation, two products and a sum forward, as many again and the
slices' zero-filled gradients backward. `Rope` runs the same multiplications and additions in
one pass each way (train.cpu_kernels' `rope`): y₁ = x₁c₁ + (−x₂)s₁, y₂ = x₂c₂ + x₁s₂, and the
gradient g₁c₁ + g₂s₂, g₂c₂ + (−(g₁s₁)), which is what autograd adds up (a sum of two terms,
the slices' zeros aside), so its values are transformers' to the bit, forward and backward
(tests/train/test_fused_rope.py). It runs where train.recompute's wrapper of the modelling
modules' apply_rotary_pos_emb finds the library applies (`applies`); everything else is
transformers' own.
"""

from __future__ import annotations

import torch

from tunix_rt.train import cpu_kernels


def applies(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1) -> bool:
    """x [B, H, T, D] and cos, sin [B or 1, T, D] as Gemma's attention passes them (heads on
    axis 1), fp32 on the CPU, the rows contiguous, and the library built."""
    if unsqueeze_dim != 1 or x.dim() != 4 or cos.dim() != 3 or x.shape[-1] % 2:
        return False
    b, _, t, d = x.shape
    return (cos.shape == sin.shape and cos.shape[1:] == (t, d) and cos.shape[0] in (1, b)
            and cos.stride() == sin.stride() and cos.stride(-1) == 1 and sin.stride(-1) == 1
            and cpu_kernels.applies(x, cos, sin))


def _trig(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """cos or sin over x's batch (a shared row: stride 0 over the batch, no copy)."""
    return c if c.shape[0] == x.shape[0] else c.expand(x.shape[0], *c.shape[1:])


class Rope(torch.autograd.Function):
    """transformers' apply_rotary_pos_emb for one tensor x [B, H, T, D] (`applies`)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cos, sin = _trig(x, cos), _trig(x, sin)
        ctx.save_for_backward(cos, sin)
        return cpu_kernels.rope(x, cos, sin)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cos, sin = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        if not cpu_kernels.applies(grad):  # a layout the library cannot read: in a dense copy
            grad = grad.contiguous()
        return cpu_kernels.rope(grad, cos, sin, back=True), None, None


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return Rope.apply(x, cos, sin)
