"""The measured answers on the real Gemma 3 270M, in one prepared script for a lent GPU (or, with
--cpu-dry, a check of the script itself on tiny-gemma3 on a CPU). Every step is the real CLI,
one process each, each command printed to the log; stages that share nothing run side by side.

    python3 benchmarks/real_270m.py [--out DIR] [--budget-s 540] [--sft-steps 160] [--cpu-dry]

1. setup  `model import gemma3-270m` (the GGUF package, dequantised); `data import gsm8k` with
          and without `--tools calculator`; a dozen reasoning-gym tasks (test split: seeds
          never trained on).
2. sft    the same recipe twice (`--config gpu`, packed, --sft-steps steps): plain traces and
          calculator traces (`tools=[calculator]`), side by side.                 (issue 24.6)
3. greedy `eval --split dev` on all 405 dev items for both, then `compare` (McNemar).  (24.6)
4. then side by side until the budget ends:
          GRPO (`--config gpu-grpo`) from each SFT run (the calculator one with its tool):
          pass@G and the zero-variance share per step;                            (24.6)
          `eval --samples 8 --temperature T` on GSM8K dev for both SFT runs: pass@1/8, maj@8;
          pass@8 of the plain SFT run on each reasoning-gym task.              (issue 25.5)
Writes DIR/real_270m.json (every figure), DIR/real_270m.log (every command and its output) and
DIR/evals.tar.gz (each eval's summary and predictions).
Last line: RESULT plain_acc=… calc_acc=… mcnemar_p=… calc_over_plain=…

On a lent H100 (2026-11-26; the project's packages as wheels, the GGUF package copied in) with
`--budget-s 520 --sft-steps 200`: setup 67 s, each SFT 200 steps of <= 8192 packed tokens in
~68 s side by side, greedy dev evals 24-27 s; the sampled evals and GRPO did not finish in the
budget (sampled decoding drew its noise on the CPU then: 146-205 s a GRPO step).
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

RG_TASKS = ("basic_arithmetic", "chain_sum", "leg_counting", "simple_equations", "gcd", "lcm",
            "number_sorting", "count_bits", "letter_counting", "decimal_arithmetic",
            "fraction_simplification", "products")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/real-270m"))
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--sft-steps", type=int, default=160)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--rg-per-task", type=int, default=32)
    ap.add_argument("--cpu-dry", action="store_true")
    args = ap.parse_args()
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

    def cli(name: str, argv: list[str], cap: float) -> tuple[int, str]:
        t0 = time.time()
        rc, text = sh(CLI + argv, left(cap), log)
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
    steps = 3 if dry else args.sft_steps

    # 1. setup
    rg_n = 4 if dry else args.rg_per_task
    together(
        lambda: cli("model_import", ["model", "import", model], 300),
        lambda: cli("data_plain", ["data", "import", "gsm8k", gsm, "--name", "gsm8k"], 200),
        lambda: cli("data_calc", ["data", "import", "gsm8k", gsm, "--name", "gsm8k-calc", "--tools", "calculator"], 200),
        lambda: cli("data_rg", ["data", "import", "reasoning-gym", ",".join(RG_TASKS), "--n", str(len(RG_TASKS)),
                                "--seed", "7", "--dev-n", str(len(RG_TASKS)), "--test-n", str(rg_n * len(RG_TASKS)),
                                "--name", "rg-dozen"], 200),
    )

    # 2. SFT, same recipe, with and without the calculator
    common = ["--config", "gpu", "--engine", "torch", f"model={model}", "packing=true", "epochs=null",
              f"max_steps={steps}", "eval_interval=0", "save_interval=0", "log_interval=5"] + dev
    if dry:
        common += ["batch_size=2", "max_seq_len=256", "warmup_steps=1"]
    runs: dict[str, str] = {}

    def sft(tag: str, extra: list[str]):
        rc, text = cli(f"sft_{tag}", ["train"] + common + extra, 400)
        run = run_dir(text)
        if rc == 0 and run:
            runs[tag] = run.name
            rows = metrics(run)
            st = [r for r in rows if "step_s" in r]
            with lock:
                res[f"sft_{tag}"] = {"run": run.name, "steps": len(st) and st[-1].get("step"),
                                     "train_s": round(sum(r["step_s"] for r in st), 1),
                                     "last_loss": next((r["loss"] for r in reversed(rows) if "loss" in r), None)}
    together(lambda: sft("plain", ["dataset=gsm8k"]),
             lambda: sft("calc", ["dataset=gsm8k-calc", "tools=[calculator]"]))

    # 3. greedy on all dev items, then compare
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

    together(*[(lambda t=t: ev(f"greedy_{t}", runs[t], ["--dataset", "gsm8k", "--split", "dev", "--batch-size", ebatch], 200))
               for t in ("plain", "calc") if t in runs])
    if (work / "greedy_plain").exists() and (work / "greedy_calc").exists():
        rc, text = cli("compare", ["compare", str(work / "greedy_plain"), str(work / "greedy_calc"), "--json"], 60)
        if rc == 0:
            c = json.loads(text[text.index("{"):])
            res["compare_plain_calc"] = {k: c[k] for k in ("mcnemar_p", "shared", "both_right", "both_wrong")}
            res["compare_plain_calc"].update(right_to_wrong=len(c["right_to_wrong"]), wrong_to_right=len(c["wrong_to_right"]))
    save()

    # 4. side by side: GRPO from each SFT run; sampled evals
    grpo_common = ["--config", "gpu-grpo", "--engine", "torch", f"model={model}", "max_steps=200", "save_interval=0",
                   "eval_interval=0", "dataset=gsm8k"] + dev
    if dry:
        grpo_common += ["rl_prompts=2", "max_seq_len=256", "rollout_max_new_tokens=16", "max_steps=2", "warmup_steps=1"]

    def grpo(tag: str, extra: list[str]):
        # runs until the budget ends (killed then): the per-step rollout figures are the measurement
        rc, text = cli(f"grpo_{tag}", ["train"] + grpo_common + [f"init={runs[tag]}"] + extra, max(5, deadline - time.time() - 25))
        run = run_dir(text)
        rows = [r for r in metrics(run) if "rollout_pass_at_g" in r] if run else []
        if rows:
            n = len(rows)
            with lock:
                res[f"grpo_{tag}"] = {
                    "run": run.name, "steps": n, "prompts": n * (2 if dry else 8),
                    "rollout_pass_at_g": round(sum(r["rollout_pass_at_g"] for r in rows) / n, 4),
                    "zero_variance_share": round(sum(r["zero_variance_share"] for r in rows) / n, 4),
                    "rollout_accuracy": round(sum(r.get("rollout_accuracy", 0.0) for r in rows) / n, 4),
                    "step_s": round(sum(r.get("step_s", 0.0) for r in rows) / n, 2)}

    sb = "12" if dry else "810"
    jobs = []
    for t in ("plain", "calc"):
        if t in runs:
            jobs.append(lambda t=t: grpo(t, ["tools=[calculator]", "dataset=gsm8k-calc"] if t == "calc" else []))
            jobs.append(lambda t=t: ev(f"sampled_{t}", runs[t], ["--dataset", "gsm8k", "--split", "dev", "--samples", "8",
                                                                  "--temperature", str(args.temperature), "--batch-size", sb], 400))
    if "plain" in runs:
        jobs.append(lambda: ev("rg_plain", runs["plain"], ["--dataset", "rg-dozen", "--split", "test", "--samples", "8",
                                                           "--temperature", str(args.temperature), "--batch-size", sb], 400))
    together(*jobs)

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
    calc_preds = work / "greedy_calc" / "predictions.jsonl"
    if calc_preds.exists():
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
    pa, ca = g("greedy_plain", "accuracy"), g("greedy_calc", "accuracy")
    print(json.dumps({k: v for k, v in res.items() if k not in ("stages", "tool_example")}, indent=1, default=str))
    print(f"RESULT plain_acc={pa} calc_acc={ca} mcnemar_p={g('compare_plain_calc', 'mcnemar_p')} "
          f"calc_over_plain={round(ca / pa, 3) if pa and ca is not None else 'na'}")


if __name__ == "__main__":
    main()
