"""The scorer over a table of tricky completions, and the metrics over a set."""

from __future__ import annotations

import pytest

from tunix_rt.eval.scoring import UNCATEGORIZED, by_category, category_of, metrics, score_completion

R = "<reasoning>\nwork\n</reasoning>\n"

# completion, gold, correct, format_ok, answer, answer_source
TABLE = [
    pytest.param(R + "<answer>42</answer>", "42", True, True, "42", "tag", id="clean"),
    pytest.param(R + "<answer>42</answer><end_of_turn>", "42", True, True, "42", "tag", id="clean-with-eot"),
    pytest.param(R + "<answer>42</answer>\n  \n", "42", True, True, "42", "tag", id="trailing-whitespace"),
    pytest.param("The answer is 42.", "42", False, False, "42", "fallback", id="missing-tags-fallback"),
    pytest.param("I do not know.", "42", False, False, "", "none", id="missing-tags-no-number"),
    pytest.param(R + "<answer>3</answer><answer>4</answer>", "3", True, False, "3", "tag", id="two-answers-first-wins"),
    pytest.param(R + "<answer>3</answer><answer>4</answer>", "4", False, False, "3", "tag", id="two-answers-second-not-taken"),
    pytest.param(R + "<answer>$1,234.50</answer>", "1234.5", True, True, "$1,234.50", "tag", id="dollars-commas"),
    pytest.param(R + "<answer>1234.50</answer>", "$1,234.5", True, True, "1234.50", "tag", id="gold-dollars"),
    pytest.param(R + "<answer>-3</answer>", "-3", True, True, "-3", "tag", id="negative"),
    pytest.param(R + "<answer>3</answer>", "-3", False, True, "3", "tag", id="sign-matters"),
    pytest.param(R + "<answer>\u22123</answer>", "-3", True, True, "\u22123", "tag", id="unicode-minus"),
    pytest.param(R + "<answer>3/4</answer>", "0.75", True, True, "3/4", "tag", id="fraction-vs-decimal"),
    pytest.param(R + "<answer>6/8</answer>", "3/4", True, True, "6/8", "tag", id="fraction-unreduced"),
    pytest.param(R + "<answer>18.0</answer>", "18", True, True, "18.0", "tag", id="trailing-zero"),
    pytest.param(R + "<answer>18 dollars</answer>", "18", True, True, "18 dollars", "tag", id="unit-suffix"),
    pytest.param(R + "<answer>19</answer>", "18", False, True, "19", "tag", id="wrong-number"),
    pytest.param(R + "<answer>Paris</answer>", "paris", True, True, "Paris", "tag", id="text-case"),
    pytest.param(R + "<answer>7</answer> because 3+4", "7", True, False, "7", "tag", id="answer-then-more-text"),
    pytest.param("<answer>5</answer>", "5", True, False, "5", "tag", id="answer-without-reasoning"),
    pytest.param(R + "<answer></answer>", "5", False, False, "", "none", id="empty-answer"),
    pytest.param("<reasoning>5 apples</reasoning>\n<answer> </answer>", "5", False, False, "5", "fallback", id="blank-answer-fallback"),
    pytest.param("<reasoning>2+3=5</reasoning>\n<answer>5", "5", False, False, "5", "fallback", id="truncated-answer"),
    pytest.param("<reasoning>a <reasoning>b</reasoning></reasoning>\n<answer>5</answer>", "5", True, False, "5", "tag", id="nested-reasoning"),
    pytest.param(R + "<answer><answer>5</answer></answer>", "5", False, False, "<answer>5", "tag", id="nested-answer"),
    pytest.param("<answer>5</answer>" + R, "5", True, False, "5", "tag", id="answer-before-reasoning"),
    pytest.param("The total is \u221212 dollars", "-12", False, False, "\u221212", "fallback", id="fallback-unicode-minus"),
]


@pytest.mark.parametrize("text, gold, correct, format_ok, answer, source", TABLE)
def test_score_table(text, gold, correct, format_ok, answer, source):
    s = score_completion(text, gold)
    assert (s.correct, s.format_ok, s.answer, s.answer_source) == (correct, format_ok, answer, source)
    # a fallback answer is never "correct" and never format_ok; lenient accuracy may count it
    if source != "tag":
        assert not s.correct and not s.format_ok


def test_fallback_counts_for_lenient_only():
    s = score_completion("so the answer is 42", "42")
    assert s.answer_source == "fallback" and s.correct_lenient and not s.correct


def test_reasoning_extracted_or_empty():
    assert score_completion(R + "<answer>1</answer>", "1").reasoning == "work"
    assert score_completion("<answer>1</answer>", "1").reasoning == ""


def _pred(correct, fmt, source, n_tokens, finish, category="a", lenient=None):
    return {"correct": correct, "format_ok": fmt, "answer_source": source, "n_tokens": n_tokens,
            "finish_reason": finish, "category": category,
            "correct_lenient": correct if lenient is None else lenient}


def test_metrics_by_hand():
    preds = [
        _pred(True, True, "tag", 10, "stop"),
        _pred(False, False, "fallback", 20, "length", lenient=True),
        _pred(False, False, "none", 30, "length", category="b"),
        _pred(False, True, "tag", 40, "stop", category="b"),
    ]
    m = metrics(preds)
    assert m.n == 4
    assert m.accuracy == 0.25
    assert m.format_rate == 0.5
    assert m.answer_found_rate == 0.75
    assert (m.answer_tag_rate, m.answer_fallback_rate) == (0.5, 0.25)
    assert m.lenient_accuracy == 0.5
    assert m.mean_completion_tokens == 25.0
    assert m.truncated_rate == 0.5
    cats = by_category(preds)
    assert list(cats) == ["a", "b"]
    assert cats["a"]["accuracy"] == 0.5 and cats["b"]["accuracy"] == 0.0 and cats["b"]["n"] == 2


def test_arith_metrics_pool_the_claims_and_average_the_reward():
    """arith_accuracy: claims that hold over all claims; arith_reward: the RL reward's mean
    (0 for an item without claims); the prediction line counts them from its reasoning."""
    from tunix_rt.eval.runner import prediction
    from tunix_rt.eval.generate import Generation
    from tunix_rt.traces.schema import Trace

    rec = Trace(id="q1", question="?", steps=["6*24 = 144"], answer="16")
    text = "<reasoning>6*24 = 144 and 144-128 = 26, so 2+2 = 4</reasoning><answer>16</answer>"
    line = prediction(rec, [1, 2], Generation(ids=[], text=text, n_tokens=9, finish_reason="stop"))
    assert (line["arith_claims"], line["arith_true"]) == (3, 2)
    preds = [_pred(True, True, "tag", 10, "stop") | {"arith_claims": 3, "arith_true": 2},
             _pred(True, True, "tag", 10, "stop") | {"arith_claims": 1, "arith_true": 1},
             _pred(True, True, "tag", 10, "stop") | {"arith_claims": 0, "arith_true": 0}]
    m = metrics(preds)
    assert m.arith_accuracy == 0.75
    assert m.arith_reward == round((2 / 3 + 1) / 3, 6)
    assert m.arith_claims_per_item == round(4 / 3, 3)
    none = metrics([_pred(True, True, "tag", 10, "stop") | {"arith_claims": 0, "arith_true": 0}])
    assert (none.arith_accuracy, none.arith_claims_per_item) == (0.0, 0.0)  # no claims, and it says so


def test_metrics_empty_is_zero_not_error():
    assert metrics([]).n == 0 and metrics([]).accuracy == 0.0


def test_category_of():
    assert category_of({"category": "geometry"}) == "geometry"
    assert category_of({}) == UNCATEGORIZED
    assert category_of({"category": ""}) == UNCATEGORIZED
