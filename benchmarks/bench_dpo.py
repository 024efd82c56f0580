"""Our DPO step against TRL's DPOTrainer: same model, pairs, LoRA, beta; fp32 CPU.

    .venv/bin/python benchmarks/bench_dpo.py [--home DIR] [--pairs 2] [--steps 2] [--warmup 1]
        [--rounds 1] [--remat]

Gemma 3 270M (real weights, `ensure_model("gemma3-270m")`), LoRA r=16 alpha=32 on all seven
projections, sigmoid DPO with beta 0.1, the reference the adapter-off model on both sides
(TRL: a PEFT model and no ref_model, its default for LoRA), AdamW at a constant lr 1e-5,
grad-norm clip 1.0, fp32, CPU, P pairs per optimizer step in one micro-batch (2P rows).

The pairs: GSM8K train records, the prompt rendered as SFT and eval render it (the question
under our system prompt, in the Gemma turn format), `chosen` the record's worked solution in
our <reasoning>/<answer> format + <end_of_turn>, `rejected` the next record's solution (a
wrong answer to this question). The parent tokenises them once, in our method's seeded
order, and both sides train on those very token ids:

- ours: the PyTorch engine through our DPO method (`Preference.step`: a no-grad reference
  pass (adapter off) for R, then one forward pass of the policy whose chunked head gives each
  token's log-prob and its gradient wrt the hidden state at once (loss.sequence_logprobs),
  then dL/dS per sequence scales those gradients into backward: no [B, L, V] logits, the head
  run once; engine.SequenceObjective);
- trl: `trl.DPOTrainer.train()` with its defaults apart from fp32/CPU and the shared settings
  above; its train dataset replaced after construction by the same ids (prompt_ids,
  chosen_ids, rejected_ids, what its own tokenisation produces and its collator reads). Its
  sampler shuffles, so a step may hold other pairs of the same set than ours (same total).

Each side runs in its own subprocess (its peak RSS is its own, model loading included); the
sides alternate over rounds. A TRL step is timed from its callback's on_step_begin to
on_step_end (forward, backward, optimizer); ours is the whole `Preference.step`. pairs/s =
P / median step time. The last line: `RESULT speed_ratio=<ours/TRL pairs/s>
mem_ratio=<ours/TRL peak RSS>` (medians over rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from sides import alternate, print_result, run_worker  # benchmarks/ is sys.path[0]

BETA, LR, RANK, ALPHA = 0.1, 1e-5, 16, 32.0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def base_cfg(args, model_dir: str, pairs_file: str):
    from tunix_rt.train.config import TrainConfig

    return TrainConfig(model=model_dir, dataset=pairs_file, split="all", method="dpo", pref_loss="dpo",
                       pref_beta=BETA, finetune="lora", lora_rank=RANK, lora_alpha=ALPHA, lr=LR, schedule="constant",
                       max_seq_len=512, batch_size=2 * args.pairs, grad_accum=1, gradient_checkpointing=args.remat,
                       max_steps=args.warmup + args.steps, engine="torch", device="cpu", seed=0)


# --------------------------------------------------------------------------- parent

def prepare(args) -> Path:
    """The pairs file (TRL's format) and the token ids of every step's pairs, in our method's
    seeded order."""
    from tunix_rt.home import Home
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.render import target_body
    from tunix_rt.traces.dataset import load_dataset
    from tunix_rt.train.preference import Preference

    home = Home.resolve()
    model_dir = str(ensure_model(args.model, home))
    tok = load_tokenizer(model_dir, home)
    work = Path(tempfile.mkdtemp(prefix="bench-dpo-"))
    records = load_dataset("gsm8k", home).records[: 4 * args.pairs * (args.warmup + args.steps) + 1]
    with (work / "pairs.jsonl").open("w") as f:
        for r, other in zip(records, records[1:]):
            f.write(json.dumps({"id": r.id, "prompt": r.question, "chosen": target_body(r.steps, r.answer),
                                "rejected": target_body(other.steps, other.answer)}) + "\n")
    method = Preference(base_cfg(args, model_dir, str(work / "pairs.jsonl")), home, tok)
    steps = [[method.train_pairs[method.order.take()] for _ in range(args.pairs)]
             for _ in range(args.warmup + args.steps)]
    out = work / "steps.json"
    out.write_text(json.dumps({"model_dir": model_dir, "home": str(home.root), "pairs_file": str(work / "pairs.jsonl"),
                               "steps": [[{"id": p.id, "prompt_ids": p.prompt, "chosen_ids": p.chosen,
                                           "rejected_ids": p.rejected} for p in s] for s in steps]}))
    return out


def run_side(side: str, data: Path, args) -> dict:
    """One side's worker in its own process, given this run's step counts and settings."""
    return run_worker(__file__, side, data, ["--warmup", str(args.warmup), "--steps", str(args.steps),
                                             "--pairs", str(args.pairs)] + (["--remat"] if args.remat else []))


# --------------------------------------------------------------------------- workers

def ours_worker(args, data: dict) -> dict:
    """Our DPO method on the torch engine, fed the parent's pairs in order."""
    from tunix_rt.home import Home
    from tunix_rt.models.store import load_tokenizer
    from tunix_rt.train.preference import Preference
    from tunix_rt.train.torch_engine import TorchEngine

    home = Home(Path(data["home"]))
    cfg = base_cfg(args, data["model_dir"], data["pairs_file"])
    tok = load_tokenizer(data["model_dir"], home)
    engine = TorchEngine(cfg)
    engine.devices()
    engine.setup(Path(data["model_dir"]), tok)
    method = Preference(cfg, home, tok)
    index = {p.id: i for i, p in enumerate(method.train_pairs)}
    queue = [index[e["id"]] for step in data["steps"] for e in step]
    for (i, e) in zip(queue, [e for step in data["steps"] for e in step]):
        assert method.train_pairs[i].chosen == e["chosen_ids"]  # the very ids TRL gets

    class Fed:  # the parent's pair order (our own order, written once)
        def take(self):
            return queue.pop(0)

    method.order = Fed()
    times, rows = [], []
    for step in range(len(data["steps"])):
        t0 = time.perf_counter()
        row, _ = method.step(engine, step, LR)
        dt = time.perf_counter() - t0
        rows.append({k: row[k] for k in ("loss", "rewards_margin", "tokens")})
        if step >= args.warmup:
            times.append(dt)
    return {"step_s": times, "rows": rows}


def trl_worker(args, data: dict) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(data["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(data["model_dir"], dtype=torch.float32, attn_implementation="sdpa")
    n = len(data["steps"])
    conf = DPOConfig(output_dir=tempfile.mkdtemp(prefix="bench-dpo-trl-"), per_device_train_batch_size=args.pairs,
                     gradient_accumulation_steps=1, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
                     max_steps=n, beta=BETA, loss_type="sigmoid", max_grad_norm=1.0, use_cpu=True, bf16=False,
                     fp16=False, gradient_checkpointing=args.remat, logging_steps=1, report_to=[], save_strategy="no",
                     max_length=512, dataloader_num_workers=0, seed=0)
    lora = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0, bias="none",
                      task_type="CAUSAL_LM")
    rows = [{k: e[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for step in data["steps"] for e in step]
    text = Dataset.from_list([{"prompt": "a", "chosen": " b", "rejected": " c"}])
    trainer = DPOTrainer(model=model, args=conf, train_dataset=text, processing_class=tok, peft_config=lora)
    trainer.train_dataset = Dataset.from_list(rows)  # the parent's token ids (what its tokenisation gives)
    times, starts = [], []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            starts.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - starts[-1])

    trainer.add_callback(Clock())
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"step_s": times[args.warmup:], "rows": [{"loss": x} for x in losses]}


def worker(args) -> None:
    data = json.loads(Path(args.data).read_text())
    res = trl_worker(args, data) if args.worker == "trl" else ours_worker(args, data)
    res["pairs_per_s"] = args.pairs / statistics.median(res["step_s"])
    print_result(args.worker, res)


# --------------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", help="TUNIX_RT_HOME holding (or to receive) gemma3-270m")
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--pairs", type=int, default=2, help="pairs per optimizer step (2 rows each)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--remat", action="store_true", help="gradient checkpointing on both sides")
    ap.add_argument("--worker", choices=("ours", "trl"), help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.home:
        os.environ["TUNIX_RT_HOME"] = os.path.abspath(args.home)
    data = prepare(args)
    sides = ["ours", "trl"]

    def show(r: int, side: str, res: dict) -> None:
        print(f"round {r + 1} {side:5s}: {statistics.median(res['step_s']):.2f} s/step, "
              f"{res['pairs_per_s']:.3f} pairs/s, peak RSS {res['peak_rss'] / 2**30:.2f} GiB "
              f"({res.get('allocator')} malloc, {res.get('matmul')} products)", flush=True)

    results = alternate(sides, args.rounds, lambda side: run_side(side, data, args), show)
    med = {s: {"pairs_per_s": statistics.median(x["pairs_per_s"] for x in v),
               "step_s": statistics.median(statistics.median(x["step_s"]) for x in v),
               "peak_rss": statistics.median(x["peak_rss"] for x in v)} for s, v in results.items()}
    tokens = statistics.median(r["tokens"] for r in results["ours"][0]["rows"])
    print(f"\n{args.model} LoRA r{RANK}, fp32 CPU, sigmoid DPO beta {BETA}, {args.pairs} pairs per step "
          f"(~{tokens:.0f} tokens), {args.steps} measured steps after {args.warmup} warm-up, {args.rounds} round(s), "
          f"gradient checkpointing {'on' if args.remat else 'off'}")
    names = {"ours": "torch eng.", "trl": "TRL DPO"}
    print(f"{'side':11s} {'s/step':>8s} {'pairs/s':>9s} {'peak RSS GiB':>13s}")
    for s in sides:
        m = med[s]
        print(f"{names[s]:11s} {m['step_s']:8.2f} {m['pairs_per_s']:9.3f} {m['peak_rss'] / 2**30:13.2f}")
    for s in sides:
        print(f"{names[s]}: loss per step " + ", ".join(f"{r['loss']:.4f}" for r in results[s][0]["rows"]))
    print(f"RESULT speed_ratio={med['ours']['pairs_per_s'] / med['trl']['pairs_per_s']:.3f} "
          f"mem_ratio={med['ours']['peak_rss'] / med['trl']['peak_rss']:.3f}")


if __name__ == "__main__":
    main()
