"""The JAX engine's own step (our chunked loss) against Tunix's PeftTrainer with its default loss.

    .venv/bin/python benchmarks/bench_jax_loss.py --home /work/main/.cache/test-home \
        [--steps 3] [--warmup 1] [--rounds 1] [--chunk-bytes N] [--remat] [--sides ours,tunix,torch]

Gemma 3 270M (real weights, `ensure_model("gemma3-270m")`), GSM8K traces rendered by
tunix_rt.render (longer than --seq dropped), qwix LoRA r=16 alpha=32 on all projections,
batch 4 x 256 (every batch padded to 256), fp32, CPU, AdamW at constant lr 2e-4, the
same batches in the same order on both sides. `--pad longest` hands the JAX engine each
batch padded to its longest row instead, as training's collator does (the engine then pads
it to its 64-token width bucket, one compilation per bucket; the torch side always pads to
the longest row): the fair setting against `torch`. A training run compiles each bucket
once, so the JAX engine runs each bucket of the measured steps once before timing, through
its gradient alone (`warm_buckets`: no update, the parameters untouched), and prints the
seconds that took; a bucket's first call costs more than its compilation as jax.monitoring
counts it. Any compilation still inside a measured step (jax.monitoring's trace, lowering
and backend-compile durations) is taken out of its wall and CPU time and printed. Only the
loss differs:

- tunix: `peft_trainer._default_loss_fn` (full [B, L, V] logits, log_softmax, one-hot);
  its target mask is our loss mask (the model turn), so both compute the same number;
- ours: `tunix_rt.train.jax_loss` (hidden states, then a scan over chunks of tokens whose
  logits fit in --chunk-bytes, the config's default unless given;
  a custom VJP computes each chunk's gradient in the forward pass, targets by index).

The `ours` side is the JAX engine itself (`JaxEngine.train_step`: its jitted gradient
and update functions, the update donating parameters and optimizer state); the `tunix` side
is Tunix's `PeftTrainer` as shipped, with its default loss. Both use the engine's CPU
allocator setting. A third side, `torch`, is the
PyTorch engine's own step on the same batches (same LoRA, optimizer and lr; its chunked
loss with the config's default chunk), from bench_torch_vs_trl's worker: the
JAX engine against the PyTorch engine on one config.

Each side runs in its own subprocess (peak RSS is its own, model loading included); sides
alternate (ours, tunix, then tunix, ours, ...). Step time is the median of the measured
steps (the first --warmup steps, which compile, are not measured). Also prints the loss of
each side on the first batch, which must agree. Last line:
`RESULT mem_ratio=<ours/tunix peak RSS> speed_ratio=<ours/tunix tokens/s>
cpu_speed_ratio=<tunix/ours CPU-seconds per step> ... jax_vs_torch_speed=<JAX engine/PyTorch
engine tokens/s> ... jax_mm_fraction=<JAX engine's model FLOP/s / fp32 matmul bound>
tunix_mm_fraction=... torch_mm_fraction=...` (medians; CPU time is what a shared machine
disturbs least).

Each side's rate is also given as a share of the bound it is under (issue 27.1): the model
FLOPs of a measured step over its median wall time, divided by this machine's fp32 matmul
throughput at the model's training shapes (`roofline.bounds()`, measured in this invocation
before the sides run). Every side is credited the same model FLOPs for the same batch:
bench_torch_vs_trl's `sft_step_flops` as the torch engine computes it without gradient
checkpointing (each real row's padded batch, causal attention, the head over the supervised
positions only, forward and the gradient wrt the hidden states). Work a side does beyond that
(recomputation under --remat, padding to --seq, Tunix's head over every position, the full
attention square) is not credited: this is a model-FLOPs utilisation, comparable across sides.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from sides import alternate, print_result, run_worker  # benchmarks/ is sys.path[0]

from tunix_rt.files import peak_rss_bytes
from tunix_rt.train.chunking import DEFAULT_CHUNK_BYTES


def prepare(args) -> Path:
    """Render GSM8K once and write the batches every side trains on, in order: the same
    file bench_torch_vs_trl writes (its worker is the `torch` side here)."""
    from bench_torch_vs_trl import prepare as write_batches  # benchmarks/ is sys.path[0]

    return write_batches(args)


def model_flops(data: Path, args) -> float:
    """The model FLOPs credited to every side for one measured step: the mean over the measured
    steps of bench_torch_vs_trl's count for the torch engine without recompute (module doc)."""
    from bench_torch_vs_trl import LORA_RANK, side_flops  # benchmarks/ is sys.path[0]

    info = json.loads(data.read_text())
    hf = json.loads((Path(info["model_dir"]) / "config.json").read_text())
    steps = side_flops(hf, info["steps"], "ours", LORA_RANK, False)[args.warmup:]
    return sum(f["total"] for f in steps) / len(steps)


def run_side(side: str, data: Path, args) -> dict:
    """One side's worker in its own process; the `torch` side is bench_torch_vs_trl's `ours`
    worker, its result put in this script's terms."""
    if side != "torch":
        return run_worker(__file__, side, data, ["--seq", str(args.seq), "--chunk-bytes", str(args.chunk_bytes),
                                                 "--warmup", str(args.warmup), "--pad", args.pad]
                          + (["--remat"] if args.remat else []))
    res = run_worker(Path(__file__).with_name("bench_torch_vs_trl.py"), "ours", data,
                     ["--warmup", str(args.warmup), "--steps", str(args.steps)] + (["--ours-gc"] if args.remat else []))
    steps = res["step_s"][args.warmup:]
    tokens = res["tokens_per_s"] * sum(steps) / len(steps)  # real tokens per measured step
    return {"side": "torch", "step_s": statistics.median(steps), "tokens_per_s": res["tokens_per_s"],
            "cpu_s_per_step": tokens / res["tokens_per_cpu_s"], "peak_rss": res["peak_rss"],
            "rss_after_load": None, "losses": res["losses"], "compile_s_taken_out": 0.0,
            "allocator": res["allocator"], "matmul": res.get("matmul")}


# --------------------------------------------------------------------------- worker

def batch_arrays(step, seq: int, pad_id: int):
    """One bench step for Tunix's PeftTrainer: its default loss uses input_mask as the
    target mask (our loss mask: the model turn)."""
    import numpy as np

    b = len(step)
    ids = np.full((b, seq), pad_id, np.int32)
    mask = np.zeros((b, seq), np.int32)
    for r, e in enumerate(step):
        ids[r, : len(e["ids"])] = e["ids"]
        mask[r, : len(e["loss_mask"])] = e["loss_mask"]
    return {"input_tokens": ids, "input_mask": mask.astype(bool), "real": ids != pad_id}


def engine_batch(step, seq: int, pad_id: int):
    """One bench step as the engine's data.Batch (labels from the loss mask, padded to seq)."""
    import numpy as np

    from tunix_rt.train.data import IGNORE, Batch, weighted

    b = len(step)
    ids = np.full((b, seq), pad_id, np.int64)
    labels = np.full((b, seq), IGNORE, np.int64)
    for r, e in enumerate(step):
        x, m = np.asarray(e["ids"]), np.asarray(e["loss_mask"], bool)
        ids[r, :len(x)] = x
        labels[r, :len(x) - 1] = np.where(m[1:], x[1:], IGNORE)
    pos = np.broadcast_to(np.arange(seq), (b, seq)).copy()
    batch = Batch(ids, labels, pos, [], int((ids != pad_id).sum()), int((labels != IGNORE).sum()))
    return weighted([batch])[0]


def worker(args) -> None:
    import jax

    from tunix_rt.heap import tune_cpu_allocator

    tune_cpu_allocator()  # as the JAX engine does on a CPU
    data = json.loads(Path(args.data).read_text())
    measure = engine_worker if args.worker == "ours" else tunix_worker
    compiled = _compile_clock(jax)
    times, cpu, losses, tokens, rss_loaded = measure(args, data, jax, compiled)
    step_s = statistics.median(times)
    print_result(args.worker, {"step_s": step_s, "tokens_per_s": statistics.median(tokens) / step_s,
                               "cpu_s_per_step": statistics.median(cpu), "rss_after_load": rss_loaded,
                               "losses": losses, "compile_s_taken_out": compiled.taken_out,
                               "warmed": compiled.warmed})


class _compile_clock:
    """Seconds JAX spent compiling so far (tracing, lowering to MLIR, XLA's backend compile),
    from jax.monitoring's duration events; `taken_out` sums what _timed removed from measured
    steps."""

    EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "/jax/core/compile/backend_compile_duration")

    def __init__(self, jax):
        self.total = 0.0
        self.taken_out = 0.0
        self.warmed: dict[int, float] = {}  # engine_worker's warm_buckets
        jax.monitoring.register_event_duration_secs_listener(self._on)

    def _on(self, name, secs, **_kw):
        if name in self.EVENTS:
            self.total += secs

    def __call__(self) -> float:
        return self.total


def _timed(steps, warmup, run_one, compiled: "_compile_clock | None" = None):
    """Per measured step: wall and CPU seconds (less any compilation inside it), the loss, the
    real tokens."""
    times, cpu, losses, tokens = [], [], [], []
    for i, step in enumerate(steps):
        t0, c0, k0 = time.perf_counter(), time.process_time(), compiled() if compiled else 0.0
        loss = float(run_one(step))
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        losses.append(loss)
        if i >= warmup:
            k = (compiled() - k0) if compiled else 0.0  # a new width bucket compiled in this step
            if compiled:
                compiled.taken_out += k
            times.append(dt - k)
            cpu.append(max(dc - k, 0.0))
            tokens.append(sum(len(e["ids"]) for e in step))
    return times, cpu, losses, tokens


def engine_worker(args, data, jax, compiled):
    """The JAX engine's own step: LoRA r16, AdamW at a constant 2e-4, our loss."""
    from types import SimpleNamespace

    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.engine import NLL
    from tunix_rt.train.jax_engine import JaxEngine

    cfg = TrainConfig(dataset="bench", lora_rank=16, lora_alpha=32.0, lr=2e-4, optimizer="adamw",
                      weight_decay=1e-4, grad_clip=0.0, gradient_checkpointing=args.remat,
                      loss_chunk_bytes=args.chunk_bytes, engine="jax", device="cpu")
    engine = JaxEngine(cfg)
    engine.devices()
    engine.setup(Path(data["model_dir"]), SimpleNamespace(pad_id=data["pad_id"]))
    rss_loaded = peak_rss_bytes()
    def width(step) -> int:  # --pad longest: as training's collator pads; the engine buckets it
        return args.seq if args.pad == "seq" else max(len(e["ids"]) for e in step)

    def batch(step):
        return engine_batch(step, width(step), data["pad_id"])

    compiled.warmed = warm_buckets(engine, [batch(s) for s in data["steps"][args.warmup:]], NLL)
    out = _timed(data["steps"], args.warmup, lambda step: engine.train_step([batch(step)], NLL, 2e-4).loss, compiled)
    return (*out, rss_loaded)


def warm_buckets(engine, batches, objective) -> dict[int, float]:
    """Each width bucket the measured steps will use, run once before timing through the
    engine's gradient alone (`JaxEngine.gradients`: no update, its rngs put back, so the
    parameters and the trajectory are those of an unwarmed run): {bucket width: wall seconds}.
    Why: a bucket's first call costs more than its compilation as jax.monitoring counts it
    (tracing, lowering and XLA's compile or cache read are counted; on a 2-core Xeon a
    192-wide bucket's first step took 13.3 s, its steady steps 4.7 s, the counted compile
    6.3 s), and a training run pays that once per bucket, not per step."""
    import time

    from tunix_rt.train.jax_engine import width_bucket

    warmed: dict[int, float] = {}
    for b in batches:
        bucket = width_bucket(b.input_ids.shape[1])
        if bucket in warmed:
            continue
        rngs, t0 = engine.rngs, time.perf_counter()
        engine.gradients([b], objective)
        engine.rngs = rngs
        warmed[bucket] = time.perf_counter() - t0
    return warmed


def tunix_worker(args, data, jax, compiled):
    """Tunix's PeftTrainer as shipped (its jitted step, its default loss) on the same LoRA."""
    import optax
    from tunix.sft import peft_trainer, utils

    from tunix_rt.models.jax_loader import load_model, make_mesh
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.jax_engine import apply_lora

    mesh = make_mesh()
    cfg = TrainConfig(dataset="bench", lora_rank=16, lora_alpha=32.0)
    with jax.set_mesh(mesh):
        model, tcfg = load_model(data["model_dir"], mesh, "fp32", remat=args.remat)
        model = apply_lora(model, cfg, tcfg)
        rss_loaded = peak_rss_bytes()
        trainer = peft_trainer.PeftTrainer(
            model, optax.adamw(2e-4), peft_trainer.TrainingConfig(eval_every_n_steps=10**9, max_steps=None,
                                                                  max_inflight_computations=1))

        def gen(b):
            real = b["real"]
            return {"input_tokens": b["input_tokens"], "input_mask": b["input_mask"],
                    "positions": utils.build_positions_from_mask(real),
                    "attention_mask": utils.make_causal_attn_mask(real)}

        trainer.with_gen_model_input_fn(gen)
        step_fn, _ = trainer.jit_train_and_eval_step()

        def run_one(step):
            batch = {k: jax.numpy.asarray(v) for k, v in batch_arrays(step, args.seq, data["pad_id"]).items()}
            return step_fn(batch)[0]

        out = _timed(data["steps"], args.warmup, run_one, compiled)
    return (*out, rss_loaded)


# --------------------------------------------------------------------------- parent

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", help="TUNIX_RT_HOME holding (or to receive) gemma3-270m")
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES,
                    help="bytes of one chunk's fp32 logits in our loss (TrainConfig.loss_chunk_bytes)")
    ap.add_argument("--remat", action="store_true",
                    help="gradient checkpointing on every side (JAX: tunix_rt.models.jax_remat, which holds on "
                         "CPU; torch: the engine's gradient_checkpointing)")
    ap.add_argument("--pad", choices=("seq", "longest"), default="seq",
                    help="the JAX engine's batches: padded to --seq (as tunix's), or to the longest row as "
                         "training's collator pads them (the engine buckets the width; the fair setting against torch)")
    ap.add_argument("--sides", default="ours,tunix,torch",
                    help="ours (JAX engine, our loss), tunix (JAX engine, Tunix's default loss), torch (the PyTorch engine)")
    ap.add_argument("--worker", choices=("ours", "tunix"), help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.home:
        os.environ["TUNIX_RT_HOME"] = os.path.abspath(args.home)
    from roofline import bounds, fraction  # here, not at the top: it imports torch, which a JAX worker must not hold

    data = prepare(args)
    sides = [x for x in args.sides.split(",") if x]
    step_flops, peak = model_flops(data, args), bounds()["fp32_gflops"] * 1e9  # the machine before the sides run

    def show(r: int, side: str, res: dict) -> None:
        after = f" (after load {res['rss_after_load'] / 2**30:.2f})" if res["rss_after_load"] else ""
        print(f"round {r + 1} {side:5s}: {res['step_s']:.2f} s/step ({res['cpu_s_per_step']:.1f} CPU-s), "
              f"{res['tokens_per_s']:.0f} tok/s, peak RSS {res['peak_rss'] / 2**30:.2f} GiB{after}, "
              f"first loss {res['losses'][0]:.5f}, {res.get('allocator')} malloc, {res.get('matmul')} products"
              + (f", compilation taken out {res['compile_s_taken_out']:.1f} s" if res["compile_s_taken_out"] else "")
              + (", buckets warmed before timing " + ", ".join(f"{w} ({t:.1f} s)" for w, t in res["warmed"].items())
                 if res.get("warmed") else ""),
              flush=True)

    results = alternate(sides, args.rounds, lambda side: run_side(side, data, args), show)
    keys = ("step_s", "cpu_s_per_step", "tokens_per_s", "peak_rss")
    med = {s: {k: statistics.median(x[k] for x in v) for k in keys} for s, v in results.items()}
    for s, v in results.items():
        loaded = [x["rss_after_load"] for x in v if x["rss_after_load"]]
        med[s]["rss_after_load"] = statistics.median(loaded) if loaded else None
    print(f"\nGemma 3 270M, LoRA r16 on all projections, batch {args.batch} x {args.seq} "
          f"({'JAX engine: longest row, bucketed' if args.pad == 'longest' else 'padded'}), fp32, CPU, AdamW 2e-4, "
          f"{args.steps} measured steps after {args.warmup} warm-up, {args.rounds} round(s); our chunks {args.chunk_bytes / 2**20:g} MiB of logits; "
          f"gradient checkpointing {'on' if args.remat else 'off'}")
    names = {"ours": "jax+ours", "tunix": "jax+tunix", "torch": "torch eng."}
    print(f"{'side':11s} {'s/step':>8s} {'CPU-s/step':>11s} {'tok/s':>8s} {'peak RSS GiB':>13s} {'train extra GiB':>16s}")
    for s in sides:
        m = med[s]
        extra = f"{(m['peak_rss'] - m['rss_after_load']) / 2**30:16.2f}" if m["rss_after_load"] else f"{'-':>16s}"
        print(f"{names[s]:11s} {m['step_s']:8.2f} {m['cpu_s_per_step']:11.1f} {m['tokens_per_s']:8.0f} "
              f"{m['peak_rss'] / 2**30:13.2f} {extra}")
    first = {s: results[s][0]["losses"][0] for s in sides}
    print("first-batch loss: " + ", ".join(f"{names[s]} {first[s]:.6f}" for s in sides))
    mm = {s: step_flops / med[s]["step_s"] / peak for s in sides}
    print(f"model FLOPs a measured step {step_flops / 1e12:.3f} T (the torch engine's count without recompute); "
          f"fp32 matmul bound measured here (roofline.bounds, training shapes) {peak / 1e12:.3f} TFLOP/s; share of it: "
          + ", ".join(f"{names[s]} {fraction(mm[s] * peak, peak)}" for s in sides))
    out = []
    if "ours" in med and "tunix" in med:
        extra = lambda s: med[s]["peak_rss"] - med[s]["rss_after_load"]  # noqa: E731
        out += [f"mem_ratio={med['ours']['peak_rss'] / med['tunix']['peak_rss']:.3f}",
                f"speed_ratio={med['ours']['tokens_per_s'] / med['tunix']['tokens_per_s']:.3f}",
                f"cpu_speed_ratio={med['tunix']['cpu_s_per_step'] / med['ours']['cpu_s_per_step']:.3f}",
                f"extra_mem_ratio={extra('ours') / max(extra('tunix'), 1):.3f}",
                f"loss_diff={abs(first['ours'] - first['tunix']):.2e}"]
    if "ours" in med and "torch" in med:
        out += [f"jax_vs_torch_speed={med['ours']['tokens_per_s'] / med['torch']['tokens_per_s']:.3f}",
                f"jax_vs_torch_cpu_speed={med['torch']['cpu_s_per_step'] / med['ours']['cpu_s_per_step']:.3f}",
                f"jax_vs_torch_mem={med['ours']['peak_rss'] / med['torch']['peak_rss']:.3f}",
                f"jax_vs_torch_loss_diff={abs(first['ours'] - first['torch']):.2e}"]
    out += [f"{'jax' if s == 'ours' else s}_mm_fraction={mm[s]:.2f}" for s in sides]
    print("RESULT " + " ".join(out))


if __name__ == "__main__":
    main()
