"""The per-token objective of SFT and of the GRPO family, in reference form (numpy, float64).

The contract both engines implement in their fused chunked loss (no [B, L, V] logits):
every method's loss is an elementwise function of the log-probability of the target token,

    loss = sum_t c_t * phi(l_t; aux_t),        l_t = log softmax(z_t)[y_t]

where z_t are the logits at position t, y_t the target (sampled) token, c_t the token's
coefficient (`advantages.token_coefficients` for RL, the per-token normalisation for SFT;
0 off the completion) and aux_t the per-token inputs below. With

    g_t := d loss / d l_t = c_t * phi'(l_t; aux_t)      (`Objective.dloss_dlogp`)

and d l_t / d z_t = onehot(y_t) - softmax(z_t), the gradient of the logits is

    d loss / d z_t = -g_t * (softmax(z_t) - onehot(y_t)).

For SFT phi(l) = -l, so g_t = -c_t and d loss / d z_t = c_t * (softmax(z_t) - onehot(y_t)):
the familiar cross-entropy gradient. A chunk of the fused loss therefore computes l_t,
then phi and g_t elementwise, then scales the rows of (softmax - onehot) by -g_t (and, for
a soft-capped head, by the cap's derivative as before).

The GRPO-family phi (per token; logp_old from rollout time, logp_ref under the reference
policy, i.e. the LoRA adapter disabled; A_t the completion's advantage):

    r_t   = exp(l_t - logp_old_t)
    k3_t  = exp(logp_ref_t - l_t) - (logp_ref_t - l_t) - 1
    phi_t = -min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t) + beta * k3_t
    phi'_t = -r_t * A_t * [clip branch inactive] + beta * (1 - exp(logp_ref_t - l_t))

The clipped branch is active where it is strictly the smaller one: A_t > 0 and
r_t > 1 + eps_high, or A_t < 0 and r_t < 1 - eps_low; there the policy term's derivative is
0. On a tie both branches have the derivative -r_t * A_t (as torch and JAX give it).

Tool-written tokens (a calculator's result, a python output: tunix_rt.tools) are
observations, not actions: the policy did not choose them, so neither the policy term nor
the KL may push on their log-probabilities. Their c_t is 0 (`tool_mask` here; GRPO's update
batches give them coefficient 0 and no label), so they add nothing to the loss, the
gradient or the stats, and the per-token normalisation counts the model's tokens only.

Stats are taken over the completion tokens, the positions with c_t != 0, as plain token
means, with the token count so micro-batches can be combined: clip_fraction (clipped branch
active), clip_low_fraction, clip_high_fraction, kl_mean (k3), ratio_mean, n_tokens.

Sequence-level ratios (rl_loss gspo and rloo; `sequence_policy_loss`, rows = completions).
One ratio per completion i from the log-ratio of its loss tokens (o_i: the positions with
c_t != 0, |o_i| of them):

    gspo  LR_i = (1 / |o_i|) sum_{t in o_i} (l_t - logp_old_t)   (GSPO; TRL's GRPOTrainer with
          importance_sampling_level="sequence")
    rloo  LR_i = sum_{t in o_i} (l_t - logp_old_t)               (TRL's RLOOTrainer)
    s_i = exp(LR_i),  V_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)
    loss = sum_i sum_{t in o_i} c_t (V_i + beta k3_t)             (rloo: beta = 0 here, its
                                                                   KL is in the reward)

V_i is the same at every token of o_i, so with C_i = sum_{t in o_i} c_t the policy part is
sum_i C_i V_i (the mean of V_i over completions for grpo's c = 1 / (N |o_i|)). It is not
elementwise in l_t: its gradient is a per-sequence scalar,

    d loss / d l_t = C_i V'_i dLR_i/dl_t + c_t beta (1 - exp(logp_ref_t - l_t)),
    V'_i = -s_i A_i (0 where the clipped branch is strictly smaller, as above),
    dLR_i/dl_t = 1 / |o_i| (gspo) or 1 (rloo).

How each engine trains it through its fused chunked objective (no [B, L, V] logits) is
train.sequence_ratio's part; this is the reference both are tested against.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Objective(NamedTuple):
    loss: float
    """sum_t c_t * phi_t."""
    dloss_dlogp: np.ndarray
    """g_t = c_t * phi'(l_t), same shape as logp."""
    stats: dict[str, float]


def policy_loss(logp, old_logp, ref_logp, adv, coef, *, eps_low: float, eps_high: float,
                beta: float, tool_mask=None) -> Objective:
    """The clipped-ratio policy loss with the k3 KL penalty (see the module docstring).
    Arrays of one shape (any), float64 inside. tool_mask: 1 where a tool wrote the token
    (its coefficient taken as 0), None: the model wrote every token."""
    lp, old, ref, a, c = _same_shape(logp, old_logp, ref_logp, adv, coef)
    if tool_mask is not None:
        c = c * (1.0 - _same_shape(tool_mask, c)[0])
    with np.errstate(over="ignore", invalid="ignore"):  # padding may hold anything; masked below
        return _policy_loss(lp, old, ref, a, c, eps_low, eps_high, beta)


def _policy_loss(lp, old, ref, a, c, eps_low, eps_high, beta) -> Objective:
    ratio = np.exp(lp - old)
    clip_high = (a > 0) & (ratio > 1.0 + eps_high)
    clip_low = (a < 0) & (ratio < 1.0 - eps_low)
    clipped = clip_high | clip_low
    pg = -np.minimum(ratio * a, np.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * a)
    d_pg = np.where(clipped, 0.0, -ratio * a)
    ref_ratio = np.exp(ref - lp)
    k3 = ref_ratio - (ref - lp) - 1.0
    phi = pg + beta * k3
    dphi = d_pg + beta * (1.0 - ref_ratio)
    on = c != 0
    stats = {
        "clip_fraction": _mean(clipped, on),
        "clip_low_fraction": _mean(clip_low, on),
        "clip_high_fraction": _mean(clip_high, on),
        "kl_mean": _mean(k3, on),
        "ratio_mean": _mean(ratio, on),
        "n_tokens": float(on.sum()),
    }
    return Objective(_weighted_sum(c, phi, on), np.where(on, c * dphi, 0.0), stats)


def sequence_policy_loss(logp, old_logp, ref_logp, adv, coef, *, level: str, eps_low: float, eps_high: float,
                         beta: float) -> Objective:
    """The sequence-level policy loss (see the module docstring) of [N, T] arrays, one row
    per completion; adv [N] or [N, T] (a row's value at its first loss token is taken).
    level: "mean" (gspo) or "sum" (rloo). Stats as policy_loss's, a clipped completion
    counting each of its tokens."""
    if level not in ("mean", "sum"):
        raise ValueError(f"level must be mean or sum, got {level!r}")
    lp, old, ref, c = _same_shape(logp, old_logp, ref_logp, coef)
    if lp.ndim != 2:
        raise ValueError(f"sequence-level arrays are [completions, tokens], got shape {lp.shape}")
    on = c != 0
    a = np.asarray(adv, dtype=np.float64)
    if a.ndim == 2:
        a = np.where(on.any(axis=1), a[np.arange(len(a)), on.argmax(axis=1)], 0.0)
    n = on.sum(axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        lr = np.where(on, lp - old, 0.0).sum(axis=1)
        if level == "mean":
            lr = lr / np.maximum(n, 1)
        s = np.exp(lr)
        clip_high = (a > 0) & (s > 1.0 + eps_high)
        clip_low = (a < 0) & (s < 1.0 - eps_low)
        clipped = clip_high | clip_low
        v = -np.minimum(s * a, np.clip(s, 1.0 - eps_low, 1.0 + eps_high) * a)
        dv = np.where(clipped, 0.0, -s * a)
        ref_ratio = np.exp(ref - lp)
        k3 = ref_ratio - (ref - lp) - 1.0
        big_c = np.where(on, c, 0.0).sum(axis=1)
        dlr = 1.0 / np.maximum(n, 1) if level == "mean" else np.ones_like(big_c)
        grad = np.where(on, (big_c * dv * dlr)[:, None] + c * beta * (1.0 - ref_ratio), 0.0)
        loss = float((big_c * v).sum()) + beta * _weighted_sum(c, k3, on)
    rows = lambda x: np.broadcast_to(x[:, None], on.shape)  # noqa: E731
    stats = {"clip_fraction": _mean(rows(clipped), on), "clip_low_fraction": _mean(rows(clip_low), on),
             "clip_high_fraction": _mean(rows(clip_high), on), "kl_mean": _mean(k3, on),
             "ratio_mean": _mean(rows(s), on), "n_tokens": float(on.sum())}
    return Objective(loss, grad, stats)


def nll(logp, coef) -> Objective:
    """SFT in the same form: phi(l) = -l, so g_t = -c_t."""
    lp, c = _same_shape(logp, coef)
    on = c != 0
    return Objective(_weighted_sum(c, -lp, on), np.where(on, -c, 0.0),
                     {"nll_mean": _mean(-lp, on), "n_tokens": float(on.sum())})


def _same_shape(*arrays) -> list[np.ndarray]:
    out = [np.asarray(x, dtype=np.float64) for x in arrays]
    if len({x.shape for x in out}) != 1:
        raise ValueError(f"per-token arrays differ in shape: {[x.shape for x in out]}")
    return out


def _weighted_sum(c: np.ndarray, phi: np.ndarray, on: np.ndarray) -> float:
    """sum c * phi over the completion tokens only: a padding position's phi may be
    anything (inf from exp of garbage) and must not turn 0 * inf into nan."""
    return float((c[on] * phi[on]).sum())


def _mean(values: np.ndarray, on: np.ndarray) -> float:
    n = on.sum()
    return float(values[on].sum() / n) if n else 0.0
