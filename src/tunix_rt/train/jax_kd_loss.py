"""The distillation kernel of train.kd_loss in JAX: neither model's [B, L, V] logits.

The same loss and gradients (see train.kd_loss for the divergences), built like
train.jax_loss's token objective: the labelled tokens are moved to the front (a stable sort),
padded to whole chunks, and a scan computes per chunk both models' logits from their hidden
states and heads, the divergence, and under differentiation (a custom VJP) its gradient with
respect to the student's hidden rows and head right away; chunks without a labelled token
are skipped at run time (`lax.cond`). The teacher's hidden states carry no gradient.

`spec` is (kd_loss, kd_beta, temperature, alpha), static (train.distill.Distillation's fields).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

N_STATS = 4  # kd, kl, nll, tokens (train.distill.KD_STATS)


def _jsd_beta(kind: str, beta: float) -> float:
    return {"forward_kl": 0.0, "reverse_kl": 1.0}.get(kind, float(beta))


def _capped(h, emb, softcap):
    z = jnp.dot(h, emb.T, preferred_element_type=jnp.float32)
    if softcap is None:
        return z, None
    t = jnp.tanh(z / softcap)
    return t * softcap, t


def _chunk_terms(h, emb, ht, emb_t, y, c, m, softcaps, spec, want_grad: bool):
    """One chunk: sum_t c_t * loss_t, the statistics [4] (labelled rows) and dloss/dz."""
    kind, beta, temp, alpha = spec
    beta = _jsd_beta(kind, beta)
    zs, ts = _capped(h, emb, softcaps[0])
    zt, _ = _capped(jax.lax.stop_gradient(ht), emb_t, softcaps[1])
    log_p = jax.nn.log_softmax(zt / temp, axis=-1)
    log_q = jax.nn.log_softmax(zs / temp, axis=-1)
    q, p = jnp.exp(log_q), jnp.exp(log_p)
    kl = jnp.sum(p * (log_p - log_q), axis=-1)
    if beta == 0.0:
        d, dds = kl, q - p
    elif beta == 1.0:
        d = jnp.sum(q * (log_q - log_p), axis=-1)
        dds = q * (log_q - log_p - d[:, None])
    else:
        log_m = jnp.logaddexp(log_q + math.log1p(-beta), log_p + math.log(beta))
        kl_qm = jnp.sum(q * (log_q - log_m), axis=-1)
        d = beta * jnp.sum(p * (log_p - log_m), axis=-1) + (1.0 - beta) * kl_qm
        dds = (1.0 - beta) * q * (log_q - log_m - kl_qm[:, None])
    log_q1 = log_q if temp == 1.0 else jax.nn.log_softmax(zs, axis=-1)
    nll = -jnp.take_along_axis(log_q1, y[:, None], axis=-1)[:, 0]
    loss = jnp.sum(c * ((1.0 - alpha) * d + alpha * nll))
    mf = m.astype(jnp.float32)
    stats = jnp.stack([jnp.sum(d * mf), jnp.sum(kl * mf), jnp.sum(nll * mf), jnp.sum(mf)])
    if not want_grad:
        return loss, stats, None
    g = dds * (c[:, None] * ((1.0 - alpha) / temp))
    if alpha:
        soft = jnp.exp(log_q1) * (c[:, None] * alpha)
        g = g + soft.at[jnp.arange(y.shape[0]), y].add(-c * alpha)
    if ts is not None:
        g = g * (1.0 - ts * ts)
    return loss, stats, g


def _chunks(h, ht, targets, coef, mask, chunk):
    """Tokens flattened, labelled ones first, padded to whole chunks: [k, chunk, ...] arrays."""
    d, dt = h.shape[-1], ht.shape[-1]
    h, ht = h.reshape(-1, d), ht.reshape(-1, dt)
    n = h.shape[0]
    targets, coef, mask = targets.reshape(-1), coef.reshape(-1).astype(jnp.float32), mask.reshape(-1)
    order = jnp.argsort((~mask).astype(jnp.int32), stable=True)
    h, ht, targets, coef, mask = h[order], ht[order], targets[order], coef[order], mask[order]
    chunk = min(chunk, n)
    pad = (-n) % chunk
    if pad:
        h, ht = jnp.pad(h, ((0, pad), (0, 0))), jnp.pad(ht, ((0, pad), (0, 0)))
        targets, coef, mask = jnp.pad(targets, (0, pad)), jnp.pad(coef, (0, pad)), jnp.pad(mask, (0, pad))
    k = h.shape[0] // chunk
    return (h.reshape(k, chunk, d), ht.reshape(k, chunk, dt), targets.reshape(k, chunk), coef.reshape(k, chunk),
            mask.reshape(k, chunk))


def kd_objective(h, emb, ht, emb_t, targets, coef, mask, spec, chunk: int = 1024, softcaps=(None, None)):
    """(sum_t coef_t * loss_t, statistics [4]) over the student's hidden states h [B, L, D] (or
    [N, D]) and the teacher's ht [B, L, D_t], with targets, coef and mask (the positions that
    carry a target) of the same leading shape, `chunk` tokens at a time through the heads
    emb [V, D] and emb_t [V, D_t]."""
    hc, htc, tc, cc, mc = _chunks(h, jax.lax.stop_gradient(ht), targets, coef, mask.astype(jnp.bool_), chunk)
    return _fused(hc, emb, htc, jax.lax.stop_gradient(emb_t), tc, cc, mc, tuple(softcaps), tuple(spec))


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8))
def _fused(hc, emb, htc, emb_t, tc, cc, mc, softcaps, spec):
    zero = (jnp.zeros((), jnp.float32), jnp.zeros(N_STATS, jnp.float32))

    def body(carry, xs):
        h, ht, t, c, m = xs
        loss, stats = jax.lax.cond(
            jnp.any(m), lambda *x: _chunk_terms(*x, softcaps, spec, False)[:2], lambda *_: zero,
            h, emb, ht, emb_t, t, c, m)
        return (carry[0] + loss, carry[1] + stats), None

    out, _ = jax.lax.scan(body, zero, (hc, htc, tc, cc, mc))
    return out


def _fused_fwd(hc, emb, htc, emb_t, tc, cc, mc, softcaps, spec):
    def grads(gw, h, ht, t, c, m):
        loss, stats, dz = _chunk_terms(h, emb, ht, emb_t, t, c, m, softcaps, spec, True)
        gh = jnp.dot(dz, emb, preferred_element_type=jnp.float32).astype(h.dtype)
        return gw + jnp.dot(dz.T, h, preferred_element_type=jnp.float32), loss, stats, gh

    def skip(gw, h, ht, t, c, m):
        return gw, jnp.zeros((), jnp.float32), jnp.zeros(N_STATS, jnp.float32), jnp.zeros_like(h)

    def body(gw, xs):
        h, ht, t, c, m = xs
        gw, loss, stats, gh = jax.lax.cond(jnp.any(m), grads, skip, gw, h, ht, t, c, m)
        return gw, (loss, stats, gh)

    gw, (losses, stats, gh) = jax.lax.scan(body, jnp.zeros(emb.shape, jnp.float32), (hc, htc, tc, cc, mc))
    return (jnp.sum(losses), jnp.sum(stats, axis=0)), (gh, gw.astype(emb.dtype))


def _fused_bwd(softcaps, spec, res, g):
    gh, gw = res
    g = g[0]  # the statistics carry no gradient
    return (gh * g.astype(gh.dtype), gw * g.astype(gw.dtype), None, None, None, None, None)


_fused.defvjp(_fused_fwd, _fused_bwd)


def plain_kd(h, emb, ht, emb_t, targets, coef, mask, spec, softcaps=(None, None)):
    """The reference: both models' full logits, autograd through log_softmax (tests and
    loss_impl=plain)."""
    kind, beta, temp, alpha = spec
    beta = _jsd_beta(kind, beta)
    zs, _ = _capped(h, emb, softcaps[0])
    zt, _ = _capped(jax.lax.stop_gradient(ht), jax.lax.stop_gradient(emb_t), softcaps[1])
    log_q, log_p = jax.nn.log_softmax(zs / temp, axis=-1), jax.nn.log_softmax(zt / temp, axis=-1)
    if beta == 0.0:
        d = jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)
    elif beta == 1.0:
        d = jnp.sum(jnp.exp(log_q) * (log_q - log_p), axis=-1)
    else:
        log_m = jnp.log(beta * jnp.exp(log_p) + (1.0 - beta) * jnp.exp(log_q))
        d = (beta * jnp.sum(jnp.exp(log_p) * (log_p - log_m), axis=-1)
             + (1.0 - beta) * jnp.sum(jnp.exp(log_q) * (log_q - log_m), axis=-1))
    nll = -jnp.take_along_axis(jax.nn.log_softmax(zs, axis=-1), targets[..., None], axis=-1)[..., 0]
    w = coef.astype(jnp.float32) * mask
    return jnp.sum(w * ((1.0 - alpha) * d + alpha * nll))


class JaxTeacher:
    """A frozen Tunix model and what the kernel needs of it: its final hidden states (one
    jitted forward per micro-batch, no gradient), its head (the embedding's own buffer, no
    copy) and its final logit cap."""

    def __init__(self, model):
        from flax import nnx

        from tunix_rt.train.jax_loss import head_of, hidden_states

        self.graph, self.state = nnx.split(model)
        self.head, self.softcap = head_of(model)

        def forward(state, ids, pos, attn):
            return jax.lax.stop_gradient(hidden_states(nnx.merge(self.graph, state), ids, pos, attn))

        self.forward = jax.jit(forward)

    def inputs(self, b: dict) -> dict:
        """What a device batch (jax_engine) adds for the distillation loss."""
        return {"teacher_h": self.forward(self.state, b["ids"], b["pos"], b["attn"]), "teacher_emb": self.head}


def distill_loss(h, emb, softcap, b: dict, objective, impl: str, chunk: int):
    """(loss, statistics [4]) of a device batch for a distillation objective
    (train.distill.Distillation): the fused kernel, or the full-logits reference for
    loss_impl=plain."""
    spec = (objective.kd_loss, objective.kd_beta, objective.temperature, objective.alpha)
    caps = (softcap, objective.teacher.softcap)
    if impl == "plain":
        loss = plain_kd(h, emb, b["teacher_h"], b["teacher_emb"], b["targets"], b["coef"], b["mask"], spec, caps)
        return loss, jnp.zeros(N_STATS, jnp.float32)
    return kd_objective(h, emb, b["teacher_h"], b["teacher_emb"], b["targets"], b["coef"], b["mask"], spec,
                        chunk, caps)
