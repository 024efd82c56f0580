"""Per-record scorers (eval.scoring.score): numeric by default, `math` through math-verify,
`rg:<task>` through reasoning-gym's own verifier; the one dispatch that eval's correctness,
the RL reward `answer` and GRPO's accuracy share."""

from __future__ import annotations

import json
import time

import pytest
from requires import require_module

from tunix_rt.errors import BadInput
from tunix_rt.eval import scoring
from tunix_rt.eval.generate import Generation
from tunix_rt.eval.scoring import score, score_record
from tunix_rt.traces.schema import Trace


def _tagged(answer: str) -> str:
    return f"<reasoning>\nwork\n</reasoning>\n<answer>{answer}</answer>"


def _rg_record(task="basic_arithmetic", config=None) -> Trace:
    require_module("reasoning_gym")
    from tunix_rt.traces.reasoning_gym import make_items

    return Trace(**make_items(task, 1, 1, config or {})[0])


def _math_record(gold: str) -> Trace:
    require_module("math_verify")
    return Trace(id="m", question="q", steps=["s"], answer=gold, meta={"scorer": "math"})


def test_numeric_is_the_default():
    gsm = Trace(id="g", question="q", steps=["s"], answer="1234.5")
    assert scoring.scorer_of(gsm) == "numeric"
    assert score(gsm, "$1,234.50") == 1.0 and score(gsm, "1234.50") == 1.0
    assert score(gsm, "1234") == 0.0 and score(gsm, "") == 0.0
    explicit = Trace(id="n", question="q", steps=["s"], answer="3/4", meta={"scorer": "numeric"})
    assert score(explicit, "0.75") == 1.0


@pytest.mark.parametrize("gold, answer, right", [
    ("\\frac{1}{2}", "0.5", True),
    ("\\frac{1}{2}", "1/2", True),
    ("\\frac{1}{2}", "$\\frac{2}{4}$", True),
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{2}}", True),
    ("\\frac{1}{2}", "0.6", False),
    ("\\frac{1}{2}", "", False),
    ("x^2+2x+1", "(x+1)^2", True),
    ("x^2+2x+1", "(x+1)^3", False),
    ("\\sqrt{2}", "\\sqrt{2}", True),
    ("\\sqrt{2}", "1.41", False),
])
def test_math_scorer(gold, answer, right):
    rec = _math_record(gold)
    assert score(rec, answer) == (1.0 if right else 0.0)
    assert score_record(_tagged(answer), rec).correct is right


def test_rg_scorer_is_the_tasks_own():
    rec = _rg_record()
    assert rec.meta["scorer"] == "rg:basic_arithmetic"
    assert score(rec, rec.answer) == 1.0
    wrong = str(int(rec.answer) + 1)
    assert score(rec, wrong) == 0.0
    # reasoning-gym compares strings: "-4.0" earns partial credit there, not correct; the
    # numeric scorer would have counted it right
    assert 0.0 < score(rec, rec.answer + ".0") < 1.0
    assert not score_record(_tagged(rec.answer + ".0"), rec).correct
    assert score_record(_tagged(rec.answer + ".0"), rec).value == score(rec, rec.answer + ".0")
    assert score_record(_tagged(rec.answer + ".0"), Trace(**{**rec.to_record(), "steps": ["s"], "meta": {}})).correct
    s = score_record(_tagged(rec.answer), rec)
    assert s.correct and s.value == 1.0 and s.format_ok
    # only a tagged answer is correct; a fallback number counts as lenient only
    fallback = score_record(f"the result is {rec.answer}", rec)
    assert fallback.answer_source == "fallback" and not fallback.correct and fallback.correct_lenient


def test_rg_scorer_uses_the_records_config():
    """decimal_arithmetic's verifier allows an error of one unit in the config's last decimal
    place: 0.05 off is right at 1 decimal place (the record's config), wrong at 3 (the default)."""
    from decimal import Decimal

    rec = _rg_record("decimal_arithmetic", {"min_num_decimal_places": 1, "max_num_decimal_places": 1})
    near = str(Decimal(rec.answer) + Decimal("0.05"))
    assert score(rec, rec.answer) == 1.0 and score(rec, near) == 1.0
    meta = rec.to_record()["meta"]
    meta["rg"]["config"].update(min_num_decimal_places=3, max_num_decimal_places=3)
    assert score(Trace(**{**rec.to_record(), "meta": meta}), near) == 0.0


def test_unknown_scorer_and_broken_record_raise():
    with pytest.raises(BadInput, match="unknown scorer 'nope'"):
        score(Trace(id="x", question="q", steps=[], answer="1", meta={"scorer": "nope"}), "1")
    require_module("reasoning_gym")
    with pytest.raises(BadInput, match="no meta.rg.task"):
        score(Trace(id="x", question="q", steps=[], answer="1", meta={"scorer": "rg:basic_arithmetic"}), "1")


@pytest.mark.serial
def test_a_verifier_that_hangs_or_raises_scores_zero(monkeypatch):
    from tunix_rt.traces import reasoning_gym

    rec = _rg_record()
    monkeypatch.setattr(scoring, "SCORER_TIMEOUT_S", 0.2)
    monkeypatch.setattr(reasoning_gym, "score", lambda *a: time.sleep(5) or 1.0)
    t0 = time.monotonic()
    assert score(rec, rec.answer) == 0.0
    assert time.monotonic() - t0 < 2.0

    def boom(*a):
        raise ValueError("cannot parse")

    monkeypatch.setattr(reasoning_gym, "score", boom)
    assert score(rec, rec.answer) == 0.0


def test_rewards_and_eval_predictions_use_the_records_scorer():
    from tunix_rt.eval.runner import prediction
    from tunix_rt.train.rewards import answer_close_reward, answer_reward

    rec = _rg_record()
    plain = Trace(**{**rec.to_record(), "steps": ["s"], "meta": {}})  # same gold, numeric scorer
    near = _tagged(rec.answer + ".0")
    reward = answer_reward()
    assert reward(rec, _tagged(rec.answer), None, None) == 1.0
    assert reward(rec, near, None, None) == 0.0 and reward(plain, near, None, None) == 1.0
    assert answer_close_reward()(rec, _tagged(rec.answer), None, None) == 1.0

    out = Generation(ids=[1, 2], text=near, n_tokens=2, finish_reason="stop")
    assert prediction(rec, [0], out)["correct"] is False
    assert prediction(plain, [0], out)["correct"] is True
    ok = Generation(ids=[1, 2], text=_tagged(rec.answer), n_tokens=2, finish_reason="stop")
    p = prediction(rec, [0], ok)
    assert p["correct"] is True and p["category"] == "basic_arithmetic"


def test_eval_on_a_tiny_model_over_an_rg_dataset(cli, home, tiny_dirs):
    require_module("reasoning_gym")
    r = cli("data", "import", "reasoning-gym", "basic_arithmetic,leg_counting", "--n", "8", "--seed", "4",
            "--name", "mix")
    assert r.code == 0, r.err
    r = cli("eval", "--model", tiny_dirs["tiny-gemma3"], "--dataset", "mix", "--split", "test",
            "--max-new-tokens", "4", "--batch-size", "4", "--device", "cpu", "--json")
    assert r.code == 0, r.err
    summary = json.loads(r.out)
    assert summary["dataset"]["split"] == "test" and summary["dataset"]["n"] == 2
    assert set(summary["by_category"]) == {"basic_arithmetic", "leg_counting"}
    from tunix_rt.traces.dataset import load_dataset

    records = {t.id: t for t in load_dataset("mix", home).split("test")}
    preds = [json.loads(line) for line in next((home.root / "evals").iterdir()).joinpath("predictions.jsonl")
             .read_text().splitlines()]
    for p in preds:
        rec = records[p["id"]]
        assert p["correct"] == score_record(p["completion"], rec).correct
        assert p["gold"] == rec.answer
    # the constant-answer floor: the train split's most common answer on these items, per task too
    ds = load_dataset("mix", home)
    test = ds.split("test")
    floor = summary["constant_baseline"]
    assert floor == {**scoring.constant_baseline(ds.split("train"), test).to_dict(),
                     "by_category": {c: scoring.constant_baseline(
                         [x for x in ds.split("train") if x.meta["category"] == c],
                         [x for x in test if x.meta["category"] == c]).to_dict()
                         for c in ("basic_arithmetic", "leg_counting")}}
    assert floor["n"] == 2 and set(floor["by_category"]) == {"basic_arithmetic", "leg_counting"}
    r = cli("eval", "--model", tiny_dirs["tiny-gemma3"], "--dataset", "mix", "--split", "test",
            "--max-new-tokens", "4", "--batch-size", "4", "--device", "cpu", "--limit", "1")
    assert r.code == 0 and "(constant baseline)" in r.out, r.err
    r = cli("eval", "--model", tiny_dirs["tiny-gemma3"], "--dataset", "mix", "--split", "train",
            "--max-new-tokens", "2", "--batch-size", "4", "--device", "cpu", "--limit", "1", "--json")
    assert r.code == 0 and "constant_baseline" not in json.loads(r.out), r.err  # not on the train split


def test_constant_baseline_is_the_most_common_answer_scored_by_each_items_scorer():
    def t(i, answer, scorer=None):
        return Trace(id=f"r{i}", question=f"q{i}", steps=["s"], answer=answer,
                     meta={"scorer": scorer} if scorer else {})

    train = [t(0, "2"), t(1, "1"), t(2, "1"), t(3, "2"), t(4, "3")]  # 1 and 2 tie: the first seen wins
    items = [t(5, "2.0"), t(6, "2"), t(7, "1"), t(8, "$2")]  # numeric: "2" is right on 2.0 and $2
    b = scoring.constant_baseline(train, items)
    assert (b.answer, b.accuracy, b.n) == ("2", 0.75, 4)
    assert b.to_dict() == {"answer": "2", "accuracy": 0.75, "n": 4}
    assert scoring.constant_baseline([], items) is None and scoring.constant_baseline(train, []) is None
    rg = _rg_record("syllogism")
    yes = scoring.constant_baseline([t(9, rg.answer)], [rg])
    assert yes.accuracy == 1.0  # scored by the task's own verifier
    other = "No" if rg.answer == "Yes" else "Yes"
    assert scoring.constant_baseline([t(9, other)], [rg]).accuracy == 0.0
