"""Continuous batching in `tunix-rt serve`: N concurrent chat requests against the same N sent
one after another, through the real `openai` client on loopback.

    .venv/bin/python benchmarks/bench_serve.py [--home DIR] [--requests 32] [--max-tokens 64]
        [--max-batch 16]

Gemma 3 270M (`gemma3-270m`, imported into --home if missing), fp32, CPU. Each request is one
GSM8K train question (distinct questions), greedy (temperature 0), `max_tokens` new tokens at
most. The server is started once (`tunix-rt serve --max-batch B`) and warmed by one request;
then the sequential pass (one request at a time) and the concurrent pass (all N at once from
threads) alternate over --rounds. completion tokens/s = the pass's completion tokens (usage)
/ its wall time. The concurrent pass must return the same text as the sequential one for
every request (greedy, batched or not). Last line:
`RESULT batching_speedup=<concurrent / sequential completion tokens per second>`.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def questions(home, n: int) -> list[str]:
    from tunix_rt.traces.dataset import load_dataset

    return [r.question for r in list(load_dataset("gsm8k", home).split("train"))[:n]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", help="TUNIX_RT_HOME holding (or to receive) gemma3-270m")
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    if args.home:
        os.environ["TUNIX_RT_HOME"] = os.path.abspath(args.home)

    from openai import OpenAI

    from tunix_rt.home import Home
    from tunix_rt.models.store import ensure_model

    home = Home.resolve().ensure()
    ensure_model(args.model, home)
    qs = questions(home, args.requests)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tunix_rt.cli", "serve", "--port", str(port), "--device", "cpu",
                               "--max-batch", str(args.max_batch), "--max-queue", str(4 * args.requests)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        token_file = Path(home.root) / "service_token"
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                if token_file.is_file():
                    break
            except OSError:
                pass
            if server.poll() is not None:
                raise SystemExit(f"serve exited: {server.stderr.read()[-3000:]}")
            time.sleep(0.5)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=token_file.read_text().strip(),
                        timeout=3600, max_retries=0)

        def ask(q: str):
            r = client.chat.completions.create(model=args.model, messages=[{"role": "user", "content": q}],
                                               max_tokens=args.max_tokens, temperature=0.0)
            return r.choices[0].message.content, r.usage.completion_tokens

        ask(qs[0])  # loads the model and warms the decode path
        seq_rates, con_rates = [], []
        for r in range(args.rounds):
            for mode in (("sequential", "concurrent") if r % 2 == 0 else ("concurrent", "sequential")):
                t0 = time.perf_counter()
                if mode == "sequential":
                    out = [ask(q) for q in qs]
                else:
                    with ThreadPoolExecutor(len(qs)) as pool:
                        out = list(pool.map(ask, qs))
                dt = time.perf_counter() - t0
                tokens = sum(n for _, n in out)
                (seq_rates if mode == "sequential" else con_rates).append(tokens / dt)
                texts = [t for t, _ in out]
                if mode == "sequential":
                    seq_texts = texts
                else:
                    con_texts = texts
                print(f"round {r + 1} {mode:10s}: {len(qs)} requests, {tokens} completion tokens in {dt:.1f} s "
                      f"= {tokens / dt:.1f} tokens/s", flush=True)
            same = sum(a == b for a, b in zip(seq_texts, con_texts))
            print(f"round {r + 1}: {same}/{len(qs)} concurrent replies equal the sequential ones", flush=True)
            if same != len(qs):
                raise SystemExit("greedy replies differ between batched and one-at-a-time decoding")
    finally:
        server.terminate()
        server.wait(timeout=60)
    seq, con = statistics.median(seq_rates), statistics.median(con_rates)
    print(f"\nGemma 3 270M fp32 CPU, {args.requests} distinct GSM8K questions, greedy, <= {args.max_tokens} tokens, "
          f"serve --max-batch {args.max_batch}, {args.rounds} round(s)")
    print(f"{'pass':11s} {'tokens/s':>9s}")
    print(f"{'sequential':11s} {seq:9.1f}")
    print(f"{'concurrent':11s} {con:9.1f}")
    print(f"RESULT batching_speedup={con / seq:.3f}")


if __name__ == "__main__":
    main()
