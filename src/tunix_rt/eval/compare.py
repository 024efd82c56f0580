"""Compare two evaluations: metrics side by side, per-item flips, an exact McNemar test,
and bars the candidate (B) must clear — a regression gate for CI.

A and B are each an eval dir, an eval_summary.json path, an eval id under <home>/evals,
or a run (id or dir): a run picks its latest eval (by finished_at).

McNemar's exact test looks only at the items the two evaluations disagree on: b items A got
right and B got wrong, c the other way. Under "no difference" each disagreement is a fair
coin, so the two-sided p-value is min(1, 2 * P[Binomial(b + c, 1/2) <= min(b, c)]).

Sampled evaluations (`eval --samples K`, eval.runner's module doc) add two things:
- their pass@k and maj@K rows in the metrics table (a row a side lacks shows "-");
- `pass1`: a paired test of pass@1 over the shared items, on each item's share of correct
  samples (a greedy side's item counts as one sample, 0 or 1): the exact sign-flip
  permutation test of the mean difference (eval.passk.paired_sign_test). Thresholding the
  per-item shares first (McNemar on "majority right") would throw away the graded signal
  of K samples; with one sample each side the test is exactly McNemar's.
The item-level McNemar test above still reads each line's `correct`, which for a sampled
eval is the majority vote's (maj@K per item), so it is McNemar on maj@K correctness.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.eval.passk import is_sampled_metric, item_counts, paired_sign_test, sampled_metric_names
from tunix_rt.eval.runner import NO_RUN
from tunix_rt.home import Home
from tunix_rt.rundir import EVALS, PREDICTIONS, SUMMARY

METRICS = ("accuracy", "format_rate", "answer_found_rate", "lenient_accuracy",
           "mean_completion_tokens", "truncated_rate", "arith_accuracy", "arith_reward",
           "arith_claims_per_item", "n")


@dataclass(frozen=True)
class EvalResult:
    """An eval dir read back: its summary and its predictions by id."""

    path: Path
    summary: dict
    predictions: dict[str, dict]

    @property
    def label(self) -> str:
        s = self.summary
        who = s["model"] if s.get("run_id", NO_RUN) == NO_RUN else s["run_id"]
        return f"{who} / {s.get('eval_id', self.path.name)}"


def find_eval_dir(ref: str, home: Home) -> Path:
    """Eval dir, eval_summary.json, eval id under <home>/evals, or a run → its latest eval."""
    path = Path(ref)
    if path.is_file() and path.name == SUMMARY:
        return path.parent
    if (path / SUMMARY).is_file():
        return path
    if (home.root / "evals" / ref / SUMMARY).is_file():
        return home.root / "evals" / ref
    run = path if (path / EVALS).is_dir() else home.runs / ref
    evals = [d for d in (run / EVALS).glob("*") if (d / SUMMARY).is_file()] if run.is_dir() else []
    if not evals:
        raise BadInput(f"{ref!r}: not an eval dir, an eval_summary.json, or a run with an eval under eval/")
    return max(evals, key=lambda d: (_read_json(d / SUMMARY).get("finished_at", ""), d.name))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TunixRtError(f"{path}: unreadable ({e})") from None


def load_eval(ref: str, home: Home) -> EvalResult:
    return load_eval_dir(find_eval_dir(ref, home))


def load_eval_dir(d: Path) -> EvalResult:
    """An eval dir's summary and predictions (unreadable files: TunixRtError)."""
    summary = _read_json(d / SUMMARY)
    preds: dict[str, dict] = {}
    try:
        for n, line in enumerate((d / PREDICTIONS).read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                rec = json.loads(line)
                preds[rec["id"]] = rec
    except (OSError, ValueError, KeyError) as e:
        raise TunixRtError(f"{d / PREDICTIONS}: unreadable ({e})") from None
    return EvalResult(d, summary, preds)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts b and c."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2.0 * tail)


def parse_bars(items: list[str]) -> dict[str, float]:
    """["accuracy=0.3", …] → {"accuracy": 0.3}; unknown metrics are bad input."""
    bars = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or (name not in METRICS and not is_sampled_metric(name)):
            raise BadInput(f"--fail-below {item!r}: expected METRIC=VALUE with METRIC one of {', '.join(METRICS)}, "
                           "pass@K or maj@K")
        try:
            bars[name] = float(raw)
        except ValueError:
            raise BadInput(f"--fail-below {item!r}: {raw!r} is not a number") from None
    return bars


def compare(a: EvalResult, b: EvalResult, bars: dict[str, float] | None = None) -> dict:
    """The comparison as one JSON-ready object (what --json prints)."""
    ma, mb = a.summary["metrics"], b.summary["metrics"]
    names = [m for m in METRICS if m in ma or m in mb] + sampled_metric_names(ma, mb)
    rows = [{"metric": m, "a": ma.get(m), "b": mb.get(m),
             "delta": (mb[m] - ma[m]) if m in ma and m in mb else None} for m in names]
    shared = sorted(set(a.predictions) & set(b.predictions))
    r2w = [i for i in shared if a.predictions[i]["correct"] and not b.predictions[i]["correct"]]
    w2r = [i for i in shared if not a.predictions[i]["correct"] and b.predictions[i]["correct"]]
    failed = [{"metric": m, "bar": v, "value": mb.get(m)} for m, v in (bars or {}).items()
              if mb.get(m) is None or mb[m] < v]
    return {
        "a": {"path": str(a.path), "label": a.label},
        "b": {"path": str(b.path), "label": b.label},
        "same_dataset": _dataset_key(a) == _dataset_key(b),
        "metrics": rows,
        "shared": len(shared),
        "right_to_wrong": r2w,
        "wrong_to_right": w2r,
        "both_right": sum(1 for i in shared if a.predictions[i]["correct"] and b.predictions[i]["correct"]),
        "both_wrong": sum(1 for i in shared if not a.predictions[i]["correct"] and not b.predictions[i]["correct"]),
        "mcnemar_p": mcnemar_exact(len(r2w), len(w2r)),
        **({"pass1": pass1_test(a, b, shared)} if _sampled(a) or _sampled(b) else {}),
        "bars": [{"metric": m, "bar": v, "value": mb.get(m)} for m, v in (bars or {}).items()],
        "failed_bars": failed,
        "passed": not failed,
    }


def _sampled(e: EvalResult) -> bool:
    return "samples" in e.summary.get("metrics", {}) or any("n_samples" in p for p in e.predictions.values())


def correct_basis(e: EvalResult) -> str:
    """What a line's `correct` means in `e`: maj@K for a sampled eval, else its one completion."""
    k = e.summary.get("metrics", {}).get("samples")
    return f"maj@{k}" if k else "one completion"


def sampled_pass1(dir_a: str | Path, dir_b: str | Path) -> dict | None:
    """pass1_test of two eval dirs on their shared items, None when neither is sampled (the
    REST comparison reads the files: the registry keeps one row per item, not its samples)."""
    a, b = load_eval_dir(Path(dir_a)), load_eval_dir(Path(dir_b))
    if not (_sampled(a) or _sampled(b)):
        return None
    return pass1_test(a, b, sorted(set(a.predictions) & set(b.predictions)))


def pass1_test(a: EvalResult, b: EvalResult, shared: list[str]) -> dict:
    """pass@1 over the shared items on both sides and the paired sign-flip test (module doc)."""
    ca = [item_counts(a.predictions[i]) for i in shared]
    cb = [item_counts(b.predictions[i]) for i in shared]

    def mean(counts) -> float:
        return round(sum(c / n for c, n in counts) / len(counts), 6) if counts else 0.0

    return {"items": len(shared), "a": mean(ca), "b": mean(cb), "delta": round(mean(cb) - mean(ca), 6),
            "p": paired_sign_test(ca, cb), "test": "exact paired sign-flip test of per-item pass rates",
            "a_correct_is": correct_basis(a), "b_correct_is": correct_basis(b)}


def _dataset_key(e: EvalResult) -> tuple:
    d = e.summary.get("dataset", {})
    return d.get("name"), d.get("sha256"), d.get("split")
