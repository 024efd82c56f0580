"""Which int8 kernel decodes faster on this CPU, and by how much over fp32: the lean decode
step (tunix_rt.eval.fast_gemma.LeanGemma) against tunix_rt.eval.int8_weights.Int8Gemma with
each kernel ("int_mm": two-level int8 activations x int8 weights; "dequant": weight blocks
dequantised into cache, fp32 matmul), batch 1 and 8, on random models of tiny-gemma3's and
gemma3-270m's shapes (and the real gemma3-270m where it is imported; --real DIR).

Per side: the median wall time of a decode step (after a prefill of 32 tokens), the sides
alternating round by round so a shared machine slows each alike. Prints a table and

    RESULT int8_speedup_b1=<fp32 / best int8 step time, 270M shapes (random), batch 1>
           best_kernel=<0 int_mm | 1 dequant> speedup_<model>_b<B>=… kernel_<model>_b<B>=…

The fp32 side here is the lean step with full fp32 logits (`LeanGemma.step`); generation also
screens the head in int8 (tunix_rt.eval.screened_head), which benchmarks/bench_generate.py
--weights int8 includes. Use --threads 1 on a shared, oversubscribed machine (idle OpenMP
threads spin: small matmuls at 2 threads took milliseconds here under load).

    .venv/bin/python benchmarks/bench_int8_weights.py [--shapes tiny,270m] [--steps 24] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from tunix_rt.eval.fast_gemma import LeanGemma
from tunix_rt.eval.generate import left_pad, position_ids
from tunix_rt.eval.int8_weights import Int8Gemma
from tunix_rt.models.catalog import get_preset
from tunix_rt.models.tiny import hf_config

REAL = Path(__file__).resolve().parents[1] / ".cache" / "test-home" / "models" / "gemma3-270m"


def random_model(preset: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = hf_config(get_preset(preset))
    cfg._attn_implementation = "eager"
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def step_time(model, lean, batch: int, steps: int) -> float:
    """Median seconds per lean decode step after a 32-token prefill."""
    from transformers import DynamicCache

    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, vocab, (32,), generator=g).tolist() for _ in range(batch)]
    with torch.inference_mode():
        ids, mask = left_pad(prompts, 0, "cpu")
        pos = position_ids(mask)
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
        st = lean.start(cache, mask, pos[:, -1] + 1, steps + 1)
        tok = torch.full((batch,), 5)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            tok = lean.step(tok, st).argmax(-1)
            times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="tiny,270m")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--real", default=str(REAL), help="An imported gemma3-270m dir (skipped when absent).")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    presets = {"tiny": "tiny-gemma3", "270m": "gemma3-270m"}
    models = [(f"{s} (random)", lambda p=presets[s]: random_model(p)) for s in args.shapes.split(",")]
    if Path(args.real).is_dir() and "270m" in args.shapes:
        from tunix_rt.eval.runner import load_model

        models.append(("270m (real)", lambda: load_model(Path(args.real), None, "cpu")))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"cpu {torch.backends.cpu.get_cpu_capability()} (a shared machine: wall times under load)")
    print(f"{'model':<16}{'B':>3}{'fp32 ms':>10}{'int_mm ms':>11}{'dequant ms':>12}{'x int_mm':>10}{'x dequant':>11}")
    result = {}
    for name, make in models:
        fp = make()
        leans = {"fp32": LeanGemma.for_model(fp)}
        q1, q2 = make(), make()
        leans["int_mm"] = Int8Gemma.for_model(q1, "int_mm")
        leans["dequant"] = Int8Gemma.for_model(q2, "dequant")
        for b in [int(x) for x in args.batches.split(",")]:
            t = {k: [] for k in leans}
            for r in range(args.rounds):
                order = list(leans) if r % 2 == 0 else list(leans)[::-1]
                for k in order:
                    t[k].append(step_time({"fp32": fp, "int_mm": q1, "dequant": q2}[k], leans[k], b, args.steps))
            m = {k: statistics.median(v) for k, v in t.items()}
            print(f"{name:<16}{b:>3}{m['fp32'] * 1e3:>10.2f}{m['int_mm'] * 1e3:>11.2f}{m['dequant'] * 1e3:>12.2f}"
                  f"{m['fp32'] / m['int_mm']:>10.2f}{m['fp32'] / m['dequant']:>11.2f}")
            best = min(("int_mm", "dequant"), key=lambda k: m[k])
            key = name.split()[0] + ("_real" if "real" in name else "") + f"_b{b}"
            result[key] = (m["fp32"] / m[best], KERNEL_CODE[best])
        del fp, q1, q2, leans
    speed, code = result.get("270m_b1", result.get("tiny_b1", (0.0, 0)))
    extra = " ".join(f"speedup_{k}={v[0]:.2f} kernel_{k}={v[1]}" for k, v in result.items() if k != "270m_b1")
    print(f"RESULT int8_speedup_b1={speed:.2f} best_kernel={code} {extra}")


KERNEL_CODE = {"int_mm": 0, "dequant": 1}

if __name__ == "__main__":
    main()
