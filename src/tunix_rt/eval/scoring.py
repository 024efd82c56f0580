"""Scoring: one completion against its gold answer, and the metrics over a set.

Definitions (the ones eval_summary.json reports):
- `correct`: the answer inside <answer>…</answer> is right by the record's scorer (below).
  Only a tagged answer can be correct: the headline accuracy rewards the format it was
  trained for.
- `format_ok`: exactly one <reasoning>…</reasoning> followed by exactly one non-empty
  <answer>…</answer>, nothing after but whitespace (and <end_of_turn>).
- `answer_source`: "tag" when a non-empty <answer> was found, else "fallback" when the
  completion holds a number (the last one is taken), else "none". A fallback answer counts
  for answer_found_rate and lenient_accuracy, never for format_rate or accuracy.
- `truncated`: generation hit max_new_tokens (finish_reason "length").

Scorers: a record names its verifier in `meta.scorer`; `score(record, answer)` is the one
dispatch (eval's correctness, the RL reward `answer`, GRPO's accuracy, hence compare), a
value in [0, 1] where 1 means correct:
- `numeric` (the default, for records without a scorer, GSM8K's): equal numerically when
  both are numbers (`$1,234.50` == `1234.5`, `3/4` == `0.75`, `−3` == `-3`), else as
  normalised text (`tunix_rt.render.answers_match`).
- `math`: math-verify (`parse` then `verify(gold, answer)`) for LaTeX and symbolic answers
  (`\\frac{1}{2}` == `0.5`, `(x+1)^2` == `x^2+2x+1`); text without a math delimiter is
  read as `$…$` (the answer also as it stands, right when either reading is).
- `rg:<task>`: reasoning-gym's own `score_answer` for the task (traces.reasoning_gym.score);
  a task may give partial credit (a value below 1: not correct).

The two verifiers run on a worker thread under a time limit (SCORER_TIMEOUT_S): sympy on a
pathological answer (`9**9**9**9`) can run for ever. An answer the verifier cannot judge
within the limit, or on which it raises, scores 0 (logged): the verdict on an unreadable
answer is "not correct", and one odd completion must not stop an RL run. The thread is left
behind (a daemon). What is not the answer's fault still raises: an unknown scorer, a missing
package, a record without what its scorer needs (BadInput). That the verifier's verdict on
the gold answer is 1 is checked when a reasoning-gym record is made.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable

from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.render import answers_match, fallback_answer, parse_completion
from tunix_rt.traces import reasoning_gym
from tunix_rt.traces.schema import Trace

SOURCE_TAG, SOURCE_FALLBACK, SOURCE_NONE = "tag", "fallback", "none"
UNCATEGORIZED = "uncategorized"
NUMERIC, MATH, RG_PREFIX = "numeric", "math", reasoning_gym.SCORER_PREFIX
DEFAULT_SCORER = NUMERIC
SCORERS = (NUMERIC, MATH, RG_PREFIX + "<task>")
SCORER_TIMEOUT_S = 10.0
"""The time one verifier call may take before the answer scores 0."""
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Score:
    """What one completion earned."""

    reasoning: str
    """Text inside <reasoning>…</reasoning> ("" when absent)."""
    answer: str
    """The tagged answer, else the fallback number, else ""."""
    answer_source: str
    """tag | fallback | none."""
    correct: bool
    """Tagged answer equals gold."""
    correct_lenient: bool
    """The answer (tagged or fallback) equals gold."""
    format_ok: bool
    value: float = 0.0
    """The scorer's value for the tagged answer, in [0, 1] (0 without one)."""


def scorer_of(record: Trace) -> str:
    """The scorer a record names (meta.scorer), else DEFAULT_SCORER."""
    name = record.meta.get("scorer")
    return name if isinstance(name, str) and name.strip() else DEFAULT_SCORER


def check_scorer(name: str) -> None:
    if name not in (NUMERIC, MATH) and not (name.startswith(RG_PREFIX) and len(name) > len(RG_PREFIX)):
        raise BadInput(f"unknown scorer {name!r} (known: {', '.join(SCORERS)})")


def score(record: Trace, answer: str) -> float:
    """The record's scorer's value for an extracted answer, in [0, 1]; 1.0 is correct."""
    name = scorer_of(record)
    check_scorer(name)
    if name == NUMERIC:
        return float(answers_match(answer, record.answer))
    if name == MATH:
        return _bounded(name, record, lambda: _math_verify(record.answer, answer))
    return _bounded(name, record, lambda: reasoning_gym.score(record.meta, record.question, record.answer, answer))


def is_correct(value: float) -> bool:
    return value >= 1.0 - 1e-9


def _bounded(name: str, record: Trace, fn: Callable[[], float]) -> float:
    """fn() on a daemon thread under SCORER_TIMEOUT_S; see the module docstring."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller below
            box["error"] = e

    worker = threading.Thread(target=run, name=f"scorer-{name}", daemon=True)
    worker.start()
    worker.join(SCORER_TIMEOUT_S)
    if worker.is_alive():
        _log.warning("scorer %s: no verdict on record %s within %.0f s; scored 0", name, record.id, SCORER_TIMEOUT_S)
        return 0.0
    if isinstance(err := box.get("error"), (BadInput, TunixRtError)):
        raise err
    if err is not None:
        _log.warning("scorer %s raised on record %s (%s: %s); scored 0", name, record.id, type(err).__name__, err)
        return 0.0
    value = float(box["value"])
    return min(max(value, 0.0), 1.0) if value == value else 0.0


def _math_verify(gold: str, answer: str) -> float:
    try:
        from math_verify import parse, verify
    except ImportError as e:
        raise BadInput(f"the math scorer needs math-verify: {reasoning_gym.INSTALL_HINT} ({e})") from None
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout disabled" notice: ours bounds it
    if not answer.strip():
        return 0.0
    target = parse(_delimited(gold), parsing_timeout=None)
    readings = [_delimited(answer), answer] if _delimited(answer) != answer else [answer]
    return float(any(verify(target, parse(r, parsing_timeout=None), timeout_seconds=None) for r in readings))


def _delimited(text: str) -> str:
    """Text without a math delimiter as "$…$": math-verify reads LaTeX only between
    delimiters ("\\frac{1}{2}", "x^2+2x+1"). The gold is read that way; an answer both ways
    (as math, and as it stands: "the answer is 1/2"), right when either reading is."""
    if not any(d in text for d in ("$", "\\(", "\\[", "\\boxed")):
        return f"${text}$"
    return text


def score_record(text: str, record: Trace) -> Score:
    """Score one completion against a record, by the record's scorer."""
    return _score_text(text, lambda answer: score(record, answer))


def score_completion(text: str, gold: str) -> Score:
    """Score one completion against a bare gold answer (the numeric scorer)."""
    return _score_text(text, lambda answer: float(answers_match(answer, gold)))


def _score_text(text: str, judge: Callable[[str], float]) -> Score:
    """Score one completion (the generated text, stop token excluded or not)."""
    parsed = parse_completion(text)
    tagged = (parsed.answer or "").strip()
    format_ok = parsed.format_ok and bool(tagged) and _single_tags(text)
    if tagged:
        answer, source = tagged, SOURCE_TAG
    else:
        fb = fallback_answer(text)
        answer, source = (fb, SOURCE_FALLBACK) if fb else ("", SOURCE_NONE)
    value = judge(answer) if source != SOURCE_NONE else 0.0
    correct = source == SOURCE_TAG and is_correct(value)
    lenient = source != SOURCE_NONE and is_correct(value)
    return Score(parsed.reasoning or "", answer, source, correct, lenient, format_ok, value if source == SOURCE_TAG else 0.0)


def _single_tags(text: str) -> bool:
    """One opening and one closing tag of each kind: nested or repeated tags break the
    format even when the regex in parse_completion can stretch over them."""
    return all(text.count(t) == 1 for t in ("<reasoning>", "</reasoning>", "<answer>", "</answer>"))


@dataclass(frozen=True)
class Metrics:
    """The metrics block of eval_summary.json (rates in [0, 1])."""

    accuracy: float
    format_rate: float
    answer_found_rate: float
    answer_tag_rate: float
    answer_fallback_rate: float
    lenient_accuracy: float
    mean_completion_tokens: float
    truncated_rate: float
    arith_accuracy: float
    """The share of the arithmetic claims (`a op b = c`, train.arith) in all reasoning that hold;
    0 when there are none (see arith_claims_per_item: a model that leaves its arithmetic to the
    calculator writes none of its own)."""
    arith_reward: float
    """The mean per item of the `arith` RL reward: its share of claims that hold, 0 without any."""
    arith_claims_per_item: float
    """Arithmetic claims the model wrote itself, per item (what the tool wrote is not counted)."""
    n: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def metrics(preds: Iterable[dict]) -> Metrics:
    """Metrics over prediction records (the dicts written to predictions.jsonl)."""
    preds = list(preds)
    n = len(preds)

    claims = sum(p.get("arith_claims", 0) for p in preds)  # predictions written before: none counted

    def rate(pred) -> float:
        return round(sum(1 for p in preds if pred(p)) / n, 6) if n else 0.0

    return Metrics(
        accuracy=rate(lambda p: p["correct"]),
        format_rate=rate(lambda p: p["format_ok"]),
        answer_found_rate=rate(lambda p: p["answer_source"] != SOURCE_NONE),
        answer_tag_rate=rate(lambda p: p["answer_source"] == SOURCE_TAG),
        answer_fallback_rate=rate(lambda p: p["answer_source"] == SOURCE_FALLBACK),
        lenient_accuracy=rate(lambda p: p["correct_lenient"]),
        mean_completion_tokens=round(sum(p["n_tokens"] for p in preds) / n, 3) if n else 0.0,
        truncated_rate=rate(lambda p: p["finish_reason"] == "length"),
        arith_accuracy=round(sum(p.get("arith_true", 0) for p in preds) / claims, 6) if claims else 0.0,
        arith_reward=round(sum(p["arith_true"] / p["arith_claims"] for p in preds if p.get("arith_claims")) / n, 6)
        if n else 0.0,
        arith_claims_per_item=round(claims / n, 3) if n else 0.0,
        n=n,
    )


def by_category(preds: Iterable[dict]) -> dict[str, dict]:
    """Metrics per trace meta.category ("uncategorized" when a trace has none)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for p in preds:
        groups[p["category"]].append(p)
    return {cat: metrics(group).to_dict() for cat, group in sorted(groups.items())}


def category_of(meta: dict | None) -> str:
    cat = (meta or {}).get("category")
    return str(cat) if cat not in (None, "") else UNCATEGORIZED


@dataclass(frozen=True)
class ConstantBaseline:
    """What always giving one answer scores: the floor a trained model must clear before its
    accuracy says it learned the task rather than the task's answer distribution (a syllogism
    split whose gold is "Yes" two times in three; letter counts that are mostly 1 or 2)."""

    answer: str
    """The most common gold answer of the reference records (the first seen on a tie)."""
    accuracy: float
    """Its share of correct verdicts on the evaluated items, by each item's own scorer."""
    n: int

    def to_dict(self) -> dict:
        return {"answer": self.answer, "accuracy": round(self.accuracy, 6), "n": self.n}


def constant_baseline(reference: Iterable[Trace], items: Iterable[Trace]) -> ConstantBaseline | None:
    """The constant-answer baseline: the most common answer of `reference` (a train split),
    scored against every item of `items` with `score` (so `1` is right on a gold `1.0` where
    the scorer says so); None without reference records or items."""
    counts: dict[str, int] = {}
    for rec in reference:
        counts[rec.answer] = counts.get(rec.answer, 0) + 1
    items = list(items)
    if not counts or not items:
        return None
    answer = max(counts, key=lambda a: counts[a])  # dicts keep first-seen order: ties go to the earliest
    right = sum(is_correct(score(rec, answer)) for rec in items)
    return ConstantBaseline(answer=answer, accuracy=right / len(items), n=len(items))
