"""Sampled evaluation's estimators: pass@k, majority vote, and the paired test over
per-item pass rates.

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): with n
samples of an item of which c are correct, the unbiased estimate of "at least one of k
samples drawn without replacement is correct" is

    pass@k = 1 - C(n - c, k) / C(n, k)        (1 when n - c < k)

Computed here in exact rational arithmetic (Python integers, then one rounding to float),
so it is exact for any n: no cancellation in 1 - x, no overflow of C(n, k). The eval's
pass@k is the mean over items; pass@1 is then the mean share of correct samples.

Majority vote (maj@K): the samples' extracted answers are normalised
(`tunix_rt.render.normalize_answer`: a number in lowest terms, else lower-cased text without
punctuation) and each distinct normalised answer counts its votes; samples without an
answer do not vote (the eval passes only tagged answers, eval.runner.sampled_prediction). Ties go to the answer whose first vote came earliest (the lowest sample
index), so the vote is a pure function of the samples in order. The item is right under
maj@K when the winning answer is (the representative sample, the earliest one carrying
it, is correct); an item where no sample answered is wrong.

The paired test for pass@1 (`paired_sign_test`): per shared item the difference of the two
evaluations' shares of correct samples, d_i = b_i - a_i. Under "no difference" each pair
is exchangeable, so each d_i's sign is a fair coin (the sign-flip permutation test of the
mean difference). The two-sided p-value P(|sum ±d_i| >= |sum d_i|) is computed exactly by
convolving the distribution over integer-scaled differences (d_i * K_a * K_b), not by
Monte Carlo, so the same inputs always give the same p. With one sample on each side
(greedy vs greedy) the d_i are 0 or ±1 and the test is exactly McNemar's exact test; it
uses the per-item fractions of a sampled eval rather than a thresholded majority, so it
keeps the information of all K samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

from tunix_rt.errors import BadInput
from tunix_rt.render import normalize_answer


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one item with n samples, c of them correct (0 <= c <= n, 1 <= k <= n)."""
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise BadInput(f"pass_at_k: n, c and k must be integers, got {n!r}, {c!r}, {k!r}")
    if n < 1 or not 0 <= c <= n:
        raise BadInput(f"pass_at_k: need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise BadInput(f"pass_at_k: k must be in 1..n={n}, got {k}")
    if n - c < k:
        return 1.0
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def ks_for(n_samples: int) -> list[int]:
    """The k reported for K samples: the powers of two up to K, and K itself."""
    if n_samples < 1:
        raise BadInput(f"samples must be >= 1, got {n_samples}")
    ks = [1 << i for i in range(n_samples.bit_length()) if 1 << i <= n_samples]
    return ks if ks[-1] == n_samples else ks + [n_samples]


@dataclass(frozen=True)
class Vote:
    """The outcome of one item's majority vote."""

    answer: str
    """The winning normalised answer ("" when no sample answered)."""
    votes: int
    """Its number of votes (0 when no sample answered)."""
    sample: int | None
    """The earliest sample carrying the winning answer (None when no sample answered)."""


def majority_vote(answers: Sequence[str | None]) -> Vote:
    """Vote over the samples' extracted answers in sample order; None or an answer that
    normalises to "" does not vote; ties go to the answer first seen earliest."""
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, a in enumerate(answers):
        key = normalize_answer(a) if a is not None else ""
        if key:
            counts[key] = counts.get(key, 0) + 1
            first.setdefault(key, i)
    if not counts:
        return Vote("", 0, None)
    best = min(counts, key=lambda a: (-counts[a], first[a]))
    return Vote(best, counts[best], first[best])


def paired_sign_test(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> float:
    """Two-sided exact sign-flip test of the mean per-item difference of pass rates; `a[i]`
    and `b[i]` are (correct, samples) of the same item in the two evaluations."""
    if len(a) != len(b):
        raise BadInput(f"paired_sign_test: {len(a)} items in A, {len(b)} in B")
    diffs = []
    for (ca, na), (cb, nb) in zip(a, b):
        if na < 1 or nb < 1 or not 0 <= ca <= na or not 0 <= cb <= nb:
            raise BadInput(f"paired_sign_test: bad (correct, samples) pair {(ca, na)} / {(cb, nb)}")
        diffs.append(Fraction(cb, nb) - Fraction(ca, na))
    nonzero = [d for d in diffs if d != 0]
    if not nonzero:
        return 1.0
    scale = math.lcm(*(d.denominator for d in nonzero))  # K_a * K_b at most in one pair of evals
    scaled = [int(d * scale) for d in nonzero]
    g = math.gcd(*scaled)
    return _sign_flip_tail([abs(v) // g for v in scaled], abs(sum(scaled)) // g)


def _sign_flip_tail(x: list[int], observed: int) -> float:
    """P(|sum of ±x_i| >= observed) with independent fair signs, exactly (a convolution over
    the integer sums; probabilities in float64, each step exact halving and adding)."""
    import numpy as np

    total = sum(x)
    dist = np.zeros(2 * total + 1)
    dist[total] = 1.0  # index total ↔ sum 0
    for v in x:
        nxt = np.zeros_like(dist)
        nxt[v:] += dist[: len(dist) - v]
        nxt[: len(dist) - v] += dist[v:]
        dist = nxt * 0.5
    sums = np.arange(-total, total + 1)
    return float(min(1.0, dist[np.abs(sums) >= observed].sum()))


# ---------------------------------------------------------------------------------------
# Over predictions.jsonl lines (eval.runner's module doc has the sampled line's fields)


def item_counts(line: dict) -> tuple[int, int]:
    """(correct samples, samples) of one predictions line; a line of a greedy (one-sample)
    eval counts as one sample."""
    if "n_samples" in line:
        return int(line["n_correct"]), int(line["n_samples"])
    return int(bool(line["correct"])), 1


def sampled_metrics(lines: Sequence[dict]) -> dict:
    """`pass@k` (the mean over items of pass_at_k) for k in ks_for(K), `maj@K` (the share of
    items whose line is correct: its top fields are the majority vote's sample) and
    `samples` K, over sampled lines that all hold K samples."""
    if not lines:
        return {}
    counts = [item_counts(p) for p in lines]
    k_all = {n for _, n in counts}
    if len(k_all) != 1:
        raise BadInput(f"sampled_metrics: items hold different numbers of samples {sorted(k_all)}")
    n = k_all.pop()
    out: dict = {f"pass@{k}": round(sum(pass_at_k(n, c, k) for c, _ in counts) / len(counts), 6) for k in ks_for(n)}
    out[f"maj@{n}"] = round(sum(bool(p["correct"]) for p in lines) / len(lines), 6)
    out["samples"] = n
    return out


def is_sampled_metric(name: str) -> bool:
    """`pass@K` or `maj@K` (K a positive integer)."""
    kind, sep, k = name.partition("@")
    return bool(sep) and kind in ("pass", "maj") and k.isdigit() and int(k) >= 1


def sampled_metric_names(*blocks: dict) -> list[str]:
    """The pass@k and maj@K names in any of the metrics blocks: pass@k by k, then maj@K."""
    names = {k for m in blocks for k in m if is_sampled_metric(k)}
    return sorted(names, key=lambda k: (k.startswith("maj"), int(k.partition("@")[2])))
