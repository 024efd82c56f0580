"""GSPO and RLOO (rl_loss gspo | rloo): the GRPO method's sequence-level importance ratios,
trained through each engine's fused chunked objective (train.engine: no [B, L, V] logits).
The reference form, and what the tests hold both engines to, is
train.rl_objective.sequence_policy_loss; its notation here (o_i: completion i's loss tokens,
c_t != 0; C_i = sum of their c_t; LR_i its log-ratio; s_i = exp(LR_i); V_i, V'_i).

A sequence-level loss is not elementwise in the token log-probs l_t, but its gradient with
respect to each l_t is a per-sequence scalar, so a step is: the per-sequence numbers from
no-gradient passes (Engine.token_logprobs), then the engine's fused objective with per-token
inputs that give exactly that gradient:

gspo  LR_i = mean over o_i of (l_t - old_t). The engine's policy objective, with each loss
      token's old log-prob replaced by old'_t = now_t - LR_i (now: the current policy's
      log-probs, no gradient): r_t = exp(l_t - old'_t) is s_i in value with d r_t / d l_t =
      s_i, the clip is decided on s_i, and because c_t is one value over o_i (every rl_loss's
      token weights are; checked) c_t phi'(l_t) = C_i V'_i / |o_i| + c_t beta (1 - e^(ref - l)):
      the GSPO gradient, the KL per token as TRL's (k3). The loss value is sum c_t (V_i +
      beta k3_t) as TRL's loss_type="grpo". On-policy (mu = 1) s_i = 1: the step is GRPO's
      in value and gradient (they part once the policy has moved, mu > 1); the first of mu
      updates needs no pass either (now = old).
rloo  TRL's RLOOTrainer: each reward minus beta x the completion's summed first-order KL
      (sum over o_i of old - ref, no gradient), the leave-one-out advantages of those
      (train.advantages, kind rloo), LR_i = the sum over o_i of (l_t - old_t), loss =
      sum_i C_i V_i (the mean over completions). Its gradient is C_i V'_i at each token of
      o_i: the engine's NLL objective (phi = -l, g_t = -coef_t) with coefficient -C_i V'_i
      there trains exactly it. That surrogate's value is not the loss, so the loss and the
      statistics are computed here, float64 over the whole window (accumulation 8x1 = 1x8),
      and logged.

With lora_dropout > 0 the no-gradient passes are dropout-free while the update draws
dropout, as in TRL (whose old log-probs are dropout-free too).
"""

from __future__ import annotations

import numpy as np

from tunix_rt.train.engine import NLL, Objective, StepResult

#: the rl_loss values with a sequence-level ratio, and how LR_i sums its tokens
LEVELS = {"gspo": "mean", "rloo": "sum"}


def sequence_index(batch) -> np.ndarray:
    """[B, L] int64: the batch's sequence (completion) index of each position, in the order
    the batch was built (a row each, or the branches of shared-prefix rows in turn), -1 on a
    shared prefix and on padding."""
    rows, width = batch.labels.shape
    if batch.segments is None:
        return np.repeat(np.arange(rows, dtype=np.int64)[:, None], width, axis=1)
    seg = np.asarray(batch.segments)
    per_row = np.maximum(seg.max(axis=1), 0)
    base = np.concatenate([[0], np.cumsum(per_row)[:-1]])
    return np.where(seg >= 1, base[:, None] + seg - 1, -1)


def sequences_in(batch) -> int:
    return int(sequence_index(batch).max(initial=-1)) + 1


class Window:
    """The sequences of one optimizer step's micro-batches: each position's global sequence
    index (`seq`, -1 off a completion), its loss tokens (`on`: c_t != 0) and per-sequence
    sums over them."""

    def __init__(self, batches: list):
        self.batches, self.seq, self.on, offset = batches, [], [], 0
        for b in batches:
            local = sequence_index(b)
            self.seq.append(np.where(local >= 0, local + offset, -1))
            self.on.append((np.asarray(b.coef) != 0) & (local >= 0))
            offset += sequences_in(b)
        self.n_seq = offset
        self.n = self.sum([np.ones(b.labels.shape) for b in batches])
        self.big_c = self.sum([np.asarray(b.coef, np.float64) for b in batches])

    def sum(self, values: list[np.ndarray]) -> np.ndarray:
        """[n_seq] float64: per sequence, the sum of values over its loss tokens."""
        out = np.zeros(self.n_seq)
        for v, s, on in zip(values, self.seq, self.on):
            out += np.bincount(s[on], weights=np.asarray(v, np.float64)[on], minlength=self.n_seq)
        return out

    def spread(self, per_seq: np.ndarray, k: int, off: np.ndarray | float = 0.0) -> np.ndarray:
        """float32 [B, L] of batch k: per_seq at each loss token, `off` elsewhere."""
        s = self.seq[k]
        return np.where(self.on[k], per_seq[np.maximum(s, 0)], off).astype(np.float32)

    def check_uniform_coef(self) -> None:
        """Every completion's loss tokens share one c_t (what gspo's shifted old log-probs need)."""
        hi, lo = np.full(self.n_seq, -np.inf), np.full(self.n_seq, np.inf)
        for b, s, on in zip(self.batches, self.seq, self.on):
            np.maximum.at(hi, s[on], np.asarray(b.coef, np.float64)[on])
            np.minimum.at(lo, s[on], np.asarray(b.coef, np.float64)[on])
        used = np.isfinite(hi)
        if not np.allclose(hi[used], lo[used], rtol=1e-6, atol=0.0):
            raise ValueError("gspo needs one coefficient over each completion's loss tokens")


def sequence_update(cfg, objective: Objective) -> "SequenceUpdate | None":
    """The update of a sequence-level rl_loss (None: a token-level one, GRPO's own loop)."""
    return SequenceUpdate(cfg, objective) if cfg.rl_loss in LEVELS else None


class SequenceUpdate:
    def __init__(self, cfg, objective: Objective):
        self.cfg, self.objective, self.level = cfg, objective, LEVELS[cfg.rl_loss]

    def train(self, engine, batches: list, rewards: np.ndarray, lr: float) -> list[StepResult]:
        """mu optimizer steps on the window's batches (their coef, aux old_logp, ref_logp and
        adv as train.grpo sets them); rewards [P, G] of the window's completions in order."""
        if not batches:
            return [engine.train_step(batches, self.objective, lr) for _ in range(self.cfg.mu)]
        plan = self.start(engine, batches, rewards)
        results = []
        for k in range(self.cfg.mu):
            objective, finish = plan.prepare(engine, k)
            results.append(finish(engine.train_step(batches, objective, lr)))
        plan.restore()
        return results

    def start(self, engine, batches: list, rewards: np.ndarray) -> "GspoPlan | RlooPlan":
        """The window's per-sequence numbers; plan.prepare(engine, k) sets the batches' inputs
        of update k and returns (the objective to train, what turns its StepResult into the
        logged one); plan.restore() puts the batches back as they came."""
        w = Window(batches)
        return GspoPlan(self, w) if self.level == "mean" else RlooPlan(self, engine, w, rewards)

    def log_ratio(self, engine, w: Window, k: int, old: list[np.ndarray]):
        """(LR [n_seq], the current log-probs or None) of update k: 0 on-policy and for the
        first update (the policy is the rollouts'), else from a no-gradient pass."""
        if self.objective.on_policy or k == 0:
            return np.zeros(w.n_seq), None
        now = [engine.token_logprobs(b) for b in w.batches]
        lr = w.sum([n.astype(np.float64) - o for n, o in zip(now, old)])
        return (lr / np.maximum(w.n, 1) if self.level == "mean" else lr), now


def _same(result: StepResult) -> StepResult:
    return result


class GspoPlan:
    def __init__(self, update: SequenceUpdate, w: Window):
        w.check_uniform_coef()
        self.update, self.w = update, w
        self.old = [np.asarray(b.aux["old_logp"], np.float64) for b in w.batches]

    def prepare(self, engine, k: int):
        w = self.w
        log_ratio, now = self.update.log_ratio(engine, w, k, self.old)
        for i, b in enumerate(w.batches):  # r_t = exp(l_t - now_t + LR_i): s_i in value
            b.aux["old_logp"] = (self.old[i] if now is None else
                                 np.where(w.on[i], now[i] - w.spread(log_ratio, i), self.old[i])).astype(np.float32)
        return self.update.objective, _same

    def restore(self) -> None:
        for b, o in zip(self.w.batches, self.old):
            b.aux["old_logp"] = o.astype(np.float32)


class RlooPlan:
    def __init__(self, update: SequenceUpdate, engine, w: Window, rewards: np.ndarray):
        from tunix_rt.train.advantages import group_advantages

        cfg = update.cfg
        self.update, self.w = update, w
        if update.objective.on_policy and cfg.beta > 0:  # the KL penalty needs the rollout policy's log-probs
            for b in w.batches:
                b.aux["old_logp"] = engine.token_logprobs(b)
        self.old = [np.asarray(b.aux["old_logp"], np.float64) for b in w.batches]
        self.kl = (w.sum([o - np.asarray(b.aux["ref_logp"], np.float64) for o, b in zip(self.old, w.batches)])
                   if cfg.beta > 0 else np.zeros(w.n_seq))
        rewards = np.asarray(rewards, np.float64)
        self.adv = group_advantages(rewards - cfg.beta * self.kl.reshape(rewards.shape), "rloo").reshape(-1)
        self.coef = [b.coef for b in w.batches]
        for i, b in enumerate(w.batches):
            b.aux["adv"] = w.spread(self.adv, i)

    def prepare(self, engine, k: int):
        w, adv, obj = self.w, self.adv, self.update.objective
        log_ratio, _ = self.update.log_ratio(engine, w, k, self.old)
        s = np.exp(log_ratio)
        clipped = ((adv > 0) & (s > 1.0 + obj.eps_high)) | ((adv < 0) & (s < 1.0 - obj.eps_low))
        value = -np.minimum(s * adv, np.clip(s, 1.0 - obj.eps_low, 1.0 + obj.eps_high) * adv)
        dvalue = np.where(clipped, 0.0, -s * adv)
        for i, b in enumerate(w.batches):  # NLL: g_t = -coef_t = C_i V'_i
            b.coef = w.spread(-w.big_c * dvalue, i)
        stats = {"clipped": float((w.n * clipped).sum()), "kl": float(self.kl.sum()),
                 "ratio": float((w.n * s).sum()), "tokens": float(w.n.sum())}
        loss = float((w.big_c * value).sum())
        return NLL, lambda res: StepResult(loss, res.grad_norm, stats)

    def restore(self) -> None:
        for b, c in zip(self.w.batches, self.coef):
            b.coef = c
