"""Our PyTorch engine against TRL's SFTTrainer: same model, data, LoRA, batches, fp32, CPU.

    .venv/bin/python benchmarks/bench_torch_vs_trl.py [--steps 3] [--warmup 1] [--rounds 1]

Gemma 3 270M (real weights, `ensure_model("gemma3-270m")`), GSM8K traces rendered by
tunix_rt.render (examples longer than --seq dropped), LoRA r=16 alpha=32 on all seven
projections, batch 4, one micro-batch per step, constant lr 2e-4. Both sides get the very
same examples in the very same order (TRL with a sequential sampler, the prompt masked out
through `completion_mask`). Each side runs in its own subprocess so that its peak RSS is its
own (model loading included); the sides alternate (ours, TRL, then TRL, ours, ...) so a busy
machine slows both alike. TRL runs with its defaults apart from fp32 (bf16=False), which
includes gradient checkpointing; pass --trl-no-gc to turn that off.

tokens/s = real (non-padding) tokens of the measured steps / their wall time; tokens/CPU-s
divides by the process's CPU time instead, which a shared machine disturbs less. The last line:
`RESULT speed_ratio=<ours/TRL tokens/s> mem_ratio=<ours/TRL peak RSS> cpu_speed_ratio=<…>`
(medians over rounds).
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


# --------------------------------------------------------------------------- parent

def prepare(args) -> Path:
    """Render GSM8K once and write the batches both sides will train on, in order."""
    from tunix_rt.home import Home
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.render import render_dataset
    from tunix_rt.traces.dataset import load_dataset
    from tunix_rt.train.data import BatchStream

    home = Home.resolve()
    model_dir = ensure_model(args.model, home)
    tok = load_tokenizer(str(model_dir), home)
    records = load_dataset("gsm8k", home).split("train")[: 64 * args.batch]
    examples, stats = render_dataset(records, tok, args.seq, on_overlong="drop")
    stream = BatchStream(examples, args.batch, args.seq, False, seed=0, pad_id=tok.pad_id)
    steps = [[row[0] for row in stream.next_rows()] for _ in range(args.warmup + args.steps)]
    data = {"model_dir": str(model_dir), "pad_id": tok.pad_id, "dropped_overlong": stats.dropped_overlong,
            "steps": [[{"id": e.id, "ids": e.ids, "loss_mask": e.loss_mask} for e in s] for s in steps]}
    out = Path(tempfile.mkdtemp(prefix="bench-torch-trl-")) / "batches.json"
    out.write_text(json.dumps(data))
    return out


def run_side(side: str, data: Path, args) -> dict:
    """One side's worker in its own process; adds the process's wall time, loading included."""
    t0 = time.perf_counter()
    result = run_worker(__file__, side, data, ["--warmup", str(args.warmup), "--steps", str(args.steps)]
                        + (["--trl-no-gc"] if args.trl_no_gc else []))
    result["wall_s"] = time.perf_counter() - t0
    return result


def main(args) -> None:
    data = prepare(args)
    info = json.loads(data.read_text())
    tokens = [sum(len(e["ids"]) for e in s) for s in info["steps"]]
    print(f"model {info['model_dir']}; {args.warmup} warm-up + {args.steps} measured steps of batch {args.batch}, "
          f"seq <= {args.seq}; real tokens per step {tokens}; load avg {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")

    def show(r: int, side: str, res: dict) -> None:
        print(f"  round {r + 1} {side:4s}: {res['step_s_mean']:.2f} s/step, {res['tokens_per_s']:.1f} tokens/s, "
              f"peak RSS {res['peak_rss'] / 2**30:.2f} GiB, last loss {res['last_loss']:.4f} "
              f"(load avg {os.getloadavg()[0]:.1f})", flush=True)

    results = alternate(("ours", "trl"), args.rounds, lambda side: run_side(side, data, args), show)
    keys = ("tokens_per_s", "tokens_per_cpu_s", "step_s_mean", "peak_rss")
    med = {side: {k: statistics.median(x[k] for x in rs) for k in keys}
           for side, rs in results.items()}
    print()
    print(f"{'engine':<22}{'s/step':>10}{'tokens/s':>12}{'tokens/CPU-s':>14}{'peak RSS GiB':>15}")
    names = {"ours": "tunix-rt torch engine", "trl": "TRL SFTTrainer" + (" (no GC)" if args.trl_no_gc else "")}
    for side in ("ours", "trl"):
        m = med[side]
        print(f"{names[side]:<22}{m['step_s_mean']:>10.2f}{m['tokens_per_s']:>12.1f}{m['tokens_per_cpu_s']:>14.1f}"
              f"{m['peak_rss'] / 2**30:>15.2f}")
    speed = med["ours"]["tokens_per_s"] / med["trl"]["tokens_per_s"]
    mem = med["ours"]["peak_rss"] / med["trl"]["peak_rss"]
    cpu_speed = med["ours"]["tokens_per_cpu_s"] / med["trl"]["tokens_per_cpu_s"]
    print(f"RESULT speed_ratio={speed:.2f} mem_ratio={mem:.2f} cpu_speed_ratio={cpu_speed:.2f}")


# --------------------------------------------------------------------------- workers

def _report(side: str, step_times: list[float], tokens: list[int], losses: list[float], warmup: int,
            cpu_times: list[float]) -> None:
    measured_t, measured_tok = step_times[warmup:], tokens[warmup:]
    print_result(side, {
        "tokens_per_s": sum(measured_tok) / sum(measured_t),
        "tokens_per_cpu_s": sum(measured_tok) / sum(cpu_times[warmup:]),
        "step_s_mean": sum(measured_t) / len(measured_t),
        "step_s": step_times, "losses": losses, "last_loss": losses[-1],
    })


def worker_ours(data: dict, args) -> None:
    """The PyTorch engine's own step (TorchEngine.train_step: its fused chunked loss, AdamW)."""
    from types import SimpleNamespace

    from tunix_rt.render import Rendered
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.data import collate, weighted
    from tunix_rt.train.engine import NLL
    from tunix_rt.train.torch_engine import TorchEngine

    cfg = TrainConfig(model=data["model_dir"], dataset="prepared-batches", finetune="lora", lora_rank=16,
                      lora_alpha=32, batch_size=len(data["steps"][0]), max_seq_len=256, lr=2e-4,
                      schedule="constant", dtype="fp32", max_steps=len(data["steps"]), device="cpu",
                      engine="torch", gradient_checkpointing=bool(getattr(args, "ours_gc", False)))
    engine = TorchEngine(cfg)
    engine.devices()  # on a CPU: the allocator setting, as in a run
    engine.setup(Path(data["model_dir"]), SimpleNamespace(pad_id=data["pad_id"]))
    batches = [collate([[Rendered(e["id"], e["ids"], e["loss_mask"], 0, "", "")] for e in s], data["pad_id"])
               for s in data["steps"]]
    times, cpu, losses = [], [], []
    for b in batches:
        t0, c0 = time.perf_counter(), time.process_time()
        loss = engine.train_step(weighted([b]), NLL, 2e-4).loss
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        losses.append(loss)
    _report("ours", times, [b.n_tokens for b in batches], losses, args.warmup, cpu)


def worker_trl(data: dict, args) -> None:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from tunix_rt.train.config import ALL_LORA_TARGETS

    rows = [{"input_ids": e["ids"], "completion_mask": e["loss_mask"]} for s in data["steps"] for e in s]
    batch = len(data["steps"][0])
    times, cpu, losses, t0 = [], [], [], [0.0, 0.0]

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            t0[:] = [time.perf_counter(), time.process_time()]

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - t0[0])
            cpu.append(time.process_time() - t0[1])

        def on_log(self, _args, _state, _control, logs=None, **k):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    model = AutoModelForCausalLM.from_pretrained(data["model_dir"], dtype=torch.float32, use_safetensors=True)
    tok = AutoTokenizer.from_pretrained(data["model_dir"])
    out = tempfile.mkdtemp(prefix="trl-out-")
    config = SFTConfig(
        output_dir=out, per_device_train_batch_size=batch, gradient_accumulation_steps=1,
        max_steps=len(data["steps"]), learning_rate=2e-4, lr_scheduler_type="constant", warmup_steps=0,
        bf16=False, fp16=False, use_cpu=True, logging_steps=1, save_strategy="no", report_to=[],
        train_sampling_strategy="sequential", completion_only_loss=True, max_length=256,
        dataloader_num_workers=0, disable_tqdm=True, seed=0,
        **({"gradient_checkpointing": False} if args.trl_no_gc else {}),
    )
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=list(ALL_LORA_TARGETS),
                      bias="none", task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows),
                         processing_class=tok, peft_config=lora, callbacks=[Timer()])
    trainer.train()
    tokens = [sum(len(e["ids"]) for e in s) for s in data["steps"]]
    _report("trl", times, tokens, losses or [float("nan")], args.warmup, cpu)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1, help="ours/TRL alternations")
    p.add_argument("--trl-no-gc", action="store_true", help="TRL without gradient checkpointing")
    p.add_argument("--ours-gc", action="store_true", help="our engine with gradient checkpointing (default off)")
    p.add_argument("--worker", choices=("ours", "trl"), help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    return p.parse_args()


if __name__ == "__main__":
    a = parse()
    if a.worker:
        payload = json.loads(Path(a.data).read_text())
        (worker_ours if a.worker == "ours" else worker_trl)(payload, a)
    else:
        main(a)
