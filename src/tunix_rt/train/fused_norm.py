"""Gemma's RMSNorm as one op forward and one backward on the CPU (PyTorch engine, fp32).

transformers' Gemma RMSNorm, x · rsqrt(mean(x²) + eps) · (1 + w), is five autograd ops; its
backward another ten passes over the rows. `RMSNorm` computes it in the library of
train.cpu_kernels (one pass each way, the rows' rsqrt kept: 4 bytes a row) and keeps x, as
transformers' ops do. Where the library does not apply (another dtype or device, a layout it
cannot read, TUNIX_RT_CPU_KERNELS=torch) the norm is transformers' own, to its bits.

The values are transformers' to fp32 rounding (tests/train/test_fused_norm.py against fp64);
the same on every run and thread count, so a norm's output remade in backward (train.recompute)
equals the forward's to the bit, and a full fine-tuning run's reference model (built the same
way) gives the policy's log-probs at step 0 to the bit.
"""

from __future__ import annotations

import types

import torch

from tunix_rt.train import cpu_kernels

#: the transformers norm classes computed as x · rsqrt(mean(x²) + eps) · (1 + weight)
GEMMA_NORMS = ("GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm")


class RMSNorm(torch.autograd.Function):
    """x · rsqrt(mean(x²) + eps) · (1 + weight) over the last axis, through cpu_kernels."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        w1 = weight.detach() + 1.0
        y, rstd = cpu_kernels.rms_norm(x, w1, eps)
        ctx.save_for_backward(x, w1, rstd)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, w1, rstd = ctx.saved_tensors
        dx, dw = cpu_kernels.rms_norm_backward(grad, x, w1, rstd, ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        return dx, dw, None


def _forward(orig):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if w.dim() == 1 and x.shape[-1] == w.shape[0] and cpu_kernels.applies(x, w):
            return RMSNorm.apply(x, w, float(self.eps))
        return orig(x)
    forward.tunix_rt_fused = True
    return forward


def fuse_norms(model: torch.nn.Module) -> int:
    """Give every Gemma RMSNorm of `model` (GEMMA_NORMS) the one-op forward (checked at each call:
    anything the library does not take goes to transformers' forward); call it before
    train.recompute.keep_recipes, whose norms then remake their outputs through it. The number
    of norms changed (0 for other architectures, which keep theirs)."""
    n = 0
    for m in model.modules():
        if type(m).__name__ in GEMMA_NORMS and isinstance(getattr(m, "weight", None), torch.Tensor) \
                and hasattr(m, "eps") and not getattr(m.forward, "tunix_rt_fused", False):
            m.forward = types.MethodType(_forward(m.forward), m)
            n += 1
    return n
