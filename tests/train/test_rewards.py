"""Rewards: the built-ins against eval's own rules, the arithmetic checker on real GSM8K
reasoning, the weighted set from a config, and failures that name the reward and record."""

from __future__ import annotations

import json
import random
import re
import textwrap
from fractions import Fraction
from importlib import resources

import numpy as np
import pytest

from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.eval.scoring import score_completion
from tunix_rt.render import parse_completion
from tunix_rt.traces.schema import Trace
from tunix_rt.train import rewards
from tunix_rt.train.arith import find_claims
from tunix_rt.train.rewards import RewardSet, RewardSpec, register_reward


def trace(answer: str = "18", id: str = "gsm8k-train-00017") -> Trace:
    return Trace(id=id, question="q?", steps=["s"], answer=answer)


def completion(reasoning: str, answer: str) -> str:
    return f"<reasoning>\n{reasoning}\n</reasoning>\n<answer>{answer}</answer>"


def score_one(config: dict, record: Trace, text: str) -> dict[str, float]:
    total, parts = RewardSet.from_config(config).score([record], [text])
    return {"total": float(total[0]), **{k: float(v[0]) for k, v in parts.items()}}


# --- format and answer: exactly eval's format_ok and correct ----------------------------

R = "<reasoning>\nwork\n</reasoning>\n"
EVAL_CASES = [
    (R + "<answer>42</answer>", "42"),
    (R + "<answer>42</answer><end_of_turn>", "42"),
    (R + "<answer>$1,234.50</answer>", "1234.5"),
    (R + "<answer>3/4</answer>", "0.75"),
    (R + "<answer>\u22123</answer>", "-3"),
    (R + "<answer>19</answer>", "18"),
    (R + "<answer>Paris</answer>", "paris"),
    ("The answer is 42.", "42"),
    (R + "<answer>3</answer><answer>4</answer>", "3"),
    (R + "<answer>7</answer> because 3+4", "7"),
    ("<answer>5</answer>", "5"),
    (R + "<answer></answer>", "5"),
    ("<reasoning>5 apples</reasoning>\n<answer> </answer>", "5"),
    ("<reasoning>2+3=5</reasoning>\n<answer>5", "5"),
    ("<reasoning>a <reasoning>b</reasoning></reasoning>\n<answer>5</answer>", "5"),
    (R + "<answer><answer>5</answer></answer>", "5"),
    ("<answer>5</answer>" + R, "5"),
]


def test_format_and_answer_are_evals_format_ok_and_correct():
    records = [trace(gold, id=f"r{i}") for i, (_, gold) in enumerate(EVAL_CASES)]
    texts = [text for text, _ in EVAL_CASES]
    total, parts = RewardSet.from_config({"format": 0.5, "answer": 1.0}).score(records, texts)
    scores = [score_completion(text, gold) for text, gold in EVAL_CASES]
    assert parts["format"].tolist() == [float(s.format_ok) for s in scores]
    assert parts["answer"].tolist() == [float(s.correct) for s in scores]
    assert 0 < sum(s.correct for s in scores) < len(scores)  # the table has both outcomes
    assert 0 < sum(s.format_ok for s in scores) < len(scores)
    np.testing.assert_array_equal(total, 0.5 * parts["format"] + parts["answer"])


# --- answer_close -------------------------------------------------------------------------

@pytest.mark.parametrize("pred,gold,rel_tol,expected", [
    ("18", "18", 0.1, 1.0),
    ("$18.00", "18", 0.1, 1.0),
    ("100", "99", 0.1, 1.0 - (1 / 99) / 0.1),
    ("105", "100", 0.1, 0.5),
    ("95", "100", 0.1, 0.5),
    ("110", "100", 0.1, 0.0),
    ("150", "100", 0.1, 0.0),
    ("105", "100", 0.2, 0.75),
    ("-105", "-100", 0.1, 0.5),
    ("0.1", "0", 0.1, 0.0),
    ("0", "0", 0.1, 1.0),
    ("paris", "Paris", 0.1, 1.0),
    ("london", "Paris", 0.1, 0.0),
    ("18 dollars", "18", 0.1, 1.0),
    ("18 apples", "18", 0.1, 0.0),  # not a number to eval either (no such unit)
    ("eighteen", "18", 0.1, 0.0),
])
def test_answer_close_decays_linearly_to_rel_tol(pred, gold, rel_tol, expected):
    got = score_one({"answer_close": {"rel_tol": rel_tol}}, trace(gold), completion("w", pred))
    assert got["answer_close"] == pytest.approx(expected, abs=1e-12)


def test_answer_close_needs_the_tagged_answer():
    """Like `answer`: a number outside <answer> earns nothing, however close."""
    assert score_one({"answer_close": 1.0}, trace("100"), "the answer is 100")["answer_close"] == 0.0
    assert score_one({"answer_close": 1.0}, trace("100"), "<answer>101</answer>")["answer_close"] == pytest.approx(0.9)


# --- arith: the checker ---------------------------------------------------------------------

# (text, [(claim text, holds)]): real GSM8K reasoning lines (row index in the vendored
# train.jsonl), then the constructs the brief lists, then things that are not claims.
CLAIMS = [
    pytest.param("Natalia sold 48/2 = 24 clips in May.", [("48/2 = 24", True)], id="gsm8k-0-division"),
    pytest.param("Weng earns 12/60 = $0.2 per minute.", [("12/60 = $0.2", True)], id="gsm8k-1-dollar-decimal"),
    pytest.param("Working 50 minutes, she earned 0.2 x 50 = $10.", [("0.2 x 50 = $10", True)], id="gsm8k-1-x-times"),
    pytest.param("This means, Betty needs 100 - 50 - 30 - 15 = $5 more.", [("100 - 50 - 30 - 15 = $5", True)], id="gsm8k-2-chain"),
    pytest.param("So he makes 4500*5=$22,500", [("4500*5=$22,500", True)], id="gsm8k-15-thousands"),
    pytest.param("He makes 22,500*20=$450,000", [("22,500*20=$450,000", True)], id="gsm8k-15-thousands-lhs"),
    pytest.param("Bill and Dale eat 2 x 4 x 50% = 4 pieces.", [("2 x 4 x 50% = 4", True)], id="gsm8k-30-percent"),
    pytest.param("Coursework materials are thus $1000-($150+$300+$250) = $300", [("$1000-($150+$300+$250) = $300", True)], id="gsm8k-44-parentheses"),
    pytest.param("she makes $18/hour so her overtime pay is 18*.5 = $9.00", [("18*.5 = $9.00", True)], id="gsm8k-9-leading-point"),
    pytest.param("for a total of 1/2+1/2 = 1 cup per day", [("1/2+1/2 = 1", True)], id="gsm8k-90-halves"),
    pytest.param("so she needs 1/4+1/4 = 1/2 cup of lime juice", [("1/4+1/4 = 1/2", True)], id="gsm8k-904-fraction-result"),
    pytest.param("so the birds eat 2 - 1/2 = 1 1/2 cups of birdseed.", [("2 - 1/2 = 1 1/2", True)], id="gsm8k-802-mixed-number"),
    pytest.param("so he used 25 / 1/3 = 75 total decorations", [("25 / 1/3 = 75", True)], id="glued-fraction-binds-tighter"),
    pytest.param("Margaret has 100 * 0.75 = $0.75.", [("100 * 0.75 = $0.75", False)], id="gsm8k-false-claim"),
    pytest.param("6*24 = 144 and 144-128 = 16", [("6*24 = 144", True), ("144-128 = 16", True)], id="two-claims-one-line"),
    pytest.param("6*24 = 144 and 144-128 = 17", [("6*24 = 144", True), ("144-128 = 17", False)], id="two-claims-one-false"),
    pytest.param("3 * 4 + 2 = 14", [("3 * 4 + 2 = 14", True)], id="precedence"),
    pytest.param("3 * 4 + 2 = 18", [("3 * 4 + 2 = 18", False)], id="precedence-left-to-right-is-wrong"),
    pytest.param("(3 + 4) * 2 = 14", [("(3 + 4) * 2 = 14", True)], id="parentheses"),
    pytest.param("2*3 = 6*2 = 12", [("2*3 = 6*2", True), ("6*2 = 12", True)], id="running-chain"),
    pytest.param("3 \u00d7 4 \u00f7 2 = 6", [("3 \u00d7 4 \u00f7 2 = 6", True)], id="unicode-times-divide"),
    pytest.param("5 \u2212 8 = \u22123", [("5 \u2212 8 = \u22123", True)], id="unicode-minus"),
    pytest.param("-3 + 5 = 2", [("-3 + 5 = 2", True)], id="unary-minus"),
    pytest.param("5 * -2 = -10", [("5 * -2 = -10", True)], id="unary-after-operator"),
    pytest.param("- 3 + 5 = 8", [("3 + 5 = 8", True)], id="bullet-dash-is-not-a-sign"),
    pytest.param("**3 + 5 = 8**", [("3 + 5 = 8", True)], id="markdown-bold"),
    pytest.param("25/100 * 80 = 20%", [("25/100 * 80 = 20%", True)], id="percent-as-number"),
    pytest.param("25% * 80 = 20", [("25% * 80 = 20", True)], id="percent-as-fraction"),
    pytest.param("25% * 80 = 30", [("25% * 80 = 30", False)], id="percent-false"),
    pytest.param("10/3 = 3.33", [("10/3 = 3.33", True)], id="rounded-to-written-digits"),
    pytest.param("10/3 = 3.3", [("10/3 = 3.3", True)], id="rounded-one-digit"),
    pytest.param("10/3 = 3.34", [("10/3 = 3.34", False)], id="misrounded"),
    pytest.param("7/2 = 3", [("7/2 = 3", False)], id="integer-result-is-exact"),
    pytest.param("5 / 0 = 0", [("5 / 0 = 0", False)], id="division-by-zero-is-false"),
    pytest.param("46*7 = 322kg", [("46*7 = 322", True)], id="unit-glued-to-result"),
    pytest.param("1 + 5 = 6th floor", [("1 + 5 = 6", True)], id="ordinal"),
    # not claims: none of these may count, true or false
    pytest.param("He feeds them 1/2 cup in the morning", [], id="half-cup"),
    pytest.param("1/2 cup = 8 tablespoons", [], id="unit-conversion"),
    pytest.param("She picks 3-4 apples a day", [], id="range-without-equals"),
    pytest.param("pages 3-7 = 5 pages", [], id="range-with-equals"),
    pytest.param("from 1990-1995 = 5 years", [], id="year-range"),
    pytest.param("On 12/25/2020 she left at 10:30.", [], id="date-and-time"),
    pytest.param("From 8:00 to 11:00, Mckenna spends 11:00-8:00 = 3 hours at work", [], id="gsm8k-243-clock-times"),
    pytest.param("10:30 + 2 = 12:30", [], id="time-arithmetic"),
    pytest.param("0900-0130 = 0730 hours", [], id="military-time"),
    pytest.param("Let x = 5 and Total = 18", [], id="assignments"),
    pytest.param("2x + 3 = 7", [], id="algebra"),
    pytest.param("2 * 2S = 4S people", [], id="gsm8k-variable"),
    pytest.param("100/5 = 5A/5 or 20 = A", [], id="gsm8k-algebra-result"),
    pytest.param("2 liters * 20% = .4 liters", [], id="gsm8k-26-word-operand"),
    pytest.param("21 consonants * 1/7 = 3 consonants", [], id="word-operand-before-operator"),
    pytest.param("3*30 = 30 + M trees", [], id="result-goes-on-in-words"),
    pytest.param("version 1.2.3 = 4", [], id="version-number"),
    pytest.param("12 = 12", [], id="no-operator"),
    pytest.param("a <= 3 + 4 and 3 + 4 => 7", [], id="not-equality-signs"),
    pytest.param("", [], id="empty"),
]


@pytest.mark.parametrize("text,expected", CLAIMS)
def test_arith_claims(text, expected):
    assert [(c.text, c.holds) for c in find_claims(text)] == expected


def _gsm8k_notes() -> list[str]:
    """Every calculator note `<<lhs=c>>` of the vendored GSM8K train split."""
    path = resources.files("tunix_rt") / "assets" / "gsm8k" / "train.jsonl"
    notes = []
    for line in path.read_text(encoding="utf-8").splitlines():
        notes += re.findall(r"<<(.*?)>>", json.loads(line)["answer"])
    return notes


_BINARY = re.compile(r"[\d)%]\s*[-+*/x]\s*[-\d.($]")


@pytest.fixture(scope="module")
def gsm8k_claims() -> list[str]:
    """The notes that are claims (a binary operator on the left): 23,356 of 23,716; the
    rest copy a number (`<<12=12>>`) or use `//`."""
    notes = [n for n in _gsm8k_notes() if "=" in n and _BINARY.search(n.rsplit("=", 1)[0])]
    assert len(notes) > 20_000
    return notes


def test_arith_accepts_gsm8k_calculator_notes(gsm8k_claims):
    """Each note is one claim and (nearly) all hold: measured 23,356 / 23,356."""
    found = [find_claims(n) for n in gsm8k_claims]
    assert sum(len(c) == 1 for c in found) / len(found) >= 0.99
    accepted = sum(len(c) == 1 and c[0].holds for c in found)
    assert accepted / len(found) >= 0.99, [n for n, c in zip(gsm8k_claims, found) if not (c and c[0].holds)][:20]


def _corrupt(note: str, i: int) -> str:
    """The note with its result changed: +1, -1, or 3 units in its last written decimal
    (beyond the rounding a written result may carry)."""
    lhs, c = note.rsplit("=", 1)
    decimals = len(c.split(".")[1]) if "." in c else 0
    step = [Fraction(1), Fraction(-1), Fraction(3, 10 ** decimals)][i % 3]
    wrong = Fraction(c.strip()) + step
    text = str(int(wrong)) if decimals == 0 else f"{float(wrong):.{decimals}f}"
    return f"{lhs}={text}"


def test_arith_rejects_corrupted_gsm8k_notes(gsm8k_claims):
    corrupted = [_corrupt(n, i) for i, n in enumerate(gsm8k_claims)]
    found = [find_claims(n) for n in corrupted]
    assert all(len(c) == 1 and not c[0].holds for c in found), \
        [n for n, c in zip(corrupted, found) if not (len(c) == 1 and not c[0].holds)][:20]


def test_arith_never_raises():
    """Model output is arbitrary text: the checker must be total (it runs inside a reward,
    where an exception stops the run)."""
    rng = random.Random(0)
    alphabet = list("0123456789+-*/x=().,$% :") + ["\u2212", "\u00d7", "\u00f7", "abc", "1/2", "((((", "))))"]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        for claim in find_claims(text):
            assert isinstance(claim.holds, bool)
    assert find_claims("(" * 5000 + "1+1" + ")" * 5000 + "=2") == []  # too deep: not a claim, no RecursionError


# --- arith: the reward ------------------------------------------------------------------------

@pytest.mark.parametrize("text,params,expected", [
    (completion("48/2 = 24\n48+24 = 72", "72"), {}, 1.0),
    (completion("48/2 = 24\n48+24 = 73", "73"), {}, 0.5),
    (completion("48/2 = 25\n48+25 = 72", "72"), {}, 0.0),
    (completion("She sold half as many in May.", "72"), {}, 0.0),
    (completion("She sold half as many in May.", "72"), {"none_value": 1}, 1.0),
    ("<answer>72</answer> 48/2 = 24", {}, 0.0),  # no reasoning tag: claims outside it do not count
])
def test_arith_reward_is_the_share_of_true_claims(text, params, expected):
    got = score_one({"arith": {"weight": 1.0, **params}}, trace("72"), text)
    assert got["arith"] == expected


# --- length -----------------------------------------------------------------------------------

@pytest.mark.parametrize("n_chars,mode,expected", [
    (100, "linear", 0.0), (101, "linear", -0.01), (150, "linear", -0.5), (200, "linear", -1.0),
    (900, "linear", -1.0), (100, "step", 0.0), (101, "step", -1.0),
])
def test_length_penalty(n_chars, mode, expected):
    got = score_one({"length": {"budget": 100, "mode": mode}}, trace(), "a" * n_chars + "<end_of_turn>")
    assert got["length"] == pytest.approx(expected)


# --- the weighted set from a config ---------------------------------------------------------

USER_MODULE = textwrap.dedent('''
    calls = []

    def reward(record, completion, reasoning, answer):
        calls.append((record.id, completion, reasoning, answer))
        return 0.25

    def divide(record, completion, reasoning, answer):
        return 1 / 0 if record.id == "gsm8k-train-00017" else 1.0

    def nan(record, completion, reasoning, answer):
        return float("nan") if record.id == "gsm8k-train-00017" else 1.0

    def text(record, completion, reasoning, answer):
        return "1.0" if record.id == "gsm8k-train-00017" else 1.0

    def none(record, completion, reasoning, answer):
        return None if record.id == "gsm8k-train-00017" else 1.0

    def yes(record, completion, reasoning, answer):
        return answer == record.answer

    NOT_CALLABLE = 3
''')


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    import sys

    sys.modules.pop("my_rewards", None)
    yield importlib.import_module("my_rewards")
    sys.modules.pop("my_rewards", None)


def test_config_example_scores_every_part_and_weights_the_total(user_module):
    config = {"format": 0.5, "answer": 1.0, "arith": {"weight": 0.5, "none_value": 0},
              "my_rewards:reward": 2.0, "length": {"weight": 0.1, "budget": 40}}
    good = completion("48/2 = 24\n48+24 = 72", "72")
    bad = "<reasoning>48/2 = 25</reasoning>"
    records = [trace("72", "a"), trace("72", "b")]
    total, parts = RewardSet.from_config(config).score(records, [good, bad])
    assert list(parts) == ["format", "answer", "arith", "my_rewards:reward", "length"]
    assert parts["format"].tolist() == [1.0, 0.0]
    assert parts["answer"].tolist() == [1.0, 0.0]
    assert parts["arith"].tolist() == [1.0, 0.0]
    assert parts["my_rewards:reward"].tolist() == [0.25, 0.25]
    assert parts["length"].tolist() == [pytest.approx(-(len(good) - 40) / 40), 0.0]
    expected = sum(w * parts[n] for n, w in [("format", 0.5), ("answer", 1.0), ("arith", 0.5),
                                             ("my_rewards:reward", 2.0), ("length", 0.1)])
    np.testing.assert_allclose(total, expected, rtol=0, atol=1e-15)
    # every reward got the completion parsed once, as parse_completion parses it
    assert user_module.calls == [(r.id, t, *parse_completion(t)[:2]) for r, t in zip(records, [good, bad])]


def test_spec_round_trips_through_its_mapping():
    config = {"format": 0.5, "arith": {"weight": 0.5, "none_value": 1}, "answer_close": {"rel_tol": 0.2}}
    spec = RewardSpec.from_mapping(config)
    assert spec.to_mapping() == {"format": 0.5, "arith": {"weight": 0.5, "none_value": 1},
                                 "answer_close": {"weight": 1.0, "rel_tol": 0.2}}
    assert RewardSpec.from_mapping(spec.to_mapping()) == spec


@pytest.mark.parametrize("config,message", [
    ({}, "non-empty mapping"),
    (["format"], "non-empty mapping"),
    ({"formats": 1.0}, "unknown reward 'formats'; known: answer, answer_close, arith, format, judge, length, tool_error, or module:function"),
    ({"format": "high"}, "weight must be a finite number"),
    ({"format": True}, "weight must be a finite number"),
    ({"format": float("nan")}, "weight must be a finite number"),
    ({"arith": {"weight": 1, "none": 0}}, "reward 'arith': got an unexpected keyword argument 'none'"),
    ({"length": 1.0}, "reward 'length': missing a required argument: 'budget'"),
    ({"format": {"weight": 1, "strict": True}}, "reward 'format': got an unexpected keyword argument 'strict'"),
    ({"my_rewards:reward": {"weight": 1, "x": 2}}, "a module:function reward takes no parameters"),
])
def test_spec_rejects_bad_entries(config, message):
    with pytest.raises(BadInput, match=re.escape(message)):
        RewardSpec.from_mapping(config)


@pytest.mark.parametrize("config,message", [
    ({"arith": {"none_value": 2}}, "none_value must be a number in [0, 1]"),
    ({"answer_close": {"rel_tol": 0}}, "rel_tol must be a number > 0"),
    ({"length": {"budget": 0}}, "budget must be an integer >= 1"),
    ({"length": {"budget": 10, "mode": "cliff"}}, "mode must be one of linear|step"),
    ({"no_such_module_xyz:fn": 1}, "reward 'no_such_module_xyz:fn': cannot import module 'no_such_module_xyz'"),
    ({"my_rewards:missing": 1}, "module 'my_rewards' has no attribute 'missing'"),
    ({"my_rewards:NOT_CALLABLE": 1}, "'NOT_CALLABLE' is a int, not a function"),
    ({"my_rewards:": 1}, "expected module:function"),
])
def test_build_rejects_bad_parameters_and_user_rewards(user_module, config, message):
    with pytest.raises(BadInput, match=re.escape(message)):
        RewardSet.from_config(config)


@pytest.mark.parametrize("fn,message", [
    ("divide", "reward 'my_rewards:divide' on record gsm8k-train-00017: ZeroDivisionError: division by zero"),
    ("nan", "reward 'my_rewards:nan' on record gsm8k-train-00017: returned nan (float), not a finite number"),
    ("text", "reward 'my_rewards:text' on record gsm8k-train-00017: returned '1.0' (str), not a finite number"),
    ("none", "reward 'my_rewards:none' on record gsm8k-train-00017: returned None (NoneType), not a finite number"),
])
def test_a_failing_reward_stops_the_run_naming_reward_and_record(user_module, fn, message):
    rs = RewardSet.from_config({"format": 1.0, f"my_rewards:{fn}": 1.0})
    with pytest.raises(TunixRtError, match=re.escape(message)) as info:
        rs.score([trace("1", "ok"), trace()], [completion("w", "1"), completion("w", "1")])
    assert not isinstance(info.value, BadInput)  # exit 1: the run failed, the config was fine


def test_bool_and_numpy_scalars_are_numbers(user_module):
    rs = RewardSet.from_config({"my_rewards:yes": 1.0})
    _, parts = rs.score([trace("1"), trace("2")], [completion("w", "1"), completion("w", "1")])
    assert parts["my_rewards:yes"].tolist() == [1.0, 0.0]


def test_registered_factory_with_parameters(monkeypatch):
    """The registration point the judge reward uses."""
    monkeypatch.setattr(rewards, "_REGISTRY", dict(rewards._REGISTRY))

    def make_contains(word: str, bonus: float = 1.0):
        def contains(record, completion, reasoning, answer):
            return bonus if word in (reasoning or "") else 0.0
        return contains

    register_reward("contains", make_contains)
    assert "contains" in rewards.reward_names()
    rs = RewardSet.from_config({"contains": {"weight": 2.0, "word": "half", "bonus": 0.5}})
    total, parts = rs.score([trace(), trace()], [completion("half of 48", "24"), completion("48/2", "24")])
    assert parts["contains"].tolist() == [0.5, 0.0] and total.tolist() == [1.0, 0.0]
    with pytest.raises(BadInput, match="missing a required argument: 'word'"):
        RewardSpec.from_mapping({"contains": 1.0})
    with pytest.raises(BadInput, match="already registered"):
        register_reward("contains", make_contains)
    with pytest.raises(BadInput, match="without ':'"):
        register_reward("a:b", make_contains)


def test_score_checks_lengths():
    with pytest.raises(ValueError, match="2 records for 1 completions"):
        RewardSet.from_config({"format": 1}).score([trace(), trace()], ["x"])


def test_modules_import_neither_torch_nor_jax():
    """Both engines share these modules: they must load where only one engine is installed."""
    import subprocess
    import sys

    code = ("import sys; import tunix_rt.train.rewards, tunix_rt.train.advantages, tunix_rt.train.rl_objective; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'jax', 'flax', 'transformers'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- the time limit of a reward call (reward_timeout_s) ------------------------------------


@pytest.fixture
def released():
    """Set at the end of the test: the calls a timeout abandoned return then, not 60 s later."""
    import threading

    done = threading.Event()
    yield done
    done.set()


@pytest.mark.serial
def test_a_reward_past_its_time_limit_fails_naming_the_reward_and_record(released):
    import time

    def naps(record, completion, reasoning, answer):  # sleeps 60 s, unless the test is over
        released.wait(60)
        return 1.0

    def spins(record, completion, reasoning, answer):  # a pure-Python loop that never returns
        while not released.is_set():
            pass
        return 1.0

    for name, fn in (("naps", naps), ("spins", spins)):
        rs = RewardSet([("format", 1.0, rewards.format_reward()), (name, 1.0, fn)], timeout_s=0.5)
        t0 = time.monotonic()
        with pytest.raises(TunixRtError, match=rf"reward '{name}' on record t7: no result within "
                                               r"reward_timeout_s=0.5 s") as info:
            rs.score([trace(id="t7")], [completion("w", "18")])
        assert time.monotonic() - t0 < 10, name  # bounded: not the 60 s the call would take
        assert not isinstance(info.value, BadInput)  # exit 1: the run failed, the config was fine


@pytest.mark.serial
def test_after_a_timeout_the_next_call_gets_a_fresh_worker(released):
    def slow_once(record, completion, reasoning, answer):
        if completion == "slow":
            released.wait(60)
        return float(len(completion))

    rs = RewardSet([("n", 1.0, slow_once)], timeout_s=0.3)
    with pytest.raises(TunixRtError, match="reward 'n' on record r: no result within"):
        rs.score([trace(id="r")], ["slow"])
    total, _ = rs.score([trace(id="r")], ["abc"])  # not the stuck call's late answer
    assert total.tolist() == [3.0]


def test_the_time_limit_is_a_positive_number_and_the_worker_a_daemon_that_ends():
    import threading

    for bad in (0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(BadInput, match="timeout_s must be a number > 0"):
            RewardSet([("format", 1.0, rewards.format_reward())], timeout_s=bad)
    seen = []

    def where(record, completion, reasoning, answer):
        seen.append(threading.current_thread())
        return 1.0

    RewardSet([("where", 1.0, where)], timeout_s=2.0).score([trace(), trace()], ["x", "y"])
    (thread,) = set(seen)  # one worker for the batch
    assert thread is not threading.main_thread() and thread.daemon  # a stuck call never holds the process
    thread.join(timeout=10)
    assert not thread.is_alive()  # and it ends once the batch is scored: no thread left per run
