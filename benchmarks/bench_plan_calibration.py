"""The memory plan against reality on this CPU: predicted peak (tunix_rt.plan) versus the
measured peak RSS of real training runs, each in its own process (tests/plan/rss_child.py),
and the analytic versus XLA estimate of the JAX train step.

    .venv/bin/python benchmarks/bench_plan_calibration.py [--gemma] [--xla-headline]

Default: the tiny model on both engines, and one GRPO step on the tiny model (a minute).
--gemma adds Gemma 3 270M LoRA and full on the torch engine (batch 4 x 256; minutes);
--gemma-rl one GRPO step of Gemma 3 270M (4 prompts x 4 samples of 128 tokens, prompts of
128, the update in micro-batches of 1 with remat: many minutes), each RL phase measured on
its own (rss_child resets the high-water mark per phase); --xla-headline adds Gemma 2B full
FT over 8 fake v5e devices, with and without remat (two compiles of minutes). Last line:
RESULT with the ratios (measured / predicted, xla / analytic).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHILD = REPO / "tests" / "plan" / "rss_child.py"


def traces(path: Path, n: int, words: int) -> str:
    with open(path, "w") as f:
        for i in range(n):
            steps = [f"{i} plus {j} is {i + j}. " * words for j in range(1 + i % 3)]
            f.write(json.dumps({"id": f"t{i:03d}", "question": f"Add {i}?", "steps": steps, "answer": str(i)}) + "\n")
    return str(path)


def questions(path: Path, n: int, filler: int) -> str:
    """Prompts of about one length (see tests/plan/test_plan_calibration.write_questions)."""
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"q{i:03d}", "question": f"Add {i} and {i + 7}? " + "Think carefully. " * filler,
                                "steps": [f"{i} plus {i + 7} is {2 * i + 7}."], "answer": str(2 * i + 7)}) + "\n")
    return str(path)


def measure(fields: dict, home: Path) -> dict:
    env = {**os.environ, "TUNIX_RT_HOME": str(home)}
    proc = subprocess.run([sys.executable, str(CHILD), json.dumps(fields)], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-2000:])
    return json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gemma", action="store_true")
    ap.add_argument("--gemma-rl", action="store_true")
    ap.add_argument("--xla-headline", action="store_true")
    args = ap.parse_args()
    from rich.console import Console
    from rich.table import Table

    rows, result = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tiny = dict(model="tiny-gemma3", dataset=traces(tmp / "tiny.jsonl", 16, 1), split="all", eval_split="all",
                    eval_limit=4, batch_size=4, max_seq_len=128, max_steps=2)
        rl = dict(split="all", eval_split="all", eval_limit=8, method="grpo", rl_prompts=4, group_size=4,
                  max_steps=1, _seq_fits_prompts=True)  # as tests/plan/test_plan_calibration.grpo_fields
        cases = [("tiny_torch_full", {**tiny, "method": "full", "_threads": 1}),
                 ("tiny_jax_lora", {**tiny, "method": "lora", "engine": "jax"}),
                 ("tiny_torch_grpo", {**rl, "model": "tiny-gemma3", "dataset": questions(tmp / "q.jsonl", 16, 0),
                                      "rollout_max_new_tokens": 32, "batch_size": 4, "_threads": 1})]
        if args.gemma or args.gemma_rl:
            from tunix_rt.home import Home
            from tunix_rt.models.store import ensure_model

            model = str(ensure_model("gemma3-270m", Home.resolve(REPO / ".cache" / "test-home")))
        if args.gemma_rl:
            cases.append(("gemma3_270m_torch_grpo", {
                **rl, "model": model, "dataset": questions(tmp / "gq.jsonl", 16, 28), "rollout_max_new_tokens": 128,
                "batch_size": 1, "gradient_checkpointing": True, "_threads": 2}))
        if args.gemma:
            g = dict(model=model, dataset=traces(tmp / "g.jsonl", 40, 6), split="all", eval_split="all",
                     eval_limit=2, batch_size=4, max_seq_len=256, packing=True, max_steps=2,
                     _threads=2)
            cases += [("gemma3_270m_torch_lora", {**g, "method": "lora"}), ("gemma3_270m_torch_full", {**g, "method": "full"})]
        for name, fields in cases:
            out = measure(fields, tmp / f"home-{name}")
            ratio = out["measured_peak_rss"] / out["predicted"]
            rows.append((name, out["predicted"], out["measured_peak_rss"], ratio, out["train_s"]))
            result[f"{name}_ratio"] = round(ratio, 3)
            for part, (predicted, measured) in out.get("compare", {}).items():  # an RL step's phases
                rows.append((f"  {part}", predicted, measured, measured / predicted, ""))
                result[f"{name}_{part.replace('-', '_').replace(' ', '_')}_ratio"] = round(measured / predicted, 3)
    table = Table(title="predicted peak vs measured peak RSS (CPU)")
    for col in ("case", "predicted GB", "measured GB", "measured/predicted", "train s"):
        table.add_column(col)
    for name, pred, meas, ratio, secs in rows:
        table.add_row(name, f"{pred / 1e9:.3f}", f"{meas / 1e9:.3f}", f"{ratio:.2f}", f"{secs}")
    Console().print(table)
    if args.xla_headline:
        from tunix_rt.plan import GiB, PlanInputs, make_plan

        for remat in (True, False):
            plan = make_plan(PlanInputs(model="gemma-2b", method="full", seq=512, batch=8, device="tpu-v5e",
                                        devices=8, engine="jax", dtype="bf16", remat=remat), xla=True)
            a, x = plan.estimators["analytic"], plan.estimators["xla"]
            print(f"gemma-2b full, v5e-8, seq 512, batch 8, bf16, remat={remat}: analytic {a / GiB:.2f} GiB, "
                  f"xla {x / GiB:.2f} GiB, compile {plan.details['xla']['compile_s']} s")
            result[f"headline{'' if remat else '_no_remat'}_xla_over_analytic"] = round(x / a, 3)
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
