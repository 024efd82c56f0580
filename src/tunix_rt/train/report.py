"""REPORT.md of a run: what was trained, the before/after table, the training curves, the
first predictions of its evaluation, stage times and the files. Written by the demo and by
`tunix-rt submit`; the evidence it reports on is checked by tunix_rt.evidence."""

from __future__ import annotations

import json
from pathlib import Path

from tunix_rt.files import write_bytes_atomic
from tunix_rt.rundir import PREDICTIONS, REPORT, SUMMARY, Run, reward_curves
from tunix_rt.train.methods import METHODS, method_class

N_EXAMPLES = 5

ROWS = (("accuracy", "accuracy", True), ("format rate", "format_rate", True),
        ("answer found", "answer_found_rate", True), ("truncated", "truncated_rate", True),
        ("mean tokens", "mean_completion_tokens", False))


def before_after_rows(*summaries: dict) -> list[tuple[str, ...]]:
    """(metric, value per summary..., change last vs first) as display strings; shared by the
    CLI and REPORT.md (base → fine-tuned, or base → SFT → SFT+RL)."""
    rows = []
    for label, key, pct in ROWS:
        vals = [s["metrics"][key] for s in summaries]
        if pct:
            rows.append((label, *(f"{100 * v:.1f}%" for v in vals), f"{100 * (vals[-1] - vals[0]):+.1f} pt"))
        else:
            rows.append((label, *(f"{v:.1f}" for v in vals), f"{vals[-1] - vals[0]:+.1f}"))
    return rows


def write_report(run_dir: Path, eval_dir: Path, base_eval_dir: Path | None = None,
                 stage_seconds: dict[str, float] | None = None, sft_eval_dir: Path | None = None,
                 intro: str | None = None) -> Path:
    """REPORT.md: what was trained, the before/after table (when a base evaluation is
    given; base → SFT → SFT+RL with the SFT run's evaluation), the training curves (loss;
    rewards for an RL run) and the first five predictions of the evaluation (the first
    five, not the best five). `intro`: a section of the caller's, after the head (the demo's
    task)."""
    run_dir, eval_dir = Path(run_dir), Path(eval_dir)
    manifest = Run(run_dir).manifest
    tuned = json.loads((eval_dir / SUMMARY).read_text())
    base = json.loads((Path(base_eval_dir) / SUMMARY).read_text()) if base_eval_dir else None
    sft = json.loads((Path(sft_eval_dir) / SUMMARY).read_text()) if sft_eval_dir else None
    preds = [json.loads(x) for x in (eval_dir / PREDICTIONS).read_text().splitlines() if x.strip()]
    parts = [_report_head(run_dir, manifest, tuned), *([intro] if intro else []), _report_table(tuned, base, sft),
             _report_loss(run_dir), _report_examples(preds[:N_EXAMPLES])]
    if stage_seconds:
        parts.append(_report_stages(stage_seconds))
    parts.append(_report_files(run_dir, eval_dir, base_eval_dir))
    return write_bytes_atomic(run_dir / REPORT, "\n".join(parts).encode("utf-8"))


def _report_head(run_dir: Path, manifest: dict, tuned: dict) -> str:
    cfg = manifest["config"]
    ds = tuned["dataset"]
    how = (f"{cfg.get('method', 'sft')} with {cfg.get('finetune', 'lora')}"
           + (f" (rank {cfg['lora_rank']}, alpha {cfg['lora_alpha']})" if cfg.get("finetune", "lora") == "lora" else ""))
    return "\n".join([line for line in [
        f"# tunix-rt run `{run_dir.name}`", "",
        f"- model: `{cfg['model']}`, {how} on `{cfg['dataset']}` split `{cfg['split']}`",
        method_line(cfg),
        f"- training: {cfg.get('max_steps', cfg.get('epochs'))} "
        f"{'steps' if cfg.get('max_steps') else 'epochs'} of {cfg['batch_size']}×{cfg['grad_accum']} "
        f"sequences ≤ {cfg['max_seq_len']} tokens, lr {cfg['lr']}, {cfg['dtype']}, "
        f"{manifest['engine']} engine, seed {cfg['seed']}",
        f"- status: {manifest['status']}, started {manifest['started_at']}, "
        f"finished {manifest.get('finished_at', 'not finished')}",
        f"- evaluation: {ds['name']}@{ds['version']} `{ds['split']}`, n={tuned['metrics']['n']}, "
        f"decoding {json.dumps(tuned['decoding'], sort_keys=True)}",
        f"- tunix-rt {manifest['git_sha']}", "",
    ] if line is not None])


def method_line(cfg: dict) -> str | None:
    """The line of REPORT.md's head that says what the method did and with which settings: the
    method's own (its report_line, train.methods), and the run it started from; None for a
    method with nothing to add (SFT) or a name this version does not know."""
    name = cfg.get("method", "sft")
    if name not in METHODS:
        return None
    line = method_class(name).report_line(cfg)
    return None if line is None else line + (f", from run `{cfg['init']}`" if cfg.get("init") else "")


def _report_table(tuned: dict, base: dict | None, sft: dict | None = None) -> str:
    if base is None:
        lines = ["## Evaluation", "", "| metric | fine-tuned |", "| --- | ---: |"]
        for label, key, pct in ROWS:
            v = tuned["metrics"][key]
            lines.append(f"| {label} | {100 * v:.1f}% |" if pct else f"| {label} | {v:.1f} |")
        return "\n".join(lines + [""])
    if sft is not None:
        lines = ["## Base → SFT → SFT+RL (same items, same decoding)", "",
                 "| metric | base model | SFT | SFT+RL | change (RL vs base) |", "| --- | ---: | ---: | ---: | ---: |"]
        return "\n".join(lines + [f"| {' | '.join(row)} |" for row in before_after_rows(base, sft, tuned)] + [""])
    lines = ["## Before / after (same items, same decoding)", "",
             "| metric | base model | fine-tuned | change |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {' | '.join(row)} |" for row in before_after_rows(base, tuned)]
    return "\n".join(lines + [""])


def _report_loss(run_dir: Path) -> str:
    rows = Run(run_dir).metrics()
    losses = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    rewards = reward_curves(rows)
    text = ["## Training curves" if rewards else "## Training loss", "", "![loss](loss.png)", ""]
    if rewards:
        text += ["Mean reward over each step's rollouts, first five steps → last five steps:", "",
                 "| reward | first 5 steps | last 5 steps |", "| --- | --- | --- |"]
        for name, points in rewards.items():
            vals = [v for _, v in points]
            text.append(f"| {name} | {sum(vals[:5]) / len(vals[:5]):.3f} | {sum(vals[-5:]) / len(vals[-5:]):.3f} |")
        text.append("")
    text += _report_rounds(rows) + _report_preference(rows) + _report_distill(rows)
    pairs = any("rewards_margin" in r for r in rows)
    if not rewards and losses:
        first, last = losses[0], losses[-1]
        text += [f"{'Preference loss per pair' if pairs else 'Loss per supervised token'}: {first[1]:.3f} at step "
                 f"{first[0]} → {last[1]:.3f} at step {last[0]}.", ""]
    return "\n".join(text)


def _first_last(rows: list[dict], key: str, pct: bool = False) -> tuple[str, str]:
    """The mean of `key` over the first five and the last five rows that have it."""
    vals = [r[key] for r in rows if key in r]
    out = [sum(part) / len(part) for part in (vals[:5], vals[-5:])]
    return tuple(f"{100 * v:.1f}%" if pct else f"{v:.4f}" for v in out)


#: the implicit-reward statistics of a preference run (train.preference.pair_metrics)
PAIR_ROWS = (("chosen reward", "rewards_chosen", False), ("rejected reward", "rewards_rejected", False),
             ("margin (chosen − rejected)", "rewards_margin", False),
             ("accuracy (chosen reward higher)", "rewards_accuracy", True))


def _report_preference(rows: list[dict]) -> list[str]:
    """Preference optimisation (train.preference): the implicit rewards of the chosen and the
    rejected completions, their margin and accuracy, first five steps → last five (steps
    without a pair left out), and the last held-out values."""
    train = [r for r in rows if "loss" in r and "rewards_margin" in r]
    if not train:
        return []
    held = [r for r in rows if "eval_rewards_margin" in r]
    text = [f"Implicit rewards over {len(train)} steps with pairs ({sum(r['pairs'] for r in train)} pairs), "
            "first five steps → last five steps" + (f"; held out at step {held[-1]['step']}" if held else "") + ":", "",
            "| implicit reward | first 5 steps | last 5 steps |" + (" held out |" if held else ""),
            "| --- | ---: | ---: |" + (" ---: |" if held else "")]
    for label, key, pct in PAIR_ROWS:
        cell = ""
        if held:
            v = held[-1][f"eval_{key}"]
            cell = f" {100 * v:.1f}% |" if pct else f" {v:.4f} |"
        text.append(f"| {label} | {' | '.join(_first_last(train, key, pct))} |{cell}")
    return text + [""]


def _report_distill(rows: list[dict]) -> list[str]:
    """Distillation (train.distill): the KL to the teacher and the student's NLL per token,
    first five steps → last five, and the last held-out KL."""
    train = [r for r in rows if "loss" in r and "kl_teacher" in r]
    if not train:
        return []
    held = [r for r in rows if "eval_kl_teacher" in r]
    text = ["Distillation, per supervised token, first five steps → last five steps:", "",
            "| measure | first 5 steps | last 5 steps |", "| --- | ---: | ---: |",
            f"| KL(teacher ‖ student) | {' | '.join(_first_last(train, 'kl_teacher'))} |",
            f"| the divergence trained (kd_loss) | {' | '.join(_first_last(train, 'kd'))} |",
            f"| student NLL of the targets | {' | '.join(_first_last(train, 'nll'))} |", ""]
    if held:
        text += [f"Held-out KL to the teacher at step {held[-1]['step']}: {held[-1]['eval_kl_teacher']:.4f} "
                 "nats per token.", ""]
    return text


def _report_rounds(rows: list[dict]) -> list[str]:
    """Rejection sampling (train.rft): each round's samples, kept completions and kept share
    (the first five rounds and the last five)."""
    rounds = [r for r in rows if "kept_share" in r]
    if not rounds:
        return []
    shown = rounds if len(rounds) <= 10 else rounds[:5] + rounds[-5:]
    text = ["Rejection sampling: each round's samples, those accepted and kept (distinct), the kept share:", "",
            "| round | step | samples | accepted | kept | kept share |", "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    text += [f"| {r['rft_round']} | {r['step']} | {r['rft_samples']} | {r['rft_accepted']} | {r['rft_kept']} | "
             f"{100 * r['kept_share']:.1f}% |" for r in shown]
    total = sum(r["rft_samples"] for r in rounds)
    kept = sum(r["rft_kept"] for r in rounds)
    return text + ["", f"Over {len(rounds)} rounds: {kept} of {total} samples kept "
                       f"({100 * kept / total if total else 0.0:.1f}%).", ""]


def _report_examples(preds: list[dict]) -> str:
    lines = [f"## {len(preds)} example predictions (the first of the sample, not picked)", ""]
    for i, p in enumerate(preds, 1):
        mark = "correct" if p["correct"] else "wrong"
        fmt = "format ok" if p["format_ok"] else "format broken"
        lines += [f"### {i}. `{p['id']}`: {mark}, {fmt}, {p['n_tokens']} tokens ({p['finish_reason']})", "",
                  f"**Question.** {_one_para(p['question'])}", "",
                  "**Reasoning.**", "", _quote(p["reasoning"] or "(no <reasoning> block)"), "",
                  f"**Answer:** `{p['answer'] or '(none extracted)'}` — **gold:** `{p['gold']}`", ""]
    return "\n".join(lines)


def _one_para(text: str) -> str:
    return " ".join(text.split())


def _quote(text: str) -> str:
    return "\n".join(f"> {line}" if line.strip() else ">" for line in text.strip().splitlines())


def _report_stages(seconds: dict[str, float]) -> str:
    lines = ["## Stage times (this machine)", "", "| stage | seconds |", "| --- | ---: |"]
    lines += [f"| {k} | {v:.1f} |" for k, v in seconds.items()]
    return "\n".join(lines + [""])


def _report_files(run_dir: Path, eval_dir: Path, base_eval_dir: Path | None) -> str:
    lines = ["## Files", "",
             "- `run_manifest.json`, `config.yaml`, `environment.json`, `metrics.jsonl`, `loss.png`",
             f"- `{eval_dir.relative_to(run_dir) if eval_dir.is_relative_to(run_dir) else eval_dir}/`: "
             "eval_summary.json, predictions.jsonl (every item)",
             "- `final/adapter/`: the LoRA adapter (PEFT format, safetensors)"]
    if base_eval_dir:
        lines.append(f"- base-model evaluation: `{base_eval_dir}`")
    return "\n".join(lines + [""])
