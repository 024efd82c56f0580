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
divides by the process's CPU time instead, which a shared machine disturbs less.

Matmul throughput: `sft_step_flops` counts, analytically, the matmul FLOPs (2·M·K·N each) each
side's step computes on its batches, at the padded [batch, longest row] shapes both run the
decoder on (padding included: it is computed), with what each side really does: our fused
loss projects only the positions with a target through the 262K head (forward, then the
gradient wrt the hidden states); TRL's fused head (CPU path) projects every position but the
last, and recomputes the logits in backward (3 passes); TRL's gradient checkpointing
recomputes every decoder layer's forward. Attention counts the causal triangle where the
kernel runs causal (no padding mask: our side; the CPU flash kernel works in blocks of query
rows, so it computes somewhat more than the triangle) and the full square where a padding mask
is given (TRL), 2 matmuls forward and 5 backward (the CPU flash kernel recomputes the scores).
tests/benchmarks/test_sft_flops.py checks the count against torch's FlopCounterMode around
both workers on tiny-gemma3.
Elementwise work (norms, softmax, AdamW) is not counted. Achieved TFLOP/s = FLOPs of the
measured steps / their wall time, shown as a share of this machine's fp32 matmul throughput
at the model's training shapes (`roofline.bounds()`, measured in this invocation before the
sides run).

The last line: `RESULT speed_ratio=<ours/TRL tokens/s> mem_ratio=<ours/TRL peak RSS>
cpu_speed_ratio=<…> mm_fraction=<ours achieved / measured fp32 matmul throughput>
trl_mm_fraction=<TRL's>` (medians over rounds).
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


# --------------------------------------------------------------------------- FLOPs

def projection_shapes(hf: dict) -> dict[str, tuple[int, int]]:
    """(K, N) of each of a decoder layer's seven projections, x [T, K] @ W^T [K, N], from the
    model's config.json."""
    d, ff = hf["hidden_size"], hf["intermediate_size"]
    q, kv = hf["num_attention_heads"] * hf["head_dim"], hf["num_key_value_heads"] * hf["head_dim"]
    return {"q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d),
            "gate_proj": (d, ff), "up_proj": (d, ff), "down_proj": (ff, d)}


FIRST_LAYER_INPUTS = ("q_proj", "k_proj", "v_proj")
"""The projections that read the (frozen) embedding through a norm in layer 0: autograd forms
no gradient wrt their input unless the embedding output is made to require one (as
gradient checkpointing does, through enable_input_require_grads)."""


def sft_step_flops(hf: dict, *, rows: int, width: int, head_rows: int, lora_rank: int, head_passes: int,
                   recompute: bool, input_grad: bool, causal: bool, rope_rows: int) -> dict[str, int]:
    """Matmul FLOPs (2·M·K·N each) of one LoRA SFT step, on all seven projections of every
    layer, frozen base weights and head, over a [rows, width] (padded) batch:
    - projections: forward base + LoRA (x A^T then B^T); backward the gradient wrt the input
      through the frozen base, and through LoRA the gradients wrt B, wrt x A^T, wrt A and wrt
      the input; none wrt the input of layer 0's q/k/v unless `input_grad`; `recompute`
      (gradient checkpointing) runs every layer's forward a second time in backward;
    - attention: 2 matmuls forward (scores, values) and 5 backward (the scores recomputed,
      grad wrt the probabilities, V, Q, K) per query head, over `width`² query-key pairs, or
      the causal triangle width·(width+1)/2 when `causal`; forward again under `recompute`;
    - head: `head_passes` passes of `head_rows` x hidden x vocabulary (ours: logits and the
      gradient wrt the hidden rows, 2; the tied head is frozen, so no weight gradient);
    - rope: the rotary embedding's inv_freq x positions product, once per layer type, over
      `rope_rows` rows of positions.
    Returns each part and `total`."""
    t, r, layers = rows * width, lora_rank, hf["num_hidden_layers"]
    shapes = projection_shapes(hf)
    fwd = sum(2 * t * k * n + 2 * t * r * (k + n) for k, n in shapes.values())
    bwd = sum(2 * t * k * n + 4 * t * r * (k + n) for k, n in shapes.values())
    no_input_grad = 0 if input_grad else sum(2 * t * k * n + 2 * t * r * k
                                             for name, (k, n) in shapes.items() if name in FIRST_LAYER_INPUTS)
    projections = layers * (fwd * (2 if recompute else 1) + bwd) - no_input_grad
    heads, hd = hf["num_attention_heads"], hf["head_dim"]
    pairs = width * (width + 1) // 2 if causal else width * width
    one_matmul = 2 * rows * heads * pairs * hd
    attention = layers * one_matmul * (2 * (2 if recompute else 1) + 5)
    head = head_passes * 2 * head_rows * hf["hidden_size"] * hf["vocab_size"]
    rope = len(set(hf.get("layer_types") or ["one"])) * 2 * rope_rows * (hd // 2) * width
    parts = {"projections": projections, "attention": attention, "head": head, "rope": rope}
    return {**parts, "total": sum(parts.values())}


def side_flops(hf: dict, steps: list[list[dict]], side: str, lora_rank: int, gc: bool) -> list[dict[str, int]]:
    """sft_step_flops of each step's batch as `side` computes it (see the module docstring)."""
    out = []
    for s in steps:
        rows, width = len(s), max(len(e["ids"]) for e in s)
        if side == "ours":  # collate: a label wherever the next token's loss mask is on
            head_rows, passes, causal, rope_rows = sum(sum(e["loss_mask"][1:]) for e in s), 2, True, rows
        else:  # TRL: every position but the last; a padding mask unless all rows are as long
            head_rows, passes, rope_rows = rows * (width - 1), 3, 1
            causal = all(len(e["ids"]) == width for e in s)
        out.append(sft_step_flops(hf, rows=rows, width=width, head_rows=head_rows, lora_rank=lora_rank,
                                  head_passes=passes, recompute=gc, input_grad=gc, causal=causal,
                                  rope_rows=rope_rows))
    return out


LORA_RANK = 16
"""Both sides' LoRA rank (alpha = 2 x rank)."""

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
    from roofline import bounds, fraction

    data = prepare(args)
    info = json.loads(data.read_text())
    peak = bounds()["fp32_gflops"] * 1e9  # before the sides run: the machine as quiet as it gets here
    hf = json.loads((Path(info["model_dir"]) / "config.json").read_text())
    flops = {"ours": side_flops(hf, info["steps"], "ours", LORA_RANK, args.ours_gc),
             "trl": side_flops(hf, info["steps"], "trl", LORA_RANK, not args.trl_no_gc)}
    tokens = [sum(len(e["ids"]) for e in s) for s in info["steps"]]
    print(f"model {info['model_dir']}; {args.warmup} warm-up + {args.steps} measured steps of batch {args.batch}, "
          f"seq <= {args.seq}; real tokens per step {tokens}; load avg {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")

    def show(r: int, side: str, res: dict) -> None:
        print(f"  round {r + 1} {side:4s}: {res['step_s_mean']:.2f} s/step, {res['tokens_per_s']:.1f} tokens/s, "
              f"peak RSS {res['peak_rss'] / 2**30:.2f} GiB, last loss {res['last_loss']:.4f} "
              f"(load avg {os.getloadavg()[0]:.1f}; {res.get('allocator')} malloc, {res.get('matmul')} products)", flush=True)

    results = alternate(("ours", "trl"), args.rounds, lambda side: run_side(side, data, args), show)
    measured = {side: sum(f["total"] for f in fs[args.warmup:]) for side, fs in flops.items()}
    for rs in results.values():
        for x in rs:
            x["flop_s"] = measured[x["side"]] / sum(x["step_s"][args.warmup:])
    keys = ("tokens_per_s", "tokens_per_cpu_s", "step_s_mean", "peak_rss", "flop_s")
    med = {side: {k: statistics.median(x[k] for x in rs) for k in keys}
           for side, rs in results.items()}
    print()
    print(f"{'engine':<22}{'s/step':>10}{'tokens/s':>12}{'tokens/CPU-s':>14}{'peak RSS GiB':>15}"
          f"{'TFLOP/step':>12}{'TFLOP/s':>10}{'of fp32 mm':>12}")
    names = {"ours": "tunix-rt torch engine", "trl": "TRL SFTTrainer" + (" (no GC)" if args.trl_no_gc else "")}
    for side in ("ours", "trl"):
        m = med[side]
        per_step = measured[side] / args.steps
        print(f"{names[side]:<22}{m['step_s_mean']:>10.2f}{m['tokens_per_s']:>12.1f}{m['tokens_per_cpu_s']:>14.1f}"
              f"{m['peak_rss'] / 2**30:>15.2f}{per_step / 1e12:>12.3f}{m['flop_s'] / 1e12:>10.3f}"
              f"{fraction(m['flop_s'], peak):>12}")
    print(f"fp32 matmul throughput measured here (roofline.bounds, training shapes): {peak / 1e12:.3f} TFLOP/s")
    for side in ("ours", "trl"):
        print(f"  {names[side]}, last step's FLOPs: "
              + ", ".join(f"{k} {v / 1e12:.3f} T" for k, v in flops[side][-1].items()))
    speed = med["ours"]["tokens_per_s"] / med["trl"]["tokens_per_s"]
    mem = med["ours"]["peak_rss"] / med["trl"]["peak_rss"]
    cpu_speed = med["ours"]["tokens_per_cpu_s"] / med["trl"]["tokens_per_cpu_s"]
    print(f"RESULT speed_ratio={speed:.2f} mem_ratio={mem:.2f} cpu_speed_ratio={cpu_speed:.2f} "
          f"mm_fraction={med['ours']['flop_s'] / peak:.2f} trl_mm_fraction={med['trl']['flop_s'] / peak:.2f}")


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

    cfg = TrainConfig(model=data["model_dir"], dataset="prepared-batches", finetune="lora", lora_rank=LORA_RANK,
                      lora_alpha=2 * LORA_RANK, batch_size=len(data["steps"][0]), max_seq_len=256, lr=2e-4,
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
    lora = LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, lora_dropout=0.0, target_modules=list(ALL_LORA_TARGETS),
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
