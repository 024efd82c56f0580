"""`tunix-rt eval` and `tunix-rt compare`: parse flags, call the stage, print.

torch/jax load inside the commands (through the runner), so `tunix-rt --help` stays fast."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tunix_rt import devices
from tunix_rt.errors import BadInput
from tunix_rt.eval.generate import DecodeConfig

out = Console()
err = Console(stderr=True)


def eval_cmd(
    dataset: Annotated[Optional[str], typer.Option("--dataset", "-d", help="Dataset NAME, NAME@VERSION, or a trace JSONL path (required unless --harness).")] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Catalog name or HF model dir (a run's final/merged too). Optional with --adapter RUN: the run's base model.")] = None,
    adapter: Annotated[Optional[str], typer.Option("--adapter", help="A run id, a run dir, or a PEFT adapter dir.")] = None,
    split: Annotated[Optional[str], typer.Option("--split", help="train | dev | test | all (default: dev; all for a JSONL path; test: reasoning-gym datasets).")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", help="Only the first N records of the split.")] = None,
    engine: Annotated[str, typer.Option("--engine", help="auto | torch | jax (auto: JAX for gpu/tpu or where torch is missing, as train picks)")] = "auto",
    device: Annotated[str, typer.Option("--device", help=devices.HELP)] = "auto",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Most tokens generated per item.")] = DecodeConfig.max_new_tokens,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Prompts decoded together.")] = DecodeConfig.batch_size,
    temperature: Annotated[float, typer.Option("--temperature", help="0 = greedy; above 0 samples.")] = DecodeConfig.temperature,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass (sampling only).")] = DecodeConfig.top_p,
    top_k: Annotated[int, typer.Option("--top-k", help="Keep the k most likely tokens (0: all; sampling only).")] = DecodeConfig.top_k,
    seed: Annotated[int, typer.Option("--seed", help="Sampling seed.")] = DecodeConfig.seed,
    tools: Annotated[Optional[str], typer.Option("--tools", help="Tools the model may call while it decodes: calculator,python, or none (default: the run's own tools; none for a catalog model).")] = None,
    samples: Annotated[int, typer.Option("--samples", help="Completions per item (needs --temperature > 0): reports pass@k and maj@K; sample j of item i is seeded by (seed, i, j).")] = 1,
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Write the eval here (default: runs/<run>/eval/<eval_id>/ for a run, else <home>/evals/<eval_id>/).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print eval_summary.json instead of the table.")] = False,
    judge: Annotated[Optional[Path], typer.Option("--judge", help="A YAML judge config (url, model, rubric, score_pattern, …): adds judge_score.")] = None,
    harness: Annotated[Optional[str], typer.Option("--harness", help="Run lm-evaluation-harness tasks instead (comma-separated: gsm8k_cot,arc_easy,… or local ones): one eval per task.")] = None,
    harness_include: Annotated[Optional[Path], typer.Option("--harness-include", help="A directory of lm-eval task YAMLs (searched before lm-eval's own).")] = None,
    harness_fewshot: Annotated[Optional[int], typer.Option("--harness-fewshot", help="Few-shot examples per prompt (default: each task's own).")] = None,
    harness_plain: Annotated[bool, typer.Option("--harness-plain", help="lm-eval's plain-text prompts (no chat turns, no system prompt).")] = False,
    weights: Annotated[str, typer.Option("--weights", help="fp32 | int8 | int4: decode with weight-only int8 or int4 weights (torch engine, Gemma 3/2; faster, not bit-exact).")] = "fp32",
) -> None:
    """Evaluate a base model, a run's LoRA adapter or a merged model on a dataset split:
    writes predictions.jsonl and eval_summary.json. With --harness: lm-eval's tasks on the
    same model, one eval per task (tunix_rt.eval.harness)."""
    if harness is not None:
        if dataset or split or judge or samples != 1 or weights != "fp32":
            raise BadInput("--harness runs lm-eval's tasks: --dataset, --split, --judge, --samples and --weights do not apply")
        return harness_cmd(harness, model, adapter, harness_include, harness_fewshot, not harness_plain, limit, engine,
                           device, DecodeConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                                top_k=top_k, seed=seed, batch_size=batch_size,
                                                tools=tool_names(tools) or ()), out_dir, as_json)
    if not dataset:
        raise BadInput("--dataset is required (or --harness TASKS)")
    from tunix_rt.eval.runner import EvalRequest, run_eval
    from tunix_rt.rundir import SUMMARY

    decode = DecodeConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                          top_k=top_k, seed=seed, batch_size=batch_size)
    from tunix_rt.eval.judge import JudgeConfig

    req = EvalRequest(dataset=dataset, model=model, adapter=adapter, split=split, limit=limit,
                      engine=engine, device=device, decode=decode, samples=samples, out=out_dir, tools=tool_names(tools),
                      judge=JudgeConfig.from_yaml(judge) if judge else None, weights=weights)
    with GenerationProgress() as progress:
        path = run_eval(req, on_start=progress.start, on_tokens=progress.advance)
    from tunix_rt.registry.record import record_eval

    record_eval(path)
    summary = json.loads((path / SUMMARY).read_text(encoding="utf-8"))
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary, path)


def harness_cmd(tasks: str, model, adapter, include, fewshot, chat: bool, limit, engine: str, device: str,
                decode: DecodeConfig, out_dir, as_json: bool) -> None:
    """`tunix-rt eval --harness`: run lm-eval, record each task's eval, print the figures."""
    from tunix_rt.eval.harness import HarnessRequest, parse_tasks, run_harness
    from tunix_rt.registry.record import record_eval
    from tunix_rt.rundir import SUMMARY

    req = HarnessRequest(tasks=parse_tasks(tasks), model=model, adapter=adapter, include=include, num_fewshot=fewshot,
                         chat=chat, limit=limit, engine=engine, device=device, decode=decode, out=out_dir)
    with GenerationProgress() as progress:
        paths, _ = run_harness(req, on_start=progress.start, on_tokens=progress.advance)
    summaries = []
    for path in paths:
        record_eval(path)
        summaries.append(json.loads((path / SUMMARY).read_text(encoding="utf-8")))
    if as_json:
        print(json.dumps(summaries, indent=2))
        return
    t = Table(title=f"lm-eval on {summaries[0]['model'] if summaries else model} (adapter: "
                    f"{summaries[0]['adapter'] if summaries else adapter})")
    for col in ("task", "metric", "value", "stderr", "n"):
        t.add_column(col, justify="left" if col in ("task", "metric") else "right")
    for s in summaries:
        figures = s["harness"]["results"]
        for key, value in s["metrics"].items():
            if "," in key:
                stderr = figures.get(key.replace(",", "_stderr,", 1))
                t.add_row(s["harness"]["task"], key, f"{value:.4f}",
                          f"{stderr:.4f}" if isinstance(stderr, (int, float)) else "-", str(s["metrics"]["n"]))
    out.print(t)
    for path in paths:
        out.print(f"wrote {escape(str(path))}", highlight=False)


class GenerationProgress:
    """A rich progress bar over generated tokens (the total is the max_new_tokens budget,
    so it ends early when items stop), with tokens/s."""

    def __init__(self):
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

        self._p = Progress(TextColumn("[bold]eval"), BarColumn(), TaskProgressColumn(),
                           TextColumn("{task.completed:,.0f} tok"), TextColumn("{task.fields[tps]} tok/s"),
                           TimeElapsedColumn(), console=err, transient=True)
        self._task = None

    def __enter__(self) -> "GenerationProgress":
        self._p.start()
        return self

    def __exit__(self, *exc) -> None:
        self._p.stop()

    def start(self, n_prompts: int, max_tokens: int) -> None:
        self._task = self._p.add_task("eval", total=max_tokens, tps="-")

    def advance(self, n: int) -> None:
        self._p.advance(self._task, n)
        task = self._p.tasks[self._task]
        if task.elapsed:
            self._p.update(self._task, tps=f"{task.completed / task.elapsed:,.1f}")


def print_summary(s: dict, path: Path) -> None:
    m, d = s["metrics"], s["dataset"]
    t = Table(title=f"{s['model']} (adapter: {s['adapter']}) on {d['name']}@{d['version']} {d['split']} (n={d['n']})")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k in ("accuracy", "format_rate", "answer_found_rate", "lenient_accuracy", "truncated_rate",
              "arith_accuracy", "arith_reward", "arith_claims_per_item"):
        if k in m:  # arith_*: summaries written before they existed lack them
            t.add_row(k, f"{m[k]:.3f}")
    from tunix_rt.eval.passk import sampled_metric_names

    for k in sampled_metric_names(m):
        t.add_row(k, f"{m[k]:.3f}")
    t.add_row("mean_completion_tokens", f"{m['mean_completion_tokens']:.1f}")
    t.add_row("tokens/s", f"{s['tokens_per_s']:.1f}")
    floor = s.get("constant_baseline")  # held-out splits only; older summaries lack it
    if floor:
        t.add_row(f'always "{escape(floor["answer"][:24])}" (constant baseline)', f"{floor['accuracy']:.3f}")
    out.print(t)
    if len(s["by_category"]) > 1:
        per = (floor or {}).get("by_category", {})
        c = Table(title="by category")
        for col in ("category", "n", "accuracy", "format_rate", "constant baseline"):
            c.add_column(col, justify="right" if col != "category" else "left")
        for cat, cm in s["by_category"].items():
            b = per.get(cat)
            c.add_row(cat, str(cm["n"]), f"{cm['accuracy']:.3f}", f"{cm['format_rate']:.3f}",
                      f"{b['accuracy']:.3f}" if b else "")
        out.print(c)
    out.print(f"wrote {escape(str(path))}", highlight=False)


def compare_cmd(
    a: Annotated[str, typer.Argument(help="Baseline: an eval dir, an eval_summary.json, an eval id, or a run (its latest eval).")],
    b: Annotated[str, typer.Argument(help="Candidate, same forms as A; --fail-below applies to it.")],
    fail_below: Annotated[Optional[list[str]], typer.Option("--fail-below", help="METRIC=VALUE: exit 1 when B's metric is under VALUE (repeatable).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as one JSON object.")] = False,
) -> None:
    """Compare two evaluations: metrics with deltas, per-item flips, exact McNemar p-value."""
    from tunix_rt.eval.compare import compare, load_eval, parse_bars
    from tunix_rt.home import Home

    home = Home.resolve()
    bars = parse_bars(fail_below or [])
    result = compare(load_eval(a, home), load_eval(b, home), bars)
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print_compare(result)
    if not result["passed"]:
        raise typer.Exit(1)


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:d}" if isinstance(v, int) else f"{v:.3f}"


def print_compare(r: dict) -> None:
    t = Table(title="A: " + r["a"]["label"] + "\nB: " + r["b"]["label"])
    for col in ("metric", "A", "B", "B - A"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for row in r["metrics"]:
        delta = row["delta"]
        style = "" if not delta else ("green" if delta > 0 else "red")
        if row["metric"] in ("truncated_rate", "mean_completion_tokens", "n"):
            style = ""  # neither better nor worse by sign alone
        shown = "-" if delta is None else (f"{delta:+d}" if isinstance(delta, int) else f"{delta:+.3f}")
        t.add_row(row["metric"], _fmt(row["a"]), _fmt(row["b"]), f"[{style}]{shown}[/{style}]" if style else shown)
    out.print(t)
    if not r["same_dataset"]:
        out.print("[yellow]warning:[/yellow] A and B were evaluated on different datasets or splits")
    out.print(f"shared items {r['shared']}: both right {r['both_right']}, both wrong {r['both_wrong']}, "
              f"right→wrong {len(r['right_to_wrong'])}, wrong→right {len(r['wrong_to_right'])}")
    for label, ids in (("right→wrong", r["right_to_wrong"]), ("wrong→right", r["wrong_to_right"])):
        if ids:
            shown = ", ".join(ids[:10]) + (f", … (+{len(ids) - 10})" if len(ids) > 10 else "")
            out.print(f"  {label}: {escape(shown)}", highlight=False)
    t1 = r.get("pass1")
    if t1 is None:
        out.print(f"McNemar exact p = {r['mcnemar_p']:.4g}")
    else:  # a sampled eval: `correct` is its maj@K answer's
        out.print(f"McNemar exact p = {r['mcnemar_p']:.4g} (per-item correctness: A {t1['a_correct_is']}, "
                  f"B {t1['b_correct_is']})")
        out.print(f"pass@1 over {t1['items']} shared items: A {t1['a']:.3f}, B {t1['b']:.3f} "
                  f"(B - A {t1['delta']:+.3f}); paired sign-flip test over per-item pass rates, exact p = {t1['p']:.4g}")
    for bar in r["bars"]:
        ok = bar not in r["failed_bars"]
        out.print(f"{'[green]pass' if ok else '[red]FAIL'}[/] B {bar['metric']} = {_fmt(bar['value'])} "
                  f"(bar {bar['bar']:g})")


def tool_names(text: str | None) -> tuple[str, ...] | None:
    """--tools: None (the run's own), "none" (no tools) or comma-separated names (checked by
    DecodeConfig)."""
    if text is None:
        return None
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    return () if names in ((), ("none",)) else names
