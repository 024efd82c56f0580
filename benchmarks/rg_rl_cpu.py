"""Issue 25.5 on a CPU: GRPO of the real Gemma 3 270M on a reasoning-gym mixture, with the
curriculum and with the dataset's fixed difficulty, the same steps from one SFT run; greedy
accuracy on the mixture's held-out test split (seeds never trained on) by each task's own
scorer, beside each task's constant-answer floor, and exact McNemar per task: each run against
the SFT run, and the curriculum run against the fixed one. Every step is the real CLI, one
process at a time (the CPU is shared by nothing else), each command printed to the log.

    TUNIX_RT_HOME=/tmp/rgrl-home .venv/bin/python benchmarks/rg_rl_cpu.py \
        [--budget-s 720] [--tasks gcd,letter_counting,products,basic_arithmetic | auto] [--n 1024]
        [--test-per-task 64] [--curriculum YAML] [--grpo-over KEY=VALUE ...] [--calc | --python] [--sft RUN]
        [--survey] [--survey-only] [--survey-n 16] [--survey-tasks DOZEN | +T,...] [--band 0.05,0.6] [--out DIR] [--eval-batch 32] [--tiny]

1. setup   `model import gemma3-270m` (the GGUF package, dequantised), `data import gsm8k`
           (the vendored train split).
2. sft     `train --config cpu-demo` on GSM8K (the format: reasoning-gym records have no
           reasoning steps to learn from), unless --sft names a run of the home. --calc: on
           GSM8K's calculator traces (`data import gsm8k --tools calculator`, `dataset=gsm8k-calc
           tools=[calculator]`), and the GRPO runs and evals below call the calculator too.
           --python: the same notes as python calls (`data import gsm8k --tools python`,
           `dataset=gsm8k-python tools=[python] limit=512`: rendering runs every call in the
           sandbox, ~20 ms each, so the 240 examples of 60 steps come from 512 records, not
           all 7,068), and the GRPO runs and evals run the model's python in the sandbox.
   survey  (--survey, --survey-only, --tasks auto) the SFT run's pass@8 on a dozen reasoning-gym
           tasks at their default difficulty (`data import reasoning-gym DOZEN --seed 7 --name
           rg-dozen`; `eval --split test --samples 8 --temperature 0.7`, --survey-n items a
           task, the run's own tools; --survey-tasks +T,... adds tasks): the issue's pick is the tasks whose pass@8 lies in --band
           (5-60%). --tasks auto trains on exactly those; an explicit --tasks outside the band
           is named in the output. --survey-only stops here.
   data    `data import reasoning-gym TASKS --n N --seed 1 --test-n (per task x tasks) --name
           rg-rl` (train/dev/test from disjoint seeds).
3. probe   `--config cpu-grpo dataset=rg-rl` (and each --grpo-over) for 2 steps from the SFT
           run: its seconds a step, so that both runs get max_steps = budget / that. The probe
           is not counted.
4. grpo    from the SFT run, one after the other: `curriculum=YAML` (each task's level moves
           with its rolling rollout accuracy, starting at level 0) and without (the dataset's
           records at the task's default difficulty). The seconds each took are recorded.
5. greedy  `eval --split test` of the SFT run and both GRPO runs on the mixture's test split;
           per task: accuracy, the constant-answer floor, McNemar of each GRPO run against the
           SFT run and of the curriculum run against the fixed one; `compare` on all items.

Writes DIR/rg_rl_cpu.json (every figure), DIR/rg_rl_cpu.log (every command and its output) and
prints a table. Last line: RESULT sft_acc=... fixed_acc=... curriculum_acc=... fixed_p=...
curriculum_p=... curriculum_vs_fixed_p=... gains_p01=<tasks where the curriculum run gained over
SFT with p < 0.01, or none> ahead=<curriculum|fixed|tie> (ahead: the more accurate GRPO run on
all test items).
--tiny runs the same pipeline on tiny-gemma3 with a few steps and items: a check of the script.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import ROOT, metrics  # noqa: E402
from real_270m import RG_TASKS, per_task_mcnemar, rollout_figures  # noqa: E402
from stages import Bench  # noqa: E402

from tunix_rt.demo import TOOLS_DATASETS  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=720.0, help="training seconds each GRPO run gets (from the probe)")
    ap.add_argument("--tasks", default="gcd,letter_counting,products,basic_arithmetic",
                    help="reasoning-gym tasks of the mixture (default: four whose pass@8 after SFT was 5-60%%, README), "
                         "or auto: the survey's pick")
    ap.add_argument("--survey", action="store_true", help="the SFT run's pass@8 on the reasoning-gym dozen first")
    ap.add_argument("--survey-only", action="store_true", help="setup, SFT (or --sft) and the survey, then stop")
    ap.add_argument("--survey-n", type=int, default=16, help="test items a task in the survey")
    ap.add_argument("--survey-tasks", default=",".join(RG_TASKS),
                    help="the survey's tasks (default: the dozen); +T1,T2 adds tasks to the dozen")
    ap.add_argument("--band", default="0.05,0.6", help="the survey's pick: pass@8 within LOW,HIGH")
    ap.add_argument("--n", type=int, default=1024, help="training records of the mixture")
    ap.add_argument("--test-per-task", type=int, default=64)
    ap.add_argument("--curriculum", default="{window: 16, raise_at: 0.6, lower_below: 0.2}")
    ap.add_argument("--grpo-over", action="append", default=[], metavar="KEY=VALUE",
                    help="an override of --config cpu-grpo for the probe and both GRPO runs (repeatable), e.g. lr=1e-4")
    ap.add_argument("--calc", action="store_true",
                    help="SFT on GSM8K's calculator traces (gsm8k-calc) and GRPO and eval with tools=[calculator]")
    ap.add_argument("--python", action="store_true",
                    help="SFT on GSM8K's notes as python calls (gsm8k-python) and GRPO and eval with tools=[python]")
    bench = Bench(ap, "rg_rl_cpu", "/tmp/rgrl-home")
    args, res, over, tiny, work = bench.args, bench.res, bench.over, bench.tiny, bench.work
    tasks = [] if args.tasks == "auto" else args.tasks.split(",")
    per_task = 2 if tiny else args.test_per_task

    # 1. setup
    bench.setup()
    if args.calc and args.python:
        raise SystemExit("--calc or --python, not both")
    tool = "calculator" if args.calc else "python" if args.python else None
    calc = [f"tools=[{tool}]"] if tool else []
    traces = TOOLS_DATASETS.get(tool)
    if tool:
        bench.cli(f"data_import_{tool}", ["data", "import", "gsm8k", str(ROOT / "src/tunix_rt/assets/gsm8k/train.jsonl"),
                                          "--name", traces, "--tools", tool])
    train = bench.train

    def ev(name: str, run: Path) -> dict:
        s = bench.eval(name, run, "rg-rl", "test", ["--max-new-tokens", "24"] if tiny else [])
        m = s["metrics"]
        res[name] = {**{k: m.get(k) for k in ("accuracy", "n", "format_rate", "mean_completion_tokens", "truncated_rate")},
                     "by_category": {t: {k: c.get(k) for k in ("accuracy", "n", "format_rate")}
                                     for t, c in (s.get("by_category") or {}).items()},
                     "constant_baseline": s.get("constant_baseline")}
        bench.save()
        return res[name]

    def compare(a: str, b: str, key: str) -> dict:
        return bench.compare(a, b, key, per_task=per_task_mcnemar(work / a, work / b))

    # 2. SFT on GSM8K (the format)
    sft = bench.sft([f"dataset={traces}"] + calc + (["limit=512"] if args.python else []) if tool else [])

    # the survey: pass@8 on the dozen, the pick in the band
    if args.survey or args.survey_only or not tasks:
        lo, hi = (float(x) for x in args.band.split(","))
        n = 1 if tiny else args.survey_n
        st = args.survey_tasks
        surveyed = list(RG_TASKS) + st[1:].split(",") if st.startswith("+") else st.split(",")
        res["survey_tasks"] = surveyed
        bench.cli("data_import_dozen", ["data", "import", "reasoning-gym", ",".join(surveyed), "--n", str(len(surveyed)),
                                        "--seed", "7", "--dev-n", str(len(surveyed)), "--test-n", str(n * len(surveyed)),
                                        "--name", "rg-dozen"])
        s = bench.eval("survey_sft", sft, "rg-dozen", "test", ["--samples", "8", "--temperature", "0.7"]
                       + (["--max-new-tokens", "24"] if tiny else []))
        table = {t: {k: c.get(k) for k in ("n", "pass@1", "pass@8", "maj@8", "format_rate")}
                 for t, c in sorted((s.get("by_category") or {}).items())}
        band = [t for t, c in table.items() if lo <= (c["pass@8"] or 0.0) <= hi]
        res["survey"] = {"table": table, "band": [lo, hi], "in_band": band}
        print(f"\n{'task':<24} {'n':>4} {'pass@1':>7} {'pass@8':>7} {'maj@8':>7}")
        for t, c in table.items():
            print(f"{t:<24} {c['n']:>4} {c['pass@1'] or 0:>7.1%} {c['pass@8'] or 0:>7.1%} {c['maj@8'] or 0:>7.1%}"
                  + ("  in band" if t in band else ""))
        if not tasks:
            if not band:
                raise SystemExit(f"--tasks auto: no task's pass@8 lies in {lo}-{hi}")
            tasks = band
        elif outside := [t for t in tasks if t not in band]:
            print(f"--tasks outside the band {lo}-{hi}: {','.join(outside)}")
            res["survey"]["picked_outside_band"] = outside
        bench.save()
        if args.survey_only:
            bench.done()
            print(f"RESULT in_band={','.join(band) or 'none'} n_per_task={n}")
            return
    res["tasks"] = tasks
    bench.cli("data_import_rg", ["data", "import", "reasoning-gym", ",".join(tasks), "--n", str(16 if tiny else args.n),
                                 "--seed", "1", "--test-n", str(per_task * len(tasks)), "--name", "rg-rl"])
    ev("greedy_sft", sft)

    # 3. seconds a step on the mixture, from 2 steps
    grpo = ["--config", "cpu-grpo", "dataset=rg-rl", f"init={sft.name}"] + over + calc + args.grpo_over
    probe, _ = train("probe", grpo + ["max_steps=2"])
    res["probe_step_s"] = round(bench.step_s(probe), 2)
    steps = 2 if tiny else max(1, round(args.budget_s / res["probe_step_s"]))
    res["steps"] = steps
    bench.save()

    # 4.-5. both GRPO runs, their greedy evals, McNemar per task
    for tag, extra in (("fixed", []), ("curriculum", [f"curriculum={args.curriculum}"])):
        run, wall = train(f"grpo_{tag}", grpo + [f"max_steps={steps}"] + extra)
        stepped = [r for r in metrics(run) if "curriculum_moves" in r]
        res[f"grpo_{tag}"] = {"run": run.name, "train_wall_s": round(wall, 1),
                              "step_seconds": round(sum(r["step_s"] for r in metrics(run) if "step_s" in r), 1),
                              **rollout_figures(run),
                              **({"levels": {k.removeprefix("curriculum_level_"): v for k, v in stepped[-1].items()
                                             if k.startswith("curriculum_level_")},
                                  "moves": sum(r["curriculum_moves"] for r in stepped)} if stepped else {})}
        bench.save()
        ev(f"greedy_{tag}", run)
        compare("greedy_sft", f"greedy_{tag}", f"{tag}_vs_sft")
    compare("greedy_fixed", "greedy_curriculum", "curriculum_vs_fixed")
    bench.done()

    # the table: per task, then all items
    floor = (res["greedy_sft"].get("constant_baseline") or {})
    print(f"\n{'task':<18} {'n':>4} {'floor':>7} {'SFT':>7} {'fixed':>7} {'curric.':>7} "
          f"{'p fixed':>9} {'p curr.':>9} {'p c vs f':>9}")
    gains = []
    for t in sorted(res["greedy_sft"]["by_category"]):
        acc = {k: res[f"greedy_{k}"]["by_category"].get(t, {}).get("accuracy") or 0.0 for k in ("sft", "fixed", "curriculum")}
        pf, pc, pcf = (res[k]["per_task"].get(t, {}).get("mcnemar_p", 1.0)
                       for k in ("fixed_vs_sft", "curriculum_vs_sft", "curriculum_vs_fixed"))
        fl = ((floor.get("by_category") or {}).get(t) or {}).get("accuracy")
        if acc["curriculum"] > acc["sft"] and pc < 0.01:
            gains.append(t)
        fls = "" if fl is None else f"{fl:.1%}"
        print(f"{t:<18} {res['greedy_sft']['by_category'][t]['n']:>4} {fls:>7} "
              f"{acc['sft']:>7.1%} {acc['fixed']:>7.1%} {acc['curriculum']:>7.1%} {pf:>9.4g} {pc:>9.4g} {pcf:>9.4g}")
    s, f, c = (res[f"greedy_{k}"]["accuracy"] for k in ("sft", "fixed", "curriculum"))
    fall = "" if floor.get("accuracy") is None else f"{floor['accuracy']:.1%}"
    print(f"{'all':<18} {res['greedy_sft']['n']:>4} {fall:>7} "
          f"{s:>7.1%} {f:>7.1%} {c:>7.1%} {res['fixed_vs_sft']['mcnemar_p']:>9.4g} "
          f"{res['curriculum_vs_sft']['mcnemar_p']:>9.4g} {res['curriculum_vs_fixed']['mcnemar_p']:>9.4g}")
    for tag in ("fixed", "curriculum"):
        g = res[f"grpo_{tag}"]
        print(f"grpo {tag}: {steps} steps, {g['step_seconds']} s of steps ({g['train_wall_s']} s wall), rollout accuracy "
              f"{g.get('rollout_accuracy')}, zero-variance share {g.get('zero_variance_share')}"
              + (f", levels {g['levels']} after {g['moves']} moves" if "levels" in g else ""))
    ahead = "curriculum" if c > f else "fixed" if f > c else "tie"
    print(f"RESULT sft_acc={s:.4f} fixed_acc={f:.4f} curriculum_acc={c:.4f} "
          f"fixed_p={res['fixed_vs_sft']['mcnemar_p']:.4g} curriculum_p={res['curriculum_vs_sft']['mcnemar_p']:.4g} "
          f"curriculum_vs_fixed_p={res['curriculum_vs_fixed']['mcnemar_p']:.4g} "
          f"gains_p01={','.join(gains) or 'none'} ahead={ahead}")


if __name__ == "__main__":
    main()
