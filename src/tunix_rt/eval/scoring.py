"""Scoring: one completion against its gold answer, and the metrics over a set.

Definitions (the ones eval_summary.json reports):
- `correct`: the answer inside <answer>…</answer> equals the gold answer, numerically when
  both are numbers (`$1,234.50` == `1234.5`, `3/4` == `0.75`, `−3` == `-3`), else as
  normalised text (`tunix_rt.render.answers_match`). Only a tagged answer can be correct:
  the headline accuracy rewards the format it was trained for.
- `format_ok`: exactly one <reasoning>…</reasoning> followed by exactly one non-empty
  <answer>…</answer>, nothing after but whitespace (and <end_of_turn>).
- `answer_source`: "tag" when a non-empty <answer> was found, else "fallback" when the
  completion holds a number (the last one is taken), else "none". A fallback answer counts
  for answer_found_rate and lenient_accuracy, never for format_rate or accuracy.
- `truncated`: generation hit max_new_tokens (finish_reason "length").
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

from tunix_rt.render import answers_match, fallback_answer, parse_completion

SOURCE_TAG, SOURCE_FALLBACK, SOURCE_NONE = "tag", "fallback", "none"
UNCATEGORIZED = "uncategorized"


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


def score_completion(text: str, gold: str) -> Score:
    """Score one completion (the generated text, stop token excluded or not)."""
    parsed = parse_completion(text)
    tagged = (parsed.answer or "").strip()
    format_ok = parsed.format_ok and bool(tagged) and _single_tags(text)
    if tagged:
        answer, source = tagged, SOURCE_TAG
    else:
        fb = fallback_answer(text)
        answer, source = (fb, SOURCE_FALLBACK) if fb else ("", SOURCE_NONE)
    correct = source == SOURCE_TAG and answers_match(answer, gold)
    lenient = source != SOURCE_NONE and answers_match(answer, gold)
    return Score(parsed.reasoning or "", answer, source, correct, lenient, format_ok)


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
    """The share of the arithmetic claims (`a op b = c`, train.arith) in all reasoning that hold."""
    arith_reward: float
    """The mean per item of the `arith` RL reward: its share of claims that hold, 0 without any."""
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
