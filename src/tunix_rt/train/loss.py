"""The language-model loss without the [batch, seq, vocab] logits.

Gemma's vocabulary is 256K tokens: the logits of a 4 x 256 batch are 1 GB in fp32, and
autograd keeps them (plus the softmax) for backward. Here the head is fused into the loss:
only the supervised positions are gathered, and for each chunk of them the forward pass
computes the logits, the summed cross-entropy and, right away, its gradient with respect to
the hidden states (and, when the head is trained, with respect to the head weight). The
chunk's logits are then freed; backward only scales the stored gradients by the incoming
scalar. Nothing is recomputed, so the loss costs the same matmuls as the plain one.

Gemma 2 caps its final logits with cap * tanh(z / cap); the cap's derivative
(1 - tanh^2) is applied to the softmax gradient chunk by chunk as well.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tunix_rt.train.data import IGNORE  # noqa: F401 (defined where the labels are built, torch-free)


class FusedLinearCrossEntropy(torch.autograd.Function):
    """sum_i CE(cap(h_i @ W^T), y_i), with gradients computed in forward, chunk by chunk."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk: int, softcap: float | None):
        want_w = weight.requires_grad
        grad_h = torch.empty_like(hidden)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for s in range(0, hidden.shape[0], chunk):
            h, y = hidden[s:s + chunk], targets[s:s + chunk]
            loss, g = _chunk_loss_and_grad(h, weight, y, softcap)
            total += loss
            grad_h[s:s + chunk] = g @ weight
            if want_w:
                grad_w.addmm_(g.t().float(), h.float())
        ctx.save_for_backward(grad_h, grad_w if want_w else torch.empty(0))
        ctx.want_w, ctx.w_dtype = want_w, weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        gh = grad_h * grad_out.to(grad_h.dtype)
        gw = (grad_w * grad_out).to(ctx.w_dtype) if ctx.want_w else None
        return gh, gw, None, None, None


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, softcap: float | None):
    """fp32 logits of one chunk; with a cap, also tanh(z / cap) for the derivative."""
    z = (h @ weight.t()).float()
    if softcap is None:
        return z, None
    t = z.div_(softcap).tanh_()  # in place: one [c, V] buffer
    return t * softcap, t


def _chunk_loss_and_grad(h, weight, y, softcap):
    """Summed CE of one chunk and dL/dz (softmax - onehot, times the cap's derivative)."""
    z, t = _chunk_logits(h, weight, softcap)
    rows = torch.arange(z.shape[0], device=z.device)
    target_logit = z[rows, y]
    m = z.amax(dim=-1, keepdim=True)
    p = z.sub_(m).exp_()  # reuses z's buffer
    s = p.sum(dim=-1, keepdim=True)
    loss = (m.squeeze(1) + s.log().squeeze(1) - target_logit).sum()
    p.div_(s)
    p[rows, y] -= 1.0
    if t is not None:
        p.mul_(t.mul_(t).neg_().add_(1.0))  # d(cap * tanh(z / cap))/dz = 1 - tanh^2
    return loss, p.to(weight.dtype)


def _chunk_loss_only(h, weight, y, softcap) -> torch.Tensor:
    z, _ = _chunk_logits(h, weight, softcap)
    return F.cross_entropy(z, y, reduction="sum")


def chunked_linear_ce(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk: int = 1024,
    softcap: float | None = None,
) -> torch.Tensor:
    """Summed cross-entropy of the rows of `hidden` [T, H] against `targets` [T] through the
    head `weight` [V, H]. Without autograd (evaluation) only the loss is computed."""
    if hidden.shape[0] == 0:
        return hidden.sum() * 0.0
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return FusedLinearCrossEntropy.apply(hidden, weight, targets, chunk, softcap)
    with torch.no_grad():
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for s in range(0, hidden.shape[0], chunk):
            total += _chunk_loss_only(hidden[s:s + chunk], weight, targets[s:s + chunk], softcap)
        return total


def supervised_rows(hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The hidden states [T, H] and targets [T] of the positions that carry a label."""
    keep = labels.reshape(-1) != IGNORE
    return hidden.reshape(-1, hidden.shape[-1])[keep], labels.reshape(-1)[keep]


def plain_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The reference: summed CE over full [B, L, V] logits (already soft-capped)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                           ignore_index=IGNORE, reduction="sum")
