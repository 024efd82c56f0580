"""The per-token objective: its derivative against central finite differences in every
region (inside the clip range, clipped above and below, A > 0 and A < 0, with and without
KL), against torch autograd of the formula as an engine writes it, the stats by hand, and
the sign convention down to the logits."""

from __future__ import annotations

import numpy as np
from requires import require_module
import pytest

from tunix_rt.train.rl_objective import nll, policy_loss

EPS_LOW, EPS_HIGH = 0.2, 0.28
HP = dict(eps_low=EPS_LOW, eps_high=EPS_HIGH)


def region_points(region: str, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(logp - old_logp, adv) with the ratio inside a region, at least 1e-3 from a kink."""
    if region == "inside":
        log_r = rng.uniform(np.log(1 - EPS_LOW) + 1e-3, np.log(1 + EPS_HIGH) - 1e-3, n)
        adv = rng.choice([-1, 1], n) * rng.uniform(0.1, 3.0, n)
    elif region == "above":  # r > 1 + eps_high
        log_r = rng.uniform(np.log(1 + EPS_HIGH) + 1e-3, 1.0, n)
        adv = rng.choice([-1, 1], n) * rng.uniform(0.1, 3.0, n)  # clipped only for A > 0
    else:  # r < 1 - eps_low
        log_r = rng.uniform(-2.0, np.log(1 - EPS_LOW) - 1e-3, n)
        adv = rng.choice([-1, 1], n) * rng.uniform(0.1, 3.0, n)  # clipped only for A < 0
    return log_r, adv


@pytest.mark.parametrize("beta", [0.0, 0.04, 1.0])
@pytest.mark.parametrize("region", ["inside", "above", "below"])
def test_derivative_matches_finite_differences(region, beta):
    rng = np.random.default_rng(["inside", "above", "below"].index(region) * 10 + int(beta * 100))
    n = 200
    log_r, adv = region_points(region, n, rng)
    old = -rng.uniform(0.01, 6.0, n)
    logp = old + log_r
    ref = logp + rng.normal(0.0, 0.5, n)
    coef = rng.uniform(0.1, 2.0, n)
    out = policy_loss(logp, old, ref, adv, coef, beta=beta, **HP)
    h = 1e-6
    for t in range(n):  # one token at a time: the loss is a sum of per-token terms

        def loss_at(x):
            return policy_loss([x], old[t:t + 1], ref[t:t + 1], adv[t:t + 1], coef[t:t + 1], beta=beta, **HP).loss

        fd = (loss_at(logp[t] + h) - loss_at(logp[t] - h)) / (2 * h)
        assert out.dloss_dlogp[t] == pytest.approx(fd, rel=1e-6, abs=1e-9), (region, t)
    clipped = ((adv > 0) & (region == "above")) | ((adv < 0) & (region == "below"))
    assert out.stats["clip_fraction"] == pytest.approx(clipped.mean())
    if region != "inside":
        assert 0 < clipped.sum() < n  # both signs of A were drawn: clipped and not
    if beta == 0.0:  # no KL: a clipped token has no gradient at all
        assert (out.dloss_dlogp[clipped] == 0).all() and (out.dloss_dlogp[~clipped] != 0).all()


def test_same_as_torch_autograd_of_the_formula():
    """The loss as an engine writes it (torch.min, torch.clamp), differentiated by autograd."""
    torch = require_module("torch")
    rng = np.random.default_rng(7)
    n = 500
    old = -rng.uniform(0.01, 6.0, n)
    logp = old + rng.normal(0.0, 0.4, n)
    ref = logp + rng.normal(0.0, 0.5, n)
    adv = rng.normal(0.0, 1.5, n)
    coef = rng.uniform(0.0, 1.0, n) * (rng.uniform(size=n) > 0.2)
    beta = 0.05
    lp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    o, rf, a, c = (torch.tensor(x, dtype=torch.float64) for x in (old, ref, adv, coef))
    r = torch.exp(lp - o)
    pg = -torch.min(r * a, torch.clamp(r, 1 - EPS_LOW, 1 + EPS_HIGH) * a)
    k3 = torch.exp(rf - lp) - (rf - lp) - 1
    loss = (c * (pg + beta * k3)).sum()
    loss.backward()
    ours = policy_loss(logp, old, ref, adv, coef, beta=beta, **HP)
    assert ours.loss == pytest.approx(loss.item(), rel=1e-13)
    np.testing.assert_allclose(ours.dloss_dlogp, lp.grad.numpy(), rtol=1e-12, atol=1e-15)
    assert 0 < ours.stats["clip_fraction"] < 0.5


def test_stats_by_hand():
    # tokens: inside (A>0), clipped high (A>0, r=1.5), clipped low (A<0, r=0.5),
    # r=1.5 with A<0 (not clipped), padding (coef 0, garbage that must not count)
    log_r = np.log([1.0, 1.5, 0.5, 1.5, 1.0])
    old = np.array([-1.0, -2.0, -0.5, -1.0, np.inf])
    logp = old + log_r
    logp[4] = -np.inf
    ref = logp.copy()
    ref[:2] += [0.1, -0.3]
    adv = np.array([1.0, 2.0, -1.0, -1.0, 5.0])
    coef = np.array([0.25, 0.25, 0.25, 0.25, 0.0])
    out = policy_loss(logp, old, ref, adv, coef, beta=0.5, **HP)
    k3 = [np.exp(0.1) - 0.1 - 1, np.exp(-0.3) + 0.3 - 1, 0.0, 0.0]
    assert out.stats == pytest.approx({
        "clip_fraction": 0.5, "clip_low_fraction": 0.25, "clip_high_fraction": 0.25,
        "kl_mean": np.mean(k3), "ratio_mean": np.mean([1.0, 1.5, 0.5, 1.5]), "n_tokens": 4.0,
    })
    pg = [-1.0, -(1 + EPS_HIGH) * 2.0, (1 - EPS_LOW), 1.5]
    assert out.loss == pytest.approx(0.25 * sum(p + 0.5 * k for p, k in zip(pg, k3)))
    assert np.isfinite(out.loss) and np.isfinite(out.dloss_dlogp).all() and out.dloss_dlogp[4] == 0.0


def test_on_policy_without_kl_is_minus_advantage():
    """The first update after a rollout: logp == old_logp, r = 1, nothing clips, and the
    gradient is -c * A exactly (the REINFORCE-with-baseline step)."""
    rng = np.random.default_rng(3)
    logp = -rng.uniform(0.0, 5.0, 64)
    adv, coef = rng.normal(size=64), rng.uniform(size=64)
    out = policy_loss(logp, logp, logp, adv, coef, beta=0.3, **HP)
    np.testing.assert_array_equal(out.dloss_dlogp, -coef * adv)
    assert out.loss == pytest.approx(-(coef * adv).sum())
    assert out.stats["clip_fraction"] == 0.0 and out.stats["kl_mean"] == 0.0 and out.stats["ratio_mean"] == 1.0


def test_nll_is_the_same_contract():
    logp = np.array([-0.5, -2.0, -7.0, 0.0])
    coef = np.array([0.5, 0.25, 0.25, 0.0])
    out = nll(logp, coef)
    assert out.loss == pytest.approx(0.25 + 0.5 + 1.75)
    np.testing.assert_array_equal(out.dloss_dlogp, [-0.5, -0.25, -0.25, 0.0])
    assert out.stats == {"nll_mean": pytest.approx(9.5 / 3), "n_tokens": 3.0}


@pytest.mark.parametrize("objective", ["nll", "policy"])
def test_logit_gradient_sign_convention(objective):
    """The documented chain to the logits: d loss / d z_t = -g_t * (softmax(z_t) - onehot(y_t)),
    checked by finite differences on the logits themselves."""
    rng = np.random.default_rng(11)
    t, v = 5, 7
    z = rng.normal(size=(t, v))
    y = rng.integers(0, v, size=t)
    coef = rng.uniform(0.1, 1.0, t)
    old = rng.normal(-2.0, 0.3, t)
    ref = rng.normal(-2.0, 0.3, t)
    adv = rng.normal(size=t)

    def logp_of(z):
        zs = z - z.max(axis=1, keepdims=True)
        return zs[np.arange(t), y] - np.log(np.exp(zs).sum(axis=1))

    def run(z):
        if objective == "nll":
            return nll(logp_of(z), coef)
        return policy_loss(logp_of(z), old, ref, adv, coef, beta=0.1, **HP)

    g = run(z).dloss_dlogp
    softmax = np.exp(z - z.max(axis=1, keepdims=True))
    softmax /= softmax.sum(axis=1, keepdims=True)
    onehot = np.eye(v)[y]
    analytic = -g[:, None] * (softmax - onehot)
    h = 1e-6
    for i in range(t):
        for j in range(v):
            up, down = z.copy(), z.copy()
            up[i, j] += h
            down[i, j] -= h
            fd = (run(up).loss - run(down).loss) / (2 * h)
            assert analytic[i, j] == pytest.approx(fd, rel=1e-5, abs=1e-9)


def test_shapes_must_agree():
    with pytest.raises(ValueError, match="differ in shape"):
        policy_loss(np.zeros(3), np.zeros(3), np.zeros(3), np.zeros(2), np.zeros(3), beta=0.0, **HP)
