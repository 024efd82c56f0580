"""What the loss chunk size costs: the torch fused loss (`train.loss`) alone, forward and
backward, at Gemma 3 270M's head shapes, for several `loss_chunk_bytes` budgets.

    .venv/bin/python benchmarks/bench_loss_chunk.py [--rows 512] [--reps 5] [--mib 1024,256,128,64]

The head is [262144, 640] fp32 (random: only shapes matter), the rows are the supervised
positions of a batch (512: about half of a 4 x 256 GSM8K batch; 1024: all of it), LoRA-like
(gradient for the hidden states only; --full adds the head's). Budgets alternate within
each repetition (forward order, then reverse) so a busy machine slows all alike; the table
gives CPU seconds (process time, which sharing disturbs less than wall time), min and median.
Each chunk multiplies its rows by the whole head twice (logits, then dlogits @ W): a smaller
chunk means more passes over the 671 MB head, which on a CPU is memory traffic.

Last line: `RESULT cpu_ratio_<MiB>=<median CPU s / median CPU s of the largest budget> ...`.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mib", default="1024,256,128,64", help="budgets in MiB, the first is the reference")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--full", action="store_true", help="the head is trained too (full fine-tuning)")
    args = ap.parse_args()
    import torch

    from tunix_rt.train.chunking import chunk_tokens
    from tunix_rt.train.loss import chunked_linear_ce

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    vocab, width = 262_144, 640
    weight = (torch.randn(vocab, width) * 0.02).requires_grad_(args.full)
    hidden = torch.randn(args.rows, width)
    targets = torch.randint(0, vocab, (args.rows,))
    budgets = [int(m) * 2**20 for m in args.mib.split(",")]
    cpu: dict[int, list[float]] = {b: [] for b in budgets}
    for rep in range(args.reps):
        for b in budgets if rep % 2 == 0 else budgets[::-1]:
            h = hidden.clone().requires_grad_(True)
            weight.grad = None
            c0 = time.process_time()
            chunked_linear_ce(h, weight, targets, b).backward()
            cpu[b].append(time.process_time() - c0)
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"fused loss, {args.rows} rows x [{vocab}, {width}] head, {args.threads} threads")
    for col in ("loss_chunk_bytes", "tokens/chunk", "chunks", "CPU s min", "CPU s median", "vs first"):
        table.add_column(col)
    ref = statistics.median(cpu[budgets[0]])
    result = {}
    for b in budgets:
        tok = chunk_tokens(b, vocab)
        med = statistics.median(cpu[b])
        result[f"cpu_ratio_{b // 2**20}"] = round(med / ref, 3)
        table.add_row(f"{b // 2**20} MiB", str(min(tok, args.rows)), str(-(-args.rows // tok)),
                      f"{min(cpu[b]):.2f}", f"{med:.2f}", f"{med / ref:.2f}")
    Console().print(table)
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
