"""Knowledge distillation without either model's [batch, seq, vocab] logits (PyTorch engine).

Distillation (train.distill) trains the student's token distribution q toward the teacher's
p at every labelled position. Unlike the objectives of train.loss, the loss depends on the
whole distribution, not on logp(target) alone, so it has its own fused kernel, built the same
way: only the positions with a target are gathered; for each chunk of them the kernel
computes the student's logits (student hidden rows @ student head) and the teacher's
(teacher hidden rows @ teacher head, the teacher's hidden states computed once per
micro-batch without gradient), the divergence and, right away, its gradient with respect
to the student's hidden rows (and the student's head, when it is trained). The chunk's
logits are then freed; backward only scales the stored gradients. Neither model's
[B, L, V] logits exist at any time.

With temperature T, s = z_student / T, q = softmax(s), p = softmax(z_teacher / T), per token:

    forward_kl   D = KL(p || q)                      dD/ds = q - p
    reverse_kl   D = KL(q || p)                      dD/ds = q * (log q - log p - D)
    jsd (beta)   D = beta KL(p || m) + (1 - beta) KL(q || m),  m = beta p + (1 - beta) q
                                                     dD/ds = (1 - beta) q * (log q - log m - KL(q || m))

which is TRL's GKDTrainer.generalized_jsd_loss (its beta = 0 is forward_kl and beta = 1
reverse_kl, as here; no T^2 factor, as there); dD/dz = dD/ds / T. Optionally mixed with the
student's NLL of the target at temperature 1 (alpha): per token

    loss_t = coef_t * ((1 - alpha) D_t + alpha * (-log softmax(z)[y_t]))

Gemma 2's final logit cap (cap * tanh(z / cap)) is applied to both models' logits, its
derivative (1 - tanh^2) to the student's gradient, chunk by chunk.

Statistics per micro-batch, summed over the labelled tokens (their names:
train.distill.KD_STATS): the divergence D, KL(p || q) at temperature T (the KL to the
teacher, whatever the loss), the student's NLL at temperature 1, and the token count.
"""

from __future__ import annotations

import math

import torch

from tunix_rt.train import cpu_matmul
from tunix_rt.train.chunking import DEFAULT_CHUNK_BYTES, rows_per_chunk
from tunix_rt.train.data import IGNORE
from tunix_rt.train.fused_head import head_backward, head_forward

#: the divergences (TrainConfig.kd_loss)
KD_LOSSES = ("forward_kl", "reverse_kl", "jsd")
N_STATS = 4


def jsd_beta(kind: str, beta: float) -> float:
    """The generalised JSD's beta of a divergence: forward_kl is beta 0, reverse_kl beta 1
    (TRL's convention)."""
    if kind not in KD_LOSSES:
        raise ValueError(f"kd_loss must be one of {'|'.join(KD_LOSSES)}, got {kind!r}")
    return {"forward_kl": 0.0, "reverse_kl": 1.0}.get(kind, float(beta))


def capped(z: torch.Tensor, softcap: float | None):
    """fp32 logits after the final cap, and tanh(z / cap) (None without a cap)."""
    z = z.float()
    if softcap is None:
        return z, None
    t = torch.tanh(z / softcap)
    return t * softcap, t


def divergence(log_q: torch.Tensor, log_p: torch.Tensor, beta: float, want_grad: bool):
    """(D [c], dD/ds [c, V] or None, KL(p || q) [c]) of rows of log-probabilities."""
    q, p = log_q.exp(), log_p.exp()
    kl_pq = (p * (log_p - log_q)).sum(-1)
    if beta == 0.0:
        return kl_pq, (q - p) if want_grad else None, kl_pq
    if beta == 1.0:
        d = (q * (log_q - log_p)).sum(-1)
        return d, (q * (log_q - log_p - d[:, None])) if want_grad else None, kl_pq
    log_m = torch.logaddexp(log_q + math.log1p(-beta), log_p + math.log(beta))
    kl_qm = (q * (log_q - log_m)).sum(-1)
    d = beta * (p * (log_p - log_m)).sum(-1) + (1.0 - beta) * kl_qm
    grad = (1.0 - beta) * q * (log_q - log_m - kl_qm[:, None]) if want_grad else None
    return d, grad, kl_pq


def _chunk(hs, ws, ht, wt, y, c, objective, softcaps, want_grad: bool):
    """One chunk: sum_t c_t * loss_t, the statistics [4] and (want_grad) dloss/dz [c, V]."""
    T, alpha = objective.temperature, objective.alpha
    beta = jsd_beta(objective.kd_loss, objective.kd_beta)
    zs, ts = capped(cpu_matmul.mm(hs, ws.t()), softcaps[0])
    with torch.no_grad():
        zt, _ = capped(cpu_matmul.mm(ht, wt.t()), softcaps[1])
        log_p = torch.log_softmax(zt / T, dim=-1)
    del zt
    log_q = torch.log_softmax(zs / T, dim=-1)
    d, dds, kl = divergence(log_q, log_p, beta, want_grad)
    del log_p
    log_q1 = log_q if T == 1.0 else torch.log_softmax(zs, dim=-1)
    rows = torch.arange(zs.shape[0], device=zs.device)
    nll = -log_q1[rows, y]
    loss = (c * ((1.0 - alpha) * d + alpha * nll)).sum()
    stats = torch.stack([d.sum(), kl.sum(), nll.sum(), torch.tensor(float(d.numel()), device=d.device)])
    if not want_grad:
        return loss, stats, None
    g = dds.mul_(c[:, None] * ((1.0 - alpha) / T))
    if alpha:
        soft = log_q1.exp().mul_(c[:, None] * alpha)
        soft[rows, y] -= c * alpha
        g.add_(soft)
    if ts is not None:
        g.mul_(1.0 - ts * ts)
    return loss, stats, g.to(ws.dtype)


class FusedDistillation(torch.autograd.Function):
    """sum_t c_t * loss_t (the module docstring) over student rows `hidden` [N, Hs] and the
    teacher's rows `teacher_hidden` [N, Ht]; gradients w.r.t. the student's hidden rows
    (and head) computed in forward, chunk by chunk."""

    @staticmethod
    def forward(ctx, hidden, weight, teacher_hidden, teacher_weight, targets, coef, chunk: int, softcaps, objective):
        def one(sl, h):
            return _chunk(h, weight, teacher_hidden[sl], teacher_weight, targets[sl], coef[sl], objective, softcaps, True)

        return head_forward(ctx, hidden, weight, N_STATS, chunk, one)

    @staticmethod
    def backward(ctx, grad_out, _grad_stats):
        return (*head_backward(ctx, grad_out), None, None, None, None, None, None, None)


def kd_objective(hidden, weight, teacher_hidden, teacher_weight, targets, coef, objective,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, softcaps=(None, None)):
    """(sum_t coef_t * loss_t, statistics [4]) over N labelled rows, in chunks whose fp32
    logits (one model's) fit in `chunk_bytes` (train.chunking). `objective` carries kd_loss,
    kd_beta, temperature and alpha (train.distill.Distillation); softcaps are the student's
    and the teacher's final logit caps. Without autograd no gradient is formed."""
    coef = coef.float()
    teacher_hidden = teacher_hidden.detach()
    if hidden.shape[0] == 0:
        return hidden.sum() * 0.0, torch.zeros(N_STATS, device=hidden.device)
    chunk = rows_per_chunk(hidden.shape[0], chunk_bytes, weight.shape[0])
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return FusedDistillation.apply(hidden, weight, teacher_hidden, teacher_weight, targets, coef, chunk,
                                       tuple(softcaps), objective)
    with torch.no_grad():
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        stats = torch.zeros(N_STATS, dtype=torch.float32, device=hidden.device)
        for s in range(0, hidden.shape[0], chunk):
            sl = slice(s, s + chunk)
            loss, st, _ = _chunk(hidden[sl], weight, teacher_hidden[sl], teacher_weight, targets[sl], coef[sl],
                                 objective, softcaps, False)
            total += loss
            stats += st
        return total, stats


def plain_kd(student_logits, teacher_logits, labels, coef, objective) -> torch.Tensor:
    """The reference: full [B, L, V] logits of both models (already capped), autograd
    through log_softmax (tests and loss_impl=plain)."""
    T, alpha = objective.temperature, objective.alpha
    beta = jsd_beta(objective.kd_loss, objective.kd_beta)
    keep = labels != IGNORE
    log_q = torch.log_softmax(student_logits.float() / T, dim=-1)[keep]
    log_p = torch.log_softmax(teacher_logits.detach().float() / T, dim=-1)[keep]
    if beta == 0.0:
        d = (log_p.exp() * (log_p - log_q)).sum(-1)
    elif beta == 1.0:
        d = (log_q.exp() * (log_q - log_p)).sum(-1)
    else:
        m = beta * log_p.exp() + (1.0 - beta) * log_q.exp()
        d = beta * (log_p.exp() * (log_p - m.log())).sum(-1) + (1.0 - beta) * (log_q.exp() * (log_q - m.log())).sum(-1)
    nll = -torch.log_softmax(student_logits.float(), dim=-1)[keep].gather(-1, labels[keep][:, None])[:, 0]
    return (coef[keep].float() * ((1.0 - alpha) * d + alpha * nll)).sum()


class Teacher:
    """A frozen causal LM (eval mode, no gradient) and what the kernel needs of it: its
    final hidden states, its head and its final logit cap."""

    def __init__(self, model: torch.nn.Module):
        self.model = model.eval().requires_grad_(False)

    @property
    def head(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    @property
    def softcap(self) -> float | None:
        return getattr(self.model.config, "final_logit_softcapping", None)

    def hidden(self, inputs: dict) -> torch.Tensor:
        with torch.no_grad():
            return self.model.model(**inputs).last_hidden_state

    def logits(self, inputs: dict) -> torch.Tensor:
        with torch.no_grad():
            return self.model(**inputs).logits


def distill_forward(module, t: dict, objective):
    """What loss.ObjectiveModule.forward returns for a distillation objective: (sum_t coef_t *
    loss_t, statistics) of one micro-batch, through the fused kernel (or, for
    loss_impl=plain, the full-logits reference). `objective.teacher` is a Teacher on the
    student's device."""
    if "segments" in t:
        raise ValueError("distillation batches are plain rows (no shared prefix)")
    teacher = objective.teacher
    inputs = {"input_ids": t["input_ids"], "position_ids": t["position_ids"], "use_cache": False}
    if module.loss_impl == "plain":
        logits = module.model(**inputs).logits
        return plain_kd(logits, teacher.logits(inputs), t["labels"], t["coef"], objective), torch.zeros(N_STATS)
    h = module.base().model(**inputs).last_hidden_state
    ht = teacher.hidden(inputs)
    keep = t["labels"].reshape(-1) != IGNORE
    rows = h.reshape(-1, h.shape[-1])[keep]
    trows = ht.reshape(-1, ht.shape[-1])[keep]
    return kd_objective(rows, module.head(), trows, teacher.head, t["labels"].reshape(-1)[keep],
                        t["coef"].reshape(-1)[keep], objective, module.chunk_bytes,
                        (module.softcap(), teacher.softcap))
