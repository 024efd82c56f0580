"""The measured answers on the real Gemma 3 270M, in one prepared script for a lent GPU (or, with
--cpu-dry, a check of the script itself on tiny-gemma3 on a CPU). Every step is the real CLI,
one process each, each command printed to the log; stages that share nothing run side by side.

    python3 benchmarks/real_270m.py [--out DIR] [--budget-s 540] [--stages gsm8k[,rg-rl][,methods]]
        [--recipes full[,lora,…]] [--kinds plain,calc] [--sft-epochs 2] [--sft-batch 32]
        [--grpo-steps 12] [--grpo-fit-s S] [--grpo-over=K=V …] [--sampled-batch 405] [--no-sampled] [--method-rollouts 512] [--cpu-dry]
    e.g. a longer GRPO from the calculator run alone: --kinds calc --no-sampled --grpo-steps 30
    the methods of issue 26.8 alone: --stages methods

1. setup  `model import gemma3-270m` (the GGUF package, dequantised); `data import gsm8k` with
          and without `--tools calculator`; a dozen reasoning-gym tasks (test split: seeds
          never trained on).
2. sft    each recipe (RECIPES: overrides of `--config gpu`, packed rows of 512 tokens) twice,
          on plain traces and on calculator traces (`tools=[calculator]`), side by side;
          one recipe after the other.                                               (24.6)
3. greedy `eval --split dev` on all 405 dev items for every run; `compare` (McNemar) of each
          recipe's two runs; the best run of each kind on dev goes on.              (24.6)
4. side by side: GRPO (`--config gpu-grpo`, --grpo-steps steps) from each kind's best run
          (the calculator one with its tool): pass@G and the zero-variance share per step,
          then greedy on dev and McNemar against its start;                          (24.6)
          `eval --samples 8 --temperature T` on GSM8K dev for both: pass@1/8, maj@8;
          pass@8 of the best plain run on each reasoning-gym task.               (issue 25.5)
--stages rg-rl (issue 25.5), after the plain full SFT run (made here when gsm8k did not run):
          `data import reasoning-gym --rg-rl-tasks` (default: the four of the dozen whose pass@8
          was 5-60%); GRPO from the SFT run on that mixture with `curriculum=` and with the
          dataset's fixed difficulty, same steps, side by side; greedy on the mixture's test
          split before and after, McNemar per task, and curriculum vs fixed per task.
--stages methods (issue 26.8), from the same plain full SFT run: GRPO, RFT, SimPO on on-policy
          pairs, and SimPO then GRPO (half the budget each), every method given the same number
          of sampled completions (--method-rollouts; wall time recorded), one after the other;
          greedy on all 405 dev items each (accuracy, `arith`) and McNemar against the SFT run.
Writes DIR/real_270m.json (every figure), DIR/real_270m.log (every command and its output) and
DIR/evals.tar.gz (each eval's summary and predictions).
Last line: RESULT best_plain=… plain_acc=… best_calc=… calc_acc=… calc_over_plain=… grpo_calc_acc=…
grpo_plain_acc=… rgrl_sft_acc=… rgrl_curriculum_acc=… rgrl_fixed_acc=… grpo_acc=… rft_acc=… simpo_acc=…
simpo_grpo_acc=… (None: that stage did not run)

On a lent H100 (2026-11-26), at fa7f1d6 with `--budget-s 545 --recipes full,lora --grpo-steps 30
--sampled-batch 810` (then the defaults): setup 79 s (the import 76 s); the full fine-tunes ran 220
steps (plain) and 262 (calculator) of <= 16,384 packed tokens in 166 and 183 s side by side; the
LoRA r64 runs beside them ran out of GPU memory at their start (the plan predicted 30.4 GiB for
each full run and 15.6 for each LoRA run: 92 GiB > 79), and so did both GRPO runs beside three
sampled evals at batch 810 -- hence one recipe at a time and a sampled batch of 405 now. Greedy
dev evals 27-32 s; sampled (8 x 405 dev items, 8 x 384 reasoning-gym items) 104-128 s side by
side; GRPO, run after them by hand (12 steps, 8 prompts x 4): 7.9-9.0 s a step.
An earlier version (one LoRA r16 recipe, 200 steps): each SFT ~68 s side by side; sampled evals
and GRPO did not finish (the sampling noise was drawn on the CPU then).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import CLI, ROOT, metrics, run_dir, sh  # noqa: E402

#: SFT recipes (overrides of `--config gpu`), each run on plain and on calculator traces. full:
#: every weight, fp32 master weights with TF32 matmuls (a bf16 weight drops AdamW's ~lr-sized
#: updates at lr 5e-5); lora: rank 64 on every projection, bf16.
RECIPES = {
    "full": {"over": ["finetune=full", "dtype=fp32", "lr=5e-5"], "env": {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}},
    "lora": {"over": ["lora_rank=64", "lora_alpha=128", "lr=5e-4"]},
    "lora16": {"over": ["lora_rank=16", "lora_alpha=32", "lr=2e-4"]},
}

RG_TASKS = ("basic_arithmetic", "chain_sum", "leg_counting", "simple_equations", "gcd", "lcm",
            "number_sorting", "count_bits", "letter_counting", "decimal_arithmetic",
            "fraction_simplification", "products")


def rollout_figures(run: Path) -> dict:
    """A GRPO run's rollout figures, averaged over its logged steps ({} before any)."""
    rows = [r for r in metrics(run) if "rollout_pass_at_g" in r]
    n = len(rows)
    if not n:
        return {}
    mean = lambda k, nd: round(sum(r.get(k, 0.0) for r in rows) / n, nd)  # noqa: E731
    return {"steps": n, "rollout_pass_at_g": mean("rollout_pass_at_g", 4),
            "zero_variance_share": mean("zero_variance_share", 4), "rollout_accuracy": mean("rollout_accuracy", 4),
            "step_s": mean("step_s", 2), "rollout_s": mean("rollout_s", 2)}


def per_task_mcnemar(a: Path, b: Path) -> dict:
    """Per task (prediction category) of two evals of the same items: right in each, the
    discordant counts, and the exact McNemar p."""
    from tunix_rt.eval.compare import mcnemar_exact

    def load(d: Path) -> dict:
        return {(p := json.loads(x))["id"]: (str(p.get("category") or "?"), bool(p["correct"]))
                for x in (d / "predictions.jsonl").read_text().splitlines() if x.strip()}

    pa, pb = load(a), load(b)
    out: dict[str, dict] = {}
    for i in sorted(pa.keys() & pb.keys()):
        task, ra = pa[i]
        rb = pb[i][1]
        t = out.setdefault(task, {"n": 0, "a_right": 0, "b_right": 0, "right_to_wrong": 0, "wrong_to_right": 0})
        t["n"] += 1
        t["a_right"] += ra
        t["b_right"] += rb
        t["right_to_wrong"] += ra and not rb
        t["wrong_to_right"] += rb and not ra
    for t in out.values():
        t["mcnemar_p"] = round(mcnemar_exact(t["right_to_wrong"], t["wrong_to_right"]), 6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/real-270m"))
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--recipes", default="full", help=f"SFT recipes, each run on both trace kinds: {','.join(RECIPES)}")
    ap.add_argument("--sft-epochs", type=float, default=2.0)
    ap.add_argument("--sft-batch", type=int, default=32, help="packed rows of 512 tokens a step")
    ap.add_argument("--grpo-steps", type=int, default=None, help="GRPO steps (default 12; with --grpo-fit-s: a cap)")
    ap.add_argument("--grpo-fit-s", type=float, default=0.0,
                    help="gsm8k: GRPO steps as many as fit the budget at this many seconds a step")
    ap.add_argument("--grpo-over", action="append", default=[],
                    help="gsm8k: an extra GRPO override (repeatable), e.g. --grpo-over=group_size=8")
    ap.add_argument("--sampled-batch", type=int, default=405,
                    help="sequences a sampled eval decodes at once (3 evals at 810 beside GRPO filled an H100)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--rg-per-task", type=int, default=32)
    ap.add_argument("--stages", default="gsm8k", help="gsm8k (SFT with and without the calculator, GRPO, "
                    "sampled evals, the reasoning-gym dozen), rg-rl (GRPO on --rg-rl-tasks, curriculum vs fixed), "
                    "methods (GRPO, RFT, SimPO, SimPO then GRPO from one SFT run), comma-separated")
    ap.add_argument("--kinds", default="plain,calc", help="gsm8k: which traces, plain and/or calc (calculator)")
    ap.add_argument("--no-sampled", dest="sampled", action="store_false",
                    help="gsm8k: skip the sampled evals (pass@k on GSM8K dev, the reasoning-gym dozen)")
    ap.add_argument("--rg-rl-tasks", default="gcd,letter_counting,products,basic_arithmetic",
                    help="reasoning-gym tasks for rg-rl: the plain SFT run's pass@8 was 5-60%% on these (README)")
    ap.add_argument("--rg-rl-n", type=int, default=4096, help="rg-rl training records")
    ap.add_argument("--rg-rl-test-per-task", type=int, default=64)
    ap.add_argument("--curriculum", default="{window: 16, raise_at: 0.6, lower_below: 0.2}")
    ap.add_argument("--method-rollouts", type=int, default=512,
                    help="methods: sampled completions each method gets (8 prompts x 4 a step: 16 GRPO steps)")
    ap.add_argument("--cpu-dry", action="store_true")
    args = ap.parse_args()
    cap = args.grpo_steps  # None: no cap on a fitted count
    args.grpo_steps = args.grpo_steps or 12
    t_start = time.time()
    deadline = t_start + args.budget_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "real_270m.log"
    home = Path(os.environ.setdefault("TUNIX_RT_HOME", "/tmp/real-270m-home"))
    work = home / "_evals"
    res: dict = {"args": vars(args), "stages": {}}
    lock = threading.Lock()

    def save() -> None:
        with lock:
            (out / "real_270m.json").write_text(json.dumps(res, indent=1, default=str))

    def left(cap: float) -> float:
        return max(5.0, min(cap, deadline - time.time()))

    def cli(name: str, argv: list[str], cap: float, env: dict[str, str] | None = None) -> tuple[int, str]:
        t0 = time.time()
        rc, text = sh(CLI + argv, left(cap), log, env)
        with lock:
            res["stages"][name] = {"rc": rc, "wall_s": round(time.time() - t0, 1), "cmd": "tunix-rt " + " ".join(argv),
                                   **({"tail": text[-1200:]} if rc else {})}
        print(f"[{time.time() - t_start:6.0f}s] {name}: rc={rc} {time.time() - t0:.0f}s", flush=True)
        save()
        return rc, text

    def together(*jobs) -> list:
        outs = [None] * len(jobs)

        def one(i, fn):
            try:
                outs[i] = fn()
            except Exception as e:  # noqa: BLE001 - one job's failure must not hide the rest
                outs[i] = e
                with lock:
                    res["stages"][f"job{i}_error"] = f"{type(e).__name__}: {e}"[-800:]
        threads = [threading.Thread(target=one, args=(i, fn)) for i, fn in enumerate(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return outs

    import torch

    res["env"] = {"python": sys.version.split()[0], "torch": torch.__version__,
                  "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                  "cpus": os.cpu_count()}
    print(json.dumps(res["env"]), flush=True)
    dry = args.cpu_dry
    model = "tiny-gemma3" if dry else "gemma3-270m"
    dev = ["device=cpu", "dtype=fp32"] if dry else ["device=cuda"]
    edev = ["--device", "cpu"] if dry else ["--device", "cuda"]
    gsm = str(ROOT / "src/tunix_rt/assets/gsm8k/train.jsonl")
    limit = ["--limit", "6", "--max-new-tokens", "24"] if dry else []
    ebatch = "6" if dry else "405"

    stages, kinds = set(args.stages.split(",")), set(args.kinds.split(","))
    rl_tasks = args.rg_rl_tasks.split(",")

    # 1. setup
    rg_n = 4 if dry else args.rg_per_task
    together(
        lambda: cli("model_import", ["model", "import", model], 300),
        lambda: cli("data_plain", ["data", "import", "gsm8k", gsm, "--name", "gsm8k"], 200),
        lambda: cli("data_calc", ["data", "import", "gsm8k", gsm, "--name", "gsm8k-calc", "--tools", "calculator"], 200),
        lambda: cli("data_rg", ["data", "import", "reasoning-gym", ",".join(RG_TASKS), "--n", str(len(RG_TASKS)),
                                "--seed", "7", "--dev-n", str(len(RG_TASKS)), "--test-n", str(rg_n * len(RG_TASKS)),
                                "--name", "rg-dozen"], 200),
        *([lambda: cli("data_rg_rl", ["data", "import", "reasoning-gym", args.rg_rl_tasks, "--n", str(8 if dry else args.rg_rl_n),
                                      "--seed", "11", "--dev-n", str(len(rl_tasks)),
                                      "--test-n", str((2 if dry else args.rg_rl_test_per_task) * len(rl_tasks)),
                                      "--name", "rg-rl"], 200)] if "rg-rl" in stages else []),
    )

    def ev(name: str, run: str, extra: list[str], cap: float) -> dict | None:
        dest = work / name
        rc, text = cli(name, ["eval", "--adapter", run, "--engine", "torch", "--json", "--out", str(dest)] + edev + limit
                       + extra, cap)
        if rc != 0:
            return None
        summ = json.loads((dest / "eval_summary.json").read_text())
        with lock:
            res[name] = summ.get("metrics")
        save()
        return summ

    def compare(a: str, b: str) -> None:
        if not ((work / a).exists() and (work / b).exists()):
            return
        rc, text = cli(f"compare_{a}_{b}", ["compare", str(work / a), str(work / b), "--json"], 60)
        if rc == 0:
            c = json.loads(text[text.index("{"):])
            r = {k: c[k] for k in ("mcnemar_p", "shared", "both_right", "both_wrong")}
            r.update(right_to_wrong=len(c["right_to_wrong"]), wrong_to_right=len(c["wrong_to_right"]))
            with lock:
                res[f"compare_{a}__{b}"] = r
            save()

    # 2. SFT: each recipe twice, on plain traces and on calculator traces (`tools=[calculator]`)
    recipes = {name: RECIPES[name] for name in args.recipes.split(",")}
    common = ["--config", "gpu", "--engine", "torch", f"model={model}", "packing=true", "eval_interval=0",
              "save_interval=0", "log_interval=5", f"batch_size={args.sft_batch}"] + dev
    common += ["batch_size=2", "max_seq_len=256", "warmup_steps=1", "epochs=null", "max_steps=3"] if dry \
        else [f"epochs={args.sft_epochs}"]
    runs: dict[str, str] = {}

    def sft(tag: str, recipe: dict, extra: list[str]):
        # on a CPU: fp32, and a rank the tiny model's narrowest projection holds
        over = [("lora_rank=8" if o.startswith("lora_rank=") else o) for o in recipe["over"]
                if not o.startswith("dtype=")] if dry else recipe["over"]
        rc, text = cli(f"sft_{tag}", ["train"] + common + over + extra, 420, env=recipe.get("env"))
        run = run_dir(text)
        if rc == 0 and run:
            runs[tag] = run.name
            rows = metrics(run)
            st = [r for r in rows if "step_s" in r]
            with lock:
                steps = len(st) and st[-1].get("step")  # rows every log_interval steps: their mean step time x steps
                res[f"sft_{tag}"] = {"run": run.name, "steps": steps,
                                     "train_s": round(sum(r["step_s"] for r in st) / max(1, len(st)) * (steps or 0), 1),
                                     "last_loss": next((r["loss"] for r in reversed(rows) if "loss" in r), None)}
    best: dict[str, str | None] = {"plain": None, "calc": None}
    if "gsm8k" in stages:
        for n, r in recipes.items():  # one recipe at a time: two full fine-tunes take ~60 of an H100's 80 GB
            together(*[(lambda d=d, x=x: sft(f"{n}_{d}", r, x))
                       for d, x in (("plain", ["dataset=gsm8k"]), ("calc", ["dataset=gsm8k-calc", "tools=[calculator]"]))
                       if d in kinds])

        # 3. greedy on all dev items, then compare each recipe's two runs (McNemar)
        greedy = ["--dataset", "gsm8k", "--split", "dev", "--batch-size", ebatch]
        together(*[(lambda t=t: ev(f"greedy_{t}", runs[t], greedy, 200)) for t in list(runs)])
        together(*[(lambda n=n: compare(f"greedy_{n}_plain", f"greedy_{n}_calc")) for n in recipes])

        def acc(name: str) -> float:
            return float((res.get(name) or {}).get("accuracy") or 0.0)

        # the best run of each kind on the dev split (recipes are tuned on dev; the test split is never read)
        best = {d: max((t for t in runs if t.endswith("_" + d)), key=lambda t: acc(f"greedy_{t}"), default=None)
                for d in ("plain", "calc")}
        res["best"] = best
        save()

        # 4. side by side: GRPO from each kind's best SFT run, then greedy on dev and McNemar against
        #    where it started; sampled evals of both (pass@1/8, maj@8); reasoning-gym pass@8 per task
        grpo_common = ["--config", "gpu-grpo", "--engine", "torch", f"model={model}", "save_interval=0",
                       "eval_interval=0", "dataset=gsm8k", f"max_steps={args.grpo_steps}"] + dev
        if dry:
            grpo_common += ["rl_prompts=2", "max_seq_len=256", "rollout_max_new_tokens=16", "max_steps=2", "warmup_steps=1"]

        grpo_common += args.grpo_over
        if args.grpo_fit_s and not dry:  # what fits before the last minute and a half, ~30 s of start-up
            fit = int((deadline - time.time() - 90 - 30) // args.grpo_fit_s)
            n = max(1, min(cap or fit, fit))
            grpo_common.append(f"max_steps={n}")
            res["grpo_steps_fitted"] = n

        def grpo(d: str, start: str, extra: list[str]):
            # stopped (SIGTERM, then no eval) if it would run past the budget's last minute and a half
            rc, text = cli(f"grpo_{d}", ["train"] + grpo_common + [f"init={runs[start]}"] + extra,
                           max(5, deadline - time.time() - 90))
            run = run_dir(text)
            if run and (fig := rollout_figures(run)):
                with lock:
                    res[f"grpo_{d}"] = {"run": run.name, "from": start, "rc": rc, **fig}
            if rc == 0 and run:
                if ev(f"greedy_grpo_{d}", run.name, greedy, max(5, deadline - time.time() - 20)):
                    compare(f"greedy_{start}", f"greedy_grpo_{d}")

        sb = "12" if dry else str(args.sampled_batch)
        sampled = ["--samples", "8", "--temperature", str(args.temperature), "--batch-size", sb]
        jobs = []
        for d, start in best.items():
            if start:
                jobs.append(lambda d=d, start=start: grpo(d, start, ["tools=[calculator]", "dataset=gsm8k-calc"]
                                                           if d == "calc" else []))
                if args.sampled:
                    jobs.append(lambda d=d, start=start: ev(f"sampled_{start}", runs[start],
                                                            ["--dataset", "gsm8k", "--split", "dev"] + sampled, 400))
        if best["plain"] and args.sampled:
            jobs.append(lambda: ev("rg_plain", runs[best["plain"]], ["--dataset", "rg-dozen", "--split", "test"] + sampled, 400))
        together(*jobs)

    if "rg-rl" in stages:
        # GRPO on the reasoning-gym tasks where the plain SFT run's pass@8 was 5-60%, with the
        # curriculum and with the dataset's fixed difficulty, same steps, side by side; greedy
        # on the mixture's test split (seeds never trained on) before and after, McNemar per task
        if "full_plain" not in runs:
            sft("full_plain", RECIPES["full"], ["dataset=gsm8k"])
        if "full_plain" in runs:
            start = runs["full_plain"]
            rgtest = ["--dataset", "rg-rl", "--split", "test", "--batch-size", "6" if dry else "512"]
            ev("rgrl_sft", start, rgtest, 200)
            base = ["--config", "gpu-grpo", "--engine", "torch", f"model={model}", "save_interval=0", "eval_interval=0",
                    "dataset=rg-rl", f"max_steps={args.grpo_steps}", f"init={start}"] + dev
            if dry:
                base += ["rl_prompts=2", "max_seq_len=256", "rollout_max_new_tokens=16", "max_steps=2", "warmup_steps=1"]

            def rl(tag: str, extra: list[str]) -> None:
                rc, text = cli(f"grpo_rg_{tag}", ["train"] + base + extra, max(5, deadline - time.time() - 60))
                run = run_dir(text)
                fig = rollout_figures(run) if run else {}
                if run and fig:
                    stepped = [r for r in metrics(run) if "curriculum_moves" in r]
                    levels = {k: v for k, v in (stepped or [{}])[-1].items() if k.startswith("curriculum_level_")}
                    levels["curriculum_moves"] = sum(r["curriculum_moves"] for r in stepped)
                    with lock:
                        res[f"grpo_rg_{tag}"] = {"run": run.name, "rc": rc, **fig, **levels}
                if rc == 0 and run and ev(f"rgrl_{tag}", run.name, rgtest, max(5, deadline - time.time() - 10)):
                    with lock:
                        res[f"rgrl_{tag}_per_task"] = per_task_mcnemar(work / "rgrl_sft", work / f"rgrl_{tag}")
                    save()

            together(lambda: rl("curriculum", [f"curriculum={args.curriculum}"]), lambda: rl("fixed", []))
            if (work / "rgrl_fixed").exists() and (work / "rgrl_curriculum").exists():
                res["rgrl_curriculum_vs_fixed"] = per_task_mcnemar(work / "rgrl_fixed", work / "rgrl_curriculum")
        save()

    if "methods" in stages:
        # issue 26.8: from one SFT run, each method with the same number of sampled completions
        # (8 prompts x 4 a step, `--config gpu-grpo`'s rollouts), one after the other; greedy on
        # all dev items; McNemar against the SFT run
        if "full_plain" not in runs:
            sft("full_plain", RECIPES["full"], ["dataset=gsm8k"])
        if "full_plain" in runs:
            start = runs["full_plain"]
            greedy = ["--dataset", "gsm8k", "--split", "dev", "--batch-size", ebatch]
            if not (work / "greedy_full_plain").exists():
                ev("greedy_full_plain", start, greedy, 200)
            prompts, group = (2, 2) if dry else (8, 4)  # the gpu presets' rollouts, set for every method
            per_step = prompts * group
            steps = 2 if dry else max(2, args.method_rollouts // per_step)
            base = ["--engine", "torch", f"model={model}", "save_interval=0", "eval_interval=0", "dataset=gsm8k",
                    "log_interval=1", f"rl_prompts={prompts}", f"group_size={group}"] + dev
            if dry:
                base += ["max_seq_len=256", "rollout_max_new_tokens=16", "warmup_steps=1"]
            simpo = ["--config", "gpu-dpo", "pref_loss=simpo", "pref_beta=2.0", "simpo_gamma=1.0"]
            plans = {  # name: [(config args, optimizer steps)], run in order, each from the last
                "grpo": [(["--config", "gpu-grpo"], steps)],
                "rft": [(["--config", "gpu-grpo", "method=rft", "rft_round_steps=2",
                          "rft_accept={answer: 1.0, format: 1.0}", "lr=5e-5"], 2 * steps)],  # a round = one GRPO step's samples; one that keeps nothing takes 1 step, not 2
                "simpo": [(simpo, steps)],
                "simpo_grpo": [(simpo, max(1, steps // 2)), (["--config", "gpu-grpo"], max(1, steps - steps // 2))],
            }

            def drawn(run: Path) -> int:
                """completions a run sampled: RFT logs each round's; GRPO and on-policy pairs draw
                per_step every step (an RFT round that keeps nothing takes one step, not two)"""
                rows = metrics(run)
                if any("rft_samples" in r for r in rows):
                    return sum(int(r.get("rft_samples", 0)) for r in rows)
                return per_step * sum(1 for r in rows if "step_s" in r)

            for name, chain in plans.items():
                frm, t0, ok, n_drawn = start, time.time(), True, 0
                for i, (conf, n) in enumerate(chain):
                    rc, text = cli(f"method_{name}_{i}", ["train"] + conf + base + [f"init={frm}", f"max_steps={n}"],
                                   max(5, deadline - time.time() - 60))
                    run = run_dir(text)
                    ok = rc == 0 and run is not None
                    if not ok:
                        break
                    frm, n_drawn = run.name, n_drawn + drawn(run)
                if ok:
                    with lock:
                        res[f"method_{name}"] = {"run": frm, "train_wall_s": round(time.time() - t0, 1),
                                                 "completions": n_drawn}
                    if ev(f"greedy_method_{name}", frm, greedy, max(5, deadline - time.time() - 10)):
                        compare("greedy_full_plain", f"greedy_method_{name}")
        save()

    # per-task pass@8 from the reasoning-gym predictions
    preds = work / "rg_plain" / "predictions.jsonl"
    if preds.exists():
        per: dict[str, list] = {}
        for line in preds.read_text().splitlines():
            p = json.loads(line)
            per.setdefault(str(p.get("category") or "?"), []).append(p)
        table = {}
        for task, ps in sorted(per.items()):
            k = max((int(p.get("n_samples", 1)) for p in ps), default=1)
            table[task] = {"items": len(ps), "pass@8": round(sum(p.get("n_correct", 0) > 0 for p in ps) / len(ps), 4),
                           "pass@1": round(sum(p.get("n_correct", 0) / k for p in ps) / len(ps), 4),
                           "maj@8": round(sum(bool(p.get("correct")) for p in ps) / len(ps), 4)}
        res["rg_table"] = table
    save()

    # a tool-using completion for the README
    calc_preds = work / f"greedy_{best['calc']}" / "predictions.jsonl"
    if best["calc"] and calc_preds.exists():
        for line in calc_preds.read_text().splitlines():
            p = json.loads(line)
            if p.get("tool_calls") and p.get("correct"):
                res["tool_example"] = p
                break
    with tarfile.open(out / "evals.tar.gz", "w:gz") as tar:
        for d in sorted(work.glob("*")):
            for f in ("eval_summary.json", "predictions.jsonl"):
                if (d / f).exists():
                    tar.add(d / f, arcname=f"{d.name}/{f}")
    res["wall_s"] = round(time.time() - t_start, 1)
    save()
    g = lambda k, m: (res.get(k) or {}).get(m)  # noqa: E731
    bp, bc = best["plain"], best["calc"]
    pa, ca = g(f"greedy_{bp}", "accuracy"), g(f"greedy_{bc}", "accuracy")
    print(json.dumps({k: v for k, v in res.items() if k not in ("stages", "tool_example")}, indent=1, default=str))
    print(f"RESULT best_plain={bp} plain_acc={pa} best_calc={bc} calc_acc={ca} "
          f"calc_over_plain={round(ca / pa, 3) if pa and ca is not None else 'na'} "
          f"grpo_calc_acc={g('greedy_grpo_calc', 'accuracy')} grpo_plain_acc={g('greedy_grpo_plain', 'accuracy')} "
          f"rgrl_sft_acc={g('rgrl_sft', 'accuracy')} rgrl_curriculum_acc={g('rgrl_curriculum', 'accuracy')} "
          f"rgrl_fixed_acc={g('rgrl_fixed', 'accuracy')} "
          + " ".join(f"{m}_acc={g(f'greedy_method_{m}', 'accuracy')}" for m in ("grpo", "rft", "simpo", "simpo_grpo")))


if __name__ == "__main__":
    main()
