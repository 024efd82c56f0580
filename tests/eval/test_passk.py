"""pass@k, majority vote and the paired sign-flip test against brute force: every k-subset
of the samples, every sign assignment."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from tunix_rt.errors import BadInput
from tunix_rt.eval.compare import mcnemar_exact
from tunix_rt.eval.passk import ks_for, majority_vote, paired_sign_test, pass_at_k
from tunix_rt.render import normalize_answer


def brute_pass_at_k(correct: list[bool], k: int) -> float:
    """The share of the k-subsets of the samples holding at least one correct sample."""
    subsets = list(itertools.combinations(range(len(correct)), k))
    return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_enumeration_over_all_k_subsets(n):
    for c in range(n + 1):
        correct = [True] * c + [False] * (n - c)
        random.Random(n * 31 + c).shuffle(correct)  # which samples are right does not matter
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(correct, k), abs=1e-15), (n, c, k)


def test_pass_at_1_is_the_share_correct_and_large_n_stays_exact():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3, abs=1e-16)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 3, 3) == 1.0  # n - c < k: always one right
    # n = 2000, one right sample: pass@k = k/n exactly; C(2000, 1000) overflows a float
    assert pass_at_k(2000, 1, 1000) == 0.5
    assert pass_at_k(2000, 1999, 1) == pytest.approx(0.9995, abs=1e-16)
    # the naive float product 1 - prod(1 - k/i) loses digits where the answer is tiny
    assert pass_at_k(10**6, 1, 1) == 1e-6


@pytest.mark.parametrize("args", [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5), (4.0, 2, 1)])
def test_pass_at_k_refuses_impossible_counts(args):
    with pytest.raises(BadInput, match="pass_at_k"):
        pass_at_k(*args)


def test_ks_are_powers_of_two_and_k():
    assert ks_for(1) == [1]
    assert ks_for(4) == [1, 2, 4]
    assert ks_for(6) == [1, 2, 4, 6]
    assert ks_for(8) == [1, 2, 4, 8]
    assert ks_for(10) == [1, 2, 4, 8, 10]


def brute_vote(answers):
    """Most votes; among the tied, the one whose first vote is earliest."""
    keys = [normalize_answer(a) if a is not None else "" for a in answers]
    votes = Counter(k for k in keys if k)
    if not votes:
        return "", 0, None
    top = max(votes.values())
    winner = next(k for k in keys if votes.get(k) == top)
    return winner, top, keys.index(winner)


def test_majority_vote_equals_enumeration_over_all_answer_sequences():
    pool = ["18", "18.0", "$18", "7", "seven", None, ""]
    for n in range(1, 5):
        for answers in itertools.product(pool, repeat=n):
            v = majority_vote(answers)
            assert (v.answer, v.votes, v.sample) == brute_vote(answers), answers


def test_majority_vote_normalises_and_breaks_ties_by_the_earliest_sample():
    v = majority_vote(["7", "$1,234.50", "1234.5", "7.0", "x"])
    assert (v.answer, v.votes, v.sample) == ("7", 2, 0)  # 7 and 1234.5 tie at 2: 7 came first
    v = majority_vote([None, "9", "1234.50", "$1,234.5"])
    assert (v.answer, v.votes, v.sample) == ("2469/2", 2, 2)
    assert majority_vote([None, "", "  "]).sample is None


def brute_sign_test(a, b) -> float:
    """Enumerate every assignment of swapped/not swapped to the pairs."""
    d = [cb / nb - ca / na for (ca, na), (cb, nb) in zip(a, b)]
    obs = abs(sum(d))
    hits = sum(abs(sum(s * x for s, x in zip(signs, d))) >= obs - 1e-12
               for signs in itertools.product((1, -1), repeat=len(d)))
    return hits / 2 ** len(d)


def test_paired_sign_test_equals_enumeration_of_all_sign_flips():
    rng = random.Random(7)
    for trial in range(60):
        m = rng.randint(1, 9)
        ka, kb = rng.choice([1, 2, 4, 8]), rng.choice([1, 3, 4])
        a = [(rng.randint(0, ka), ka) for _ in range(m)]
        b = [(rng.randint(0, kb), kb) for _ in range(m)]
        assert paired_sign_test(a, b) == pytest.approx(brute_sign_test(a, b), abs=1e-12), (a, b)


def test_paired_sign_test_with_one_sample_each_is_mcnemar():
    for b_count, c_count, same in [(0, 0, 5), (3, 0, 2), (2, 7, 10), (5, 5, 0), (1, 12, 3)]:
        a = [(1, 1)] * b_count + [(0, 1)] * c_count + [(1, 1)] * same
        b = [(0, 1)] * b_count + [(1, 1)] * c_count + [(1, 1)] * same
        assert paired_sign_test(a, b) == pytest.approx(mcnemar_exact(b_count, c_count), abs=1e-12)


def test_paired_sign_test_sees_a_consistent_shift_and_refuses_bad_pairs():
    a = [(1, 8)] * 12
    b = [(5, 8)] * 12
    assert paired_sign_test(a, b) == pytest.approx(2 / 2**12)
    assert paired_sign_test(a, a) == 1.0
    with pytest.raises(BadInput):
        paired_sign_test([(1, 4)], [])
    with pytest.raises(BadInput):
        paired_sign_test([(5, 4)], [(1, 4)])
