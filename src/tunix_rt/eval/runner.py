"""The eval stage: resolve model, adapter and dataset; render prompts exactly as training
did; generate; score; write predictions.jsonl and eval_summary.json.

Where the files go:
- evaluating a run (an adapter of a run, or a run's final/merged model):
  runs/<run_id>/eval/<eval_id>/
- anything else (a base model, an adapter dir outside a run): <home>/evals/<eval_id>/
- or `out`, when given.
eval_id = <dataset>-<split>-<YYYYmmdd-HHMMSS>-<4 hex>. The directory is written under a
temporary name and renamed when complete, so a failed eval leaves nothing half-written.

No field is ever null: an eval without an adapter says so in words (adapter, run_id); a
completion without reasoning or answer has "" there.

Sampled evaluation (`samples` K > 1, temperature > 0; `tunix_rt.eval.passk` holds the
estimators): each item is decoded K times and predictions.jsonl keeps ONE line per item, so
every reader of the format (compare, the registry, the report, the web UI) keeps working:
- the line's own fields (completion, answer, correct, format_ok, n_tokens, …) are those of
  the majority vote's sample (the earliest sample carrying the winning answer; sample 0 when
  no sample answered), so `correct` is the item's maj@K correctness. The votes are the
  tagged answers (answer_source "tag"): as for accuracy, only an answer in <answer> tags
  counts, so a fallback number neither votes nor wins;
- `samples`: all K samples in order, each with the per-completion fields (completion,
  reasoning, answer, correct, format_ok, n_tokens, finish_reason, …);
- `n_samples` K, `n_correct`, `majority_answer` (normalised, "" when none), `majority_votes`,
  `majority_sample` (its index, -1 when none).
The summary's rates are then over all n*K samples (accuracy is pass@1, the mean share of
correct samples; format_rate, mean_completion_tokens, … likewise) while `n` still counts
items, plus `pass@k` for k in passk.ks_for(K), `maj@K` and `samples` K; by_category likewise. `decoding` gains `samples`
and `sample_keys`.

`constant_baseline` (held-out splits of a dataset with a train split): what always giving the
train split's most common answer scores on the evaluated records ({answer, accuracy, n}, and
by_category for a mixture): the floor an accuracy must clear to show the task learned rather
than its answer distribution (GRPO learns a skewed one fast: README, `demo --task`).

Seeds: sample j of item i (i its 0-based position in the evaluated split, after --limit)
draws its noise from (seed, key (i, j), decode step) (`tunix_rt.eval.sampling.row_seed`),
whatever the batch size, K or the other items; a rerun with the same seed and settings is
bit-identical, and the first K' samples of a K-sample eval are those of a K'-sample eval. A
generator without per-prompt keys (the JAX engine's) keys each row by its position i*K + j.
"""

from __future__ import annotations

import dataclasses

import inspect
import json
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import yaml

from tunix_rt import fence
from tunix_rt.devices import resolve_device  # "auto" made concrete: the summary names the device that ran
from tunix_rt.rundir import CONFIG, EVALS, FINAL, PREDICTIONS, SUMMARY, Run
from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.files import atomic_dir
from tunix_rt.eval.generate import DecodeConfig, Generation, Generator
from tunix_rt.eval.passk import majority_vote, sampled_metrics
from tunix_rt.eval.scoring import SOURCE_TAG  # sampled_prediction's votes: tagged answers only
from tunix_rt.eval.scoring import by_category, category_of, metrics, score_record
from tunix_rt.home import Home
from tunix_rt.render import DEFAULT_SYSTEM_PROMPT, prompt_ids

if TYPE_CHECKING:
    from tunix_rt.eval.judge import JudgeConfig

NO_ADAPTER = "base model (no adapter)"
NO_RUN = "not a run (base model)"
DEVICES = {"torch": ("auto", "cpu", "cuda"), "jax": ("auto", "cpu", "gpu", "tpu")}


@dataclass(frozen=True)
class EvalRequest:
    """One evaluation, as `tunix-rt eval` takes it; defaults live here."""

    dataset: str
    """Dataset NAME, NAME@VERSION, or a trace JSONL path."""
    model: str | None = None
    """Catalog name or HF model dir; may be omitted when `adapter` names a run."""
    adapter: str | None = None
    """A run id, a run dir, or a PEFT adapter dir."""
    split: str | None = None
    """train|dev|test|all (test: datasets whose records carry their split, reasoning-gym's);
    None: dev for a named dataset, all for a JSONL path."""
    limit: int | None = None
    """Evaluate only the first N records of the split."""
    engine: str = "auto"
    """torch | jax | auto (train.engines.pick: the rule `tunix-rt train` uses)."""
    device: str = "auto"
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    samples: int = 1
    """Completions per item (> 1 needs temperature > 0): pass@k and maj@K (module doc)."""
    tools: tuple[str, ...] | None = None
    """Tools the model may call while it decodes (tunix_rt.tools); None: the run's own (its
    config's `tools`; none for a catalog model), () : none."""
    out: Path | None = None
    """Write here instead of the default place."""
    judge: "JudgeConfig | None" = None
    """An LLM judge (tunix_rt.eval.judge) scoring each prediction: `judge_score` per line and
    its mean in metrics; a judge that fails fails the eval."""
    weights: str = "fp32"
    """fp32 | int8 | int4: decode with weight-only int8 or int4 weights (tunix_rt.eval.int8_weights;
    torch engine, Gemma 3/2; int4 on a CPU with its kernel); recorded in eval_summary.json's decoding."""

    def __post_init__(self) -> None:
        from tunix_rt.train import engines

        object.__setattr__(self, "engine", engines.pick(self.engine, self.device))
        if self.device not in DEVICES[self.engine]:
            raise BadInput(f"device for engine {self.engine} must be one of {'|'.join(DEVICES[self.engine])}, got {self.device!r}")
        if self.limit is not None and self.limit < 1:
            raise BadInput(f"limit must be >= 1, got {self.limit}")
        if self.split not in (None, "train", "dev", "test", "all"):
            raise BadInput(f"split must be train, dev, test or all, got {self.split!r}")
        if not self.model and not self.adapter:
            raise BadInput("give --model (and optionally --adapter RUN_OR_DIR)")
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise BadInput(f"samples must be an integer >= 1, got {self.samples!r}")
        if self.samples > 1 and self.decode.greedy:
            raise BadInput(f"samples {self.samples} needs temperature > 0 (greedy decoding gives one answer per item)")
        from tunix_rt.eval.int8_weights import check_weights

        check_weights(self.weights, self.engine)


@dataclass(frozen=True)
class Target:
    """What is evaluated: base model dir, optional adapter dir, the run they belong to."""

    model: str  # as named by the user or the run config
    model_dir: Path
    adapter_dir: Path | None
    run_dir: Path | None
    system_prompt: str
    tokenizer: str
    """Where the tokenizer is read: the model dir when it has tokenizer.json, else the base model."""
    tools: tuple[str, ...] = ()
    """The tools the run trained with (its config's `tools`): what eval decodes with by default."""

    def decode(self, decode: DecodeConfig, tools: tuple[str, ...] | None = None) -> DecodeConfig:
        """`decode` with the tools asked (None: this target's own)."""
        return dataclasses.replace(decode, tools=self.tools if tools is None else tuple(tools))


# ---------------------------------------------------------------------------------------
# Resolution


def run_of_adapter(adapter_dir: Path) -> Path | None:
    """runs/<id>/final/adapter → runs/<id> (when it holds config.yaml)."""
    run = adapter_dir.resolve().parent.parent
    return run if adapter_dir.resolve().parent.name == FINAL and (run / CONFIG).is_file() else None


def resolve_adapter(ref: str, home: Home) -> tuple[Path | None, Path | None, Path]:
    """RUN_OR_DIR → (adapter dir or None, merged model dir or None, run dir or adapter dir).
    A run without final/adapter but with final/merged (full fine-tune) yields the merged model."""
    path = Path(ref)
    if (path / "adapter_config.json").is_file():
        return path, None, run_of_adapter(path) or path
    run = path if (path / FINAL).is_dir() or (path / CONFIG).is_file() else home.runs / ref
    if not run.is_dir():
        raise BadInput(f"--adapter {ref!r}: not an adapter dir, a run dir, or a run id under {home.runs}")
    if Run(run).adapter is not None:
        return Run(run).adapter, None, run
    if Run(run).merged is not None:
        return None, Run(run).merged, run
    raise BadInput(f"run {run.name}: no final/adapter/ or final/merged/ (did training finish?)")


def run_config(run_dir: Path) -> dict:
    """The run's resolved TrainConfig as a mapping (model and system_prompt are read)."""
    path = run_dir / CONFIG
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise TunixRtError(f"{path}: unreadable run config ({e})") from None
    for key in ("model", "system_prompt"):
        if key not in data:
            raise TunixRtError(f"{path}: no {key!r} field")
    return data


def resolve_target(req: EvalRequest, home: Home) -> Target:
    """Model dir, adapter dir and system prompt, from the flags and the run's config.yaml."""
    from tunix_rt.models.store import ensure_model

    adapter_dir, merged_dir, run_dir = (None, None, None)
    if req.adapter:
        adapter_dir, merged_dir, run_dir = resolve_adapter(req.adapter, home)
        if not (run_dir / CONFIG).is_file():
            run_dir = None  # a bare adapter dir: no run, no config
    elif req.model and Path(req.model).is_dir():
        run_dir = run_of_adapter(Path(req.model))  # runs/<id>/final/merged
    cfg = run_config(run_dir) if run_dir else None
    system_prompt = cfg["system_prompt"] if cfg else DEFAULT_SYSTEM_PROMPT
    tools = tuple(cfg.get("tools") or ()) if cfg else ()
    if merged_dir is not None:
        return Target(str(merged_dir), merged_dir, None, run_dir, system_prompt, _tokenizer_of(merged_dir, cfg), tools)
    name = req.model or (cfg["model"] if cfg else None)
    if not name:
        raise BadInput(f"--adapter {req.adapter}: no run config to read the base model from; give --model")
    model_dir = ensure_model(name, home)
    if cfg and req.model and req.adapter:
        trained_on = ensure_model(cfg["model"], home)
        if trained_on.resolve() != model_dir.resolve():
            raise BadInput(f"the adapter was trained on {cfg['model']} ({trained_on}), not {req.model} ({model_dir})")
    return Target(name, model_dir, adapter_dir, run_dir, system_prompt, _tokenizer_of(model_dir, cfg), tools)


def _tokenizer_of(model_dir: Path, cfg: dict | None) -> str:
    if (model_dir / "tokenizer.json").is_file() or cfg is None:
        return str(model_dir)
    return cfg["model"]  # a merged model saved without its tokenizer: the base model's


# ---------------------------------------------------------------------------------------
# Generators


def load_model(model_dir: Path, adapter_dir: Path | None, device: str):
    """The transformers model in eval mode, fp32, with the LoRA adapter merged in (merging
    is exact up to float rounding and makes each decode step as cheap as the base model's)."""
    from tunix_rt.models.hf import load_causal_lm

    model = load_causal_lm(model_dir, dtype="fp32", device=device, attn="eager")
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=False).merge_and_unload()
    return model.eval()


def make_generator(engine: str, target: Target, tok, device: str, weights: str = "fp32") -> Generator:
    """The engine's Generator: TorchGenerator (on int8 or int4 weights when `weights` says so:
    tunix_rt.eval.int8_weights), or tunix_rt.eval.jax_generate's."""
    from tunix_rt.eval.int8_weights import check_weights

    check_weights(weights, engine)
    if engine == "jax":
        from tunix_rt.eval import jax_generate

        return jax_generate.load_generator(target.model_dir, target.adapter_dir, tok, device)
    from tunix_rt.eval.generate import TorchGenerator

    gen = TorchGenerator(load_model(target.model_dir, target.adapter_dir, device), tok, device)
    if weights != "fp32":
        from tunix_rt.eval.int8_weights import use_weights

        use_weights(gen, weights)
    return gen


# ---------------------------------------------------------------------------------------
# The stage


def new_eval_id(dataset: str, split: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in dataset).strip("-.") or "dataset"
    return f"{safe}-{split}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_eval(
    req: EvalRequest,
    home: Home | None = None,
    on_tokens: Callable[[int], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
) -> Path:
    """Evaluate and write the eval dir; returns its path. `on_start(n_prompts,
    max_tokens)` and `on_tokens(n)` feed a progress display."""
    from tunix_rt.models.store import load_tokenizer
    from tunix_rt.traces.dataset import load_dataset
    from tunix_rt.train import engines

    engines.require(req.engine)
    home = (home or Home.resolve()).ensure()
    started, t0 = _now(), time.perf_counter()
    target = resolve_target(req, home)
    ds = load_dataset(req.dataset, home)
    split = req.split or ("all" if ds.version == "file" else "dev")
    records = ds.split(split)[: req.limit]
    if not records:
        raise BadInput(f"dataset {ds.ref} split {split!r} is empty")
    dest = eval_dest(req, target, home, ds.name, split)
    tok = load_tokenizer(target.tokenizer, home)
    prompts = [prompt_ids(r.question, tok, target.system_prompt) for r in records]
    device = resolve_device(req.engine, req.device)
    gen = make_generator(req.engine, target, tok, device, req.weights)
    k = req.samples
    if on_start:
        on_start(len(prompts) * k, len(prompts) * k * req.decode.max_new_tokens)
    g0 = time.perf_counter()
    decode = target.decode(req.decode, req.tools)
    outs = generate_samples(gen, prompts, decode, k, on_tokens)
    gen_s = time.perf_counter() - g0
    if k == 1:
        preds = [prediction(r, p, o, tok, decode.tools) for r, p, o in zip(records, prompts, outs)]
        scores, categories = metrics(preds).to_dict(), by_category(preds)
    else:
        preds = [sampled_prediction([prediction(r, p, o, tok, decode.tools) for o in outs[i * k:(i + 1) * k]])
                 for i, (r, p) in enumerate(zip(records, prompts))]
        scores, categories = sampled_scores(preds)
    if decode.tools:
        scores.update(tool_scores(preds if k == 1 else flat_samples(preds)))
    if req.judge is not None:
        from tunix_rt.eval.judge import judge_predictions

        scores.update(judge_predictions(req.judge, records, preds))
    summary = {
        "eval_id": "",
        "model": target.model,
        "model_path": str(target.model_dir.resolve()),
        "adapter": str(target.adapter_dir.resolve()) if target.adapter_dir else NO_ADAPTER,
        "run_id": target.run_dir.name if target.run_dir else NO_RUN,
        "engine": req.engine,
        "device": device,
        "dataset": {"name": ds.name, "version": ds.version, "split": split, "sha256": ds.sha256, "n": len(records)},
        "system_prompt": target.system_prompt,
        "decoding": decode.to_dict() | ({"samples": k, "sample_keys": SAMPLE_KEYS} if k > 1 else {})
        | {"weights": req.weights},
        "metrics": scores,
        "by_category": categories,
        "started_at": started,
        "finished_at": _now(),
        "duration_s": round(time.perf_counter() - t0, 3),
        "generation_s": round(gen_s, 3),
        "tokens_per_s": round(sum(o.n_tokens for o in outs) / gen_s, 3) if gen_s > 0 else 0.0,
    }
    if req.judge is not None:
        summary["judge"] = req.judge.describe()
    if (floor := baseline_of(ds, split, records)) is not None:
        summary["constant_baseline"] = floor
    summary["eval_id"] = dest.name
    return write_eval_dir(dest, preds, summary)


def baseline_of(ds, split: str, records: list) -> dict | None:
    """The constant-answer floor of a held-out evaluation (eval.scoring.constant_baseline):
    always the train split's most common answer, scored on the evaluated records; per
    category too when they hold several (a task mixture: each task its own most common
    answer). None for the train split itself, a plain file, or a dataset without train."""
    from tunix_rt.eval.scoring import constant_baseline

    if split in ("train", "all") or ds.version == "file":
        return None
    train = ds.split("train")
    whole = constant_baseline(train, records)
    if whole is None:
        return None
    out = whole.to_dict()
    cats = sorted({category_of(r.meta) for r in records})
    if len(cats) > 1:
        per = {c: constant_baseline([r for r in train if category_of(r.meta) == c],
                                    [r for r in records if category_of(r.meta) == c]) for c in cats}
        out["by_category"] = {c: b.to_dict() for c, b in per.items() if b is not None}
    return out


SAMPLE_KEYS = "sample j of item i: noise from (seed, (i, j), step)"
ITEM_FIELDS = ("id", "question", "gold", "category", "prompt_tokens")
"""A prediction's fields that belong to the item, not to one completion of it."""


def generate_samples(gen: Generator, prompts: list[list[int]], decode: DecodeConfig, k: int,
                     on_tokens: Callable[[int], None] | None) -> list[Generation]:
    """K completions of each prompt, item-major (sample j of item i at i*K + j), each keyed
    by (i, j) where the generator takes keys (module doc); K = 1 decodes as ever."""
    if k == 1:
        return gen.generate(prompts, decode, on_tokens)
    rows = [p for p in prompts for _ in range(k)]
    if "keys" in inspect.signature(gen.generate).parameters:
        keys = [(i, j) for i in range(len(prompts)) for j in range(k)]
        return gen.generate(rows, decode, on_tokens, keys=keys)
    return gen.generate(rows, decode, on_tokens)


def sampled_prediction(samples: list[dict]) -> dict:
    """One item's line from its K per-sample predictions (module doc): the majority vote's
    sample on top, all K under `samples`."""
    vote = majority_vote([s["answer"] if s.get("answer_source", SOURCE_TAG) == SOURCE_TAG else None for s in samples])
    top = samples[vote.sample if vote.sample is not None else 0]
    return top | {
        "n_samples": len(samples),
        "n_correct": sum(bool(s["correct"]) for s in samples),
        "majority_answer": vote.answer,
        "majority_votes": vote.votes,
        "majority_sample": vote.sample if vote.sample is not None else -1,
        "samples": [{f: v for f, v in s.items() if f not in ITEM_FIELDS} for s in samples],
    }


def tool_scores(preds: list[dict]) -> dict[str, float]:
    """Tool use over completions: calls and tool-written tokens per completion, the share
    of calls that erred, the share of completions that called a tool."""
    n = len(preds) or 1
    calls = [c for p in preds for c in p.get("tool_calls", [])]
    return {"tool_calls_per_item": round(len(calls) / n, 6),
            "tool_error_rate": round(sum(bool(c["error"]) for c in calls) / len(calls), 6) if calls else 0.0,
            "tool_use_rate": round(sum(bool(p.get("tool_calls")) for p in preds) / n, 6),
            "tool_tokens_per_item": round(sum(p.get("tool_tokens", 0) for p in preds) / n, 3)}


def flat_samples(preds: list[dict]) -> list[dict]:
    """Every sample of sampled lines as a prediction of its own (its item's fields on it)."""
    return [{f: p[f] for f in ITEM_FIELDS if f in p} | s for p in preds for s in p["samples"]]


def sampled_scores(preds: list[dict]) -> tuple[dict, dict]:
    """(metrics, by_category) of sampled lines: the usual metrics over all samples, plus
    pass@k, maj@K and samples (passk.sampled_metrics), overall and per category."""
    scores = metrics(flat_samples(preds)).to_dict() | sampled_metrics(preds) | {"n": len(preds)}
    categories = by_category(flat_samples(preds))
    for cat in categories:
        items = [p for p in preds if p["category"] == cat]
        categories[cat] |= sampled_metrics(items) | {"n": len(items)}
    return scores, categories


def eval_dest(req: EvalRequest, target: Target, home: Home, dataset: str, split: str) -> Path:
    """runs/<run>/eval/<eval_id> for a run, <home>/evals/<eval_id> otherwise, or --out;
    checked before any generation so a clash costs nothing."""
    if req.out is not None:
        dest = Path(req.out)
    else:
        root = target.run_dir / EVALS if target.run_dir else home.root / "evals"
        dest = root / new_eval_id(dataset, split)
    if dest.exists():
        raise BadInput(f"{dest} already exists; choose another --out")
    return dest


def prediction(record, prompt: list[int], out: Generation, tok=None, tools: tuple[str, ...] = ()) -> dict:
    """One predictions.jsonl line (DESIGN §2 fields first, then ours). With tools (`tok`
    given): the calls (tool, call, result, error) and the tokens the tools wrote; the arith
    claims are the model's own (a claim a tool wrote is not counted)."""
    from tunix_rt.eval.generate import tool_spans
    from tunix_rt.train.arith import find_claims

    s = score_record(out.text, record)  # the record's own scorer (meta.scorer; numeric by default)
    spans = tool_spans(out, tok) if tok is not None else ()
    start = out.text.find(s.reasoning) if spans and s.reasoning else 0  # the reasoning's place in the text
    claims = find_claims(s.reasoning, [(a - start, b - start) for a, b in spans])
    used = {"tool_calls": [dict(c) for c in out.tool_calls], "tool_tokens": int(sum(out.tool_mask))} if tools else {}
    return used | {
        "id": record.id,
        "question": record.question,
        "gold": record.answer,
        "completion": out.text,
        "reasoning": s.reasoning,
        "answer": s.answer,
        "correct": s.correct,
        "format_ok": s.format_ok,
        "n_tokens": out.n_tokens,
        "finish_reason": out.finish_reason,
        "answer_source": s.answer_source,
        "correct_lenient": s.correct_lenient,
        "category": category_of(record.meta),
        "prompt_tokens": len(prompt),
        "arith_claims": len(claims),
        "arith_true": sum(c.holds for c in claims),
    }


def write_eval_dir(dest: Path, preds: list[dict], summary: dict) -> Path:
    """Write both files into a temp dir beside dest, then publish it (files.atomic_dir):
    all or nothing, never over an existing directory."""
    if dest.exists():
        raise BadInput(f"{dest} already exists; choose another --out")
    dest.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: Path) -> None:
        with (tmp / PREDICTIONS).open("w", encoding="utf-8") as f:
            for p in preds:
                f.write(json.dumps(p, ensure_ascii=False) + "\n")
        (tmp / SUMMARY).write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    # in a job: published only while its worker holds the lease
    return atomic_dir(dest, write, before_publish=lambda: fence.guard(f"evaluation {dest}"), replace=False)
