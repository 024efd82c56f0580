"""The JAX engine's token objective without [B, L, V] logits (the torch engine's
`train.loss`, in JAX; see train.engine for the objective).

    loss = sum over tokens t of  coef[t] * phi(logp[t]; aux[t])

Tunix's default PEFT loss builds the full logits, their log-softmax and a one-hot target
over the vocabulary: three [B, L, V] arrays (1.07 GB each in fp32 for Gemma 3 at 4 x 256).
Here the model stops at the final norm (hidden states [B, L, D]) and a scan goes over chunks
of tokens; each chunk computes its logits, the log-sum-exp and the target logit by index
(no one-hot), phi and, under differentiation, its gradient right away (a custom VJP:
dloss/dz = coef * phi'(logp) * (onehot - softmax), then dh = dz @ W and dW += dz^T h).
Backward only scales the stored [N, D] gradient, so nothing is recomputed and the peak extra
memory is one [chunk, V] block; a frozen head over a vocabulary larger than JAX_SLICE_ROWS
forms it a slice at a time (an online softmax, `_online_head`), one [rows, JAX_SLICE_ROWS]
block, and takes the labelled rows of several chunks in one pass (`online_chunks`).

The tokens with a target are moved to the front first (a stable sort), so the chunks after
them hold only prompt and padding and are skipped at run time, and the last chunk that holds
any runs only a prefix of its rows, the smallest of TAIL_PARTS sizes that covers them
(`lax.switch` in the scan): shapes stay static, and the vocabulary matmuls, most of a LoRA
step's FLOPs at Gemma's 262K vocabulary, run for the supervised tokens and at most a
TAIL_PARTS-th of a chunk more. The gather's gradient puts dh back in place.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from tunix_rt.models import tunix_lean
from tunix_rt.train.chunking import DEFAULT_CHUNK_BYTES, JAX_SLICE_ROWS, chunk_tokens
from tunix_rt.train.engine import NLL, Objective

tunix_lean.install()  # before any tunix module: tunix/__init__.py imports every trainer (and torch)

#: objective statistics summed over labelled tokens (train.loss.STAT_NAMES)
STAT_NAMES = ("clipped", "kl", "ratio", "tokens")

#: a chunk's head work is cut to a prefix of its rows in steps of a TAIL_PARTS-th of the chunk.
#: Measured on the bench_jax_loss batches (Gemma 3 270M, 4 x 256, 256-row chunks, 2-core Xeon):
#: a batch's ~340 labelled rows had run 512 rows of head matmuls (about 3.7 ms a row there)
TAIL_PARTS = 4


def prefix_sizes(chunk: int) -> tuple[int, ...]:
    """The row counts a chunk's head work may be cut to (ascending, the last is `chunk`)."""
    return tuple(sorted({-(-chunk * k // TAIL_PARTS) for k in range(1, TAIL_PARTS + 1)}))


#: the frozen head's pass (_online_head over the labelled rows of several chunks) is cut to a
#: multiple of this many rows. Measured with `_online_head` alone (Gemma 3 270M's head, 2-core
#: Xeon): 128 rows 5.0 ms a row, 256 rows 4.3, 384 rows 3.9 (1.49 s against 1.73 s for the
#: 256 + 128 rows that two 256-row chunks' prefixes ran for a batch's ~330 labelled rows)
ONLINE_ROW_STEP = 64


#: the most rows a frozen head's pass over the vocabulary (_online_head) takes at once
ONLINE_PASS_ROWS = 512


def online_chunks(k: int, chunk: int, v: int) -> int:
    """How many of k chunks of `chunk` rows a frozen head's pass over a vocabulary of v rows
    takes at once: at most ONLINE_PASS_ROWS rows, and no more than keep its [rows,
    JAX_SLICE_ROWS] block within one chunk's [chunk, v] logits, the loss's memory budget."""
    return max(1, min(k, ONLINE_PASS_ROWS // chunk, v // JAX_SLICE_ROWS))


def online_sizes(n: int) -> tuple[int, ...]:
    """The row counts the frozen head's pass over n rows may be cut to (ascending, the
    last is n): multiples of ONLINE_ROW_STEP."""
    return tuple(range(ONLINE_ROW_STEP, n, ONLINE_ROW_STEP)) + (n,)


def _by_prefix(m, skip, rows_fn, *args, sizes: tuple[int, ...] | None = None):
    """lax.switch over a chunk by its labelled rows (a prefix: _chunks sorts them first): none
    -> skip(*args), else rows_fn(r, *args) for the smallest prefix size r that holds them
    (`sizes`, prefix_sizes(len(m)) unless given)."""
    sizes = sizes or prefix_sizes(m.shape[0])
    n = jnp.sum(m.astype(jnp.int32))
    pick = jnp.where(n == 0, 0, 1 + jnp.searchsorted(jnp.asarray(sizes, jnp.int32), n))
    return jax.lax.switch(pick, [skip] + [functools.partial(rows_fn, r) for r in sizes], *args)


def shift_targets(tokens: jax.Array, loss_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Position t predicts token t+1: targets and their mask, shifted left, last one 0."""
    targets = jnp.concatenate([tokens[:, 1:], jnp.zeros_like(tokens[:, :1])], axis=1)
    mask = jnp.concatenate([loss_mask[:, 1:], jnp.zeros_like(loss_mask[:, :1])], axis=1)
    return targets, mask


def weights(loss_mask, norm: float):
    """Per-token loss weights: the shifted mask divided by `norm` (supervised tokens of the
    optimizer step / micro-batches per step). numpy in, numpy out (runs in the data path)."""
    import numpy as np

    w = np.zeros(loss_mask.shape, np.float32)
    w[:, :-1] = loss_mask[:, 1:]
    return w / np.float32(norm)


def hidden_states(model, tokens, positions, attention_mask) -> jax.Array:
    """The final-norm hidden states [B, L, D], no vocabulary projection. Goes through the
    model's `__call__` (jax_loader's `return_hidden`) so that qwix LoRA applies."""
    h, _ = model(tokens, positions, None, attention_mask, return_hidden=True)
    return h


def head_of(model) -> tuple[jax.Array, float | None]:
    """The (tied) output embedding [V, D] and the final logit softcap (Gemma 2) or None."""
    return model.embedder.input_embedding[...], getattr(model, "final_logits_softcap", None)


def _logits(h, emb, softcap):
    logits = jnp.dot(h, emb.T, preferred_element_type=jnp.float32)
    if softcap is not None:
        logits = jnp.tanh(logits / softcap) * softcap
    return logits


def phi(objective: Objective, logp, aux):
    """phi(logp), phi'(logp) and the per-token statistics [n, 4] (STAT_NAMES) — train.loss.phi.
    aux columns for a policy objective: old_logp, ref_logp, adv (engine.POLICY_AUX)."""
    if objective.kind == "nll":
        return -logp, jnp.full_like(logp, -1.0), None
    old, ref, adv = aux[:, 0], aux[:, 1], aux[:, 2]
    if objective.on_policy:
        old = logp
    ratio = jnp.exp(logp - old)
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - objective.eps_low, 1.0 + objective.eps_high) * adv
    take = unclipped <= clipped  # min() picks the unclipped term: its gradient flows
    value = -jnp.minimum(unclipped, clipped)
    grad = jnp.where(take, -unclipped, 0.0)
    d = ref - logp
    k3 = jnp.exp(d) - d - 1.0
    if objective.beta:
        value = value + objective.beta * k3
        grad = grad + objective.beta * (1.0 - jnp.exp(d))
    stats = jnp.stack([(~take).astype(jnp.float32), k3, ratio, jnp.ones_like(logp)], axis=-1)
    return value, grad, stats


def _chunk_terms(h, emb, t, c, m, a, softcap, objective, want_grad: bool):
    """One chunk: sum of c * phi, the summed statistics and (want_grad) dloss/dz as two parts,
    the dense one [n, V] and the target's own coefficient [n]: dloss/dz = dense + onehot(t) *
    own. Kept apart, no [n, V] scatter follows the dense part, so XLA writes it over the
    logits' buffer (one [n, V] buffer a chunk, not two; the callers add the target term
    through a gather of emb's rows). With a final softcap (Gemma 2) tanh's output takes a
    second one."""
    z = _logits(h, emb, None)
    s = None
    if softcap is not None:
        s = jnp.tanh(z / softcap)
        z = s * softcap
    lse = jax.nn.logsumexp(z, axis=-1)
    logp = jnp.take_along_axis(z, t[:, None], axis=-1)[:, 0] - lse
    loss, stats, g = _objective_terms(logp, c, m, a, objective)
    if not want_grad:
        return loss, stats, None
    dense, own = -jnp.exp(z - lse[:, None]) * g[:, None], g
    if s is not None:  # through the softcap: d tanh = 1 - s^2, the target's own entry too
        s_t = jnp.take_along_axis(s, t[:, None], axis=-1)[:, 0]
        dense, own = dense * (1.0 - s * s), g * (1.0 - s_t * s_t)
    return loss, stats, (dense, own)


def _online_head(h, emb, t, softcap):
    """A frozen head's terms for rows h [r, D] over the vocabulary JAX_SLICE_ROWS rows of emb
    at a time (an online softmax: a running max, the sum of exponentials and the [r, D] sum
    of each row's exp(z_v - max) dz_v/draw_v emb_v, rescaled as the max grows): (lse [r], the
    target's logit [r], that sum over the sum of exponentials [r, D], i.e. sum_v p_v
    dz_v/draw_v emb_v, and the target's dz/draw [r]). The largest buffer is one slice's
    [r, JAX_SLICE_ROWS] logits, where the whole vocabulary's were [r, V]."""
    r, d = h.shape
    v = emb.shape[0]
    s = min(v, JAX_SLICE_ROWS)
    parts, rem = divmod(v, s)

    def step(carry, e, lo):
        mx, total, acc, zt = carry
        z = jnp.dot(h, e.T, preferred_element_type=jnp.float32)
        w = None
        if softcap is not None:
            sc = jnp.tanh(z / softcap)
            z, w = sc * softcap, 1.0 - sc * sc
        top = jnp.maximum(mx, jnp.max(z, axis=-1))
        scale = jnp.exp(mx - top)
        p = jnp.exp(z - top[:, None])
        total = total * scale + jnp.sum(p, axis=-1)
        acc = acc * scale[:, None] + jnp.dot(p if w is None else p * w, e, preferred_element_type=jnp.float32)
        local = t - lo
        inside = (local >= 0) & (local < e.shape[0])
        picked = jnp.take_along_axis(z, jnp.clip(local, 0, e.shape[0] - 1)[:, None], axis=-1)[:, 0]
        return top, total, acc, zt + jnp.where(inside, picked, 0.0)

    carry = (jnp.full((r,), -jnp.inf, jnp.float32), jnp.zeros((r,), jnp.float32), jnp.zeros((r, d), jnp.float32),
             jnp.zeros((r,), jnp.float32))
    carry = jax.lax.fori_loop(0, parts, lambda i, c: step(c, jax.lax.dynamic_slice_in_dim(emb, i * s, s), i * s),
                              carry)
    if rem:
        carry = step(carry, emb[parts * s:], parts * s)
    mx, total, acc, zt = carry
    own = jnp.ones_like(zt) if softcap is None else 1.0 - (zt / softcap) ** 2
    return mx + jnp.log(total), zt, acc / total[:, None], own


def _objective_terms(logp, c, m, a, objective):
    """sum of c * phi, the summed statistics and dloss/dlogp per row."""
    value, dphi, st = phi(objective, logp, a)
    stats = jnp.zeros(len(STAT_NAMES), jnp.float32) if st is None else jnp.sum(st * m[:, None], axis=0)
    return jnp.sum(value * c), stats, c * dphi


def _chunks(h, targets, coef, mask, aux, chunk):
    """Flatten to tokens, labelled ones first, padded to whole chunks: ([k, chunk, ...] arrays,
    the sort order, the token count)."""
    d = h.shape[-1]
    h = h.reshape(-1, d)
    n = h.shape[0]
    targets, coef, mask = targets.reshape(-1), coef.reshape(-1).astype(jnp.float32), mask.reshape(-1)
    aux = aux.reshape(n, -1).astype(jnp.float32)
    order = jnp.argsort((~mask).astype(jnp.int32), stable=True)
    h, targets, coef, mask, aux = h[order], targets[order], coef[order], mask[order], aux[order]
    chunk = min(chunk, n)
    pad = (-n) % chunk
    if pad:
        h = jnp.pad(h, ((0, pad), (0, 0)))
        targets, coef, mask = jnp.pad(targets, (0, pad)), jnp.pad(coef, (0, pad)), jnp.pad(mask, (0, pad))
        aux = jnp.pad(aux, ((0, pad), (0, 0)))
    k = h.shape[0] // chunk
    return (h.reshape(k, chunk, d), targets.reshape(k, chunk), coef.reshape(k, chunk), mask.reshape(k, chunk),
            aux.reshape(k, chunk, -1))


def token_objective(h, emb, targets, coef, mask, aux=None, chunk: int = 1024, softcap: float | None = None,
                    objective: Objective = NLL):
    """(sum_t coef_t * phi_t, statistics [4]) over h [B, L, D] (or [N, D]) with targets, coef and
    mask (the positions that carry a target) of the same leading shape, aux [..., 3] for a
    policy objective, `chunk` tokens at a time through the head emb [V, D]."""
    if aux is None:
        aux = jnp.zeros(targets.shape + (3,), jnp.float32)
    hc, tc, cc, mc, ac = _chunks(h, targets, coef, mask.astype(jnp.bool_), aux, chunk)
    return _fused(hc, emb, tc, cc, mc, ac, softcap, objective)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _fused(hc, emb, tc, cc, mc, ac, softcap, objective):
    """Forward only (evaluation): one chunk's logits alive at a time."""
    def rows(r, h, t, c, m, a):
        return _chunk_terms(h[:r], emb, t[:r], c[:r], m[:r], a[:r], softcap, objective, False)[:2]

    def skip(*_):
        return jnp.zeros((), jnp.float32), jnp.zeros(len(STAT_NAMES), jnp.float32)

    def body(carry, xs):
        loss, stats = _by_prefix(xs[3], skip, rows, *xs)
        return (carry[0] + loss, carry[1] + stats), None

    init = (jnp.zeros((), jnp.float32), jnp.zeros(len(STAT_NAMES), jnp.float32))
    out, _ = jax.lax.scan(body, init, (hc, tc, cc, mc, ac))
    return out


def _fused_fwd(hc, emb, tc, cc, mc, ac, softcap, objective):
    """With gradients: each chunk's dloss/dh (and, when the head trains, dloss/demb,
    accumulated) computed right away. A frozen head (LoRA: emb not differentiated, which
    symbolic_zeros tells here) runs each chunk's labelled prefix only (_by_prefix); where the
    vocabulary is larger than JAX_SLICE_ROWS it goes over it a slice at a time (_online_head),
    once for the labelled rows of several chunks (online_chunks), cut to a multiple of
    ONLINE_ROW_STEP; a
    trained one runs whole chunks and whole vocabularies, since the switch's branches would
    each hold a copy of the [V, D] accumulator (XLA's temp for the 270M's full step +403 MB)
    and its gradient needs each row's whole softmax."""
    head_trains = emb.perturbed
    hc, emb, tc, cc, mc, ac = (x.value for x in (hc, emb, tc, cc, mc, ac))

    def terms(h, t, c, m, a):
        loss, stats, (dense, own) = _chunk_terms(h, emb, t, c, m, a, softcap, objective, True)
        gh = jnp.dot(dense, emb, preferred_element_type=jnp.float32) + own[:, None] * emb[t].astype(jnp.float32)
        return loss, stats, dense, own, gh

    def zeros(h):  # a chunk without labelled tokens: no loss, no gradient
        return jnp.zeros((), jnp.float32), jnp.zeros(len(STAT_NAMES), jnp.float32), jnp.zeros_like(h)

    def online(h, t, c, m, a):  # dloss/dh = g * (own * emb[t] - sum_v p_v dz_v/draw_v emb_v)
        lse, zt, mean, own = _online_head(h, emb, t, softcap)
        loss, stats, g = _objective_terms(zt - lse, c, m, a, objective)
        return loss, stats, g[:, None] * (own[:, None] * emb[t].astype(jnp.float32) - mean)

    def whole(h, t, c, m, a):
        loss, stats, _, _, gh = terms(h, t, c, m, a)
        return loss, stats, gh

    if not head_trains:
        head = online if emb.shape[0] > JAX_SLICE_ROWS else whole

        def rows(r, h, t, c, m, a):  # the chunk's first r rows; the rest hold no target
            loss, stats, gh = head(h[:r], t[:r], c[:r], m[:r], a[:r])
            return loss, stats, jnp.pad(gh.astype(h.dtype), ((0, h.shape[0] - r), (0, 0)))

        if head is online:  # the labelled rows of several chunks (the first rows: _chunks) in one pass
            k, per = hc.shape[0], online_chunks(hc.shape[0], hc.shape[1], emb.shape[0])
            pad = (-k) % per
            groups = [jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)).reshape(-1, per * x.shape[1], *x.shape[2:])
                      for x in (hc, tc, cc, mc, ac)]
            sizes = online_sizes(groups[0].shape[1])

            def group(carry, xs):
                return carry, _by_prefix(xs[3], lambda h, *_: zeros(h), rows, *xs, sizes=sizes)

            _, (losses, stats, gh) = jax.lax.scan(group, (), groups)
            return (jnp.sum(losses), jnp.sum(stats, axis=0)), (gh.reshape(-1, *hc.shape[1:])[:k], None)

        def frozen(carry, xs):
            return carry, _by_prefix(xs[3], lambda h, *_: zeros(h), rows, *xs)

        _, (losses, stats, gh) = jax.lax.scan(frozen, (), (hc, tc, cc, mc, ac))
        return (jnp.sum(losses), jnp.sum(stats, axis=0)), (gh, None)

    def grads(gw, h, t, c, m, a):
        loss, stats, dense, own, gh = terms(h, t, c, m, a)
        gw = gw + jnp.dot(dense.T, h, preferred_element_type=jnp.float32)
        gw = gw.at[t].add(own[:, None] * h.astype(jnp.float32))
        return gw, loss, stats, gh.astype(h.dtype)

    def body(gw, xs):
        h, t, c, m, a = xs
        gw, loss, stats, gh = jax.lax.cond(jnp.any(m), grads, lambda gw, h, *_: (gw, *zeros(h)), gw, h, t, c, m, a)
        return gw, (loss, stats, gh)

    gw, (losses, stats, gh) = jax.lax.scan(body, jnp.zeros(emb.shape, jnp.float32), (hc, tc, cc, mc, ac))
    return (jnp.sum(losses), jnp.sum(stats, axis=0)), (gh, gw.astype(emb.dtype))


def _fused_bwd(softcap, objective, res, g):
    from jax.custom_derivatives import SymbolicZero

    gh, gw = res
    g = g[0]  # the statistics carry no gradient
    if isinstance(g, SymbolicZero):  # the loss itself not differentiated
        return (None,) * 6
    return (gh * g.astype(gh.dtype), None if gw is None else gw * g.astype(gw.dtype), None, None, None, None)


_fused.defvjp(_fused_fwd, _fused_bwd, symbolic_zeros=True)


def chunked_ce_sum(h, emb, targets, weights, chunk: int, softcap: float | None = None):
    """sum_t weights[t] * CE(h[t] @ emb.T, targets[t]): the SFT case of token_objective (every
    token with a non-zero weight counts)."""
    return token_objective(h, emb, targets, weights, weights != 0, None, chunk, softcap)[0]


def chunked_logprobs(h, emb, targets, chunk: int, softcap: float | None = None):
    """log p(target) at every position [B, L], chunk by chunk, no gradient (RL's old and
    reference log-probabilities)."""
    shape, d = targets.shape, h.shape[-1]
    h, t = h.reshape(-1, d), targets.reshape(-1)
    n = h.shape[0]
    chunk = min(chunk, n)
    pad = (-n) % chunk
    h, t = jnp.pad(h, ((0, pad), (0, 0))), jnp.pad(t, (0, pad))

    def one(xs):
        hc, tc = xs
        z = _logits(hc, emb, softcap)
        return jnp.take_along_axis(z, tc[:, None], axis=-1)[:, 0] - jax.nn.logsumexp(z, axis=-1)

    out = jax.lax.map(one, (h.reshape(-1, chunk, d), t.reshape(-1, chunk)))
    return out.reshape(-1)[:n].reshape(shape)


def plain_objective(h, emb, targets, coef, mask, aux=None, softcap: float | None = None,
                    objective: Objective = NLL):
    """The reference for token_objective: full logits, autograd through log_softmax (tests and
    loss_impl=plain)."""
    logp = jnp.take_along_axis(jax.nn.log_softmax(_logits(h, emb, softcap), axis=-1),
                               targets[..., None], axis=-1)[..., 0]
    flat = logp.reshape(-1)
    a = None if aux is None else aux.reshape(flat.shape[0], -1)
    if objective.kind == "policy" and objective.on_policy:
        a = a.at[:, 0].set(jax.lax.stop_gradient(flat))
        objective = Objective("policy", objective.eps_low, objective.eps_high, objective.beta, False)
    value, _, _ = phi(objective, flat, a)
    return jnp.sum(value * coef.reshape(-1).astype(jnp.float32) * mask.reshape(-1))


def plain_ce_sum(h, emb, targets, weights, softcap: float | None = None):
    """The reference: full logits and log_softmax (tests and loss_impl=plain)."""
    return plain_objective(h, emb, targets, weights, jnp.ones(weights.shape, jnp.float32), None, softcap)


def make_loss_fn(chunk_bytes: int = DEFAULT_CHUNK_BYTES, impl: str = "chunked"):
    """(model, **model inputs) -> the summed weighted CE of the batch (SFT's objective; the
    memory plan, the tests and the benchmark call it). Each chunk's fp32 logits fit in
    `chunk_bytes` (TrainConfig.loss_chunk_bytes)."""

    def loss_fn(model, input_tokens, input_mask, positions, attention_mask, loss_weights):
        del input_mask  # the padding is in attention_mask and loss_weights already
        h = hidden_states(model, input_tokens, positions, attention_mask)
        emb, softcap = head_of(model)
        targets = jnp.concatenate([input_tokens[:, 1:], jnp.zeros_like(input_tokens[:, :1])], axis=1)
        if impl == "plain":
            return plain_ce_sum(h, emb, targets, loss_weights, softcap)
        return chunked_ce_sum(h, emb, targets, loss_weights, chunk_tokens(chunk_bytes, emb.shape[0]), softcap)

    return loss_fn


def attention_mask(input_mask, positions):
    """[B, L, L]: causal, padding keys masked out, and kept inside each packed example
    (positions restart at 0 there)."""
    from tunix.sft import utils

    seg = jnp.cumsum(positions == 0, axis=1)
    same = seg[:, :, None] == seg[:, None, :]
    return utils.make_causal_attn_mask(input_mask) & same


def model_inputs(input_tokens, input_mask, positions=None, loss_weights=None) -> dict:
    """positions (from the padding mask when not given) and the [B, L, L] attention mask,
    built on device."""
    from tunix.sft import utils

    input_mask = input_mask.astype(jnp.bool_)
    if positions is None:
        positions = utils.build_positions_from_mask(input_mask)
    out = {"input_tokens": input_tokens, "input_mask": input_mask, "positions": positions,
           "attention_mask": attention_mask(input_mask, positions)}
    if loss_weights is not None:
        out["loss_weights"] = loss_weights
    return out
