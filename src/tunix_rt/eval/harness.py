"""`tunix-rt eval --harness TASKS`: EleutherAI's lm-evaluation-harness (`lm-eval`, the
`harness` extra) on a catalog model, a run's merged export or a run's LoRA adapter, its
figures written as ordinary evaluations so the registry, the leaderboard and `compare`
show them beside our own.

The model adapter is ours, not lm-eval's `hf` backend. `TunixRtLM` (registered with lm-eval
as "tunix-rt") answers lm-eval's three requests with our own parts:
- `generate_until` runs the eval stage's Generator (`runner.make_generator`): the same
  model loading (fp32, LoRA merged in memory, so a LoRA run needs no merged export), the
  same decode loop, stop tokens and sampling as `tunix-rt eval`, on either engine. The
  harness then measures the decoding we ship, and its figure can be checked against ours
  item by item (tests/eval/test_harness.py does). The `hf` backend would decode with
  transformers' `generate`, tokenize our control tokens out of text, and need a merged
  export for every LoRA run.
- `loglikelihood` / `loglikelihood_rolling` (multiple-choice and perplexity tasks such as
  arc_easy) score continuations with one batched forward of the same torch model: left
  padding with positions that count real tokens (as the generator pads), logits only at
  the scored positions (Gemma's 262K-token head over every position would not fit).
  They need the torch engine.

Prompts. By default lm-eval's chat path is used with our Gemma turn format and the run's
system prompt (`system_instruction`): a task whose doc_to_text is the question gets exactly
the prompt ids `tunix-rt eval` and training use (render.prompt_ids), few-shot examples
become earlier turns. lm-eval passes prompts as text, and our control tokens are ids that
user text can never forge (models.tokenizer), so `apply_chat_template` keeps the ids of
each chat it renders under the text it returns, and `generate_until` looks the text up.
`chat=False` (`--harness-plain`) gives lm-eval's base-model prompts: BOS + the task's text.

Decoding. A task's `generation_kwargs` decide (`until`, `max_gen_toks`, `do_sample`,
`temperature`, `top_p`, `top_k`); the CLI's decoding flags fill in what a task leaves
out. `until` strings cut the completion where they first appear (the generator itself stops
at <end_of_turn> and <eos>).

Results. One evaluation directory per leaf task, in the eval stage's layout and places
(runs/<run>/eval/<eval_id>/ for a run, else <home>/evals/<eval_id>/, or under --out):
dataset `lm-eval:<task>` at the task's version; `metrics.accuracy` is the task's first
metric under its first filter (`exact_match,strict-match` for gsm8k_cot, `acc,none` for
arc_easy), and every figure lm-eval reports is kept under lm-eval's own name
(`exact_match,flexible-extract`, …), its standard errors and the task config in the
summary's `harness` block. predictions.jsonl has one line per document: its `id` (the
document's own `id` field when the documents have unique ones, else lm-eval's doc_id), the
completion (for a multiple-choice item: the choice with the highest log-likelihood), the
answer the primary filter extracted, and `correct` when the primary metric gave the item
full marks (1).

Offline: local tasks (`--harness-include DIR`: task YAMLs with `dataset_path: json` and
`dataset_kwargs.data_files`) need nothing from the network; standard tasks (gsm8k_cot,
arc_easy, …) are lm-eval's own and lm-eval downloads their data. Nothing runs remote code:
our loader reads safetensors, and the pinned `datasets` no longer runs dataset scripts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from tunix_rt.devices import resolve_device
from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.eval.generate import (FINISH_STOP, DecodeConfig, Generation, left_pad, length_sorted_batches,
                                    position_ids)
from tunix_rt.eval.runner import (NO_ADAPTER, NO_RUN, EvalRequest, Target, make_generator, new_eval_id,
                                  resolve_target, write_eval_dir)
from tunix_rt.home import Home
from tunix_rt.render import parse_completion, prompt_ids
from tunix_rt.rundir import EVALS

if TYPE_CHECKING:
    from lm_eval.api.instance import Instance

    from tunix_rt.eval.generate import Generator
    from tunix_rt.models.tokenizer import ChatTokenizer

log = logging.getLogger("tunix_rt.eval.harness")

DATASET_PREFIX = "lm-eval:"
"""An lm-eval task's evaluations are of dataset `lm-eval:<task>`."""
SCORED = "scored"
"""finish_reason of an item lm-eval scored by log-likelihood (nothing was generated)."""
LOGIT_BUDGET = 256
"""Rows x positions of logits one scoring forward makes (x the vocabulary, in fp32)."""
_GEN_KEYS = ("until", "max_gen_toks", "do_sample", "temperature", "top_p", "top_k")


def parse_tasks(spec: str) -> tuple[str, ...]:
    """'gsm8k_cot, arc_easy' -> ('gsm8k_cot', 'arc_easy')."""
    tasks = tuple(t.strip() for t in spec.split(",") if t.strip())
    if not tasks:
        raise BadInput("--harness: give one or more lm-eval task names, comma-separated")
    return tasks


@dataclass(frozen=True)
class HarnessRequest:
    """One `tunix-rt eval --harness` invocation; defaults live here."""

    tasks: tuple[str, ...]
    """lm-eval task, group or tag names (or task YAML paths)."""
    model: str | None = None
    adapter: str | None = None
    include: Path | None = None
    """A directory of task YAMLs (lm-eval's include_path), searched before lm-eval's own."""
    num_fewshot: int | None = None
    """None: each task's own default."""
    chat: bool = True
    """Our Gemma turns with the run's system prompt; False: lm-eval's plain-text prompts."""
    limit: int | None = None
    """Only the first N documents of each task."""
    engine: str = "auto"
    device: str = "auto"
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    out: Path | None = None
    """Write each task's eval to out/<task>/ (out must not exist yet, or be empty)."""

    def __post_init__(self) -> None:
        if not self.tasks or not all(isinstance(t, str) and t.strip() for t in self.tasks):
            raise BadInput("--harness: give one or more lm-eval task names")
        if self.include is not None and not Path(self.include).is_dir():
            raise BadInput(f"--harness-include {self.include}: not a directory")
        if self.num_fewshot is not None and self.num_fewshot < 0:
            raise BadInput(f"--harness-fewshot must be >= 0, got {self.num_fewshot}")
        if self.out is not None and Path(self.out).exists() and any(Path(self.out).iterdir()):
            raise BadInput(f"--out {self.out}: exists and is not empty (each task writes out/<task>/)")
        self.eval_request()  # model/adapter/engine/device/limit checked as `tunix-rt eval` checks them

    def eval_request(self) -> EvalRequest:
        """The eval stage's request for the same model (its checks and target resolution)."""
        return EvalRequest(dataset=DATASET_PREFIX + ",".join(self.tasks), model=self.model, adapter=self.adapter,
                           limit=self.limit, engine=self.engine, device=self.device, decode=self.decode)


# ---------------------------------------------------------------------------------------
# The model adapter


def decode_for(base: DecodeConfig, gen_kwargs: dict) -> tuple[DecodeConfig, list[str]]:
    """A task's generation_kwargs over the CLI's decoding: (DecodeConfig, until strings)."""
    kw = dict(gen_kwargs or {})
    ignored = sorted(k for k in kw if k not in _GEN_KEYS)
    if ignored:
        log.warning("lm-eval generation_kwargs not supported, ignored: %s", ", ".join(ignored))
    until = kw.get("until") or []
    until = [until] if isinstance(until, str) else [u for u in until if u]
    temperature = base.temperature
    if kw.get("do_sample") is False:
        temperature = 0.0
    elif kw.get("temperature") is not None:
        temperature = float(kw["temperature"])
    elif kw.get("do_sample") is True and temperature == 0.0:
        temperature = 1.0  # sampling asked for without a temperature: transformers' default
    cfg = replace(base, max_new_tokens=int(kw.get("max_gen_toks") or base.max_new_tokens), temperature=temperature,
                  top_p=float(kw.get("top_p", base.top_p)), top_k=int(kw.get("top_k") or base.top_k))
    return cfg, until


def cut_at(text: str, until: Sequence[str]) -> tuple[str, bool]:
    """The text before the first stop string, and whether one was found."""
    cut = min((i for i in (text.find(u) for u in until) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def chat_ids(messages: Sequence[dict], tok: "ChatTokenizer", add_generation_prompt: bool = True) -> list[int]:
    """lm-eval's chat (system?, user, assistant, user, …) in our Gemma turns. The first user
    turn is render.prompt_ids (the system prompt inside it); an assistant turn fills the open
    model turn; a final assistant message (a task's gen_prefix) is left open."""
    msgs = list(messages)
    system = msgs.pop(0)["content"] if msgs and msgs[0].get("role") == "system" else ""
    if not msgs or msgs[0].get("role") != "user":
        raise TunixRtError(f"lm-eval chat must start with a user turn (after an optional system one): {messages!r}")
    ids = prompt_ids(msgs[0]["content"], tok, system)
    expect = "assistant"
    for i, m in enumerate(msgs[1:], 1):
        if m.get("role") != expect:
            raise TunixRtError(f"lm-eval chat: turn {i} is {m.get('role')!r}, expected {expect!r}")
        last = i == len(msgs) - 1
        if expect == "assistant":
            ids += tok.encode(m["content"])
            if not (last and not add_generation_prompt):
                ids += [tok.eot_id] + tok.encode("\n")
        else:
            ids += [tok.sot_id] + tok.encode("user\n" + m["content"]) + [tok.eot_id] + tok.encode("\n")
            ids += [tok.sot_id] + tok.encode("model\n")
        expect = "user" if expect == "assistant" else "assistant"
    return ids


@register_model("tunix-rt")
class TunixRtLM(LM):
    """lm-eval's LM interface over our Generator (generation) and the torch model (scoring).

    Build it with `TunixRtLM.open(...)`, or through lm-eval as model "tunix-rt" with
    model_args model=…, adapter=…, engine=…, device=…, batch_size=…, max_new_tokens=…."""

    def __init__(self, generator: "Generator", tok: "ChatTokenizer", decode: DecodeConfig, *,
                 scorer=None, device: str = "cpu", on_start: Callable[[int, int], None] | None = None,
                 on_tokens: Callable[[int], None] | None = None):
        super().__init__()
        self.generator = generator
        self.tok = tok
        self.decode = decode
        self.scorer = scorer
        """The torch causal LM scoring log-likelihoods (None: this engine cannot)."""
        self.scoring_device = device
        self.on_start, self.on_tokens = on_start, on_tokens
        self.chats: dict[str, list[int]] = {}
        """Text apply_chat_template returned -> the ids it stands for."""
        self.questions: dict[str, str] = {}
        """Context text -> the last user message in it (the question shown in predictions)."""
        self.generations: dict[tuple[str, str], Generation] = {}
        """(context, generation kwargs) -> what our generator produced for it."""

    @classmethod
    def open(cls, target: Target, engine: str, device: str, decode: DecodeConfig, home: Home,
             **callbacks) -> "TunixRtLM":
        """Load the target's tokenizer and model as `tunix-rt eval` does."""
        from tunix_rt.models.store import load_tokenizer

        tok = load_tokenizer(target.tokenizer, home)
        device = resolve_device(engine, device)
        gen = make_generator(engine, target, tok, device)
        decode = target.decode(decode, decode.tools or None)  # the run's tools unless some were asked
        return cls(gen, tok, decode, scorer=getattr(gen, "model", None), device=device, **callbacks)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None):
        args = {**{k: v for k, v in (additional_config or {}).items() if v is not None}, **arg_dict}
        decode = DecodeConfig(batch_size=int(args.get("batch_size") or DecodeConfig.batch_size),
                              max_new_tokens=int(args.get("max_new_tokens") or DecodeConfig.max_new_tokens))
        req = EvalRequest(dataset=DATASET_PREFIX, model=args.get("model"), adapter=args.get("adapter"),
                          engine=str(args.get("engine", "auto")), device=str(args.get("device") or "auto"),
                          decode=decode)
        home = Home.resolve().ensure()
        return cls.open(resolve_target(req, home), req.engine, req.device, decode, home)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    # -- prompts --------------------------------------------------------------------------

    @property
    def tokenizer_name(self) -> str:
        return "tunix-rt-gemma-turns:" + self.tok.source

    def chat_template(self, chat_template: bool | str = False) -> str:
        return "tunix-rt Gemma turns (render.prompt_ids)"

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        ids = chat_ids(chat_history, self.tok, add_generation_prompt)
        text = self.tok.decode(ids)
        if self.chats.setdefault(text, ids) != ids:
            raise TunixRtError(f"two lm-eval chats render the same text with different ids: {text[:200]!r}")
        users = [m["content"] for m in chat_history if m.get("role") == "user"]
        self.questions[text] = users[-1] if users else text
        return text

    def context_ids(self, context: str) -> list[int]:
        """A chat we rendered, or plain text after BOS (lm-eval's base-model prompts)."""
        if context in self.chats:
            return list(self.chats[context])
        return [self.tok.bos_id] + self.tok.encode(context)

    def question_of(self, context: str) -> str:
        return self.questions.get(context, context)

    # -- generation -----------------------------------------------------------------------

    def generate_until(self, requests: list["Instance"], disable_tqdm: bool = False) -> list[str]:
        """Each distinct generation_kwargs is one call of our generator, prompts in order."""
        out: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(_kwargs_key(r.args[1]), []).append(i)
        for key, idx in groups.items():
            cfg, until = decode_for(self.decode, requests[idx[0]].args[1])
            prompts = [self.context_ids(requests[i].args[0]) for i in idx]
            if self.on_start:
                self.on_start(len(prompts), len(prompts) * cfg.max_new_tokens)
            gens = self.generator.generate(prompts, cfg, self.on_tokens)
            for i, g in zip(idx, gens):
                text, cut = cut_at(g.text, until)
                if cut:
                    g = replace(g, text=text, finish_reason=FINISH_STOP)
                self.generations[(requests[i].args[0], key)] = g
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
                out[i] = text
        return out  # type: ignore[return-value]

    # -- scoring --------------------------------------------------------------------------

    def loglikelihood(self, requests: list["Instance"], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [self.pair_ids(*r.args) for r in requests]
        res = self.score(pairs)
        for r, v in zip(requests, res):
            self.cache_hook.add_partial("loglikelihood", r.args, v)
        return res

    def pair_ids(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context ids, continuation ids). After a chat we rendered the continuation is
        encoded apart, as training encodes the model turn; after plain text as lm-eval's hf
        model does: encode the whole, split after the context's ids, trailing spaces of the
        context moved to the continuation."""
        if context in self.chats:
            return list(self.chats[context]), self.tok.encode(continuation)
        if context == "":
            return [self.tok.bos_id], self.tok.encode(continuation)
        n = len(context) - len(context.rstrip())
        if n:
            context, continuation = context[:-n], context[-n:] + continuation
        ctx = self.context_ids(context)
        whole = self.context_ids(context + continuation)
        return ctx, whole[len(ctx):]

    def loglikelihood_rolling(self, requests: list["Instance"], disable_tqdm: bool = False) -> list[float]:
        """Each string in disjoint windows of the model's context length after BOS."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        out = []
        for r in requests:
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok.encode(r.args[0]), prefix_token=self.tok.bos_id,
                max_seq_len=self.max_length, context_len=1)]
            total = sum(ll for ll, _ in self.score([(list(a), list(b)) for a, b in windows]))
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, total)
            out.append(total)
        return out

    @property
    def max_length(self) -> int:
        if self.scorer is None:
            return 2048
        return int(getattr(self.scorer.config, "max_position_embeddings", None) or 2048)

    def score(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum of the continuation's log-probabilities, whether greedy decoding yields it)
        per (context ids, continuation ids); the input is cut on the left to max_length."""
        import torch

        if self.scorer is None:
            raise BadInput("this lm-eval task scores log-likelihoods (multiple choice, perplexity): "
                           "it needs --engine torch")
        for ctx, cont in pairs:
            if not cont or len(cont) > self.max_length:
                raise TunixRtError(f"cannot score a continuation of {len(cont)} tokens (1..{self.max_length})")
        inputs = [(ctx + cont)[:-1][-self.max_length:] for ctx, cont in pairs]
        out: list[tuple[float, bool] | None] = [None] * len(pairs)
        with torch.inference_mode():
            for batch in length_sorted_batches(inputs, self.decode.batch_size):
                conts = [torch.tensor(pairs[i][1], device=self.scoring_device) for i in batch]
                sums, greedy = self._score_batch([inputs[i] for i in batch], conts)
                for i, s, g in zip(batch, sums, greedy):
                    out[i] = (s, g)
        return out  # type: ignore[return-value]

    def _score_batch(self, inputs: list[list[int]], conts: list) -> tuple[list[float], list[bool]]:
        """One left-padded batch; the continuation of each row ends at the last column, so
        the k = longest continuation last columns hold every scored position. Logits are made
        for a slice of those columns at a time (LOGIT_BUDGET rows x positions)."""
        import torch

        ids, mask = left_pad(inputs, self.tok.pad_id, self.scoring_device)
        pos = position_ids(mask)
        width, k = ids.shape[1], max(len(c) for c in conts)
        chunk = max(1, LOGIT_BUDGET // len(inputs))
        sums, greedy = [0.0] * len(inputs), [True] * len(inputs)
        for s in range(0, k, chunk):
            e = min(s + chunk, k)
            keep = torch.arange(width - k + s, width - k + e, device=self.scoring_device)
            logits = self.scorer(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                                 logits_to_keep=keep).logits
            logp = logits.float().log_softmax(-1)
            for r, c in enumerate(conts):
                first = k - len(c)  # the row's first scored column, counted from width - k
                lo = max(s, first)
                if lo >= e:
                    continue
                want, rows = c[lo - first: e - first], logp[r, lo - s: e - s]
                sums[r] += float(rows.gather(-1, want[:, None]).sum())
                greedy[r] = greedy[r] and bool((rows.argmax(-1) == want).all())
        return sums, greedy


def _kwargs_key(gen_kwargs: Any) -> str:
    return json.dumps(gen_kwargs, sort_keys=True, default=str)


def _plain(obj: Any) -> Any:
    """JSON-ready: a task config may hold functions (`!function utils.x`); they become text."""
    return json.loads(json.dumps(obj, default=str))


# ---------------------------------------------------------------------------------------
# The stage


def task_manager(tasks: Sequence[str], include: Path | None):
    """lm-eval's TaskManager: only the include dir when it holds every task (indexing
    lm-eval's own ~15k task files takes seconds), else the include dir over lm-eval's own."""
    from lm_eval.tasks import TaskManager

    def unknown_in(tm) -> list[str]:
        return [t for t in tasks if t not in tm.all_tasks and not (t.endswith((".yaml", ".yml")) and Path(t).is_file())]

    if include is not None:
        local = TaskManager(include_path=str(include), include_defaults=False)
        if not unknown_in(local):
            return local
    tm = TaskManager(include_path=str(include) if include else None)
    unknown = unknown_in(tm)
    if unknown:
        where = f" or in {include}" if include else ""
        raise BadInput(f"--harness: unknown lm-eval task(s) {', '.join(unknown)} (not among lm-eval's tasks{where})")
    return tm


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_harness(req: HarnessRequest, home: Home | None = None,
                on_start: Callable[[int, int], None] | None = None,
                on_tokens: Callable[[int], None] | None = None) -> tuple[list[Path], dict]:
    """Run lm-eval and write one eval dir per leaf task; returns (the dirs, lm-eval's
    results without its per-sample logs)."""
    from lm_eval import simple_evaluate
    from tunix_rt.train import engines

    ereq = req.eval_request()
    engines.require(ereq.engine)
    home = (home or Home.resolve()).ensure()
    started, t0 = _now(), time.perf_counter()
    target = resolve_target(ereq, home)
    tm = task_manager(req.tasks, req.include)
    lm = TunixRtLM.open(target, ereq.engine, ereq.device, req.decode, home, on_start=on_start, on_tokens=on_tokens)
    system = target.system_prompt if req.chat else None
    results = simple_evaluate(model=lm, tasks=list(req.tasks), num_fewshot=req.num_fewshot, limit=req.limit,
                              task_manager=tm, log_samples=True, apply_chat_template=req.chat,
                              fewshot_as_multiturn=req.chat, system_instruction=system,
                              confirm_run_unsafe_code=False)
    if results is None:
        raise TunixRtError("lm-eval returned no results")
    samples = results.pop("samples", {})
    common = {
        "model": target.model,
        "model_path": str(target.model_dir.resolve()),
        "adapter": str(target.adapter_dir.resolve()) if target.adapter_dir else NO_ADAPTER,
        "run_id": target.run_dir.name if target.run_dir else NO_RUN,
        "engine": ereq.engine,
        "device": lm.scoring_device,
        "system_prompt": system or "",
        "started_at": started,
    }
    written = []
    for task, task_samples in samples.items():
        summary, preds = task_eval(task, task_samples, results, lm, req, common)
        summary["finished_at"] = _now()
        summary["duration_s"] = round(time.perf_counter() - t0, 3)
        dest = _dest(req, target, home, task, summary["dataset"]["split"])
        summary["eval_id"] = dest.name
        written.append(write_eval_dir(dest, preds, {"eval_id": dest.name, **summary}))
    return written, results


def _dest(req: HarnessRequest, target: Target, home: Home, task: str, split: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in task).strip("-.") or "task"
    if req.out is not None:
        return Path(req.out) / safe
    root = target.run_dir / EVALS if target.run_dir else home.root / "evals"
    return root / new_eval_id(f"lm-eval-{safe}", split)


def primary_metric(task: str, results: dict) -> tuple[str, str]:
    """(metric, filter) of the task's headline: its first metric under its first filter."""
    cfg = results.get("configs", {}).get(task, {})
    figures = results["results"].get(task, {})
    metrics = [m["metric"] for m in cfg.get("metric_list") or [] if isinstance(m.get("metric"), str)]
    filters = [f["name"] for f in cfg.get("filter_list") or [] if isinstance(f, dict) and f.get("name")] or ["none"]
    for m in metrics:
        for f in filters:
            if isinstance(figures.get(f"{m},{f}"), (int, float)):
                return m, f
    for key, v in figures.items():  # a task configured otherwise: its first figure
        if "," in key and "_stderr" not in key and isinstance(v, (int, float)):
            m, f = key.split(",", 1)
            return m, f
    raise TunixRtError(f"lm-eval task {task}: no metric in its results {sorted(figures)}")


def task_eval(task: str, task_samples: list[dict], results: dict, lm: TunixRtLM, req: HarnessRequest,
              common: dict) -> tuple[dict, list[dict]]:
    """(eval_summary, predictions) of one lm-eval task."""
    metric, filt = primary_metric(task, results)
    figures = results["results"][task]
    cfg = results.get("configs", {}).get(task, {})
    rows = sorted((s for s in task_samples if s.get("filter", "none") == filt), key=lambda s: s["doc_id"])
    docs = [s["doc"] for s in rows]
    ids = [str(d.get("id")) if isinstance(d, dict) else "" for d in docs]
    if not all(ids) or len(set(ids)) != len(ids):
        ids = [str(s["doc_id"]) for s in rows]
    preds = [prediction(i, s, metric, lm) for i, s in zip(ids, rows)]
    generated = [p for p in preds if p["finish_reason"] != SCORED]
    n = len(preds)
    scores: dict[str, Any] = {"accuracy": figures[f"{metric},{filt}"], "n": n}
    if generated:
        scores["format_rate"] = sum(p["format_ok"] for p in generated) / len(generated)
        scores["mean_completion_tokens"] = sum(p["n_tokens"] for p in generated) / len(generated)
        scores["truncated_rate"] = sum(p["finish_reason"] == "length" for p in generated) / len(generated)
    scores.update({k: v for k, v in figures.items()
                   if "," in k and "_stderr" not in k and isinstance(v, (int, float)) and not isinstance(v, bool)})
    gen_kwargs = cfg.get("generation_kwargs") or {}
    decode = decode_for(req.decode, gen_kwargs)[0] if cfg.get("output_type") == "generate_until" else req.decode
    summary = {
        **common,
        "dataset": {"name": DATASET_PREFIX + task, "version": str(results.get("versions", {}).get(task, "")),
                    "split": str(cfg.get("test_split") or cfg.get("validation_split") or "test"),
                    "sha256": hashlib.sha256(json.dumps(docs, sort_keys=True, default=str).encode()).hexdigest(),
                    "n": n},
        "decoding": decode.to_dict(),
        "metrics": scores,
        "by_category": {},
        "harness": {
            "task": task,
            "lm_eval_version": results.get("lm_eval_version"),
            "primary_metric": f"{metric},{filt}",
            "output_type": cfg.get("output_type"),
            "num_fewshot": results.get("n-shot", {}).get(task),
            "chat": req.chat,
            "limit": req.limit,
            "results": _plain(figures),
            "n_samples": results.get("n-samples", {}).get(task),
            "config": _plain(cfg),
        },
    }
    return summary, preds


def prediction(item_id: str, sample: dict, metric: str, lm: TunixRtLM) -> dict:
    """One predictions.jsonl line from an lm-eval sample (DESIGN §2 fields)."""
    args = sample["arguments"]
    context = args[0][0]
    target = sample.get("target")
    score = sample.get(metric)
    correct = isinstance(score, (int, float)) and float(score) == 1.0
    if sample["resps"] and sample["resps"][0] and isinstance(sample["resps"][0][0], str):
        completion = sample["resps"][0][0]
        filtered = sample.get("filtered_resps")
        answer = filtered[0] if isinstance(filtered, list) and filtered else filtered
        gen = lm.generations.get((context, _kwargs_key(args[0][1])))
        parsed = parse_completion(completion)
        reasoning, format_ok = parsed.reasoning or "", parsed.format_ok
        n_tokens, finish = (gen.n_tokens, gen.finish_reason) if gen else (0, FINISH_STOP)
    else:  # scored choices: the one with the highest log-likelihood is the model's answer
        lls = [r[0][0] if isinstance(r[0], (list, tuple)) else r[0] for r in sample["resps"]]
        best = max(range(len(lls)), key=lambda j: lls[j])
        completion = str(args[best][1]).strip()
        answer, reasoning, format_ok, n_tokens, finish = completion, "", False, 0, SCORED
        if isinstance(target, int) and 0 <= target < len(args):
            target = str(args[target][1]).strip()
    pred = {
        "id": item_id,
        "question": lm.question_of(context),
        "gold": target if isinstance(target, str) else json.dumps(target, default=str),
        "completion": completion,
        "reasoning": reasoning,
        "answer": answer if isinstance(answer, str) else json.dumps(answer, default=str),
        "correct": correct,
        "format_ok": format_ok,
        "n_tokens": n_tokens,
        "finish_reason": finish,
        "doc_id": sample["doc_id"],
    }
    if isinstance(score, (int, float)):
        pred["harness_score"] = float(score)
    return pred
