"""Group advantages, DAPO's dynamic sampling and the per-token weights of one optimizer step.

A rollout step draws P prompts × G completions. Rewards come as an array [P, G] (row p:
the G completions of prompt p).

Advantages (one value per completion, broadcast to its tokens by the engine):
- `grpo`, `dapo`: (r - mean_g r) / (std_g r + eps), std with Bessel's correction (ddof=1,
  as Tunix's and TRL's GRPO), eps = STD_EPS = 1e-6 (Tunix's) so that a group whose rewards
  differ by very little does not blow up;
- `dr_grpo`: r - mean_g r (Dr. GRPO: no division by the std, whose small values upweight
  easy and hopeless prompts);
- `gspo`: as `grpo` (GSPO changes the importance ratio, not the advantage: train.sequence_ratio);
- `rloo`: r - mean_{j != i} r_j, the leave-one-out baseline (RLOO; TRL's RLOOTrainer with
  normalize_advantages=False): G / (G - 1) times r - mean_g r.
A zero-variance group (all G rewards equal) carries no signal: its advantages are exactly 0
under every kind (not a rounding residue of r - mean).

Token weights: the loss of one optimizer step is sum_t c_t * loss_t over every completion
token of the step's whole window (all micro-batches), with c_t computed here up front from
the window's masks. A micro-batch contributes sum over its rows of c_t * loss_t, so
accumulation 8×1 and 1×8 give the same loss and gradient (up to float summation order).
- `grpo`, `gspo`, `rloo`: mean over each completion's tokens, then over completions:
  c = 1 / (N · len_i) (for gspo and rloo a completion's terms are one sequence-level value,
  so this is the mean over completions that GSPO and TRL's RLOOTrainer take);
- `dr_grpo`: token sum / (N · max_new_tokens): c = 1 / (N · max_new_tokens);
- `dapo`: token mean over the window: c = 1 / sum_i len_i;
where N counts the completions that carry loss (at least one token, and not truncated
when `drop_truncated`): a dropped completion is as if it were not in the window (DAPO's
overlong filtering). Each rule equals Tunix's `aggregate_loss` mode of the same meaning
(sequence-mean-token-mean, sequence-mean-token-scale with norm=max_new_tokens, token-mean).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from tunix_rt.errors import BadInput

KINDS = ("grpo", "dr_grpo", "dapo", "gspo", "rloo")
STD_EPS = 1e-6


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise BadInput(f"advantage kind must be one of {'|'.join(KINDS)}, got {kind!r}")


def _rewards_2d(rewards: Any) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 2 or r.shape[1] < 2:
        raise BadInput(f"rewards must be [prompts, completions per prompt] with at least 2 per group, got shape {r.shape}")
    if not np.isfinite(r).all():
        raise ValueError("rewards hold a non-finite value")
    return r


def zero_variance_groups(rewards: Any) -> np.ndarray:
    """[P] bool: the groups whose G rewards are all equal (no learning signal)."""
    r = _rewards_2d(rewards)
    return r.max(axis=1) == r.min(axis=1)


def group_advantages(rewards: Any, kind: str, eps: float = STD_EPS) -> np.ndarray:
    """[P, G] float64 advantages of [P, G] rewards (see the module docstring)."""
    _check_kind(kind)
    r = _rewards_2d(rewards)
    adv = r - r.mean(axis=1, keepdims=True)
    if kind == "rloo":  # r_i - (sum_g r - r_i) / (G - 1)
        adv = r - (r.sum(axis=1, keepdims=True) - r) / (r.shape[1] - 1)
    if kind in ("grpo", "dapo", "gspo"):
        adv = adv / (r.std(axis=1, ddof=1, keepdims=True) + eps)
    adv[zero_variance_groups(r)] = 0.0
    return adv


@dataclass(frozen=True)
class DynamicBatch:
    """What dynamic sampling kept: the informative groups (as the stream gave them, in
    order) and how many groups it drew to find them."""

    groups: list[Any]
    drawn: int
    filled: bool
    """False when the stream or max_draws ran out before enough groups were kept."""

    @property
    def dropped(self) -> int:
        """Zero-variance groups drawn and discarded."""
        return self.drawn - len(self.groups)


def has_variance(rewards: Any) -> bool:
    """Whether one group's rewards [G] differ (DAPO keeps only such groups)."""
    return not zero_variance_groups(np.asarray(rewards, dtype=np.float64)[None, :])[0]


def select_informative(scored: Iterable[tuple[Any, Any]], n_groups: int,
                       max_draws: int | None = None,
                       keep: Callable[[Any, Any], bool] | None = None) -> DynamicBatch:
    """DAPO dynamic sampling: pull (group, rewards[G]) pairs from `scored` until `n_groups`
    pass `keep(group, rewards)` (default: non-zero reward variance, `has_variance`; GRPO's
    rule is train.curriculum.keep_rule); the others are dropped. The stream is consumed
    lazily and never past the last group kept, so the driver can generate rollouts on
    demand. Stops early (filled=False) when the stream ends or `max_draws` groups were
    drawn; the driver decides whether a short batch may train."""
    if n_groups < 1:
        raise BadInput(f"n_groups must be >= 1, got {n_groups}")
    if max_draws is not None and max_draws < n_groups:
        raise BadInput(f"max_draws ({max_draws}) must be >= n_groups ({n_groups})")
    kept: list[Any] = []
    drawn = 0
    it: Iterator[tuple[Any, Any]] = iter(scored)
    while len(kept) < n_groups and (max_draws is None or drawn < max_draws):
        try:
            group, rewards = next(it)
        except StopIteration:
            break
        drawn += 1
        if keep(group, rewards) if keep is not None else has_variance(rewards):
            kept.append(group)
    return DynamicBatch(kept, drawn, filled=len(kept) == n_groups)


def token_coefficients(mask: Any, kind: str, max_new_tokens: int, truncated: Any = None,
                       drop_truncated: bool = False) -> np.ndarray:
    """c [N, T] float64 for the N completions of one optimizer step's whole window.

    mask [N, T]: 1 on each completion token that carries loss (its stop token included),
    0 elsewhere (prompt, padding). truncated [N]: the completion hit max_new_tokens without
    a stop token; with drop_truncated its tokens get c = 0 and it is not counted in N.
    A window with no token left gets all zeros (a zero loss, not a division by zero)."""
    _check_kind(kind)
    m = np.asarray(mask)
    if m.ndim != 2 or not np.isin(m, (0, 1)).all():
        raise BadInput(f"mask must be a [completions, tokens] array of 0/1, got shape {m.shape}")
    m = m.astype(np.float64)
    lengths = m.sum(axis=1)
    if max_new_tokens < 1 or lengths.max(initial=0) > max_new_tokens:
        raise BadInput(f"max_new_tokens={max_new_tokens} but a completion has {int(lengths.max(initial=0))} loss tokens")
    if drop_truncated:
        if truncated is None:
            raise BadInput("drop_truncated needs the truncated flag of each completion")
        t = np.asarray(truncated, dtype=bool)
        if t.shape != (m.shape[0],):
            raise BadInput(f"truncated must be [{m.shape[0]}], got shape {t.shape}")
        m[t] = 0.0
        lengths = m.sum(axis=1)
    n = int((lengths > 0).sum())
    if n == 0:
        return np.zeros_like(m)
    if kind in ("grpo", "gspo", "rloo"):
        per_row = np.divide(1.0, n * lengths, out=np.zeros_like(lengths), where=lengths > 0)
        return m * per_row[:, None]
    if kind == "dr_grpo":
        return m / (n * max_new_tokens)
    return m / lengths.sum()
