"""Group advantages, dynamic sampling and the token weights of one optimizer step: hand
tables, Tunix's own implementations of the same rules, and accumulation 8×1 == 1×8."""

from __future__ import annotations

import numpy as np
from requires import require_module
import pytest

from tunix_rt.errors import BadInput
from tunix_rt.train.advantages import (
    STD_EPS,
    group_advantages,
    select_informative,
    token_coefficients,
    zero_variance_groups,
)
from tunix_rt.train.rl_objective import policy_loss

REWARDS = np.array([
    [1.0, 0.0, 0.0, 1.0],
    [1.0, 1.0, 1.0, 0.0],
    [0.5, 0.5, 0.5, 0.5],  # zero variance
    [0.1, 0.1, 0.1, 0.1],  # zero variance
    [2.0, -1.0, 0.5, 3.5],
])


def test_grpo_table():
    adv = group_advantages([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]], "grpo")
    s1 = np.sqrt(1 / 3)  # sample std of (1, 0, 0, 1): sqrt(4 * 0.25 / 3)
    s2 = np.sqrt(0.75 / 3)  # of (1, 1, 1, 0): sqrt((3 * 0.0625 + 0.5625) / 3)
    np.testing.assert_allclose(adv[0], np.array([0.5, -0.5, -0.5, 0.5]) / (s1 + STD_EPS), rtol=1e-15)
    np.testing.assert_allclose(adv[1], np.array([0.25, 0.25, 0.25, -0.75]) / (s2 + STD_EPS), rtol=1e-15)


def test_kinds_against_their_definitions():
    mean = REWARDS.mean(axis=1, keepdims=True)
    std = REWARDS.std(axis=1, ddof=1, keepdims=True)
    live = ~zero_variance_groups(REWARDS)
    np.testing.assert_allclose(group_advantages(REWARDS, "grpo")[live], ((REWARDS - mean) / (std + STD_EPS))[live], rtol=1e-14)
    np.testing.assert_allclose(group_advantages(REWARDS, "dr_grpo")[live], (REWARDS - mean)[live], rtol=1e-14)
    np.testing.assert_array_equal(group_advantages(REWARDS, "dapo"), group_advantages(REWARDS, "grpo"))


def test_zero_variance_groups_are_exactly_zero():
    assert zero_variance_groups(REWARDS).tolist() == [False, False, True, True, False]
    three = np.full((1, 3), 0.1)
    assert (three - three.mean() != 0).any()  # mean(0.1 x 3) is not 0.1 in float: a residue
    for kind in ("grpo", "dr_grpo", "dapo"):
        adv = group_advantages(REWARDS, kind)
        assert (adv[2:4] == 0.0).all()
        np.testing.assert_allclose(adv.sum(axis=1), 0.0, atol=1e-12)  # centred in every group
        assert (group_advantages(three, kind) == 0.0).all()  # ... that we do not keep


def test_group_advantages_rejects_bad_input():
    with pytest.raises(BadInput, match="at least 2 per group"):
        group_advantages([[1.0], [0.0]], "grpo")
    with pytest.raises(BadInput, match="at least 2 per group"):
        group_advantages([1.0, 0.0], "grpo")
    with pytest.raises(BadInput, match="grpo|dr_grpo|dapo"):
        group_advantages(REWARDS, "ppo")
    with pytest.raises(ValueError, match="non-finite"):
        group_advantages([[1.0, float("nan")]], "grpo")


# --- dynamic sampling -------------------------------------------------------------------------

def scored_stream(rows, pulled: list):
    """(group id, rewards) pairs, recording every pull: the driver generates on demand."""
    for i, r in enumerate(rows):
        pulled.append(i)
        yield f"g{i}", r


STREAM = [[1, 1, 1], [0, 1, 0], [0, 0, 0], [1, 0, 1], [0.5, 0.5, 0.5], [1, 0, 0], [0, 1, 1]]


def test_select_informative_keeps_p_groups_and_counts_draws():
    pulled: list = []
    batch = select_informative(scored_stream(STREAM, pulled), n_groups=3)
    assert batch.groups == ["g1", "g3", "g5"]
    assert (batch.drawn, batch.dropped, batch.filled) == (6, 3, True)
    assert pulled == [0, 1, 2, 3, 4, 5]  # never pulled past the last group kept


@pytest.mark.parametrize("max_draws,n_groups,expected", [
    (4, 3, (["g1", "g3"], 4, 2, False)),  # the cap comes first
    (None, 5, (["g1", "g3", "g5", "g6"], 7, 3, False)),  # the stream ends first
    (None, 1, (["g1"], 2, 1, True)),
])
def test_select_informative_stops_short(max_draws, n_groups, expected):
    batch = select_informative(scored_stream(STREAM, []), n_groups=n_groups, max_draws=max_draws)
    assert (batch.groups, batch.drawn, batch.dropped, batch.filled) == expected


def test_select_informative_rejects_bad_sizes():
    with pytest.raises(BadInput, match="n_groups must be >= 1"):
        select_informative([], n_groups=0)
    with pytest.raises(BadInput, match="max_draws"):
        select_informative([], n_groups=4, max_draws=3)


# --- token coefficients ---------------------------------------------------------------------

# 3 completions of 3, 1 and 2 loss tokens in a [3, 5] window, max_new_tokens 4
MASK = np.array([[0, 1, 1, 1, 0], [0, 0, 1, 0, 0], [1, 1, 0, 0, 0]])


@pytest.mark.parametrize("kind,row_values,total", [
    ("grpo", [1 / 9, 1 / 3, 1 / 6], 1.0),  # 1 / (N * len_i)
    ("dr_grpo", [1 / 12, 1 / 12, 1 / 12], 6 / 12),  # 1 / (N * max_new_tokens)
    ("dapo", [1 / 6, 1 / 6, 1 / 6], 1.0),  # 1 / sum(len)
])
def test_token_coefficients_table(kind, row_values, total):
    c = token_coefficients(MASK, kind, max_new_tokens=4)
    np.testing.assert_allclose(c, MASK * np.array(row_values)[:, None], rtol=1e-15)
    assert c.sum() == pytest.approx(total)


@pytest.mark.parametrize("kind,row_values", [
    ("grpo", [1 / 6, 0.0, 1 / 4]),  # N = 2
    ("dr_grpo", [1 / 8, 0.0, 1 / 8]),
    ("dapo", [1 / 5, 0.0, 1 / 5]),
])
def test_dropped_truncated_completions_leave_the_window(kind, row_values):
    c = token_coefficients(MASK, kind, max_new_tokens=4, truncated=[False, True, False], drop_truncated=True)
    np.testing.assert_allclose(c, MASK * np.array(row_values)[:, None], rtol=1e-15)
    kept = token_coefficients(MASK, kind, max_new_tokens=4, truncated=[False, True, False])
    np.testing.assert_array_equal(kept, token_coefficients(MASK, kind, max_new_tokens=4))


def test_token_coefficients_edge_cases():
    everything_dropped = token_coefficients(MASK, "grpo", 4, truncated=[True] * 3, drop_truncated=True)
    assert (everything_dropped == 0).all()
    with_empty_row = np.vstack([MASK, np.zeros(5, int)])
    np.testing.assert_array_equal(token_coefficients(with_empty_row, "grpo", 4)[:3], token_coefficients(MASK, "grpo", 4))
    with pytest.raises(BadInput, match="max_new_tokens=2 but a completion has 3"):
        token_coefficients(MASK, "dr_grpo", max_new_tokens=2)
    with pytest.raises(BadInput, match="0/1"):
        token_coefficients(MASK * 2, "grpo", 4)
    with pytest.raises(BadInput, match="needs the truncated flag"):
        token_coefficients(MASK, "grpo", 4, drop_truncated=True)
    with pytest.raises(BadInput, match=r"truncated must be \[3\]"):
        token_coefficients(MASK, "grpo", 4, truncated=[True], drop_truncated=True)


def _window(seed: int = 0, n: int = 8, t: int = 12):
    """A rollout window: 8 completions of different lengths, per-token log-probs near a
    policy that moved a little since rollout (some ratios clip), advantages of 2 groups."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, t + 1, size=n)
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(int)
    old = -rng.uniform(0.05, 4.0, size=(n, t))
    logp = old + rng.normal(0.0, 0.3, size=(n, t))
    ref = old + rng.normal(0.0, 0.2, size=(n, t))
    adv = group_advantages([[1.0, 0.0, 0.0, 1.0], [2.0, 0.0, 1.0, 0.0]], "grpo")
    return mask, logp, old, ref, np.repeat(adv.reshape(n, 1), t, axis=1), t


@pytest.mark.parametrize("kind", ["grpo", "dr_grpo", "dapo"])
def test_accumulation_8x1_equals_1x8(kind):
    """Coefficients of the whole window, then any split into micro-batches: same loss and
    same per-token gradient. (For dapo, a token mean per micro-batch would not be; for grpo
    and dr_grpo it is only while micro-batches hold equal numbers of completions.)"""
    mask, logp, old, ref, adv, t = _window()
    hp = dict(eps_low=0.2, eps_high=0.28, beta=0.04)
    c = token_coefficients(mask, kind, max_new_tokens=t)
    whole = policy_loss(logp, old, ref, adv, c, **hp)
    assert 0 < whole.stats["clip_fraction"] < 1
    for split in (1, 2, 4):
        rows = np.array_split(np.arange(8), 8 // split)
        parts = [policy_loss(logp[r], old[r], ref[r], adv[r], c[r], **hp) for r in rows]
        assert sum(p.loss for p in parts) == pytest.approx(whole.loss, rel=1e-12, abs=1e-15)
        np.testing.assert_allclose(np.vstack([p.dloss_dlogp for p in parts]), whole.dloss_dlogp, rtol=1e-15)
        naive = [policy_loss(logp[r], old[r], ref[r], adv[r], token_coefficients(mask[r], kind, t), **hp) for r in rows]
        if kind == "dapo":  # a token mean per micro-batch weighs short micro-batches up
            assert sum(p.loss for p in naive) / len(rows) != pytest.approx(whole.loss, rel=1e-6)


# --- the same rules as Tunix implements them ------------------------------------------------

@pytest.mark.jax
def test_same_as_tunix_advantages_and_loss_aggregation():
    """Tunix's GRPO / Dr. GRPO advantage estimators and its aggregate_loss modes, on the same
    inputs (Tunix runs in float32)."""
    algo_core = require_module("tunix.rl.algo_core")
    from tunix.rl.common import aggregate_loss

    live = REWARDS[~zero_variance_groups(REWARDS)]
    flat = live.reshape(-1)
    np.testing.assert_allclose(group_advantages(live, "grpo").reshape(-1),
                               algo_core.compute_advantages(flat, 4), rtol=1e-12)
    np.testing.assert_allclose(group_advantages(live, "dr_grpo").reshape(-1),
                               np.asarray(algo_core.compute_drgrpo_advantages(flat, 4)), rtol=1e-6, atol=1e-6)
    mask, _, _, _, _, t = _window()
    per_token_loss = np.random.default_rng(1).normal(size=mask.shape)
    for kind, mode in (("grpo", "sequence-mean-token-mean"), ("dapo", "token-mean"),
                       ("dr_grpo", "sequence-mean-token-scale")):
        ours = (token_coefficients(mask, kind, max_new_tokens=t) * per_token_loss).sum()
        theirs = float(aggregate_loss(per_token_loss.astype(np.float32), mask.astype(np.float32), mode, norm=t))
        assert ours == pytest.approx(theirs, rel=1e-5), kind
