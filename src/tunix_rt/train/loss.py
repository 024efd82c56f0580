"""The token objective without the [batch, seq, vocab] logits (PyTorch engine).

Gemma's vocabulary is 256K tokens: the logits of a 4 x 256 batch are 1 GB in fp32, and
autograd keeps them (plus the softmax) for backward. Here the head is fused into the loss:
only the positions with a target are gathered, and for each chunk of them the forward pass
computes the logits, the log-probability of the target, the objective and, right away, its
gradient with respect to the hidden states (and, when the head is trained, the head
weight). The chunk's logits are then freed; backward only scales the stored gradients by
the incoming scalar. Nothing is recomputed, so the loss costs the same matmuls as the plain
one.

Every method uses the same kernel (train.engine): loss = sum_t coef_t * phi(logp_t; aux_t),
with phi = -logp for SFT and the clipped policy objective with a KL term for the GRPO family.
Since phi depends on logp alone, dloss/dz_t = coef_t * phi'(logp_t) * (onehot_t - softmax_t).

Gemma 2 caps its final logits with cap * tanh(z / cap); the cap's derivative
(1 - tanh^2) is applied chunk by chunk as well.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tunix_rt.train import cpu_matmul
from tunix_rt.train.chunking import DEFAULT_CHUNK_BYTES, rows_per_chunk, vocab_parts
from tunix_rt.train.data import IGNORE
from tunix_rt.train.engine import NLL, POLICY_AUX, Objective
from tunix_rt.train.fused_head import head_backward, head_forward

#: objective statistics summed over weighted tokens: clipped tokens, KL (k3), ratio, tokens
STAT_NAMES = ("clipped", "kl", "ratio", "tokens")


def phi(objective: Objective, logp: torch.Tensor, aux: torch.Tensor | None):
    """phi(logp) and phi'(logp) per token, and the [4] statistics (STAT_NAMES) of the chunk.
    aux columns for a policy objective: old_logp, ref_logp, adv (engine.POLICY_AUX)."""
    if objective.kind == "nll":
        return -logp, torch.full_like(logp, -1.0), None
    old, ref, adv = aux.unbind(-1)
    if objective.on_policy:
        old = logp.detach()
    ratio = torch.exp(logp - old)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - objective.eps_low, 1.0 + objective.eps_high) * adv
    take = unclipped <= clipped  # min() picks the unclipped term: its gradient flows
    value = -torch.minimum(unclipped, clipped)
    grad = torch.where(take, -unclipped, torch.zeros_like(logp))
    d = ref - logp
    k3 = torch.exp(d) - d - 1.0
    if objective.beta:
        value = value + objective.beta * k3
        grad = grad + objective.beta * (1.0 - torch.exp(d))
    stats = torch.stack([(~take).float().sum(), k3.sum(), ratio.sum(), torch.tensor(float(logp.numel()), device=logp.device)])
    return value, grad, stats


def logits_buffer(rows: int, chunk: int, weight: torch.Tensor, parts: int = 1) -> torch.Tensor | None:
    """One fp32 buffer for the [min(rows, chunk), V / parts] logits of every chunk of a pass
    (fp32 heads; flat, so that a slice of any width is contiguous). With a fresh tensor a
    chunk, the next chunk's logits were made while the last chunk's were still referenced (two
    buffers at once), and each was new memory to fault in (the CPU allocator returns freed
    blocks to the OS: heap.tune_cpu_allocator). Measured on the 270M's DPO step
    (benchmarks/bench_dpo.py's pairs, 2-core AVX2 EPYC, 9 steps each): peak RSS 2.94-2.97 GiB
    against 3.13-3.21, median step 14.98 s against 16.49."""
    if weight.dtype != torch.float32 or rows == 0 or (parts > 1 and cpu_matmul.applies(weight)):
        return None  # (oneDNN's products are fresh blocks: a slice's is small, freed before the next)
    return torch.empty(min(rows, chunk) * -(-weight.shape[0] // parts), dtype=torch.float32, device=weight.device)


def _block(buf: torch.Tensor | None, rows: int, cols: int) -> torch.Tensor | None:
    """The contiguous [rows, cols] view of the front of a flat logits_buffer."""
    return None if buf is None else buf[: rows * cols].view(rows, cols)


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, softcap: float | None, buf: torch.Tensor | None = None):
    """fp32 logits of one chunk (into `buf`'s first rows when given: logits_buffer); with a
    cap, also tanh(z / cap) for the derivative."""
    if cpu_matmul.applies(h, weight):  # oneDNN (train.cpu_matmul) writes fresh blocks: into the buffer
        if buf is None:  # a slice at a time where there is one (no second whole-vocabulary block)
            z = cpu_matmul.mm(h, weight.t())
        else:
            z = _block(buf, h.shape[0], weight.shape[0])
            for v0 in range(0, weight.shape[0], cpu_matmul.SLICE_ROWS):
                z[:, v0:v0 + cpu_matmul.SLICE_ROWS] = cpu_matmul.mm(h, weight[v0:v0 + cpu_matmul.SLICE_ROWS].t())
    elif buf is not None:
        z = torch.mm(h, weight.t(), out=_block(buf, h.shape[0], weight.shape[0]))
    else:
        z = (h @ weight.t()).float()
    if softcap is None:
        return z, None
    t = z.div_(softcap).tanh_()  # in place: one [c, V] buffer
    return t * softcap, t


def _normaliser(maxes: list[torch.Tensor], sums: list[torch.Tensor]):
    """From each vocabulary slice's row max m_k and sum s_k of exp(z - m_k): the row max M,
    each slice's factor to the softmax, exp(m_k - M) / S, and log S, where
    S = sum_k s_k exp(m_k - M) (logsumexp = M + log S). With one slice: M = m, a factor of
    1 / s, the whole vocabulary's own formula."""
    m = torch.stack(maxes).amax(dim=0)
    scale = torch.exp(torch.stack(maxes) - m)  # exactly 1 for the slice that holds the max
    total = (torch.stack(sums) * scale).sum(dim=0)
    return m, scale / total, total.log(), total


def _slice_stats(zs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A vocabulary slice's row max m and sum of exp(zs - m), exp(zs - m) left in zs: the one
    rule of both chunked paths, so their log-probs agree (to the bit where the logits do)."""
    m = zs.amax(dim=-1, keepdim=True)
    return m.squeeze(1), zs.sub_(m).exp_().sum(dim=-1)


def _target_logp(z: torch.Tensor, y: torch.Tensor, want_p: bool, parts: int | None = None):
    """log softmax(z)[y] of a chunk's whole-vocabulary fp32 logits (the head trains, or a
    no-gradient objective), and (want_p) the softmax itself, left in z's own buffer (no second
    [c, V] buffer): (rows, logp, p). The sums go slice by slice as in frozen_head_rows (the
    two agree to rounding: one [c, V] matmul's bits and its slices' may differ with the
    threads' split); a trained head's no-gradient log-probs come from here too (chunked_logprobs)."""
    c, v = z.shape
    width = -(-v // (parts or vocab_parts(z.device.type)))
    rows = torch.arange(c, device=z.device)
    target = z[rows, y]
    maxes, sums = [], []
    for v0 in range(0, v, width):
        m, total = _slice_stats(z[:, v0:v0 + width])  # in place in z's buffer
        maxes.append(m)
        sums.append(total)
    m, factor, log_total, _ = _normaliser(maxes, sums)
    if want_p:
        for v0, f in zip(range(0, v, width), factor):
            z[:, v0:v0 + width].mul_(f[:, None])
    return rows, target - m - log_total, z


def frozen_head_rows(h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, softcap: float | None,
                     buf: torch.Tensor | None = None, parts: int | None = None, want_grad: bool = True):
    """For one chunk of rows through a head that does not train: log p(y) [c] and (want_grad)
    G = ((onehot_y - softmax) * cap') @ W [c, H], with the vocabulary in `parts` slices, one
    [c, V / parts] block of logits at a time (in `buf`: logits_buffer with these parts). An
    online softmax: each slice's exp(z - its max) @ W_slice and row sums are rescaled
    as they come (to the running row max: one [c, H] sum held, whatever the parts) and divided
    by the softmax's sum once every slice is seen (_normaliser), so the matmuls are the whole
    vocabulary's two, the logits a `parts`-th as large. Gemma 3 270M: 8 MiB a 128-row chunk
    in 16 parts, not 128.
    A frozen head's no-gradient log-probs (chunked_logprobs: a reference, old or evaluation
    pass; token_objective without autograd) come from here too, in the same chunks, so they
    equal the training pass's to the bit."""
    c, v = h.shape[0], weight.shape[0]
    width = -(-v // (parts or vocab_parts(weight.device.type)))
    rows = torch.arange(c, device=h.device)
    target = torch.zeros(c, dtype=torch.float32, device=h.device)  # the logits are fp32 (_chunk_logits)
    cap_y = torch.ones(c, dtype=torch.float32, device=h.device)
    maxes, sums = [], []
    acc = top = None  # sum over the slices so far of exp(m_k - top) * (p_k @ W_k), top their row max
    for v0 in range(0, v, width):
        w = weight[v0:v0 + width]
        z, t = _chunk_logits(h, w, softcap, buf)
        inside = (y >= v0) & (y < v0 + w.shape[0])
        idx = (y - v0).clamp(0, w.shape[0] - 1)
        target = torch.where(inside, z[rows, idx], target)
        m, total = _slice_stats(z)  # exp(z - m) in z's buffer
        maxes.append(m)
        sums.append(total)
        p = z
        if t is not None and want_grad:
            d = t.mul_(t).neg_().add_(1.0)  # d(cap * tanh(z / cap))/dz = 1 - tanh^2
            cap_y = torch.where(inside, d[rows, idx], cap_y)
            p.mul_(d)
        if want_grad:
            a = cpu_matmul.mm(p.to(weight.dtype), w).float()
            if acc is None:
                acc, top = a, m
            else:
                new = torch.maximum(top, m)
                acc.mul_(torch.exp(top - new)[:, None]).add_(a.mul_(torch.exp(m - new)[:, None]))
                top = new
    m, _, log_total, total = _normaliser(maxes, sums)
    logp = target - m - log_total
    if not want_grad:
        return logp, None
    grad = weight[y].to(logp.dtype) * cap_y[:, None]
    grad -= acc.div_(total[:, None])  # top is the row max over every slice: the normaliser's own
    return logp, grad.to(h.dtype)


def _chunk(h, weight, y, c, aux, objective: Objective, softcap, want_grad: bool, buf=None):
    """One chunk: sum of c * phi, the statistics, and (want_grad) dloss/dz (in `buf` when
    given: used before the next chunk)."""
    z, t = _chunk_logits(h, weight, softcap, buf)
    rows, logp, p = _target_logp(z, y, want_grad)
    value, dphi, stats = phi(objective, logp, aux)
    loss = (c * value).sum()
    if not want_grad:
        return loss, stats, None
    g = c * dphi  # dloss/dlogp per row
    p.mul_(-g[:, None])
    p[rows, y] += g
    if t is not None:
        p.mul_(t.mul_(t).neg_().add_(1.0))  # d(cap * tanh(z / cap))/dz = 1 - tanh^2
    return loss, stats, p.to(weight.dtype)


def _frozen_head_objective(ctx, hidden, weight, targets, coef, aux, chunk, softcap, objective):
    """FusedTokenObjective's forward where the head does not train: each row's gradient is
    c_t * phi'(logp_t) * G_t (frozen_head_rows), kept for head_backward."""
    grad_h = torch.empty_like(hidden)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    stats = torch.zeros(len(STAT_NAMES), dtype=torch.float32, device=hidden.device)
    buf = logits_buffer(hidden.shape[0], chunk, weight, vocab_parts(weight.device.type))
    for s in range(0, hidden.shape[0], chunk):
        sl = slice(s, s + chunk)
        logp, g = frozen_head_rows(hidden[sl], weight, targets[sl], softcap, buf)
        value, dphi, st = phi(objective, logp, None if aux is None else aux[sl])
        total += (coef[sl] * value).sum()
        if st is not None:
            stats += st
        grad_h[sl] = g * (coef[sl] * dphi).to(g.dtype)[:, None]
    ctx.save_for_backward(grad_h, torch.empty(0))
    ctx.want_w, ctx.w_dtype = False, weight.dtype
    ctx.mark_non_differentiable(stats)
    return total, stats


class FusedTokenObjective(torch.autograd.Function):
    """sum_t c_t * phi(log softmax(cap(h_t @ W^T))[y_t]), gradients computed in forward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, coef, aux, chunk: int, softcap: float | None, objective: Objective):
        if not weight.requires_grad:  # LoRA: the vocabulary in slices (frozen_head_rows)
            return _frozen_head_objective(ctx, hidden, weight, targets, coef, aux, chunk, softcap, objective)
        buf = logits_buffer(hidden.shape[0], chunk, weight)

        def one(sl, h):
            return _chunk(h, weight, targets[sl], coef[sl], None if aux is None else aux[sl], objective, softcap, True,
                          buf)

        return head_forward(ctx, hidden, weight, len(STAT_NAMES), chunk, one)

    @staticmethod
    def backward(ctx, grad_out, _grad_stats):
        return (*head_backward(ctx, grad_out), None, None, None, None, None, None)


def token_objective(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, coef: torch.Tensor,
                    aux: torch.Tensor | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                    softcap: float | None = None, objective: Objective = NLL) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_t coef_t * phi_t, statistics [4]) over the rows of `hidden` [T, H] with targets [T]
    through the head `weight` [V, H], in chunks whose fp32 logits fit in `chunk_bytes`
    (train.chunking). Without autograd (evaluation) no gradient is formed."""
    if hidden.shape[0] == 0:
        return hidden.sum() * 0.0, torch.zeros(len(STAT_NAMES), device=hidden.device)
    coef = coef.float()
    frozen = not weight.requires_grad
    chunk = rows_per_chunk(hidden.shape[0], chunk_bytes, weight.shape[0], frozen)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return FusedTokenObjective.apply(hidden, weight, targets, coef, aux, chunk, softcap, objective)
    with torch.no_grad():  # the training pass's chunks and log-probs, to the bit
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        stats = torch.zeros(len(STAT_NAMES), dtype=torch.float32, device=hidden.device)
        buf = logits_buffer(hidden.shape[0], chunk, weight, vocab_parts(weight.device.type) if frozen else 1)
        for s in range(0, hidden.shape[0], chunk):
            sl = slice(s, s + chunk)
            a = None if aux is None else aux[sl]
            if frozen:
                value, _, st = phi(objective, frozen_head_rows(hidden[sl], weight, targets[sl], softcap, buf,
                                                               want_grad=False)[0], a)
                loss = (coef[sl] * value).sum()
            else:
                loss, st, _ = _chunk(hidden[sl], weight, targets[sl], coef[sl], a, objective, softcap, False, buf)
            total += loss
            if st is not None:
                stats += st
        return total, stats


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                     chunk_bytes: int = DEFAULT_CHUNK_BYTES, softcap: float | None = None) -> torch.Tensor:
    """log p(target) of each row [T], chunk by chunk, no gradient (RL's old/reference logp)."""
    out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    frozen = not weight.requires_grad
    chunk = rows_per_chunk(hidden.shape[0], chunk_bytes, weight.shape[0], frozen)
    with torch.no_grad():  # the training pass's chunks and rule (a frozen or a trained head's): its log-probs to the bit
        buf = logits_buffer(hidden.shape[0], chunk, weight, vocab_parts(weight.device.type) if frozen else 1)
        for s in range(0, hidden.shape[0], chunk):
            h, y = hidden[s:s + chunk], targets[s:s + chunk]
            out[s:s + chunk] = frozen_head_rows(h, weight, y, softcap, buf, want_grad=False)[0] if frozen \
                else _target_logp(_chunk_logits(h, weight, softcap, buf)[0], y, False)[1]
    return out


class FusedSequenceLogprobs(torch.autograd.Function):
    """log p(target) [T] of the rows of `hidden` through a head that does not train, with each
    row's gradient d log p_t / d h_t = ((onehot_t - softmax_t) * cap') @ W formed in the same
    chunk as its log-prob and kept ([T, H], no logits): backward scales row t's by the incoming
    dL/d log p_t. A sequence objective (engine.SequenceObjective) learns its coefficients from
    these log-probs after the forward, so the head runs once (two matmuls a chunk) where a
    no-gradient pass and the fused objective took three. The vocabulary goes through in
    slices (frozen_head_rows)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk: int, softcap: float | None):
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        grad_h = torch.empty_like(hidden)
        buf = logits_buffer(hidden.shape[0], chunk, weight, vocab_parts(weight.device.type))
        for s in range(0, hidden.shape[0], chunk):
            sl = slice(s, s + chunk)
            out[sl], grad_h[sl] = frozen_head_rows(hidden[sl], weight, targets[sl], softcap, buf)
        ctx.save_for_backward(grad_h)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (grad_h,) = ctx.saved_tensors
        return grad_h * grad_out.to(grad_h.dtype)[:, None], None, None, None, None


def sequence_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                      chunk_bytes: int = DEFAULT_CHUNK_BYTES, softcap: float | None = None) -> torch.Tensor:
    """log p(target) of each row [T] with autograd to `hidden` (FusedSequenceLogprobs); the
    head must not train. Without a gradient to form it is chunked_logprobs."""
    if weight.requires_grad:
        raise ValueError("sequence_logprobs: the head trains; its gradient needs the coefficients first")
    if not (torch.is_grad_enabled() and hidden.requires_grad) or hidden.shape[0] == 0:
        return chunked_logprobs(hidden, weight, targets, chunk_bytes, softcap)
    chunk = rows_per_chunk(hidden.shape[0], chunk_bytes, weight.shape[0], frozen=True)
    return FusedSequenceLogprobs.apply(hidden, weight, targets, chunk, softcap)


def chunked_linear_ce(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                      chunk_bytes: int = DEFAULT_CHUNK_BYTES, softcap: float | None = None) -> torch.Tensor:
    """Summed cross-entropy of the rows (every coefficient 1): the SFT case of token_objective."""
    coef = torch.ones(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    return token_objective(hidden, weight, targets, coef, None, chunk_bytes, softcap)[0]


def target_rows(hidden: torch.Tensor, labels: torch.Tensor, *per_token: torch.Tensor):
    """The hidden states [T, H], targets [T] and the given per-token arrays of the positions
    that carry a label."""
    keep = labels.reshape(-1) != IGNORE
    rows = hidden.reshape(-1, hidden.shape[-1])[keep]
    return (rows, labels.reshape(-1)[keep], *(a.reshape(-1, *a.shape[2:])[keep] for a in per_token))


def supervised_rows(hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The hidden states [T, H] and targets [T] of the positions that carry a label."""
    return target_rows(hidden, labels)


def plain_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The reference: summed CE over full [B, L, V] logits (already soft-capped)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                           ignore_index=IGNORE, reduction="sum")


def plain_objective(logits: torch.Tensor, labels: torch.Tensor, coef: torch.Tensor, aux: torch.Tensor | None,
                    objective: Objective = NLL) -> torch.Tensor:
    """The reference for token_objective: full [B, L, V] logits (already soft-capped), autograd
    through log_softmax (tests and loss_impl=plain)."""
    keep = labels != IGNORE
    logp_all = torch.log_softmax(logits.float(), dim=-1)
    logp = logp_all.gather(-1, labels.clamp(min=0)[..., None])[..., 0][keep]
    value, _grad, _stats = phi(objective, logp, None if aux is None else aux[keep])
    return (coef[keep].float() * value).sum()


class ObjectiveModule(torch.nn.Module):
    """A causal LM and its objective as one module: forward(t, objective) is
    (sum_t coef_t * phi_t, statistics) of one micro-batch of tensors, or, with logprobs=True,
    log p(target) of its labelled positions. The engine trains through this module (wrapped
    in DDP or sharded with FSDP2 when several processes train), so every trainable parameter,
    the tied head included, is used inside one forward, where FSDP2 has gathered it."""

    def __init__(self, model: torch.nn.Module, loss_impl: str = "chunked", chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 *, attn: str):
        super().__init__()
        self.model, self.loss_impl, self.chunk_bytes = model, loss_impl, chunk_bytes
        self.attn = attn  # the attention implementation the model was loaded with (its masks differ)

    def base(self) -> torch.nn.Module:
        """The transformers model (under a PEFT wrapper, when LoRA is applied)."""
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    def head(self) -> torch.Tensor:
        return self.base().get_output_embeddings().weight

    def softcap(self) -> float | None:
        return getattr(self.base().config, "final_logit_softcapping", None)

    def forward(self, t: dict[str, torch.Tensor], objective: Objective = NLL, logprobs: bool = False):
        if objective.kind == "distill" and not logprobs:  # the teacher's whole distribution: train.kd_loss
            from tunix_rt.train.kd_loss import distill_forward

            return distill_forward(self, t, objective)
        inputs = {"input_ids": t["input_ids"], "position_ids": t["position_ids"], "use_cache": False}
        if "segments" in t:
            inputs["attention_mask"] = shared_prefix_masks(self.base().config, self.attn, t["segments"],
                                                           t["position_ids"], self.head().dtype)
        if self.loss_impl == "plain" and not logprobs:
            logits = self.model(**inputs).logits
            return plain_objective(logits, t["labels"], t["coef"], policy_aux(t, objective), objective), \
                torch.zeros(len(STAT_NAMES))
        h = self.base().model(**inputs).last_hidden_state
        if logprobs:
            rows, y = target_rows(h, t["labels"])
            return chunked_logprobs(rows, self.head(), y, self.chunk_bytes, self.softcap())
        if objective.kind == "sequence":  # engine.SequenceObjective: the trunk once
            rows, y = target_rows(h, t["labels"])
            if not self.head().requires_grad:  # LoRA: the head once, each row's gradient formed with its log-prob
                lp = sequence_logprobs(rows, self.head(), y, self.chunk_bytes, self.softcap())
                coef = torch.as_tensor(objective.coef_of(lp.detach().cpu().numpy()), dtype=torch.float32,
                                       device=rows.device)
                return -(coef * lp).sum(), torch.zeros(len(STAT_NAMES), device=rows.device)
            # the head trains (full fine-tuning): its gradient sums coef_t g_t^T h_t, so the coefficients
            # come first: the head without gradient for them, then the fused objective
            lp = chunked_logprobs(rows.detach(), self.head().detach(), y, self.chunk_bytes, self.softcap())
            coef = torch.as_tensor(objective.coef_of(lp.cpu().numpy()), dtype=torch.float32, device=rows.device)
            return token_objective(rows, self.head(), y, coef, None, self.chunk_bytes, self.softcap(), NLL)
        aux = policy_aux(t, objective)
        rows, y, coef, *rest = target_rows(h, t["labels"], t["coef"], *((aux,) if aux is not None else ()))
        return token_objective(rows, self.head(), y, coef, rest[0] if rest else None, self.chunk_bytes,
                               self.softcap(), objective)


def policy_aux(t: dict[str, torch.Tensor], objective: Objective) -> torch.Tensor | None:
    """[B, L, 3] old_logp, ref_logp, adv for a policy objective (None for nll)."""
    if objective.kind != "policy":
        return None
    return torch.stack([t[k].float() for k in POLICY_AUX], dim=-1)


#: attention implementations whose masks `shared_prefix_masks` builds
SHARED_PREFIX_ATTENTION = ("sdpa", "eager")


def shared_prefix_masks(config, attn: str, segments: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    """The 4D masks of rows that share a prefix (data.collate_shared): a query attends to the
    earlier keys of its own segment and, outside the padding, to the whole prefix (segment 0);
    sliding-window layers also drop keys `sliding_window` positions or more behind, measured
    in position ids as transformers does. Both attentions get an additive float mask: 0 or the
    dtype's minimum for eager, 0 or -inf for sdpa (what sdpa makes of a boolean mask, but once:
    made per call, each layer kept its own copy for backward, 1.1 MiB a layer at 2 x 381
    tokens). A dict by layer type for models with `layer_types` (Gemma 2 and 3), else one
    tensor; transformers uses a 4D mask as given. With sdpa on Gemma 2 / 3 it is a
    train.tree_attention.TreeMask per layer type instead (the prefix and each branch as their
    own calls, no dense mask), unless TUNIX_RT_SHARED_ATTENTION=dense."""
    if attn == "sdpa":
        from tunix_rt.train.tree_attention import tree_masks

        tree = tree_masks(config, segments, positions)
        if tree is not None:
            return tree
    n = segments.shape[1]
    q, k = segments[:, :, None], segments[:, None, :]
    causal = torch.ones(n, n, dtype=torch.bool, device=segments.device).tril()
    allowed = causal & (((k == 0) & (q >= 0)) | (k == q))
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    out = {}
    for kind in set(types or ["full_attention"]):
        m = allowed
        if kind == "sliding_attention" and window:
            m = m & ((positions[:, :, None] - positions[:, None, :]) < window)
        m = m[:, None]
        if attn == "eager":
            m = torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, torch.finfo(dtype).min)
        elif attn == "sdpa":  # additive, as sdpa turns a boolean mask (per call: a copy kept by each layer)
            m = torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, float("-inf"))
        else:
            raise ValueError(f"no shared-prefix mask for attention {attn!r}")
        out[kind] = m
    return out if types else out["full_attention"]
