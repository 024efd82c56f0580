"""The JAX engine's loss: masked next-token cross-entropy without [B, L, V] logits.

Tunix's default PEFT loss builds the full logits, their log-softmax and a one-hot target
over the vocabulary: three [B, L, V] arrays (1.07 GB each in fp32 for Gemma 3 at 4 x 256).
Ours stops the model at the final norm (hidden states [B, L, D]) and scans over chunks of
tokens; each chunk computes its logits, the log-sum-exp and the target logit by index
(no one-hot) and, under differentiation, its gradient right away (a custom VJP: dlogits =
softmax - onehot, then dh = dlogits @ W and dW += dlogits^T h). Backward only scales the
stored [N, D] gradient, so nothing is recomputed and peak extra memory is one [chunk, V]
block (an earlier version used jax.checkpoint, which recomputes every chunk's logits).

The loss covers the model turn only (`loss_mask` from tunix_rt.render, 1 on every target
token) and is normalised per supervised token. `loss_weights` carries that normalisation
so that gradient accumulation over micro-batches equals one big batch (see `weights`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


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


def chunked_ce_sum(h, emb, targets, weights, chunk: int, softcap: float | None = None):
    """sum_t weights[t] * CE(h[t] @ emb.T, targets[t]) over all tokens, chunk by chunk.

    The tokens with a weight (the model turn) are moved to the front first (a stable sort on
    "weight is zero"), so the chunks after them hold only unweighted tokens (prompt, padding)
    and are skipped at run time (`lax.cond` in the scan): shapes stay static, and the vocabulary
    matmuls, most of a LoRA step's FLOPs at Gemma's 262K vocabulary, run for the supervised
    tokens only (on GSM8K batches of 4 x 256 about half the chunks). The gather's gradient
    puts dh back in place."""
    d = h.shape[-1]
    h = h.reshape(-1, d)
    targets = targets.reshape(-1)
    weights = weights.reshape(-1).astype(jnp.float32)
    order = jnp.argsort(weights == 0, stable=True)
    h, targets, weights = h[order], targets[order], weights[order]
    n = h.shape[0]
    chunk = min(chunk, n)
    pad = (-n) % chunk
    if pad:
        h = jnp.pad(h, ((0, pad), (0, 0)))
        targets = jnp.pad(targets, (0, pad))
        weights = jnp.pad(weights, (0, pad))
    k = h.shape[0] // chunk
    return _fused_ce(h.reshape(k, chunk, d), emb, targets.reshape(k, chunk), weights.reshape(k, chunk), softcap)


def _chunk_terms(h, emb, t, w, softcap):
    """One chunk: logits, the summed weighted CE, and dCE/dlogits (softmax - onehot, times
    the softcap's derivative)."""
    z = _logits(h, emb, None)
    s = None
    if softcap is not None:
        s = jnp.tanh(z / softcap)
        z = s * softcap
    lse = jax.nn.logsumexp(z, axis=-1)
    tgt = jnp.take_along_axis(z, t[:, None], axis=-1)[:, 0]
    loss = jnp.sum((lse - tgt) * w)
    dz = jnp.exp(z - lse[:, None]) * w[:, None]
    dz = dz.at[jnp.arange(t.shape[0]), t].add(-w)
    if s is not None:
        dz = dz * (1.0 - s * s)
    return loss, dz


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _fused_ce(hc, emb, tc, wc, softcap):
    """Forward only (eval): the summed loss, one chunk's logits alive at a time."""
    def chunk_loss(h, t, w):
        z = _logits(h, emb, softcap)
        lse = jax.nn.logsumexp(z, axis=-1)
        tgt = jnp.take_along_axis(z, t[:, None], axis=-1)[:, 0]
        return jnp.sum((lse - tgt) * w)

    def body(total, xs):
        h, t, w = xs
        loss = jax.lax.cond(jnp.any(w != 0), chunk_loss, lambda *_: jnp.zeros((), jnp.float32), h, t, w)
        return total + loss, None

    total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), (hc, tc, wc))
    return total


def _fused_fwd(hc, emb, tc, wc, softcap):
    """With gradients: each chunk's dloss/dh (and dloss/demb, accumulated) computed right
    away, so backward needs no logits and no recomputation. When the head is frozen (LoRA),
    the emb gradient is dead code and XLA drops it."""
    def chunk_grads(gw, h, t, w):
        loss, dz = _chunk_terms(h, emb, t, w, softcap)
        gh = jnp.dot(dz, emb, preferred_element_type=jnp.float32).astype(h.dtype)
        return gw + jnp.dot(dz.T, h, preferred_element_type=jnp.float32), loss, gh

    def skip(gw, h, t, w):  # a chunk without weighted tokens: no loss, no gradient
        return gw, jnp.zeros((), jnp.float32), jnp.zeros_like(h)

    def body(gw, xs):
        h, t, w = xs
        gw, loss, gh = jax.lax.cond(jnp.any(w != 0), chunk_grads, skip, gw, h, t, w)
        return gw, (loss, gh)

    gw, (losses, gh) = jax.lax.scan(body, jnp.zeros(emb.shape, jnp.float32), (hc, tc, wc))
    return jnp.sum(losses), (gh, gw.astype(emb.dtype))


def _fused_bwd(softcap, res, g):
    gh, gw = res
    return (gh * g.astype(gh.dtype), gw * g.astype(gw.dtype), None, None)


_fused_ce.defvjp(_fused_fwd, _fused_bwd)


def plain_ce_sum(h, emb, targets, weights, softcap: float | None = None):
    """The reference: full logits and log_softmax (tests and loss_impl=plain)."""
    logp = jax.nn.log_softmax(_logits(h, emb, softcap), axis=-1)
    tgt = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return -jnp.sum(tgt * weights.astype(jnp.float32))


def make_loss_fn(chunk_tokens: int = 1024, impl: str = "chunked"):
    """A loss for `PeftTrainer.with_loss_fn`: (model, **model inputs) -> scalar."""

    def loss_fn(model, input_tokens, input_mask, positions, attention_mask, loss_weights):
        del input_mask  # the padding is in attention_mask and loss_weights already
        h = hidden_states(model, input_tokens, positions, attention_mask)
        emb, softcap = head_of(model)
        targets = jnp.concatenate([input_tokens[:, 1:], jnp.zeros_like(input_tokens[:, :1])], axis=1)
        if impl == "plain":
            return plain_ce_sum(h, emb, targets, loss_weights, softcap)
        return chunked_ce_sum(h, emb, targets, loss_weights, chunk_tokens, softcap)

    return loss_fn


def model_inputs(input_tokens, input_mask, positions=None, loss_weights=None) -> dict:
    """`PeftTrainer.with_gen_model_input_fn`: positions (from the padding mask when not
    given) and the [B, L, L] attention mask, built on device: causal, padding keys masked
    out, and kept inside each packed example (positions restart at 0 there)."""
    from tunix.sft import utils

    input_mask = input_mask.astype(jnp.bool_)
    if positions is None:
        positions = utils.build_positions_from_mask(input_mask)
    seg = jnp.cumsum(positions == 0, axis=1)
    same = seg[:, :, None] == seg[:, None, :]
    causal = utils.make_causal_attn_mask(input_mask)
    out = {
        "input_tokens": input_tokens,
        "input_mask": input_mask,
        "positions": positions,
        "attention_mask": causal & same,
    }
    if loss_weights is not None:
        out["loss_weights"] = loss_weights
    return out
