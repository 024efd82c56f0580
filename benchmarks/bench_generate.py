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


def ours_generate(gen: TorchGenerator, prompts, cfg: DecodeConfig) -> list[list[int]]:
    return [g.ids for g in gen.generate(prompts, cfg)]


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
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

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


if __name__ == "__main__":
    main()
