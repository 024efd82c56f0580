"""The chunk loop of a fused head objective (train.loss's token objective, train.kd_loss's
distillation): per chunk of rows the objective gives its loss and the gradient wrt its logits,
and the gradients wrt the hidden rows and the head are formed at once, so no chunk's
[rows, vocab] logits outlive it. Forward and backward of a torch.autograd.Function share `ctx`."""

from __future__ import annotations

import torch

from tunix_rt.train import cpu_matmul


def head_forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, n_stats: int, chunk: int, one) -> tuple:
    """The forward of a fused head objective over `hidden`'s rows in chunks of `chunk`, shared by
    the token objective and distillation (train.kd_loss): `one(rows_slice, hidden_rows)` gives
    the chunk's (loss, statistics or None, gradient wrt its logits g); the gradients wrt hidden
    (g @ W) and, when the head trains, wrt W (g^T h, fp32) are formed here and kept on `ctx` for
    head_backward, so no chunk's logits outlive it. Returns (total loss, statistics)."""
    want_w = weight.requires_grad
    grad_h = torch.empty_like(hidden)
    grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    stats = torch.zeros(n_stats, dtype=torch.float32, device=hidden.device)
    for s in range(0, hidden.shape[0], chunk):
        sl = slice(s, s + chunk)
        h = hidden[sl]
        loss, st, g = one(sl, h)
        total += loss
        if st is not None:
            stats += st
        grad_h[sl] = cpu_matmul.mm(g, weight)
        if want_w:
            grad_w.addmm_(g.t().float(), h.float())  # in place: no second [V, H] buffer
    ctx.save_for_backward(grad_h, grad_w if want_w else torch.empty(0))
    ctx.want_w, ctx.w_dtype = want_w, weight.dtype
    ctx.mark_non_differentiable(stats)
    return total, stats


def head_backward(ctx, grad_out: torch.Tensor) -> tuple:
    """(gradient wrt hidden, wrt the head weight or None) from what head_forward kept."""
    grad_h, grad_w = ctx.saved_tensors
    gh = grad_h * grad_out.to(grad_h.dtype)
    gw = (grad_w * grad_out).to(ctx.w_dtype) if ctx.want_w else None
    return gh, gw
