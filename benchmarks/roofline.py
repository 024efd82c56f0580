"""A roofline for this machine: what its CPU can do at Gemma 3 270M's shapes, so the other
benchmarks can print their figures as a fraction of the bound they are under.

Measured, with torch threads = the cores:
- fp32 matmul throughput (GFLOP/s, 2·M·K·N per matmul) through each of torch's two CPU
  libraries, MKL (torch.mm) and oneDNN (`torch.ops.mkldnn._linear_pointwise`, what
  tunix_rt.train.cpu_matmul routes training's products through on AMD CPUs with AVX-512),
  the bound being the faster: MKL runs its AVX2 code on AMD CPUs, half of what a 2-core AMD
  EPYC with full-width AVX-512 does (194 against 444 GFLOP/s at [756, 640] x [640, 2048],
  measured 2026-12-07), at the model's shapes: the decode
  projections [B, 640] x [640, N] for B in 1 and 8 (q: N = 1024, k/v: 256, gate/up: 2048, and
  down [B, 2048] x [2048, 640]), the training shapes (a 1024-token chunk through the same
  projections), and the tied head [B, 640] x [640, 262144] (671 MB of fp32: memory-bound);
- int8 matmul throughput (GOP/s) through `torch._int_mm` (int8 x int8 -> exact int32, the
  kernel tunix_rt.eval.screened_head and tunix_rt.eval.int8_weights use) at the same shapes;
- memory bandwidth, STREAM-like: copy (b = a, 8 bytes moved per fp32 element) and triad
  (a = b + s·c, 12 bytes per element) over 256 MB arrays, far larger than the caches; and a
  read-only stream (read: the sum of one such array, 4 bytes per element), the bound a decode
  step is under, which reads its weights and writes next to nothing. The copy rate is not a
  bound on reading: on a 2-core AMD EPYC (AVX512-VNNI, a shared machine) the copy moved
  28.6-29.2 GB/s (reads and writes counted), the sum 20.7 GB/s in one run and 28.5 in another,
  a hand-written C read loop 16-24 GB/s. The read rate is the faster of torch's sum and a C
  loop of ours (`c_read`: four AVX-512 accumulators a thread, each thread's stream prefetched
  16 KB ahead into L2, as the decode kernels read): on a 2-core Intel Xeon (AMX, 2026-12-07)
  torch's sum read 23.7 GB/s where that loop read 28.6 (26.8 without its prefetch), and an int4
  decode step had moved 28.7: a share of the sum's rate alone overstated decoding's.

A decode projection's weights (at most 5 MB) stay in cache when one shape is timed in a loop,
so its figure is an in-cache one; a real decode step streams every layer's weights, which is
what the bandwidth (and the head row) bounds. Each figure is the best of its repetitions (the
least disturbed by other processes); the table also gives the median.

    .venv/bin/python benchmarks/roofline.py [--quick] [--threads N]

Last line: RESULT fp32_gflops=<best at the training shapes, the faster library> int8_gops=<best
_int_mm at the training shapes> copy_gbs=… triad_gbs=… read_gbs=… mkl_fp32_gflops=…
onednn_fp32_gflops=… (each library's best at the training shapes)

Importable: `bounds()` measures the five RESULT figures (about 10 s, cached per process), and
`fraction(value, bound)` formats a figure as a share of one, for other benchmarks' tables.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

D, FF, Q, KV, VOCAB = 640, 2048, 1024, 256, 262144  # Gemma 3 270M
TRAIN_ROWS = 1024
STREAM_BYTES = 256 * 2**20
"""Each STREAM array's size (fp32): 8x the 32 MB L3 seen here."""

DECODE = [("q", D, Q), ("k/v", D, KV), ("o", Q, D), ("gate/up", D, FF), ("down", FF, D)]
"""(name, K, N) of a layer's projections: x [M, K] @ w [K, N]."""

_CACHE: dict[str, float] = {}


def timed(fn, budget_s: float, min_reps: int = 3, max_reps: int = 200) -> tuple[float, float]:
    """(best, median) seconds of `fn()` after one warm-up call, repeated until `budget_s` is
    spent (at least `min_reps` times)."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - start < budget_s and len(times) < max_reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


LIBS = ("mkl", "onednn") if torch.backends.mkldnn.is_available() else ("mkl",)
"""The fp32 matmul libraries torch's CPU build holds: MKL behind torch.mm, oneDNN behind
torch.ops.mkldnn."""


def fp32_mm(m: int, k: int, n: int, budget_s: float, lib: str = "mkl") -> tuple[float, float]:
    """(best, median) GFLOP/s of x [m, k] @ w [k, n] (w stored [n, k] as nn.Linear stores it),
    through `lib` (LIBS)."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    if lib == "onednn":
        fn = lambda: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [None], "")  # noqa: E731
    else:
        out = torch.empty(m, n)
        fn = lambda: torch.mm(x, w.t(), out=out)  # noqa: E731
    best, med = timed(fn, budget_s)
    flop = 2.0 * m * k * n
    return flop / best / 1e9, flop / med / 1e9


def best_fp32_mm(m: int, k: int, n: int, budget_s: float) -> tuple[float, float, str]:
    """fp32_mm through each of LIBS: (best, median, library) of the faster."""
    return max((*fp32_mm(m, k, n, budget_s, lib), lib) for lib in LIBS)


def int8_mm(m: int, k: int, n: int, budget_s: float) -> tuple[float, float]:
    """(best, median) GOP/s of torch._int_mm(x int8 [m, k], w int8 [k, n] as the transpose of
    an [n, k] matrix), as the screened head and the int8 weights call it."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    best, med = timed(lambda: torch._int_mm(x, w.t()), budget_s)
    ops = 2.0 * m * k * n
    return ops / best / 1e9, ops / med / 1e9


C_READ = r"""
#include <immintrin.h>
int tunix_read_supported(void) { __builtin_cpu_init(); return __builtin_cpu_supports("avx512f"); }
__attribute__((target("avx512f"))) float tunix_read(const float *x, long n, int threads) {
    float total = 0.0f;
    #pragma omp parallel for num_threads(threads) reduction(+:total) schedule(static)
    for (long c = 0; c < n / 4096; c++) {
        const float *p = x + c * 4096;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (long i = 0; i < 4096; i += 64) {
            for (int j = 0; j < 4; j++) _mm_prefetch((const char *)(p + i + 4096 + 16 * j), _MM_HINT_T1);
            a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
            a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
            a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32));
            a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
        }
        total += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    }
    return total;
}
"""
"""A read-only stream as our decode kernels read: 4 KB pieces shared by the threads, four AVX-512
accumulators, 16 KB prefetched ahead into L2 (sums what it reads so nothing is optimised away)."""


def c_read():
    """`fn(tensor)` reading a contiguous fp32 tensor with C_READ on the cores, or None where it
    does not run (no C compiler, no AVX-512)."""
    import ctypes

    import subprocess

    from tunix_rt.eval.int8_kernel import FLAGS, compiled

    try:
        lib = compiled("roofline_read", C_READ, [os.environ.get("CC", "cc"), *FLAGS])
    except (OSError, subprocess.SubprocessError):  # no compiler here: torch's sum alone
        return None
    if not lib.tunix_read_supported():
        return None
    lib.tunix_read.restype = ctypes.c_float
    lib.tunix_read.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int]
    return lambda t: lib.tunix_read(t.data_ptr(), t.numel() // 4096 * 4096, os.cpu_count() or 1)


def read_best(a: torch.Tensor, budget_s: float) -> tuple[float, float]:
    """(best, median) seconds of reading `a` (fp32, a multiple of 4096 elements) by the faster of
    torch's sum and C_READ."""
    rb, rm = timed(lambda: a.sum(), budget_s)
    fn = c_read()
    if fn is not None:
        cb, cm = timed(lambda: fn(a), budget_s)
        if cb < rb:
            return cb, cm
    return rb, rm


def stream(budget_s: float) -> dict[str, tuple[float, float]]:
    """(best, median) GB/s of copy (b = a), triad (a = b + 3·c) and read (reads only, what a
    decode step's weight stream does: the faster of torch's sum of a and C_READ) over
    STREAM_BYTES arrays."""
    n = STREAM_BYTES // 4
    a, b, c = torch.ones(n), torch.full((n,), 2.0), torch.full((n,), 0.5)
    cb, cm = timed(lambda: b.copy_(a), budget_s)
    tb, tm = timed(lambda: torch.add(b, c, alpha=3.0, out=a), budget_s)
    rb, rm = read_best(a, budget_s)
    return {"copy": (8 * n / cb / 1e9, 8 * n / cm / 1e9), "triad": (12 * n / tb / 1e9, 12 * n / tm / 1e9),
            "read": (4 * n / rb / 1e9, 4 * n / rm / 1e9)}


def read_rate(budget_s: float = 0.3) -> float:
    """The read-only rate (GB/s, best of `stream`'s sum of a STREAM_BYTES array) now, with torch
    threads = the cores: measured again right before each measured run where a shared machine's
    bandwidth moves during a benchmark (bench_generate --weights pairs each run with one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        n = STREAM_BYTES // 4
        best, _ = read_best(torch.ones(n), budget_s)
        return 4 * n / best / 1e9
    finally:
        torch.set_num_threads(threads)


def bounds(budget_s: float = 1.5) -> dict[str, float]:
    """The five RESULT figures (fp32_gflops, int8_gops, copy_gbs, triad_gbs, read_gbs), measured once per
    process with torch threads = the cores (restored afterwards); fp32_gflops through the faster
    of LIBS."""
    if not _CACHE:
        threads = torch.get_num_threads()
        torch.set_num_threads(os.cpu_count() or 1)
        try:
            _CACHE["fp32_gflops"] = max(best_fp32_mm(TRAIN_ROWS, D, FF, budget_s)[0],
                                        best_fp32_mm(TRAIN_ROWS, FF, D, budget_s)[0])
            _CACHE["int8_gops"] = max(int8_mm(TRAIN_ROWS, D, FF, budget_s)[0], int8_mm(TRAIN_ROWS, FF, D, budget_s)[0])
            bw = stream(budget_s)
            _CACHE["copy_gbs"], _CACHE["triad_gbs"], _CACHE["read_gbs"] = bw["copy"][0], bw["triad"][0], bw["read"][0]
        finally:
            torch.set_num_threads(threads)
    return dict(_CACHE)


def fraction(value: float, bound: float) -> str:
    """`value` as a percentage of `bound`, for a benchmark's table."""
    return f"{100.0 * value / bound:.0f}%" if bound > 0 else "n/a"


def header() -> str:
    try:
        load = "load average %.1f %.1f %.1f" % os.getloadavg()
    except OSError:
        load = "load average unknown"
    cpu = torch.backends.cpu.get_cpu_capability()
    return (f"roofline: {platform.processor() or platform.machine()} ({cpu}), {os.cpu_count()} cores, "
            f"torch {torch.__version__} threads {torch.get_num_threads()}; {load} at start. "
            f"SHARED machine (other processes running): figures are what it gave under that load")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="Shorter timing budgets (about 15 s in all).")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: the cores)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    budget = 0.3 if args.quick else 1.0
    print(header())
    print(f"{'shape':<34}{'fp32 GFLOP/s':>14}{'(median)':>10}{'library':>8}{'int8 GOP/s':>12}{'(median)':>10}"
          f"{'int8/fp32':>11}   (fp32: the faster of {', '.join(LIBS)}; each: {', '.join(f'{x}_*' for x in LIBS)})")
    rows: list[tuple[str, int, int, int]] = []
    for b in (1, 8):
        rows += [(f"decode B={b} {name}", b, k, n) for name, k, n in DECODE]
    rows += [(f"train M={TRAIN_ROWS} {name}", TRAIN_ROWS, k, n) for name, k, n in DECODE if name != "k/v"]
    rows += [(f"head B={b} [{b},{D}]x[{D},{VOCAB}]", b, D, VOCAB) for b in (1, 8)]
    train_fp32, train_int8, per_lib = [], [], {}
    for label, m, k, n in rows:
        head = n == VOCAB
        each = {lib: fp32_mm(m, k, n, budget * (2 if head else 1), lib) for lib in LIBS}
        f_best, f_med, lib = max((*v, name) for name, v in each.items())
        i_best, i_med = int8_mm(m, k, n, budget * (2 if head else 1))
        if m == TRAIN_ROWS:
            train_fp32.append(f_best)
            train_int8.append(i_best)
            for name, v in each.items():
                per_lib.setdefault(name, []).append(v[0])
        print(f"{label:<34}{f_best:>14.1f}{f_med:>10.1f}{lib:>8}{i_best:>12.1f}{i_med:>10.1f}{i_best / f_best:>11.2f}"
              f"   " + ", ".join(f"{name} {v[0]:.1f}" for name, v in each.items()))
    bw = stream(budget * 2)
    print(f"{'STREAM (256 MB arrays)':<34}{'GB/s best':>14}{'(median)':>10}")
    for name, (best, med) in bw.items():
        print(f"{name:<34}{best:>14.1f}{med:>10.1f}")
    fp32_peak, int8_peak = max(train_fp32), max(train_int8)
    copy, triad, read = bw["copy"][0], bw["triad"][0], bw["read"][0]
    for name, rate in (("read", read), ("copy", copy)):
        print(f"bandwidth bound for one decode token of Gemma 3 270M (all weights read once, {name} rate): "
              f"fp32 {rate * 1e9 / (268e6 * 4):.1f} tokens/s, int8 {rate * 1e9 / (268e6 * 1):.1f} tokens/s")
    _CACHE.update(fp32_gflops=fp32_peak, int8_gops=int8_peak, copy_gbs=copy, triad_gbs=triad, read_gbs=read)
    print(f"RESULT fp32_gflops={fp32_peak:.1f} int8_gops={int8_peak:.1f} copy_gbs={copy:.2f} triad_gbs={triad:.2f} "
          f"read_gbs={read:.2f} " + " ".join(f"{name}_fp32_gflops={max(v):.1f}" for name, v in per_lib.items()))


if __name__ == "__main__":
    main()
