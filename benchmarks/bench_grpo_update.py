"""The GRPO update alone (reference pass + one optimizer step) with each group's prompt written
once (shared-prompt rows) against a row per sample; torch engine, fp32 CPU.

    TUNIX_RT_HOME=.cache/test-home .venv/bin/python benchmarks/bench_grpo_update.py [--prompts 4] [--rounds 2]

The cpu-grpo preset's shapes: Gemma 3 270M LoRA r16, GSM8K train prompts rendered as SFT and
eval render them, G = 4 completions per prompt, micro-batches of 4 sequences (one group),
beta 0.04 (so the adapter-off reference pass runs). The completions are fixed random token ids
of 100-160 tokens (the update's cost does not depend on what they say; no rollout is timed).
Both layouts see the very same groups and start from the same weights; the rounds alternate.
The last line: `RESULT speed_ratio=<row per sample s / shared s> tokens_ratio=<shared tokens /
row-per-sample tokens> max_logp_diff=<largest |log p| difference of the reference pass>`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    import torch

    from tunix_rt.eval.generate import Generation
    from tunix_rt.home import Home
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.grpo import GRPO, Group
    from tunix_rt.train.torch_engine import TorchEngine

    home = Home.resolve()
    model_dir = ensure_model(args.model, home)
    tok = load_tokenizer(str(model_dir), home)
    cfg = TrainConfig(model=str(model_dir), dataset="gsm8k", split="train", method="grpo", finetune="lora",
                      lora_rank=16, lora_alpha=32.0, group_size=4, rl_prompts=args.prompts,
                      rollout_max_new_tokens=160, beta=0.04, rl_loss="grpo", lr=1e-6, max_seq_len=416,
                      batch_size=4, engine="torch", device="cpu", seed=0)
    engine, method = TorchEngine(cfg), GRPO(cfg, home, tok)
    engine.devices()
    engine.setup(model_dir, tok)
    rng = np.random.default_rng(0)
    groups = []
    for _ in range(args.prompts):
        rec, prompt = method.items[method.order.take()]
        outs = [Generation(rng.integers(10, 200_000, int(rng.integers(100, 161))).tolist(), "", 0, "stop")
                for _ in range(cfg.group_size)]
        groups.append(Group(rec, prompt, outs, rng.random(cfg.group_size), {}, np.zeros(4, bool), np.zeros(4, bool)))
    start = {n: p.detach().clone() for n, p in engine.trainable.items()}

    def update(shared: bool) -> tuple[float, int, np.ndarray]:
        with torch.no_grad():
            for n, p in engine.trainable.items():
                p.copy_(start[n])
        t0 = time.perf_counter()
        batches = method.update_batches(groups, shared=shared)
        refs = []
        for b in batches:
            b.aux["ref_logp"] = engine.token_logprobs(b, adapter=False)
            b.aux["old_logp"] = np.zeros(b.labels.shape, np.float32)
            refs.append(b.aux["ref_logp"][np.asarray(b.labels) != -100])
        engine.train_step(batches, method.objective, cfg.lr)
        return time.perf_counter() - t0, sum(b.n_tokens for b in batches), np.concatenate(refs)

    update(True)  # warm-up (allocator, first-call costs)
    times = {False: [], True: []}
    tokens, refs = {}, {}
    for _ in range(args.rounds):
        for shared in (False, True):
            dt, tokens[shared], refs[shared] = update(shared)
            times[shared].append(dt)
    diff = float(np.abs(refs[True] - refs[False]).max())
    print(f"{'layout':<16}{'tokens':>8}{'update s (median)':>20}  rounds")
    for shared, name in ((False, "row per sample"), (True, "shared prompt")):
        print(f"{name:<16}{tokens[shared]:>8}{statistics.median(times[shared]):>20.2f}  "
              + " ".join(f"{t:.2f}" for t in times[shared]))
    ratio = statistics.median(times[False]) / statistics.median(times[True])
    print(f"RESULT speed_ratio={ratio:.3f} tokens_ratio={tokens[True] / tokens[False]:.3f} max_logp_diff={diff:.2e}")


if __name__ == "__main__":
    main()
