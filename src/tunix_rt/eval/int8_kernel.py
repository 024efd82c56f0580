"""The int8 matrix product of our decoders, `int_mm(lhs, w)` = `torch._int_mm(lhs, w.T)`
(int8 [M, K] x int8 [N, K] -> exact int32 [M, N]), through a small AVX-512 VNNI kernel of
our own where the CPU has one, else through its AVX2 twin, else through torch.

Why: both int8 paths of decoding (the screened head's coarse screen, tunix_rt.eval.
screened_head, and `--weights int8`, tunix_rt.eval.int8_weights) multiply a few rows of
activations (2 per sequence: two int8 levels) by a large int8 weight read once. That is a
matrix-vector product: its bound is the memory bandwidth. `torch._int_mm` goes to oneDNN,
which is made for large M: measured on a 2-core AMD EPYC (AVX512-VNNI, 2 threads) for Gemma 3
270M's head, [2, 640] x [640, 262144] took 8.9 ms (19 GB/s of weights, the machine copies at
43), and each of a layer's small projections ~85 us where its weights take ~30 us to read.
The kernel here reads each weight row once, in place ([N, K], no copy), and multiplies it by
every activation row while it is in L1. `qlinear` also reads weights in a panel layout
(`pack_rows`: each block of 16 rows with its rows' 64-byte pieces interleaved, so a block is
one front-to-back stream instead of 16 streams a row apart), which int8_weights.Int8Gemma
keeps its weights in: a single-stream decode step of Gemma 3 270M took 16.7-18.2 -> 12.2-12.7 ms
(int8_weights).

How: `vpdpbusd` multiplies unsigned by signed bytes and adds groups of four products into
int32 lanes, without saturation. The activations (signed) are shifted to unsigned, a + 128,
and the shift is taken back per output with the weight row's sum: sum((a + 128)·w) − 128·Σw.
Every partial sum is exact in int32 while K·255·127 < 2^31 (K < 66,000), and the final
subtraction is exact because the true result fits in int32 (as it must for torch._int_mm).
Sixteen weight rows at a time, one 512-bit accumulator each; their horizontal sums come out
of a transpose-and-add into one vector of 16 results. Four or more activation rows (the
screened head's 2 levels x a batch of rows) go four at a time against four weight rows: each
weight vector loaded serves four rows (the head's [16, 640] x [640, 262144] product: 21 -> 17 ms
on the 2-core EPYC). On `pack_vnni`'s layout (the screened head's copy, where this kernel serves
it) each 64-byte weight vector holds four bytes of 16 rows, so one instruction against four
bytes of an activation row broadcast to every lane adds to 16 outputs at once: no horizontal
sums, each vector loaded serves up to 8 rows (Zen 4, 2 threads: that product at 16 rows 19.5
-> 11.2 ms, at 2 rows 10.5 -> 5.5 ms). The blocks of 16 rows are shared by
OpenMP threads; the library is linked against the OpenMP runtime torch already loaded
(libgomp.so.1), so there is one pool of threads.

The library also holds `f32_linear` (an fp32 projection of up to 8 rows, a live LoRA
adapter in the same call: the decode step of an RL run's rollouts, see its doc; on AVX-512 or,
with the same bits, on AVX2 with FMA: `f32_library`), `qlinear` (a whole weight-only int8 projection: the activations'
two int8 levels, both levels' sums and their fp32 combination, the same bits as
int8_weights's torch ops) and `tunix_gemma_layer` (one Gemma 3 / Gemma 2 decoder layer on
int8 weights: norms, RoPE, the cache write, attention, the MLP; int8_weights.Int8Gemma calls
it once per layer where it applies, instead of ~70 torch ops). And `q4linear`: a weight-only int4
projection (int8_weights's `weights="int4"`: codes in groups of 32 with an fp16 scale and min,
`pack4`'s layout; the same bits as int8_weights.int4_reference), which the layer call also
takes.

On AVX2 (a CPU without AVX-512 VNNI: AMD's Zen 1-3, Intel's client cores) the same products
run on `vpmaddubsw`, which saturates: |w| is multiplied by the activation carrying w's sign,
so no pair of products passes int16 (the AVX2 section of SOURCE has the bounds), and the
int32 sums, hence every output, are the AVX-512 kernels' to the bit (`qlinear`, `q4linear`,
`int_mm`; the decoder layers' other sums in another order). There int8 weights are kept in
`pack_vnni`'s broadcast layout (`panel_layout`), which AVX2's 16 registers read in one pass.
Measured on a 2-core AMD EPYC (Zen 3, AVX2 only), benchmarks/bench_generate.py --weights int8
--batch 1: int8 decoding 3.7 -> 43.5 tokens/s (it had taken torch's dequantising path, slower
than fp32), and int4, refused there before, 73.6; fp32 6.9 -> 12.3 (its screened head, which
needs `int_mm`, now applies).

Where: built on first use with the system's C compiler (`cc`, -O3, the AVX-512 and AVX2 parts
enabled per function) into a cache directory (`TUNIX_RT_KERNEL_DIR`, else
~/.cache/tunix-rt/kernels), named by the source's hash, written atomically; loaded with
ctypes. The products run where the CPU reports avx512f, avx512bw and avx512_vnni (the AVX-512
kernels) or avx2, fma and f16c (the AVX2 ones; `decode_isa` says which, and
TUNIX_RT_KERNEL_ISA=avx2 picks them on an AVX-512 CPU too), K is a multiple of 64 and both
operands are contiguous; everything else (no compiler, another CPU, `TUNIX_RT_INT8_KERNEL=torch`)
takes torch._int_mm, with the same results (tests/eval/test_int8_kernel.py compares them, on
each instruction set the CPU runs).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ALIGN_K = 64
"""The kernel takes K in whole 64-byte vectors."""
MAX_K = 65536
"""Below this, K·255·127 fits in int32 (every partial sum of the shifted product is exact)."""

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <float.h>
#include <string.h>

#ifndef PF
#define PF 8
#endif
#define KERNEL __attribute__((target("avx512f,avx512bw,avx512vnni")))

int tunix_i8mm_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vnni");
}

/* 16 int32 vectors -> one vector whose lane r is the sum of v[r]'s 16 lanes. */
static inline KERNEL __m512i hsum16(const __m512i *v) {
    __m512i s[8], t[4];
    for (int i = 0; i < 8; i++)
        s[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                                _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        t[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(s[2 * i], s[2 * i + 1]),
                                _mm512_unpackhi_epi64(s[2 * i], s[2 * i + 1]));
    __m512i u01 = _mm512_add_epi32(_mm512_shuffle_i32x4(t[0], t[1], 0x88), _mm512_shuffle_i32x4(t[0], t[1], 0xdd));
    __m512i u23 = _mm512_add_epi32(_mm512_shuffle_i32x4(t[2], t[3], 0x88), _mm512_shuffle_i32x4(t[2], t[3], 0xdd));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(u01, u23, 0x88), _mm512_shuffle_i32x4(u01, u23, 0xdd));
}

/* The int32 sums of 16 weight rows (from wb, row stride K) against one shifted activation
   row au (a + 128, 64-byte aligned), the shift taken back with the rows' sums (sums = 128 Σw). */
static inline KERNEL __m512i dot16(const uint8_t *au, const int8_t *wb, long K, __m512i sums, int prefetch) {
    __m512i acc[16];
    for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_si512();
    for (long k = 0; k < K; k += 64) {
        __m512i av = _mm512_load_si512((const void *)(au + k));
        if (prefetch)
            for (int r = 0; r < 16; r++) _mm_prefetch((const char *)(wb + PF * 16 * K + r * K + k), _MM_HINT_T0);
        for (int r = 0; r < 16; r++)
            acc[r] = _mm512_dpbusd_epi32(acc[r], av, _mm512_loadu_si512((const void *)(wb + r * K + k)));
    }
    return _mm512_sub_epi32(hsum16(acc), sums);
}

/* dot16 on a panel (`pack_rows`): the block's 16 rows stored as K / 64 groups of 16 64-byte
   pieces (row r's bytes k..k+63 at wb + 16 k + 64 r), so the block is read front to back, one
   1 KB step per 64 columns, where the row-major block is 16 streams K bytes apart. `pf`: bytes
   ahead to prefetch (0: none), into L2 (T1: the 18 layers' and the head's int8 products 3.84 / 6.36 ->
   3.74 / 6.13 ms against T0 on a 2-core Xeon, as for q4linear). The same int32 sums as dot16 on the same rows. */
static inline KERNEL __m512i dot16p(const uint8_t *au, const int8_t *wb, long K, __m512i sums, long pf) {
    __m512i acc[16];
    for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_si512();
    for (long k = 0; k < K; k += 64) {
        __m512i av = _mm512_load_si512((const void *)(au + k));
        const int8_t *p = wb + 16 * k;
        if (pf)
            for (int r = 0; r < 16; r++) _mm_prefetch((const char *)(p + pf + r * 64), _MM_HINT_T1);
        for (int r = 0; r < 16; r++)
            acc[r] = _mm512_dpbusd_epi32(acc[r], av, _mm512_loadu_si512((const void *)(p + r * 64)));
    }
    return _mm512_sub_epi32(hsum16(acc), sums);
}

static int32_t dot1(const int8_t *a, const int8_t *w, long K) {
    int32_t s = 0;
    for (long k = 0; k < K; k++) s += (int32_t)a[k] * (int32_t)w[k];
    return s;
}

static uint8_t *shifted(const int8_t *a, long rows, long K) {
    uint8_t *au = aligned_alloc(64, (size_t)(rows * K + 64));
    if (au)
        for (long i = 0; i < rows * K; i++) au[i] = (uint8_t)a[i] ^ 0x80u; /* a + 128 */
    return au;
}

/* The int32 sums of 4 weight rows (from wb, row stride K) against 4 shifted activation rows
   (au, row stride K), the shift taken back (sums4: lane 4m + r holds 128 Σw of row r):
   lane 4m + r of the result is row m's sum against weight row r. Each weight vector loaded
   serves four activation rows (16 loads per 16 vpdpbusd with dot16 row by row, 8 here). */
static inline KERNEL __m512i dot4x4(const uint8_t *au, const int8_t *wb, long K, __m512i sums4, int prefetch) {
    __m512i acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_si512();
    for (long k = 0; k < K; k += 64) {
        __m512i wv[4];
        for (int r = 0; r < 4; r++) {
            if (prefetch) _mm_prefetch((const char *)(wb + PF * 16 * K + r * K + k), _MM_HINT_T0);
            wv[r] = _mm512_loadu_si512((const void *)(wb + r * K + k));
        }
        for (int m = 0; m < 4; m++) {
            __m512i av = _mm512_load_si512((const void *)(au + m * K + k));
            for (int r = 0; r < 4; r++) acc[m * 4 + r] = _mm512_dpbusd_epi32(acc[m * 4 + r], av, wv[r]);
        }
    }
    return _mm512_sub_epi32(hsum16(acc), sums4);
}

/* y[m, n] = sum_k a[m, k] * w[n, k]; a int8 [M, K], w int8 [N, K], wsum[n] = sum_k w[n, k],
   y int32 [M, N] (row stride N); K a multiple of 64. Four or more rows go four at a time
   against four weight rows (dot4x4), fewer row by row against sixteen (dot16); the sums are
   exact either way. Returns 0, or -1 if out of memory. */
static KERNEL int i8mm_512(const int8_t *a, const int8_t *w, const int32_t *wsum, int32_t *y,
                      long M, long N, long K, int threads) {
    if (M >= 4) {
        long groups = (M + 3) / 4;
        uint8_t *au = aligned_alloc(64, (size_t)(groups * 4 * K + 64));
        if (!au) return -1;
        memset(au, 0x80, (size_t)(groups * 4 * K)); /* the padding rows: a = 0 */
        for (long i = 0; i < M * K; i++) au[i] = (uint8_t)a[i] ^ 0x80u;
        long blocks = N / 4;
        #pragma omp parallel for num_threads(threads) schedule(static) if (blocks * K >= 16384)
        for (long b = 0; b < blocks; b++) {
            const int8_t *wb = w + b * 4 * K;
            __m512i sums4 = _mm512_slli_epi32(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(wsum + b * 4))), 7);
            for (long g = 0; g < groups; g++) {
                __m512i v = dot4x4(au + g * 4 * K, wb, K, sums4, g == 0 && b + PF * 4 < blocks);
                int32_t *out = y + g * 4 * N + b * 4;
                _mm_storeu_si128((__m128i *)out, _mm512_extracti32x4_epi32(v, 0));
                if (g * 4 + 1 < M) _mm_storeu_si128((__m128i *)(out + N), _mm512_extracti32x4_epi32(v, 1));
                if (g * 4 + 2 < M) _mm_storeu_si128((__m128i *)(out + 2 * N), _mm512_extracti32x4_epi32(v, 2));
                if (g * 4 + 3 < M) _mm_storeu_si128((__m128i *)(out + 3 * N), _mm512_extracti32x4_epi32(v, 3));
            }
        }
        for (long n = blocks * 4; n < N; n++) /* the last N % 4 rows */
            for (long m = 0; m < M; m++) y[m * N + n] = dot1(a + m * K, w + n * K, K);
        free(au);
        return 0;
    }
    uint8_t *au = shifted(a, M, K);
    if (!au) return -1;
    long blocks = N / 16;
    #pragma omp parallel for num_threads(threads) schedule(static) if (blocks * K >= 65536)
    for (long b = 0; b < blocks; b++) {
        const int8_t *wb = w + b * 16 * K;
        __m512i sums = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(wsum + b * 16)), 7);
        for (long m = 0; m < M; m++)
            _mm512_storeu_si512((void *)(y + m * N + b * 16), dot16(au + m * K, wb, K, sums, m == 0 && b + PF < blocks));
    }
    for (long n = blocks * 16; n < N; n++) /* the last N % 16 rows */
        for (long m = 0; m < M; m++) y[m * N + n] = dot1(a + m * K, w + n * K, K);
    free(au);
    return 0;
}

/* The int8 product on weights in the broadcast layout (`pack_vnni`): each whole block of 16
   rows as K / 4 vectors of 64 bytes, vector q holding bytes 4q..4q+3 of the block's 16 rows
   (row j's at bytes 4j..4j+3), so one vpdpbusd of that vector against four bytes of an
   activation row broadcast to every lane adds four products to each of the block's 16
   outputs: no horizontal sums, and each weight vector loaded serves up to 8 activation rows
   held as broadcasts. The last N % 16 rows stay row-major after the blocks. The same exact
   int32 sums as tunix_i8mm. A tile: MR activation rows (shifted, a + 128) against NB
   consecutive blocks; `corr`: 128 Σw of each block's rows; `pf`: prefetch the next tile's
   weights (the first row tile of a column tile). */
#define VTILE(MR, NB) \
static inline KERNEL void vtile_##MR##_##NB(const uint8_t *au, long K, const int8_t *wb, int32_t *y, long N, \
                                            long rows, const int32_t *wsum, int pf) { \
    __m512i acc[MR * NB]; \
    for (int i = 0; i < MR * NB; i++) acc[i] = _mm512_setzero_si512(); \
    const long bs = 16 * K; \
    for (long q = 0; q < K / 4; q++) { \
        __m512i wv[NB]; \
        for (int c = 0; c < NB; c++) { \
            if (pf) _mm_prefetch((const char *)(wb + NB * bs + c * bs + q * 64), _MM_HINT_T0); \
            wv[c] = _mm512_loadu_si512((const void *)(wb + c * bs + q * 64)); \
        } \
        for (int m = 0; m < MR; m++) { \
            __m512i av = _mm512_set1_epi32(*(const int32_t *)(au + m * K + 4 * q)); \
            for (int c = 0; c < NB; c++) acc[m * NB + c] = _mm512_dpbusd_epi32(acc[m * NB + c], av, wv[c]); \
        } \
    } \
    for (int c = 0; c < NB; c++) { \
        __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(wsum + c * 16)), 7); \
        for (int m = 0; m < MR && m < rows; m++) \
            _mm512_storeu_si512((void *)(y + m * N + c * 16), _mm512_sub_epi32(acc[m * NB + c], corr)); \
    } \
}
VTILE(1, 1) VTILE(2, 1) VTILE(4, 1) VTILE(8, 1)
VTILE(1, 2) VTILE(2, 2) VTILE(4, 2) VTILE(8, 2)
VTILE(1, 4) VTILE(2, 4) VTILE(4, 4)

#define VCASE(MR, NB) if (mr == MR && nb == NB) { vtile_##MR##_##NB(au, K, wb, y, N, rows, wsum, pf); return; }
static inline KERNEL void vtile(int mr, int nb, const uint8_t *au, long K, const int8_t *wb, int32_t *y, long N,
                                long rows, const int32_t *wsum, int pf) {
    VCASE(1, 1) VCASE(2, 1) VCASE(4, 1) VCASE(8, 1)
    VCASE(1, 2) VCASE(2, 2) VCASE(4, 2) VCASE(8, 2)
    VCASE(1, 4) VCASE(2, 4) VCASE(4, 4)
}

/* tunix_i8mm with w in `pack_vnni`'s layout. Rows go 8 at a time (the last few padded to 1, 2
   or 4 rows: padding rows are a = 0, not stored), against 2 blocks (8 rows) or 4 (fewer) at a
   time; column tiles shared by the threads. Returns 0, or -1 if out of memory. */
static KERNEL int i8mm_vnni_512(const int8_t *a, const int8_t *w, const int32_t *wsum, int32_t *y,
                           long M, long N, long K, int threads) {
    long mpad = (M + 7) / 8 * 8;
    uint8_t *au = aligned_alloc(64, (size_t)(mpad * K + 64));
    if (!au) return -1;
    memset(au, 0x80, (size_t)(mpad * K));
    for (long i = 0; i < M * K; i++) au[i] = (uint8_t)a[i] ^ 0x80u;
    long blocks = N / 16;
    int nb = M >= 5 ? 2 : 4;
    long tiles = (blocks + nb - 1) / nb;
    long last = blocks - (tiles - 1) * nb; /* blocks of the last tile */
    #pragma omp parallel for num_threads(threads) schedule(static) if (blocks * K * (M < 4 ? 4 : M) >= 65536)
    for (long t = 0; t < tiles; t++) {
        long b0 = t * nb;
        int n_here = t == tiles - 1 ? (int)last : nb;
        for (long m0 = 0; m0 < M; m0 += 8) {
            long left = M - m0;
            int mr = left >= 5 ? 8 : left >= 3 ? 4 : (int)left;
            if (n_here == nb)
                vtile(mr, nb, au + m0 * K, K, w + b0 * 16 * K, y + m0 * N + b0 * 16, N, left, wsum + b0 * 16,
                      m0 == 0 && t + 1 < tiles - 1);
            else /* the last tile's few blocks, one at a time */
                for (int c = 0; c < n_here; c++)
                    vtile(mr, 1, au + m0 * K, K, w + (b0 + c) * 16 * K, y + m0 * N + (b0 + c) * 16, N, left,
                          wsum + (b0 + c) * 16, 0);
        }
    }
    for (long n = blocks * 16; n < N; n++) /* the last N % 16 rows, row-major */
        for (long m = 0; m < M; m++) y[m * N + n] = dot1(a + m * K, w + n * K, K);
    free(au);
    return 0;
}

/* A panel's prefetch distance: QPF bytes ahead of each 1 KB step (of 0, 4 and 16 KB, 16 was the
   fastest in one run of a C harness over Gemma 3's head), while that stays inside the panels. */
#define QPF 16384

/* The least blocks x K (weight bytes / 16) that qlinear shares among its threads; below it,
   one thread. At 65536 (1 MB of weights) a single-stream decode step of Gemma 3 270M ran its
   q/k/v and o projections (0.98 and 0.66 MB) on one thread: its 18 layers took 5.7 -> 4.8 ms at
   16384 (a C-level sweep over the layers, 2-core EPYC); 8192 was no faster. */
#ifndef QPAR
#define QPAR 16384
#endif

/* A weight-only int8 projection, y = x @ (wscale * w).T, fp32 x [M, K] -> fp32 y [M, N], with
   the same operations in the same order as tunix_rt.eval.int8_weights's torch path (built
   with -ffp-contract=off: no fused multiply-adds):
   s = max(max|x| / 127, FLT_MIN), q1 = rint(x / s), q2 = rint((x - s * q1) * (127 / s)),
   step = s / 127, y = ((float(q1 . w) * 127 + float(q2 . w)) * step) * wscale.
   `packed`: w's whole blocks of 16 rows are panels (`pack_rows`, read by dot16p), its last
   N % 16 rows row-major after them (as in either layout). Returns 0, or -1 if out of memory. */
/* The activations' two int8 levels (the module doc of tunix_rt.eval.int8_weights): rows m of
   a are q1 of x's row m, rows M + m its q2; step[m] = s / 127. */
static void quant_row(const float *xm, long K, int8_t *a1, int8_t *a2, float *step) {
    float amax = 0.0f;
    for (long k = 0; k < K; k++) { float v = fabsf(xm[k]); amax = (v > amax || v != v) ? v : amax; } /* NaN stays */
    float s = amax / 127.0f;
    if (s < FLT_MIN) s = FLT_MIN; /* clamp_min(tiny); NaN stays NaN, as in torch */
    float r = (1.0f / s) * 127.0f; /* as torch evaluates 127.0 / s: reciprocal, then a product */
    for (long k = 0; k < K; k++) {
        float q1 = rintf(xm[k] / s);
        float q2 = rintf((xm[k] - s * q1) * r);
        /* outside int8 only where x is not finite (the output is NaN or inf then) or where
           s is so small that 127 / s overflows (rows below ~1e-35: the output ~1e-40) */
        a1[k] = fabsf(q1) <= 127.0f ? (int8_t)q1 : 0;
        a2[k] = fabsf(q2) <= 127.0f ? (int8_t)q2 : 0;
    }
    *step = s / 127.0f;
}

/* quant_row's bits 16 lanes at a time (a row of a decode step's projection input is quantised
   on one thread while the other waits: the scalar loop was ~2% of an int4 decode step's samples).
   The same operations in the same order (a division, a rounding to nearest even, a product, a
   difference, a product: no fused multiply-add); a row holding a NaN, or K not a multiple of 16,
   takes quant_row. */
static KERNEL void quant_row_512(const float *xm, long K, int8_t *a1, int8_t *a2, float *step) {
    __m512 top = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (long k = 0; k < K; k += 16) {
        __m512 v = _mm512_abs_ps(_mm512_loadu_ps(xm + k));
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        top = _mm512_max_ps(top, v);
    }
    if (nan) { quant_row(xm, K, a1, a2, step); return; }
    float amax = _mm512_reduce_max_ps(top);
    float s = amax / 127.0f;
    if (s < FLT_MIN) s = FLT_MIN;
    float r = (1.0f / s) * 127.0f;
    const __m512 sv = _mm512_set1_ps(s), rv = _mm512_set1_ps(r), lim = _mm512_set1_ps(127.0f);
    for (long k = 0; k < K; k += 16) {
        __m512 v = _mm512_loadu_ps(xm + k);
        __m512 q1 = _mm512_roundscale_ps(_mm512_div_ps(v, sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512 q2 = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(v, _mm512_mul_ps(sv, q1)), rv),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __mmask16 in1 = _mm512_cmp_ps_mask(_mm512_abs_ps(q1), lim, _CMP_LE_OQ);
        __mmask16 in2 = _mm512_cmp_ps_mask(_mm512_abs_ps(q2), lim, _CMP_LE_OQ);
        _mm_storeu_si128((__m128i *)(a1 + k), _mm512_cvtepi32_epi8(_mm512_maskz_cvtps_epi32(in1, q1)));
        _mm_storeu_si128((__m128i *)(a2 + k), _mm512_cvtepi32_epi8(_mm512_maskz_cvtps_epi32(in2, q2)));
    }
    *step = s / 127.0f;
}

/* Called by qlinear and q4linear alone, which run only where the CPU has AVX-512 VNNI. */
static KERNEL void quant_levels(const float *x, long M, long K, int8_t *a, float *step) {
    for (long m = 0; m < M; m++) {
        if (K % 16 == 0)
            quant_row_512(x + m * K, K, a + m * K, a + (M + m) * K, step + m);
        else
            quant_row(x + m * K, K, a + m * K, a + (M + m) * K, step + m);
    }
}

static KERNEL int qlinear_512(const float *x, const int8_t *w, const int32_t *wsum, const float *wscale,
                              float *y, long M, long N, long K, int threads, int packed) {
    int8_t *a = aligned_alloc(64, (size_t)(2 * M * K + 64));
    float *step = malloc(sizeof(float) * (size_t)(M + 1));
    if (!a || !step) { free(a); free(step); return -1; }
    quant_levels(x, M, K, a, step);
    uint8_t *au = shifted(a, 2 * M, K);
    if (!au) { free(a); free(step); return -1; }
    long blocks = N / 16;
    const __m512 c127 = _mm512_set1_ps(127.0f);
    #pragma omp parallel for num_threads(threads) schedule(static) if (blocks * K >= QPAR)
    for (long b = 0; b < blocks; b++) {
        const int8_t *wb = w + b * 16 * K;
        __m512i sums = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(wsum + b * 16)), 7);
        __m512 ws = _mm512_loadu_ps(wscale + b * 16);
        long pf = packed && (b + 1) * 16 * K + QPF <= blocks * 16 * K ? QPF : 0;
        for (long m = 0; m < M; m++) {
            __m512 f1 = _mm512_cvtepi32_ps(packed ? dot16p(au + m * K, wb, K, sums, m == 0 ? pf : 0)
                                                  : dot16(au + m * K, wb, K, sums, m == 0 && b + PF < blocks));
            __m512 f2 = _mm512_cvtepi32_ps(packed ? dot16p(au + (M + m) * K, wb, K, sums, 0)
                                                  : dot16(au + (M + m) * K, wb, K, sums, 0));
            __m512 o = _mm512_add_ps(_mm512_mul_ps(f1, c127), f2);
            o = _mm512_mul_ps(_mm512_mul_ps(o, _mm512_set1_ps(step[m])), ws);
            _mm512_storeu_ps(y + m * N + b * 16, o);
        }
    }
    for (long n = blocks * 16; n < N; n++)
        for (long m = 0; m < M; m++) {
            float o = (float)dot1(a + m * K, w + n * K, K) * 127.0f + (float)dot1(a + (M + m) * K, w + n * K, K);
            y[m * N + n] = (o * step[m]) * wscale[n];
        }
    free(au);
    free(a);
    free(step);
    return 0;
}

/* ---- Weight-only int4 (tunix_rt.eval.int8_weights, weights "int4"): each row's weights in
   groups of 32 along K, w = scale * c + min with a code c in 0..15 and an fp16 scale and min
   per row and group (5 bits a weight). Layout (`pack4`): N a multiple of 16, K of 32; each
   block of 16 rows is 8 K bytes, group g at 256 g of it, four 64-byte chunks per group; chunk
   j holds, for each row r at bytes 4 r .. 4 r + 3, the codes of k = 32 g + 8 j + i (low
   nibble of byte i) and of k + 4 (high nibble). `sm` (fp16): per block and group, the 16 rows'
   scales, then their mins. A group's sum for 16 rows is then 8 vpdpbusd of the unpacked
   codes (unsigned) by four activation bytes broadcast (signed): no horizontal sums.
   Per row and group, in this order, every product exact in int32 and every integer exact in
   fp32 (|sum| < 32 * 15 * 127 * 128): t = float(c . q1) * 127 + float(c . q2), acc += scale * t,
   acc += min * (127 * sum(q1) + sum(q2)); y = acc * step. The activations' levels are
   qlinear's (quant_levels); a row's bits depend neither on the other rows nor on the threads,
   and tunix_rt.eval.int8_weights's torch path computes the same bits. */
/* Prefetch distance and level: Q4PF bytes ahead into L2 (_MM_HINT_T1). On a 2-core Xeon (one process,
   30 alternating rounds; 18 layers' int4 products / the head): T1 2.46 / 3.36 ms, T0 2.56 / 3.63, T2 2.81 /
   3.61, NTA 4.60 / 7.88; T1 at 8 KB 2.48 / 3.35, at 32 KB 2.70 / 3.55; no prefetch at all (T0 era) 3.09 / 4.20. */
#ifndef Q4PF
#define Q4PF 16384
#endif

static KERNEL int q4linear_512(const float *x, const uint8_t *w, const uint16_t *sm, float *y,
                               long M, long N, long K, int threads) {
    if (N % 16 || K % 32) return -2;
    long G = K / 32, blocks = N / 16, total = blocks * 8 * K;
    int8_t *a = aligned_alloc(64, (size_t)(2 * M * K + 64));
    float *step = malloc(sizeof(float) * (size_t)(M + 1));
    float *gs = malloc(sizeof(float) * (size_t)(M * G + 1));
    if (!a || !step || !gs) { free(a); free(step); free(gs); return -1; }
    quant_levels(x, M, K, a, step);
    for (long m = 0; m < M; m++)
        for (long g = 0; g < G; g++) { /* each level's sum over the group, exact in int32 */
            const int8_t *p1 = a + m * K + 32 * g, *p2 = a + (M + m) * K + 32 * g;
            __m512i v1 = _mm512_add_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p1)),
                                          _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p1 + 16))));
            __m512i v2 = _mm512_add_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p2)),
                                          _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p2 + 16))));
            gs[m * G + g] = (float)_mm512_reduce_add_epi32(v1) * 127.0f + (float)_mm512_reduce_add_epi32(v2);
        }
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const __m512 c127 = _mm512_set1_ps(127.0f);
    #pragma omp parallel for num_threads(threads) schedule(static) if (blocks * K >= 2 * QPAR)
    for (long b = 0; b < blocks; b++) {
        const uint8_t *wb = w + b * 8 * K;
        const uint16_t *sb = sm + b * G * 32;
        for (long m0 = 0; m0 < M; m0 += 4) {
            int mc = M - m0 < 4 ? (int)(M - m0) : 4;
            __m512 acc[4];
            for (int i = 0; i < 4; i++) acc[i] = _mm512_setzero_ps();
            for (long g = 0; g < G; g++) {
                const uint8_t *p = wb + g * 256;
                if (m0 == 0 && b * 8 * K + g * 256 + Q4PF + 256 <= total)
                    for (int i = 0; i < 4; i++) _mm_prefetch((const char *)(p + Q4PF + 64 * i), _MM_HINT_T1);
                __m512i lo[4], hi[4];
                for (int j = 0; j < 4; j++) {
                    __m512i v = _mm512_loadu_si512((const void *)(p + 64 * j));
                    lo[j] = _mm512_and_si512(v, nib);
                    hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
                }
                __m512 sc = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + g * 32)));
                __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + g * 32 + 16)));
                for (int i = 0; i < mc; i++) {
                    const int8_t *a1 = a + (m0 + i) * K + 32 * g, *a2 = a + (M + m0 + i) * K + 32 * g;
                    __m512i d1 = _mm512_setzero_si512(), d2 = _mm512_setzero_si512();
                    for (int j = 0; j < 4; j++) {
                        int32_t l1, h1, l2, h2;
                        memcpy(&l1, a1 + 8 * j, 4); memcpy(&h1, a1 + 8 * j + 4, 4);
                        memcpy(&l2, a2 + 8 * j, 4); memcpy(&h2, a2 + 8 * j + 4, 4);
                        d1 = _mm512_dpbusd_epi32(d1, lo[j], _mm512_set1_epi32(l1));
                        d1 = _mm512_dpbusd_epi32(d1, hi[j], _mm512_set1_epi32(h1));
                        d2 = _mm512_dpbusd_epi32(d2, lo[j], _mm512_set1_epi32(l2));
                        d2 = _mm512_dpbusd_epi32(d2, hi[j], _mm512_set1_epi32(h2));
                    }
                    __m512 t = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d1), c127), _mm512_cvtepi32_ps(d2));
                    acc[i] = _mm512_add_ps(acc[i], _mm512_mul_ps(sc, t));
                    acc[i] = _mm512_add_ps(acc[i], _mm512_mul_ps(mn, _mm512_set1_ps(gs[(m0 + i) * G + g])));
                }
            }
            for (int i = 0; i < mc; i++)
                _mm512_storeu_ps(y + (m0 + i) * N + b * 16, _mm512_mul_ps(acc[i], _mm512_set1_ps(step[m0 + i])));
        }
    }
    free(a);
    free(step);
    free(gs);
    return 0;
}

/* ---- fp32 projections of a few rows: y = x @ w.T (+ s * (x @ a.T) @ b.T, a live LoRA adapter),
   the decode step's matrix-vector products (tunix_rt.eval.fast_gemma's kernel option). Each
   output is one sum in a fixed order (16-lane fused multiply-adds along K, then a fixed tree
   across the lanes, then the adapter's r terms the same way), whatever M, the row's place in
   the batch or the thread count: a row's numbers do not depend on the batch it decodes in. */

/* 16 fp32 vectors -> one vector whose lane i is the sum of v[i]'s 16 lanes. */
static inline KERNEL __m512 hsum16f(const __m512 *v) {
    __m512 s[8], t[4];
    for (int i = 0; i < 8; i++)
        s[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(s[2 * i]), _mm512_castps_pd(s[2 * i + 1]));
        __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(s[2 * i]), _mm512_castps_pd(s[2 * i + 1]));
        t[i] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
    }
    __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(t[0], t[1], 0x88), _mm512_shuffle_f32x4(t[0], t[1], 0xdd));
    __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(t[2], t[3], 0x88), _mm512_shuffle_f32x4(t[2], t[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, 0x88), _mm512_shuffle_f32x4(u01, u23, 0xdd));
}

#ifndef PFB
#define PFB 4
#endif

/* acc[r * MP + m] += xp[m, :K] * wr[r][:K] lane-wise, for MP activation rows (padded with
   zero rows) and R = 16 / MP weight rows (wr: their addresses); pr, when given, the rows to
   prefetch (a block ahead). */
#define F32_SEG(MP) \
static inline KERNEL void f32seg##MP(__m512 *acc, const float *xp, const float *const *wr, long K, const float *const *pr) { \
    enum { R = 16 / MP }; \
    long k = 0; \
    for (; k + 16 <= K; k += 16) { \
        __m512 xv[MP]; \
        for (int m = 0; m < MP; m++) xv[m] = _mm512_loadu_ps(xp + m * K + k); \
        for (int r = 0; r < R; r++) { \
            if (pr) _mm_prefetch((const char *)(pr[r] + k), _MM_HINT_T0); \
            __m512 wv = _mm512_loadu_ps(wr[r] + k); \
            for (int m = 0; m < MP; m++) acc[r * MP + m] = _mm512_fmadd_ps(xv[m], wv, acc[r * MP + m]); \
        } \
    } \
    if (k < K) { \
        __mmask16 mk = (__mmask16)((1u << (K - k)) - 1u); \
        __m512 xv[MP]; \
        for (int m = 0; m < MP; m++) xv[m] = _mm512_maskz_loadu_ps(mk, xp + m * K + k); \
        for (int r = 0; r < R; r++) { \
            __m512 wv = _mm512_maskz_loadu_ps(mk, wr[r] + k); \
            for (int m = 0; m < MP; m++) acc[r * MP + m] = _mm512_fmadd_ps(xv[m], wv, acc[r * MP + m]); \
        } \
    } \
}
F32_SEG(1) F32_SEG(2) F32_SEG(4) F32_SEG(8)

/* x[:K] * w[:K] lane-wise, in the order of f32seg (one activation row against one weight row) */
static inline KERNEL __m512 f32lanes(const float *x, const float *w, long K) {
    __m512 acc = _mm512_setzero_ps();
    long k = 0;
    for (; k + 16 <= K; k += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), _mm512_loadu_ps(w + k), acc);
    if (k < K) {
        __mmask16 mk = (__mmask16)((1u << (K - k)) - 1u);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, x + k), _mm512_maskz_loadu_ps(mk, w + k), acc);
    }
    return acc;
}

/* one output: the lanes reduced by hsum16f's tree (as lane 0; the tree is the same for every lane) */
static inline KERNEL float f32reduce(__m512 lanes) {
    __m512 acc[16];
    float o[16];
    acc[0] = lanes;
    for (int i = 1; i < 16; i++) acc[i] = _mm512_setzero_ps();
    _mm512_storeu_ps(o, hsum16f(acc));
    return o[0];
}

static inline KERNEL void f32seg(long mp, __m512 *acc, const float *xp, const float *const *wr, long K, const float *const *pr) {
    switch (mp) {
        case 1: f32seg1(acc, xp, wr, K, pr); break;
        case 2: f32seg2(acc, xp, wr, K, pr); break;
        case 4: f32seg4(acc, xp, wr, K, pr); break;
        default: f32seg8(acc, xp, wr, K, pr); break;
    }
}

/* tunix_f32_rows (below) on AVX-512 */
static KERNEL int f32_rows_512(const float *x, const float *w, const int64_t *ids, long n, const float *a,
                               const float *b, float s, long rank, float *y, long M, long K, int threads) {
    if (M < 1 || M > 8) return -2;
    long mp = M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : 8, R = 16 / mp;
    long lora = a != NULL && b != NULL && rank > 0;
    float *xp = aligned_alloc(64, sizeof(float) * (size_t)(mp * K + 16));
    float *tp = aligned_alloc(64, sizeof(float) * (size_t)(mp * (lora ? rank : 1) + 16));
    if (!xp || !tp) { free(xp); free(tp); return -1; }
    memcpy(xp, x, sizeof(float) * (size_t)(M * K));
    memset(xp + M * K, 0, sizeof(float) * (size_t)((mp - M) * K));
    if (lora) { /* t = s * (x @ a.T): the adapter's inner products, each one sum as below */
        memset(tp, 0, sizeof(float) * (size_t)(mp * rank));
        for (long j = 0; j < rank; j++)
            for (long m = 0; m < M; m++) tp[m * rank + j] = f32reduce(f32lanes(x + m * K, a + j * K, K)) * s;
    }
    long blocks = n / R;
    #pragma omp parallel for num_threads(threads) schedule(static) if (n * K >= 65536)
    for (long blk = 0; blk < blocks; blk++) {
        const float *wr[16], *pr[16], *br[16];
        long ahead = blk + PFB < blocks;
        for (long r = 0; r < R; r++) {
            long row = ids ? ids[blk * R + r] : blk * R + r;
            wr[r] = w + row * K;
            if (lora) br[r] = b + row * rank;
            if (ahead) pr[r] = w + (ids ? ids[(blk + PFB) * R + r] : (blk + PFB) * R + r) * K;
        }
        __m512 acc[16];
        for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
        f32seg(mp, acc, xp, wr, K, ahead ? pr : NULL);
        __m512 v = hsum16f(acc);
        if (lora) {
            for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
            f32seg(mp, acc, tp, br, rank, NULL);
            v = _mm512_add_ps(v, hsum16f(acc));
        }
        float o[16];
        _mm512_storeu_ps(o, v);
        for (long r = 0; r < R; r++)
            for (long m = 0; m < M; m++) y[m * n + blk * R + r] = o[r * mp + m];
    }
    for (long j = blocks * R; j < n; j++) { /* the last n % R rows, one at a time (the same sums) */
        long row = ids ? ids[j] : j;
        for (long m = 0; m < M; m++) {
            float v = f32reduce(f32lanes(xp + m * K, w + row * K, K));
            if (lora) v += f32reduce(f32lanes(tp + m * rank, b + row * rank, rank));
            y[m * n + j] = v;
        }
    }
    free(xp);
    free(tp);
    return 0;
}

/* The same products on AVX2 with FMA (a CPU without AVX-512: AMD's Zen 1-3, Intel's client
   cores), to the bit: each output's 16 lanes are held as two 8-lane halves (lanes 0-7 and
   8-15), take the same fused multiply-adds along K (the tail's lanes zero, as the masked
   loads give them), and are summed by hsum16f's tree, which for lane i of its result is
   ((q0 + q1) + (q2 + q3)) with q_j = (l[4j] + l[4j+2]) + (l[4j+1] + l[4j+3]), l = v[i]'s lanes.
   The adapter's terms the same way, then added to the base's sum. Four outputs at a time
   (eight of AVX2's sixteen registers): four weight rows against one activation row, the
   batch's other rows taking further passes over the four while they are in L1. */
#define AVX2 __attribute__((target("avx2,fma")))

static inline AVX2 __m256i tail8(long left) { /* the lanes below `left`: a maskload's mask */
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left < 0 ? 0 : left > 8 ? 8 : left)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* three vectors -> the pairwise sums hsum16f's first two levels make, within 128-bit halves:
   half h of the result holds q_h of a, b, c, d (the halves' outputs 0..3) */
static inline AVX2 __m256 quads(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    __m256 cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
    return _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(ab), _mm256_castps_pd(cd))),
                         _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(ab), _mm256_castps_pd(cd))));
}

/* four outputs (acc[2i], acc[2i + 1]: lanes 0-7 and 8-15 of output i) -> their sums */
static inline AVX2 __m128 red4(const __m256 *acc) {
    __m256 lo = quads(acc[0], acc[2], acc[4], acc[6]);  /* q0 | q1 */
    __m256 hi = quads(acc[1], acc[3], acc[5], acc[7]);  /* q2 | q3 */
    return _mm_add_ps(_mm_add_ps(_mm256_castps256_ps128(lo), _mm256_extractf128_ps(lo, 1)),
                      _mm_add_ps(_mm256_castps256_ps128(hi), _mm256_extractf128_ps(hi, 1)));
}

/* output r * NM + m (NR x NM <= 4) += xp[m, :K] * wr[r][:K] lane-wise, into acc[2i], acc[2i + 1];
   pf, when given, the rows to prefetch. One step of 16 along K: LOAD is a plain load, or the
   tail's masked one (lanes past K read as zero) */
#define LOAD_ALL(p, mask) _mm256_loadu_ps(p)
#define LOAD_MASKED(p, mask) _mm256_maskload_ps(p, mask)
#define F32_STEP(NR, NM, LOAD) { \
        __m256 xl[NM], xh[NM]; \
        for (int m = 0; m < NM; m++) { xl[m] = LOAD(xp + m * K + k, ml); xh[m] = LOAD(xp + m * K + k + 8, mh); } \
        for (int r = 0; r < NR; r++) { \
            if (pf) _mm_prefetch((const char *)(pf[r] + k), _MM_HINT_T0); \
            __m256 wl = LOAD(wr[r] + k, ml), wh = LOAD(wr[r] + k + 8, mh); \
            for (int m = 0; m < NM; m++) { \
                acc[2 * (r * NM + m)] = _mm256_fmadd_ps(xl[m], wl, acc[2 * (r * NM + m)]); \
                acc[2 * (r * NM + m) + 1] = _mm256_fmadd_ps(xh[m], wh, acc[2 * (r * NM + m) + 1]); \
            } \
        } \
    }
#define F32_BLK(NR, NM) \
static inline AVX2 void f32blk##NR##x##NM(__m256 *acc, const float *xp, const float *const *wr, long K, \
                                          const float *const *pf) { \
    long k = 0; \
    __m256i ml = tail8(K % 16), mh = tail8(K % 16 - 8); \
    for (; k + 16 <= K; k += 16) F32_STEP(NR, NM, LOAD_ALL) \
    if (k < K) F32_STEP(NR, NM, LOAD_MASKED) \
}
F32_BLK(4, 1) F32_BLK(1, 1) F32_BLK(1, 2) F32_BLK(1, 3) F32_BLK(1, 4)

/* o[r * nm + m] := the sums of xp[m, :K] * wr[r][:K] for an nr x nm block (4x1, 1x1..1x4) */
static inline AVX2 void f32block(long nr, long nm, float *o, const float *xp, const float *const *wr, long K,
                                 const float *const *pf) {
    __m256 acc[8];
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
    if (nr == 4) f32blk4x1(acc, xp, wr, K, pf);
    else if (nm == 1) f32blk1x1(acc, xp, wr, K, pf);
    else if (nm == 2) f32blk1x2(acc, xp, wr, K, pf);
    else if (nm == 3) f32blk1x3(acc, xp, wr, K, pf);
    else f32blk1x4(acc, xp, wr, K, pf);
    _mm_storeu_ps(o, red4(acc));
}

#ifndef PFR
#define PFR 4
#endif

static AVX2 int f32_rows_avx2(const float *x, const float *w, const int64_t *ids, long n, const float *a,
                              const float *b, float s, long rank, float *y, long M, long K, int threads) {
    if (M < 1 || M > 8) return -2;
    long lora = a != NULL && b != NULL && rank > 0;
    float *tp = NULL;
    if (lora) { /* t = s * (x @ a.T), as f32_rows_512's */
        tp = malloc(sizeof(float) * (size_t)(M * rank));
        if (!tp) return -1;
        for (long j = 0; j < rank; j++)
            for (long m = 0; m < M; m++) {
                const float *ar = a + j * K;
                float o[4];
                f32block(1, 1, o, x + m * K, &ar, K, NULL);
                tp[m * rank + j] = o[0] * s;
            }
    }
    /* blocks of 4 weight rows against one activation row at a time (the rows past the first
       re-read the block from L1: measured faster at 8 rows than 2 x 2 or 1 x 4 blocks, which
       hold more activations in registers); the last n % 4 rows one at a time, against up to 4
       activation rows */
    const long nr = 4, blocks = n / nr;
    #pragma omp parallel for num_threads(threads) schedule(static) if (n * K >= 65536)
    for (long blk = 0; blk <= blocks; blk++) {
        const long j0 = blk * nr, br = blk < blocks ? nr : 1, rows = blk < blocks ? nr : n - j0;
        const long mstep = br == 4 ? 1 : 4;
        for (long r0 = 0; r0 < rows; r0 += br) {
            const float *wr[4], *bp[4], *pf[4];
            long ahead = blk + PFR < blocks;
            for (long r = 0; r < br; r++) {
                long row = ids ? ids[j0 + r0 + r] : j0 + r0 + r;
                wr[r] = w + row * K;
                if (lora) bp[r] = b + row * rank;
                if (ahead) pf[r] = w + (ids ? ids[j0 + r0 + r + PFR * nr] : j0 + r0 + r + PFR * nr) * K;
            }
            for (long m0 = 0; m0 < M; m0 += mstep) {
                const long nm = M - m0 < mstep ? M - m0 : mstep;
                float o[4], t[4];
                f32block(br, nm, o, x + m0 * K, wr, K, ahead && m0 == 0 ? pf : NULL);
                if (lora) {
                    f32block(br, nm, t, tp + m0 * rank, bp, rank, NULL);
                    for (int i = 0; i < 4; i++) o[i] = o[i] + t[i];
                }
                for (long r = 0; r < br; r++)
                    for (long m = 0; m < nm; m++) y[(m0 + m) * n + j0 + r0 + r] = o[r * nm + m];
            }
        }
    }
    free(tp);
    return 0;
}

/* Which path the fp32 products take here: 2 AVX-512 (the CPU the int8 kernel needs), 1 AVX2
   with FMA, 0 none. */
int tunix_f32_supported(void) {
    __builtin_cpu_init();
    if (tunix_i8mm_supported()) return 2;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
}

/* y [M, n] = x [M, K] @ w[ids].T (+ s * (x @ a [rank, K].T) @ b[ids].T where a and b are
   given: PEFT's plain LoRA), w's rows taken in place at ids (NULL: rows 0 .. n - 1); M from 1
   to 8, every operand contiguous; the same bits on either path. Returns 0, -1 if out of
   memory, -2 for M out of range, -3 on a CPU with neither path. */
int tunix_f32_rows(const float *x, const float *w, const int64_t *ids, long n, const float *a,
                   const float *b, float s, long rank, float *y, long M, long K, int threads) {
    static int path = -1;
    if (path < 0) path = tunix_f32_supported();
    if (path == 2) return f32_rows_512(x, w, ids, n, a, b, s, rank, y, M, K, threads);
    if (path == 1) return f32_rows_avx2(x, w, ids, n, a, b, s, rank, y, M, K, threads);
    return -3;
}

/* ---- One decoder layer of Gemma 3 / Gemma 2 on int8 weights (tunix_rt.eval.int8_weights's
   fused step): the same operations as tunix_rt.eval.fast_gemma's _layer_step, in C, so a
   layer is one call instead of ~70 torch ops. Not bit-equal to the torch ops (sums in
   another order): int8 weights are not an exact option. */

/* 2^k for the AVX-512 exp (scalef: any k the clamp lets through) and its lanes' sum */
#define ROUND_512(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define SCALE2_512(y, k) _mm512_scalef_ps(y, k)
#define HSUM_512(v) _mm512_reduce_add_ps(v)

@SIMD512@
@AVX2_DECODE@
/* The sampling noise's bits (tunix_rt.eval.sampling.gumbel): for row r and column i,
   splitmix64's finaliser of seed[r] + off[r * off_stride + i] (uint64 arithmetic, wrapping),
   its top 52 bits as the mantissa of a double in [1, 2). Integer operations only, so the same
   bits as the numpy and torch paths; vectorised with AVX-512DQ's 64-bit multiply. */
int tunix_noise_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")
        && __builtin_cpu_supports("avx512cd");
}

/* splitmix64's finaliser of x, its top 52 bits: the noise's m (U = (2m + 1) / 2^53). */
static inline uint64_t noise_m(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    x ^= x >> 31;
    return x >> 12;
}

__attribute__((target("avx512f,avx512dq")))
void tunix_noise_bits(const uint64_t *restrict seed, long rows, const uint64_t *restrict off, long off_stride,
                      uint64_t *restrict bits, long bits_stride, long n) {
    for (long r = 0; r < rows; r++) {
        const uint64_t s = seed[r];
        const uint64_t *restrict o = off + r * off_stride;
        uint64_t *restrict b = bits + r * bits_stride;
        for (long i = 0; i < n; i++) b[i] = noise_m(s + o[i]) | (0x3FFULL << 52);
    }
}

/* tunix_noise_bits, and the entries that may score at least thr[r] (the bound-first draw,
   tunix_rt.eval.screened_head): those with sc[r, i] + gub >= thr[r], where gub bounds the noise
   -log(-log U) above without a log: U = (2m + 1) / 2^53, k = 2^53 - 2m - 1 >= 1, and
   -log U >= 1 - U = k / 2^53, so the noise is at most 53 ln 2 - ln k <= (clz(k) - 10) ln 2
   (ln k >= floor(log2 k) ln 2 = (63 - clz(k)) ln 2). Their flat indices r * n + i go to pos,
   ascending; returns how many, or -1 past cap (pos then holds some of them), -2 out of memory. */
typedef struct { int64_t *pos; long cap, count; } Hits;

static inline int hit_add(Hits *h, long at) {
    if (h->count >= h->cap) return 0;
    h->pos[h->count++] = at;
    return 1;
}

/* One entry: its bits at *b, and whether sc + its noise's bound reaches thr (added to h). */
static inline int screen1(uint64_t x, uint64_t *b, double sc, double thr, long at, Hits *h) {
    const uint64_t m = noise_m(x);
    *b = m | (0x3FFULL << 52);
    const double gub = (double)((long)__builtin_clzll((1ULL << 53) - 2 * m - 1) - 10) * 0.69314718055994530942;
    return sc + gub >= thr ? hit_add(h, at) : 1;
}

/* Eight entries at once: counters s + o[0..7], scores sc; as screen1. */
__attribute__((target("avx512f,avx512dq,avx512cd")))
static inline int screen8(__m512i s, const uint64_t *o, uint64_t *b, __m512d sc, __m512d thr, long at, Hits *h) {
    __m512i x = _mm512_add_epi64(s, _mm512_loadu_si512((const void *)o));
    x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 30)), _mm512_set1_epi64((long long)0xBF58476D1CE4E5B9ULL));
    x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 27)), _mm512_set1_epi64((long long)0x94D049BB133111EBULL));
    const __m512i m = _mm512_srli_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 31)), 12);
    _mm512_storeu_si512((void *)b, _mm512_or_si512(m, _mm512_set1_epi64((long long)(0x3FFULL << 52))));
    const __m512i k = _mm512_sub_epi64(_mm512_set1_epi64((long long)((1ULL << 53) - 1)), _mm512_slli_epi64(m, 1));
    const __m512d gub = _mm512_mul_pd(_mm512_cvtepi64_pd(_mm512_sub_epi64(_mm512_lzcnt_epi64(k), _mm512_set1_epi64(10))),
                                      _mm512_set1_pd(0.69314718055994530942));
    __mmask8 hit = _mm512_cmp_pd_mask(_mm512_add_pd(sc, gub), thr, _CMP_GE_OQ);
    while (hit) {
        const int j = __builtin_ctz(hit);
        hit &= hit - 1;
        if (!hit_add(h, at + j)) return 0;
    }
    return 1;
}

__attribute__((target("avx512f,avx512dq,avx512cd")))
static long noise_screen_512(const uint64_t *restrict seed, long rows, const uint64_t *restrict off,
                             const double *restrict sc, const double *restrict thr, uint64_t *restrict bits,
                             long n, int64_t *restrict pos, long cap) {
    Hits h = {pos, cap, 0};
    for (long r = 0; r < rows; r++) {
        const __m512i s = _mm512_set1_epi64((long long)seed[r]);
        const __m512d th = _mm512_set1_pd(thr[r]);
        const long base = r * n;
        long i = 0;
        for (; i + 8 <= n; i += 8)
            if (!screen8(s, off + i, bits + base + i, _mm512_loadu_pd(sc + base + i), th, base + i, &h)) return -1;
        for (; i < n; i++)
            if (!screen1(seed[r] + off[i], bits + base + i, sc[base + i], thr[r], base + i, &h)) return -1;
    }
    return h.count;
}

/* Each row's hits (got[r] of them, or -1 where its buffer filled) from its own buffer of `each`
   entries into pos in row order; -1 past cap hits or where a row failed. Frees buf and got. */
static long join_hits(int64_t *pos, long cap, int64_t *buf, long each, long *got, long rows) {
    long total = 0;
    for (long r = 0; r < rows; r++) {
        if (got[r] < 0 || total + got[r] > cap) { total = -1; break; }
        memcpy(pos + total, buf + r * each, sizeof(int64_t) * (size_t)got[r]);
        total += got[r];
    }
    free(buf);
    free(got);
    return total;
}

/* tunix_noise_screen on any x86-64 CPU: the same entries one at a time (screen1), the rows
   shared by the threads (each row's hits in a buffer of its own, then joined in row order) */
static long noise_screen_any(const uint64_t *restrict seed, long rows, const uint64_t *restrict off,
                             const double *restrict sc, const double *restrict thr, uint64_t *restrict bits,
                             long n, int64_t *restrict pos, long cap, int threads) {
    const long per = cap < n ? cap : n;
    int64_t *buf = malloc(sizeof(int64_t) * (size_t)(rows * (per > 0 ? per : 1)));
    long *got = malloc(sizeof(long) * (size_t)rows);
    if (!buf || !got) { free(buf); free(got); return -2; }
    #pragma omp parallel for num_threads(threads) schedule(static) if (rows > 1 && n >= 4096)
    for (long r = 0; r < rows; r++) {
        Hits h = {buf + r * per, per, 0};
        got[r] = 0;
        for (long i = 0; i < n; i++)
            if (!screen1(seed[r] + off[i], bits + r * n + i, sc[r * n + i], thr[r], r * n + i, &h)) { got[r] = -1; break; }
        if (got[r] == 0) got[r] = h.count;
    }
    return join_hits(pos, cap, buf, per, got, rows);
}

long tunix_noise_screen(const uint64_t *restrict seed, long rows, const uint64_t *restrict off,
                        const double *restrict sc, const double *restrict thr, uint64_t *restrict bits,
                        long n, int64_t *restrict pos, long cap, int threads) {
    static int wide = -1;
    if (wide < 0) wide = tunix_noise_supported();
    return wide ? noise_screen_512(seed, rows, off, sc, thr, bits, n, pos, cap)
                : noise_screen_any(seed, rows, off, sc, thr, bits, n, pos, cap, threads);
}

/* tunix_noise_screen with the screen's scores made on the fly from its integers: sc[r, i] =
   (comb[r, i] * step[r, g] + width[r, g]) / t for i in group g (groups of `per`), the upper
   bounds / T of screened_head._upper without a softcap or a fine level, so no [rows, n] fp64
   copy is formed; rounded otherwise than torch's, inside the caller's margins. The rows are
   shared by the threads, each row's hits in a buffer of its own, then joined in row order
   (the same hits in the same order on any number of threads). */
__attribute__((target("avx512f,avx512dq,avx512cd")))
static long screen_comb_row(long r, const uint64_t *restrict seed, const uint64_t *restrict off,
                            const int32_t *restrict comb, long groups, long per, const double *restrict step,
                            const double *restrict width, double t, const double *restrict thr,
                            uint64_t *restrict bits, int64_t *restrict pos, long cap) {
    Hits h = {pos, cap, 0};
    const __m512d vt = _mm512_set1_pd(t);
    const __m512i s = _mm512_set1_epi64((long long)seed[r]);
    const __m512d th = _mm512_set1_pd(thr[r]);
    for (long g = 0; g < groups; g++) {
        const double st = step[r * groups + g], wd = width[r * groups + g];
        const __m512d vst = _mm512_set1_pd(st), vwd = _mm512_set1_pd(wd);
        const long base = (r * groups + g) * per, ob = g * per;
        long i = 0;
        for (; i + 8 <= per; i += 8) {
            const __m512d c = _mm512_cvtepi32_pd(_mm256_loadu_si256((const __m256i *)(comb + base + i)));
            const __m512d sc = _mm512_div_pd(_mm512_add_pd(_mm512_mul_pd(c, vst), vwd), vt);
            if (!screen8(s, off + ob + i, bits + base + i, sc, th, base + i, &h)) return -1;
        }
        for (; i < per; i++)
            if (!screen1(seed[r] + off[ob + i], bits + base + i, ((double)comb[base + i] * st + wd) / t, thr[r],
                         base + i, &h)) return -1;
    }
    return h.count;
}

long tunix_noise_screen_comb(const uint64_t *restrict seed, long rows, const uint64_t *restrict off,
                             const int32_t *restrict comb, long groups, long per, const double *restrict step,
                             const double *restrict width, double t, const double *restrict thr,
                             uint64_t *restrict bits, int64_t *restrict pos, long cap, int threads) {
    if (rows < 2 || threads < 2) {
        long total = 0;
        for (long r = 0; r < rows; r++) {
            long got = screen_comb_row(r, seed, off, comb, groups, per, step, width, t, thr, bits, pos + total,
                                       cap - total);
            if (got < 0) return -1;
            total += got;
        }
        return total;
    }
    const long n = groups * per, each = cap < n ? cap : n;
    int64_t *buf = malloc(sizeof(int64_t) * (size_t)(rows * (each > 0 ? each : 1)));
    long *got = malloc(sizeof(long) * (size_t)rows);
    if (!buf || !got) { free(buf); free(got); return -2; }
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long r = 0; r < rows; r++)
        got[r] = screen_comb_row(r, seed, off, comb, groups, per, step, width, t, thr, bits, buf + r * each, each);
    return join_hits(pos, cap, buf, each, got, rows);
}

/* ---- The index of each row's largest value, as torch.argmax gives it on a CPU: the first NaN
   where a row has one, else the first entry equal to the row's maximum (-0.0 == +0.0, as torch's
   `>` keeps the earlier of them). Two passes over a row (the maximum, then the first index equal
   to it): the rows are a decode step's logits, just written, so in cache. torch's reduction took
   ~320 us for Gemma 3's [1, 262144] row on a 2-core Xeon, a twentieth of an int4 decode step. */
static long argmax_any(const float *x, long n) {
    long best = 0;
    for (long i = 0; i < n; i++) {
        if (x[i] != x[i]) return i;
        if (x[i] > x[best]) best = i;
    }
    return best;
}

static KERNEL long argmax_512(const float *x, long n) {
    long n16 = n & ~15L;
    __m512 top = _mm512_set1_ps(-INFINITY);
    for (long i = 0; i < n16; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) return argmax_any(x, n); /* a NaN: its first */
        top = _mm512_max_ps(top, v);
    }
    float m = _mm512_reduce_max_ps(top);
    for (long i = n16; i < n; i++) {
        if (x[i] != x[i]) return argmax_any(x, n);
        m = x[i] > m ? x[i] : m;
    }
    __m512 mv = _mm512_set1_ps(m);
    for (long i = 0; i < n16; i += 16) {
        __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), mv, _CMP_EQ_OQ);
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
    for (long i = n16; i < n; i++)
        if (x[i] == m) return i;
    return 0; /* only where n == 0 */
}

/* argmax_512 on AVX2 (8 lanes; a NaN anywhere: argmax_any) */
static AVX2D long argmax_256(const float *x, long n) {
    long n8 = n & ~7L;
    __m256 top = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    for (long i = 0; i < n8; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        top = _mm256_max_ps(top, v);
    }
    if (_mm256_movemask_ps(nan)) return argmax_any(x, n);
    float lanes[8], m = -INFINITY;
    _mm256_storeu_ps(lanes, top);
    for (int i = 0; i < 8; i++) m = lanes[i] > m ? lanes[i] : m;
    for (long i = n8; i < n; i++) {
        if (x[i] != x[i]) return argmax_any(x, n);
        m = x[i] > m ? x[i] : m;
    }
    __m256 mv = _mm256_set1_ps(m);
    for (long i = 0; i < n8; i += 8) {
        int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), mv, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
    for (long i = n8; i < n; i++)
        if (x[i] == m) return i;
    return 0; /* only where n == 0 */
}

/* out[r] := argmax of row r (x + r * stride, n entries); the rows shared by the threads. */
void tunix_argmax_rows(const float *x, long rows, long n, long stride, int64_t *out, int threads) {
    int isa = tunix_decode_isa();
    #pragma omp parallel for num_threads(threads) schedule(static) if (rows > 1 && rows * n >= 65536)
    for (long r = 0; r < rows; r++)
        out[r] = isa == 2 ? argmax_512(x + r * stride, n) : isa == 1 ? argmax_256(x + r * stride, n)
                                                            : argmax_any(x + r * stride, n);
}
"""

_AVX2_DECODE = r"""
/* ---- The decode kernels on AVX2 (a CPU without AVX-512 VNNI: AMD's Zen 1-3, Intel's client
   cores before AVX-512): qlinear, q4linear and the decoder layers, with the same bits as their
   AVX-512 twins (and so as int8_weights's torch path) where those promise them. AVX2 has no
   vpdpbusd; its vpmaddubsw multiplies unsigned by signed bytes and adds pairs into int16 with
   saturation, so the operands are kept where no pair can saturate:
   - int8 (qlinear): |w| (0..128 as unsigned) by the activation level with w's sign moved onto it
     (vpsignb; a level is in -127..127, so its negation fits): a pair is at most 2 * 128 * 127 =
     32512 < 32767; vpmaddwd by ones then widens the pairs into exact int32 sums (no wsum shift).
   - int4 (q4linear): the codes (0..15, unsigned) by the levels (signed): a pair is at most
     2 * 15 * 127 = 3810, so the eight pairs of a group's chunks add in int16 (<= 30480) before
     one vpmaddwd widens them.
   The int32 sums are the exact integers vpdpbusd gives, and every fp32 operation after them is
   the AVX-512 path's, lane for lane, in its order (no fused multiply-adds): the same bits. */
#define AVX2D __attribute__((target("avx2,fma,f16c")))

/* 8 int32 lanes (each in -127..127) -> 8 bytes at dst */
static inline AVX2D void store8(int8_t *dst, __m256i v) {
    __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(v, v), _mm256_setzero_si256());
    _mm_storel_epi64((__m128i *)dst, _mm_unpacklo_epi32(_mm256_castsi256_si128(p8), _mm256_extracti128_si256(p8, 1)));
}

/* quant_row's bits 8 lanes at a time (as quant_row_512: the same operations in the same order);
   a row holding a NaN takes quant_row. K a multiple of 8. */
static AVX2D void quant_row_256(const float *xm, long K, int8_t *a1, int8_t *a2, float *step) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 top = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
    for (long k = 0; k < K; k += 8) {
        __m256 v = _mm256_and_ps(_mm256_loadu_ps(xm + k), absm);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        top = _mm256_max_ps(top, v);
    }
    if (_mm256_movemask_ps(nan)) { quant_row(xm, K, a1, a2, step); return; }
    float lanes[8], amax = 0.0f;
    _mm256_storeu_ps(lanes, top);
    for (int i = 0; i < 8; i++) amax = lanes[i] > amax ? lanes[i] : amax;
    float s = amax / 127.0f;
    if (s < FLT_MIN) s = FLT_MIN;
    float r = (1.0f / s) * 127.0f;
    const __m256 sv = _mm256_set1_ps(s), rv = _mm256_set1_ps(r), lim = _mm256_set1_ps(127.0f);
    for (long k = 0; k < K; k += 8) {
        __m256 v = _mm256_loadu_ps(xm + k);
        __m256 q1 = _mm256_round_ps(_mm256_div_ps(v, sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 q2 = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(v, _mm256_mul_ps(sv, q1)), rv),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256i in1 = _mm256_castps_si256(_mm256_cmp_ps(_mm256_and_ps(q1, absm), lim, _CMP_LE_OQ));
        __m256i in2 = _mm256_castps_si256(_mm256_cmp_ps(_mm256_and_ps(q2, absm), lim, _CMP_LE_OQ));
        store8(a1 + k, _mm256_and_si256(_mm256_cvtps_epi32(q1), in1));
        store8(a2 + k, _mm256_and_si256(_mm256_cvtps_epi32(q2), in2));
    }
    *step = s / 127.0f;
}

static AVX2D void quant_levels_256(const float *x, long M, long K, int8_t *a, float *step) {
    for (long m = 0; m < M; m++) {
        if (K % 8 == 0)
            quant_row_256(x + m * K, K, a + m * K, a + (M + m) * K, step + m);
        else
            quant_row(x + m * K, K, a + m * K, a + (M + m) * K, step + m);
    }
}

/* One whole block of 16 rows on `pack_vnni`'s broadcast layout (K / 4 groups of the 16 rows' 4
   bytes: 64 bytes a group, read front to back) against M activation rows: each row's two levels
   broadcast 4 bytes at a time, rows 0-7 and 8-15 in the lanes of two int32 vectors (no
   horizontal sums). The same int32 sums and fp32 epilogue as qlinear_512. `pf`: bytes ahead to
   prefetch into L2 (0: none). */
static AVX2D void bc_block(const int8_t *a, const float *step, const int8_t *wb, const float *ws, float *yb,
                           long M, long N, long K, long pf) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256 c127 = _mm256_set1_ps(127.0f);
    for (long m = 0; m < M; m++) {
        const int8_t *x1 = a + m * K, *x2 = a + (M + m) * K;
        __m256i s1l = _mm256_setzero_si256(), s1h = s1l, s2l = s1l, s2h = s1l;
        for (long k = 0; k < K; k += 4) {
            const int8_t *p = wb + 16 * k;
            if (pf && m == 0 && (k & 15) == 0) _mm_prefetch((const char *)(p + pf), _MM_HINT_T1);
            __m256i w0 = _mm256_loadu_si256((const __m256i *)p), w1 = _mm256_loadu_si256((const __m256i *)(p + 32));
            int32_t i1, i2;
            memcpy(&i1, x1 + k, 4); memcpy(&i2, x2 + k, 4);
            __m256i l1 = _mm256_set1_epi32(i1), l2 = _mm256_set1_epi32(i2);
            __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
            s1l = _mm256_add_epi32(s1l, _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(l1, w0)), ones));
            s1h = _mm256_add_epi32(s1h, _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(l1, w1)), ones));
            s2l = _mm256_add_epi32(s2l, _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(l2, w0)), ones));
            s2h = _mm256_add_epi32(s2h, _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(l2, w1)), ones));
        }
        __m256 st = _mm256_set1_ps(step[m]);
        __m256 o = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s1l), c127), _mm256_cvtepi32_ps(s2l));
        _mm256_storeu_ps(yb + m * N, _mm256_mul_ps(_mm256_mul_ps(o, st), _mm256_loadu_ps(ws)));
        o = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s1h), c127), _mm256_cvtepi32_ps(s2h));
        _mm256_storeu_ps(yb + m * N + 8, _mm256_mul_ps(_mm256_mul_ps(o, st), _mm256_loadu_ps(ws + 8)));
    }
}

/* four int32 vectors -> their four lane sums */
static inline AVX2D __m128i hsum4x8(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

/* qlinear_512 on AVX2 (the same arguments and bits; wsum unused: no shift to take back). A
   block's 16 rows go four at a time (eight int32 accumulators, two levels), each four a pass
   over K: on panels (`packed`) a pass reads 256 contiguous bytes of each 1 KB step, the first
   pass prefetching the whole step QPF bytes ahead into L2 for the others. */
static AVX2D int qlinear_256(const float *x, const int8_t *w, const int32_t *wsum, const float *wscale,
                             float *y, long M, long N, long K, int threads, int packed) {
    (void)wsum;
    int8_t *a = aligned_alloc(64, (size_t)(2 * M * K + 64));
    float *step = malloc(sizeof(float) * (size_t)(M + 1));
    if (!a || !step) { free(a); free(step); return -1; }
    quant_levels_256(x, M, K, a, step);
    long blocks = N / 16;
    const __m256 c127 = _mm256_set1_ps(127.0f);
    const __m256i ones = _mm256_set1_epi16(1);
    #pragma omp parallel for num_threads(threads) schedule(static) if (blocks * K >= QPAR)
    for (long b = 0; b < blocks; b++) {
        const int8_t *wb = w + b * 16 * K;
        long pf = packed && (b + 1) * 16 * K + QPF <= blocks * 16 * K;
        int32_t s1[16], s2[16];
        for (long m = 0; m < M; m++) {
            const int8_t *x1 = a + m * K, *x2 = a + (M + m) * K;
            for (int g = 0; g < 4; g++) {
                __m256i acc1[4], acc2[4];
                for (int r = 0; r < 4; r++) { acc1[r] = _mm256_setzero_si256(); acc2[r] = _mm256_setzero_si256(); }
                for (long k = 0; k < K; k += 64) {
                    const int8_t *p = packed ? wb + 16 * k + 256 * g : wb + 4 * g * K + k;
                    long rs = packed ? 64 : K;
                    if (pf && g == 0 && m == 0)
                        for (int i = 0; i < 16; i++) _mm_prefetch((const char *)(wb + 16 * k + QPF + 64 * i), _MM_HINT_T1);
                    for (int h = 0; h < 2; h++) {
                        __m256i l1 = _mm256_loadu_si256((const __m256i *)(x1 + k + 32 * h));
                        __m256i l2 = _mm256_loadu_si256((const __m256i *)(x2 + k + 32 * h));
                        for (int r = 0; r < 4; r++) {
                            __m256i wv = _mm256_loadu_si256((const __m256i *)(p + r * rs + 32 * h));
                            __m256i aw = _mm256_abs_epi8(wv);
                            acc1[r] = _mm256_add_epi32(acc1[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(l1, wv)), ones));
                            acc2[r] = _mm256_add_epi32(acc2[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(l2, wv)), ones));
                        }
                    }
                }
                _mm_storeu_si128((__m128i *)(s1 + 4 * g), hsum4x8(acc1[0], acc1[1], acc1[2], acc1[3]));
                _mm_storeu_si128((__m128i *)(s2 + 4 * g), hsum4x8(acc2[0], acc2[1], acc2[2], acc2[3]));
            }
            for (int h = 0; h < 2; h++) {
                __m256 f1 = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(s1 + 8 * h)));
                __m256 f2 = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(s2 + 8 * h)));
                __m256 o = _mm256_add_ps(_mm256_mul_ps(f1, c127), f2);
                o = _mm256_mul_ps(_mm256_mul_ps(o, _mm256_set1_ps(step[m])), _mm256_loadu_ps(wscale + b * 16 + 8 * h));
                _mm256_storeu_ps(y + m * N + b * 16 + 8 * h, o);
            }
        }
    }
    for (long n = blocks * 16; n < N; n++)
        for (long m = 0; m < M; m++) {
            float o = (float)dot1(a + m * K, w + n * K, K) * 127.0f + (float)dot1(a + (M + m) * K, w + n * K, K);
            y[m * N + n] = (o * step[m]) * wscale[n];
        }
    free(a);
    free(step);
    return 0;
}

/* qlinear on `pack_vnni`'s layout (`packed` 2), on any CPU with AVX2 (the int8 weights' layout
   where the AVX2 kernels decode: on a 2-core AMD EPYC (Zen 3) Gemma 3's [262144, 640] head read
   at 15.7 GB/s this way against 8.1 on panels, whose 16 rows need 32 accumulators, more than
   AVX2's 16 registers, so panels go four rows a pass). The same bits as qlinear_512. */
static AVX2D int qlinear_256b(const float *x, const int8_t *w, const float *wscale, float *y, long M, long N,
                              long K, int threads) {
    int8_t *a = aligned_alloc(64, (size_t)(2 * M * K + 64));
    float *step = malloc(sizeof(float) * (size_t)(M + 1));
    if (!a || !step) { free(a); free(step); return -1; }
    quant_levels_256(x, M, K, a, step);
    long blocks = N / 16;
    #pragma omp parallel for num_threads(threads) schedule(static) if (blocks * K >= QPAR)
    for (long b = 0; b < blocks; b++)
        bc_block(a, step, w + b * 16 * K, wscale + b * 16, y + b * 16, M, N, K, 0);
    for (long n = blocks * 16; n < N; n++)
        for (long m = 0; m < M; m++) {
            float o = (float)dot1(a + m * K, w + n * K, K) * 127.0f + (float)dot1(a + (M + m) * K, w + n * K, K);
            y[m * N + n] = (o * step[m]) * wscale[n];
        }
    free(a);
    free(step);
    return 0;
}

/* q4linear_512 on AVX2 (the same arguments and bits). A chunk's first 32 bytes hold rows 0-7, its
   last 32 rows 8-15: a single stream takes both halves of each group in turn (one pass over
   the block: Gemma 3's head 15.7 -> 20.2 GB/s on a 2-core Zen 3 against the halves one after
   the other); several rows take the halves one after the other, four rows at a time (the
   block's 8 K bytes in L1 for the second half), which ran faster for eight rows. */
static AVX2D int q4linear_256(const float *x, const uint8_t *w, const uint16_t *sm, float *y,
                              long M, long N, long K, int threads) {
    if (N % 16 || K % 32) return -2;
    long G = K / 32, blocks = N / 16, total = blocks * 8 * K;
    int8_t *a = aligned_alloc(64, (size_t)(2 * M * K + 64));
    float *step = malloc(sizeof(float) * (size_t)(M + 1));
    float *gs = malloc(sizeof(float) * (size_t)(M * G + 1));
    if (!a || !step || !gs) { free(a); free(step); free(gs); return -1; }
    quant_levels_256(x, M, K, a, step);
    for (long m = 0; m < M; m++)
        for (long g = 0; g < G; g++) { /* each level's sum over the group, exact in int32 */
            const int8_t *p1 = a + m * K + 32 * g, *p2 = a + (M + m) * K + 32 * g;
            int32_t t1 = 0, t2 = 0;
            for (int i = 0; i < 32; i++) { t1 += p1[i]; t2 += p2[i]; }
            gs[m * G + g] = (float)t1 * 127.0f + (float)t2;
        }
    const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const __m256 c127 = _mm256_set1_ps(127.0f);
    #pragma omp parallel for num_threads(threads) schedule(static) if (blocks * K >= 2 * QPAR)
    for (long b = 0; b < blocks; b++) {
        const uint8_t *wb = w + b * 8 * K;
        const uint16_t *sb = sm + b * G * 32;
        if (M == 1) { /* a single stream: both halves of a group at once, the block read in one pass */
            __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
            for (long g = 0; g < G; g++) {
                const uint8_t *p = wb + g * 256;
                if (b * 8 * K + g * 256 + Q4PF + 256 <= total)
                    for (int i = 0; i < 4; i++) _mm_prefetch((const char *)(p + Q4PF + 64 * i), _MM_HINT_T1);
                for (int h = 0; h < 2; h++) {
                    __m256i d1 = _mm256_setzero_si256(), d2 = _mm256_setzero_si256();
                    for (int j = 0; j < 4; j++) {
                        __m256i v = _mm256_loadu_si256((const __m256i *)(p + 64 * j + 32 * h));
                        __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                        int32_t l1, h1, l2, h2;
                        memcpy(&l1, a + 32 * g + 8 * j, 4); memcpy(&h1, a + 32 * g + 8 * j + 4, 4);
                        memcpy(&l2, a + K + 32 * g + 8 * j, 4); memcpy(&h2, a + K + 32 * g + 8 * j + 4, 4);
                        d1 = _mm256_add_epi16(d1, _mm256_maddubs_epi16(lo, _mm256_set1_epi32(l1)));
                        d1 = _mm256_add_epi16(d1, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(h1)));
                        d2 = _mm256_add_epi16(d2, _mm256_maddubs_epi16(lo, _mm256_set1_epi32(l2)));
                        d2 = _mm256_add_epi16(d2, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(h2)));
                    }
                    __m256 sc = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + g * 32 + 8 * h)));
                    __m256 mn = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + g * 32 + 16 + 8 * h)));
                    __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(d1, ones)), c127),
                                             _mm256_cvtepi32_ps(_mm256_madd_epi16(d2, ones)));
                    acc[h] = _mm256_add_ps(acc[h], _mm256_mul_ps(sc, t));
                    acc[h] = _mm256_add_ps(acc[h], _mm256_mul_ps(mn, _mm256_set1_ps(gs[g])));
                }
            }
            for (int h = 0; h < 2; h++)
                _mm256_storeu_ps(y + b * 16 + 8 * h, _mm256_mul_ps(acc[h], _mm256_set1_ps(step[0])));
            continue;
        }
        for (long m0 = 0; m0 < M; m0 += 4) {
            int mc = M - m0 < 4 ? (int)(M - m0) : 4;
            for (int h = 0; h < 2; h++) {
                __m256 acc[4];
                for (int i = 0; i < 4; i++) acc[i] = _mm256_setzero_ps();
                for (long g = 0; g < G; g++) {
                    const uint8_t *p = wb + g * 256;
                    if (h == 0 && m0 == 0 && b * 8 * K + g * 256 + Q4PF + 256 <= total)
                        for (int i = 0; i < 4; i++) _mm_prefetch((const char *)(p + Q4PF + 64 * i), _MM_HINT_T1);
                    __m256i lo[4], hi[4];
                    for (int j = 0; j < 4; j++) {
                        __m256i v = _mm256_loadu_si256((const __m256i *)(p + 64 * j + 32 * h));
                        lo[j] = _mm256_and_si256(v, nib);
                        hi[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                    }
                    __m256 sc = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + g * 32 + 8 * h)));
                    __m256 mn = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + g * 32 + 16 + 8 * h)));
                    for (int i = 0; i < mc; i++) {
                        const int8_t *a1 = a + (m0 + i) * K + 32 * g, *a2 = a + (M + m0 + i) * K + 32 * g;
                        __m256i d1 = _mm256_setzero_si256(), d2 = _mm256_setzero_si256();
                        for (int j = 0; j < 4; j++) {
                            int32_t l1, h1, l2, h2;
                            memcpy(&l1, a1 + 8 * j, 4); memcpy(&h1, a1 + 8 * j + 4, 4);
                            memcpy(&l2, a2 + 8 * j, 4); memcpy(&h2, a2 + 8 * j + 4, 4);
                            d1 = _mm256_add_epi16(d1, _mm256_maddubs_epi16(lo[j], _mm256_set1_epi32(l1)));
                            d1 = _mm256_add_epi16(d1, _mm256_maddubs_epi16(hi[j], _mm256_set1_epi32(h1)));
                            d2 = _mm256_add_epi16(d2, _mm256_maddubs_epi16(lo[j], _mm256_set1_epi32(l2)));
                            d2 = _mm256_add_epi16(d2, _mm256_maddubs_epi16(hi[j], _mm256_set1_epi32(h2)));
                        }
                        __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(d1, ones)), c127),
                                                 _mm256_cvtepi32_ps(_mm256_madd_epi16(d2, ones)));
                        acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(sc, t));
                        acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(mn, _mm256_set1_ps(gs[(m0 + i) * G + g])));
                    }
                }
                for (int i = 0; i < mc; i++)
                    _mm256_storeu_ps(y + (m0 + i) * N + b * 16 + 8 * h, _mm256_mul_ps(acc[i], _mm256_set1_ps(step[m0 + i])));
            }
        }
    }
    free(a);
    free(step);
    free(gs);
    return 0;
}

/* y * 2^k on 8 lanes: as two factors 2^(k/2) (k reaches +-128 after the clamp, past a single
   factor's exponent range) */
static inline AVX2D __m256 scale2_256(__m256 y, __m256 k) {
    __m256i ki = _mm256_cvtps_epi32(k), k1 = _mm256_srai_epi32(ki, 1), k2 = _mm256_sub_epi32(ki, k1);
    __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, _mm256_set1_epi32(127)), 23));
    __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(y, p1), p2);
}

static inline AVX2D float hsum_256(__m256 v) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
}

#define ROUND_256(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define SCALE2_256(y, k) scale2_256(y, k)
#define HSUM_256(v) hsum_256(v)

@SIMD256@
@LAYERS@

/* Which decode kernels run here: 2 the AVX-512 VNNI ones, 1 the AVX2 ones, 0 none. */
static int isa_found(void) {
    __builtin_cpu_init();
    if (tunix_i8mm_supported()) return 2;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") ? 1 : 0;
}

static int isa_now = -1;

int tunix_decode_isa(void) {
    if (isa_now < 0) isa_now = isa_found();
    return isa_now;
}

/* Use the kernels of `isa` (at most what the CPU has; a test runs the AVX2 ones on an AVX-512
   CPU so): returns the one now in use. */
int tunix_set_isa(int isa) {
    int top = isa_found();
    isa_now = isa < 0 ? 0 : isa > top ? top : isa;
    return isa_now;
}

/* ---- int_mm on AVX2 (tunix_i8mm, tunix_i8mm_vnni): the exact int32 sums, as qlinear_256 and
   qlinear_256b form them (|w| by the activation with w's sign moved onto it, so a pair is at
   most 2 * 128 * 127 and vpmaddubsw never saturates). An activation of -128 has no negation
   in int8: where a holds one, the call returns -4 and int_mm sums in fp64 instead (the
   activations the decoders make are in -127..127). */
static int has_min8(const int8_t *a, long n) {
    for (long i = 0; i < n; i++)
        if (a[i] == -128) return 1;
    return 0;
}

/* row-major w: four rows a pass over K, each activation row in turn (the four rows in L1) */
static AVX2D int i8mm_256(const int8_t *a, const int8_t *w, int32_t *y, long M, long N, long K, int threads) {
    if (has_min8(a, M * K)) return -4;
    const __m256i ones = _mm256_set1_epi16(1);
    long quads = N / 4;
    #pragma omp parallel for num_threads(threads) schedule(static) if (quads * K >= 16384)
    for (long q = 0; q < quads; q++) {
        const int8_t *wq = w + q * 4 * K;
        for (long m = 0; m < M; m++) {
            const int8_t *am = a + m * K;
            __m256i acc[4];
            for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_si256();
            for (long k = 0; k < K; k += 32) {
                __m256i av = _mm256_loadu_si256((const __m256i *)(am + k));
                for (int r = 0; r < 4; r++) {
                    __m256i wv = _mm256_loadu_si256((const __m256i *)(wq + r * K + k));
                    acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(
                        _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(av, wv)), ones));
                }
            }
            _mm_storeu_si128((__m128i *)(y + m * N + q * 4), hsum4x8(acc[0], acc[1], acc[2], acc[3]));
        }
    }
    for (long n = quads * 4; n < N; n++) /* the last N % 4 rows */
        for (long m = 0; m < M; m++) y[m * N + n] = dot1(a + m * K, w + n * K, K);
    return 0;
}

/* `pack_vnni`'s layout: MR activation rows (4 bytes broadcast at a time) against one block of 16
   rows, rows 0-7 and 8-15 in two vectors' lanes; `rows` of the MR stored (the rest padding). */
#define V2TILE(MR) \
static inline AVX2D void v2tile_##MR(const int8_t *a, long K, const int8_t *wb, int32_t *y, long N, long rows) { \
    const __m256i ones = _mm256_set1_epi16(1); \
    __m256i acc[MR][2]; \
    for (int m = 0; m < MR; m++) acc[m][0] = acc[m][1] = _mm256_setzero_si256(); \
    for (long q = 0; q < K / 4; q++) { \
        __m256i w0 = _mm256_loadu_si256((const __m256i *)(wb + 64 * q)); \
        __m256i w1 = _mm256_loadu_si256((const __m256i *)(wb + 64 * q + 32)); \
        __m256i u0 = _mm256_abs_epi8(w0), u1 = _mm256_abs_epi8(w1); \
        for (int m = 0; m < MR; m++) { \
            int32_t v; \
            memcpy(&v, a + m * K + 4 * q, 4); \
            __m256i av = _mm256_set1_epi32(v); \
            acc[m][0] = _mm256_add_epi32(acc[m][0], _mm256_madd_epi16(_mm256_maddubs_epi16(u0, _mm256_sign_epi8(av, w0)), ones)); \
            acc[m][1] = _mm256_add_epi32(acc[m][1], _mm256_madd_epi16(_mm256_maddubs_epi16(u1, _mm256_sign_epi8(av, w1)), ones)); \
        } \
    } \
    for (int m = 0; m < MR && m < rows; m++) { \
        _mm256_storeu_si256((__m256i *)(y + m * N), acc[m][0]); \
        _mm256_storeu_si256((__m256i *)(y + m * N + 8), acc[m][1]); \
    } \
}
V2TILE(1) V2TILE(2) V2TILE(4)

/* Rows go 4 at a time (the last one, two or three padded to 1, 2 or 4 with a = 0), each block of
   16 weight rows (in L1 for the next four) in turn; blocks shared by the threads. */
static AVX2D int i8mm_vnni_256(const int8_t *a, const int8_t *w, int32_t *y, long M, long N, long K, int threads) {
    if (has_min8(a, M * K)) return -4;
    long mpad = (M + 3) / 4 * 4;
    int8_t *ap = calloc((size_t)(mpad * K + 64), 1);
    if (!ap) return -1;
    memcpy(ap, a, (size_t)(M * K));
    long blocks = N / 16;
    #pragma omp parallel for num_threads(threads) schedule(static) if (blocks * K * (M < 4 ? 4 : M) >= 65536)
    for (long b = 0; b < blocks; b++)
        for (long m0 = 0; m0 < M; m0 += 4) {
            long left = M - m0;
            const int8_t *am = ap + m0 * K, *wb = w + b * 16 * K;
            int32_t *yb = y + m0 * N + b * 16;
            if (left >= 3) v2tile_4(am, K, wb, yb, N, left);
            else if (left == 2) v2tile_2(am, K, wb, yb, N, left);
            else v2tile_1(am, K, wb, yb, N, left);
        }
    for (long n = blocks * 16; n < N; n++) /* the last N % 16 rows, row-major */
        for (long m = 0; m < M; m++) y[m * N + n] = dot1(a + m * K, w + n * K, K);
    free(ap);
    return 0;
}

/* The int8 products (int_mm): the AVX-512 VNNI kernels, else the AVX2 ones (-4: an activation of
   -128, see above), else -3. */
int tunix_i8mm(const int8_t *a, const int8_t *w, const int32_t *wsum, int32_t *y, long M, long N, long K, int threads) {
    switch (tunix_decode_isa()) {
    case 2: return i8mm_512(a, w, wsum, y, M, N, K, threads);
    case 1: return i8mm_256(a, w, y, M, N, K, threads);
    default: return -3;
    }
}

int tunix_i8mm_vnni(const int8_t *a, const int8_t *w, const int32_t *wsum, int32_t *y, long M, long N, long K,
                    int threads) {
    switch (tunix_decode_isa()) {
    case 2: return i8mm_vnni_512(a, w, wsum, y, M, N, K, threads);
    case 1: return i8mm_vnni_256(a, w, y, M, N, K, threads);
    default: return -3;
    }
}

/* `packed`: 0 row-major, 1 panels (`pack_rows`), 2 the broadcast layout (`pack_vnni`, read by
   the AVX2 kernel on either instruction set). */
int tunix_qlinear(const float *x, const int8_t *w, const int32_t *wsum, const float *wscale,
                  float *y, long M, long N, long K, int threads, int packed) {
    if (packed == 2) return tunix_decode_isa() > 0 ? qlinear_256b(x, w, wscale, y, M, N, K, threads) : -3;
    switch (tunix_decode_isa()) {
    case 2: return qlinear_512(x, w, wsum, wscale, y, M, N, K, threads, packed);
    case 1: return qlinear_256(x, w, wsum, wscale, y, M, N, K, threads, packed);
    default: return -3;
    }
}

int tunix_q4linear(const float *x, const uint8_t *w, const uint16_t *sm, float *y, long M, long N, long K, int threads) {
    switch (tunix_decode_isa()) {
    case 2: return q4linear_512(x, w, sm, y, M, N, K, threads);
    case 1: return q4linear_256(x, w, sm, y, M, N, K, threads);
    default: return -3;
    }
}

int tunix_gemma_layers(float *x, long B, long D, long L, const int64_t *p, const long *F,
                       float *const *kc, float *const *vc, long T, long cur, const long *lo,
                       const float *mask, const float *const *cos, const float *const *sin,
                       long H, long KV, long hd, float scaling, float softcap, float eps, int threads,
                       int packed, int fmt) {
    switch (tunix_decode_isa()) {
    case 2: return gemma_layers_512(x, B, D, L, p, F, kc, vc, T, cur, lo, mask, cos, sin, H, KV, hd, scaling,
                                    softcap, eps, threads, packed, fmt);
    case 1: return gemma_layers_256(x, B, D, L, p, F, kc, vc, T, cur, lo, mask, cos, sin, H, KV, hd, scaling,
                                    softcap, eps, threads, packed, fmt);
    default: return -3;
    }
}
"""

_LAYER = r"""
static @T@ void rms_@S@(const float *x, const float *w, float *out, long n, float eps) {
    float r = 1.0f / sqrtf(dotf_@S@(x, x, n) / (float)n + eps);
    for (long i = 0; i < n; i++) out[i] = (x[i] * r) * w[i];
}

static @T@ void rope_@S@(float *v, const float *cos, const float *sin, long hd, float *tmp) {
    long half = hd / 2;
    for (long i = 0; i < hd; i++) tmp[i] = v[i];
    for (long i = 0; i < hd; i++) {
        float rot = i < half ? -tmp[i + half] : tmp[i - half];
        v[i] = tmp[i] * cos[i] + rot * sin[i];
    }
}

/* One projection of a layer: fmt 0, int8 (w, its row sums, its scales: tunix_qlinear; `packed` as
   there); fmt 1,
   int4 (w the pack4 codes, s the pack_scales4 fp16 scales and mins, c unused: tunix_q4linear). */
static @T@ int proj_@S@(int fmt, const float *x, const void *w, const void *s, const float *c, float *y,
                       long M, long N, long K, int threads, int packed) {
    if (fmt == 1) return q4linear_@S@(x, (const uint8_t *)w, (const uint16_t *)s, y, M, N, K, threads);
    if (packed == 2) return qlinear_256b(x, (const int8_t *)w, c, y, M, N, K, threads); /* pack_vnni's layout */
    return qlinear_@S@(x, (const int8_t *)w, (const int32_t *)s, c, y, M, N, K, threads, packed);
}

static @T@ int gemma_layer_@S@(
        float *x, long B, long D,
        const float *in_norm, const float *post_attn_norm, const float *pre_ff_norm, const float *post_ff_norm,
        const float *q_norm, const float *k_norm,
        const int8_t *wqkv, const int32_t *sqkv, const float *cqkv,
        const int8_t *wo, const int32_t *so, const float *co,
        const int8_t *wgu, const int32_t *sgu, const float *cgu,
        const int8_t *wd, const int32_t *sd, const float *cd,
        long H, long KV, long hd, long F,
        float *kc, float *vc, long T, long cur, long lo, const float *mask,
        const float *cos, const float *sin, float scaling, float softcap, float eps, int threads, int packed,
        int fmt) {
    long nqkv = (H + 2 * KV) * hd, rep = H / KV, span = cur + 1 - lo;
    float *h = malloc(sizeof(float) * (size_t)(B * D));
    float *qkv = malloc(sizeof(float) * (size_t)(B * nqkv));
    float *attn = malloc(sizeof(float) * (size_t)(B * H * hd));
    float *big = malloc(sizeof(float) * (size_t)(B * 2 * F));
    float *m = malloc(sizeof(float) * (size_t)(B * F));
    float *scores = malloc(sizeof(float) * (size_t)(B * H * (span > 0 ? span : 1)));
    float *tmp = malloc(sizeof(float) * (size_t)(hd > D ? hd : D));
    int rc = -1;
    if (!h || !qkv || !attn || !big || !m || !scores || !tmp) goto done;
    for (long b = 0; b < B; b++) rms_@S@(x + b * D, in_norm, h + b * D, D, eps);
    if (proj_@S@(fmt, h, wqkv, sqkv, cqkv, qkv, B, nqkv, D, threads, packed)) goto done;
    for (long b = 0; b < B; b++) {
        float *q = qkv + b * nqkv, *k = q + H * hd, *v = k + KV * hd;
        for (long j = 0; j < H; j++) {
            if (q_norm) { rms_@S@(q + j * hd, q_norm, tmp, hd, eps); for (long i = 0; i < hd; i++) q[j * hd + i] = tmp[i]; }
            rope_@S@(q + j * hd, cos + b * hd, sin + b * hd, hd, tmp);
        }
        for (long j = 0; j < KV; j++) {
            if (k_norm) { rms_@S@(k + j * hd, k_norm, tmp, hd, eps); for (long i = 0; i < hd; i++) k[j * hd + i] = tmp[i]; }
            rope_@S@(k + j * hd, cos + b * hd, sin + b * hd, hd, tmp);
            float *kd = kc + ((b * KV + j) * T + cur) * hd, *vd = vc + ((b * KV + j) * T + cur) * hd;
            for (long i = 0; i < hd; i++) { kd[i] = k[j * hd + i]; vd[i] = v[j * hd + i]; }
        }
    }
    #pragma omp parallel for num_threads(threads) schedule(static) collapse(2) if (B * H * span * hd >= 65536)
    for (long b = 0; b < B; b++)
        for (long j = 0; j < H; j++) {
            const float *q = qkv + b * nqkv + j * hd;
            long g = j / rep;
            const float *keys = kc + (b * KV + g) * T * hd, *vals = vc + (b * KV + g) * T * hd;
            float *sc = scores + (b * H + j) * span, top = -INFINITY;
            for (long t = 0; t < span; t++) {
                const float *kt = keys + (lo + t) * hd;
                float s = dotf_@S@(q, kt, hd) * scaling;
                if (softcap > 0.0f) s = tanhf(s / softcap) * softcap;
                s += mask[b * T + lo + t];
                sc[t] = s;
                top = s > top ? s : top;
            }
            double total = 0.0;
            for (long t = 0; t < span; t++) { sc[t] = expf(sc[t] - top); total += sc[t]; }
            float inv = (float)(1.0 / total);
            float *out = attn + (b * H + j) * hd;
            for (long i = 0; i < hd; i++) out[i] = 0.0f;
            for (long t = 0; t < span; t++) {
                float p = sc[t] * inv;
                const float *vt = vals + (lo + t) * hd;
                for (long i = 0; i < hd; i++) out[i] += p * vt[i];
            }
        }
    if (proj_@S@(fmt, attn, wo, so, co, h, B, D, H * hd, threads, packed)) goto done;
    for (long b = 0; b < B; b++) {
        rms_@S@(h + b * D, post_attn_norm, tmp, D, eps);
        for (long i = 0; i < D; i++) x[b * D + i] += tmp[i];
        rms_@S@(x + b * D, pre_ff_norm, h + b * D, D, eps);
    }
    if (proj_@S@(fmt, h, wgu, sgu, cgu, big, B, 2 * F, D, threads, packed)) goto done;
    for (long b = 0; b < B; b++) gelu_mul_@S@(big + b * 2 * F, big + b * 2 * F + F, m + b * F, F);
    if (proj_@S@(fmt, m, wd, sd, cd, h, B, D, F, threads, packed)) goto done;
    for (long b = 0; b < B; b++) {
        rms_@S@(h + b * D, post_ff_norm, tmp, D, eps);
        for (long i = 0; i < D; i++) x[b * D + i] += tmp[i];
    }
    rc = 0;
done:
    free(h); free(qkv); free(attn); free(big); free(m); free(scores); free(tmp);
    return rc;
}

/* Every decoder layer of a decode step in one call (int8_weights.Int8Gemma): layer i is
   tunix_gemma_layer with its 18 weight and norm pointers at p[18 i ..] (0 for none), its MLP width
   F[i], its cache buffers kc[i] and vc[i], its window's first entry lo[i] and its RoPE table rows
   cos[i] and sin[i]. One ctypes call instead of 18 of ~45 arguments each took ~0.1 ms off a
   single-stream step of Gemma 3 270M (the empty calls alone cost ~7 us each). */
static @T@ int gemma_layers_@S@(float *x, long B, long D, long L, const int64_t *p, const long *F,
                              float *const *kc, float *const *vc, long T, long cur, const long *lo,
                              const float *mask, const float *const *cos, const float *const *sin,
                              long H, long KV, long hd, float scaling, float softcap, float eps, int threads,
                              int packed, int fmt) {
    for (long i = 0; i < L; i++) {
        const int64_t *q = p + 18 * i;
        int rc = gemma_layer_@S@(x, B, D, (const float *)q[0], (const float *)q[1], (const float *)q[2],
                                   (const float *)q[3], (const float *)q[4], (const float *)q[5],
                                   (const int8_t *)q[6], (const int32_t *)q[7], (const float *)q[8],
                                   (const int8_t *)q[9], (const int32_t *)q[10], (const float *)q[11],
                                   (const int8_t *)q[12], (const int32_t *)q[13], (const float *)q[14],
                                   (const int8_t *)q[15], (const int32_t *)q[16], (const float *)q[17],
                                   H, KV, hd, F[i], kc[i], vc[i], T, cur, lo[i], mask, cos[i], sin[i],
                                   scaling, softcap, eps, threads, packed, fmt);
        if (rc) return rc;
    }
    return 0;
}

"""
"""The decoder layer's code, written once and built per instruction set: @T@ the target
attribute, @S@ the suffix of its helpers (dotf, gelu_mul, qlinear, q4linear)."""

_SIMD = r"""
/* a . b in fp32, @W@ lanes at a time, two accumulators (a plain float loop would not vectorise:
   its sum order is fixed without -ffast-math; the widths sum in different orders, so the
   layers are bit-equal neither across instruction sets nor to the torch ops) */
static inline @T@ float dotf_@S@(const float *a, const float *b, long n) {
    @V@ acc0 = @P@_setzero_ps(), acc1 = @P@_setzero_ps();
    long i = 0;
    for (; i + 2 * @W@ <= n; i += 2 * @W@) {
        acc0 = @P@_add_ps(acc0, @P@_mul_ps(@P@_loadu_ps(a + i), @P@_loadu_ps(b + i)));
        acc1 = @P@_add_ps(acc1, @P@_mul_ps(@P@_loadu_ps(a + i + @W@), @P@_loadu_ps(b + i + @W@)));
    }
    for (; i + @W@ <= n; i += @W@)
        acc0 = @P@_add_ps(acc0, @P@_mul_ps(@P@_loadu_ps(a + i), @P@_loadu_ps(b + i)));
    float s = HSUM_@S@(@P@_add_ps(acc0, acc1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* e^x, @W@ lanes (Cephes' expf: x = k ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial, then
   y * 2^k; relative error ~1e-7; x clamped to +-88.38) */
static inline @T@ @V@ exp_@S@(@V@ x) {
    x = @P@_max_ps(@P@_min_ps(x, @P@_set1_ps(88.3762626647949f)), @P@_set1_ps(-88.3762626647949f));
    @V@ k = ROUND_@S@(@P@_mul_ps(x, @P@_set1_ps(1.44269504088896341f)));
    x = @P@_sub_ps(x, @P@_mul_ps(k, @P@_set1_ps(0.693359375f)));
    x = @P@_sub_ps(x, @P@_mul_ps(k, @P@_set1_ps(-2.12194440e-4f)));
    @V@ y = @P@_set1_ps(1.9875691500e-4f);
    y = @P@_add_ps(@P@_mul_ps(y, x), @P@_set1_ps(1.3981999507e-3f));
    y = @P@_add_ps(@P@_mul_ps(y, x), @P@_set1_ps(8.3334519073e-3f));
    y = @P@_add_ps(@P@_mul_ps(y, x), @P@_set1_ps(4.1665795894e-2f));
    y = @P@_add_ps(@P@_mul_ps(y, x), @P@_set1_ps(1.6666665459e-1f));
    y = @P@_add_ps(@P@_mul_ps(y, x), @P@_set1_ps(5.0000001201e-1f));
    y = @P@_add_ps(@P@_add_ps(@P@_mul_ps(@P@_mul_ps(y, x), x), x), @P@_set1_ps(1.0f));
    return SCALE2_@S@(y, k);
}

/* out[i] = gelu_tanh(g[i]) * u[i]; gelu_tanh(x) = 0.5 x (1 + tanh(c (x + 0.044715 x^3)))
   = x / (1 + e^(-2 c (x + 0.044715 x^3))), c = sqrt(2 / pi) */
static @T@ void gelu_mul_@S@(const float *g, const float *u, float *out, long n) {
    long i = 0;
    const @V@ c2 = @P@_set1_ps(-2.0f * 0.7978845608028654f), a = @P@_set1_ps(0.044715f);
    const @V@ one = @P@_set1_ps(1.0f);
    for (; i + @W@ <= n; i += @W@) {
        @V@ x = @P@_loadu_ps(g + i);
        @V@ inner = @P@_add_ps(x, @P@_mul_ps(a, @P@_mul_ps(x, @P@_mul_ps(x, x))));
        @V@ gl = @P@_div_ps(x, @P@_add_ps(one, exp_@S@(@P@_mul_ps(c2, inner))));
        @P@_storeu_ps(out + i, @P@_mul_ps(gl, @P@_loadu_ps(u + i)));
    }
    for (; i < n; i++) {
        float x = g[i];
        out[i] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))) * u[i];
    }
}
"""
"""fp32 helpers of the decoder layer, written once and built per vector width: @T@ the target
attribute, @S@ the suffix, @W@ the lanes, @V@ the vector type, @P@ the intrinsics' prefix (each
width defines ROUND_, SCALE2_ and HSUM_ for its suffix)."""


def _simd(target: str, sfx: str, lanes: int) -> str:
    vec, pre = ("__m512", "_mm512") if lanes == 16 else ("__m256", "_mm256")
    return (_SIMD.replace("@T@", target).replace("@S@", sfx).replace("@W@", str(lanes)).replace("@V@", vec)
            .replace("@P@", pre))


_AVX2_DECODE = _AVX2_DECODE.replace("@SIMD256@", _simd("AVX2D", "256", 8))
SOURCE = SOURCE.replace("@SIMD512@", _simd("KERNEL", "512", 16))
SOURCE = SOURCE.replace("@AVX2_DECODE@", _AVX2_DECODE).replace(
    "@LAYERS@", "".join(_LAYER.replace("@T@", t).replace("@S@", sfx) for t, sfx in (("KERNEL", "512"), ("AVX2D", "256"))))

_LOCK = threading.Lock()
_LIB: list = []  # [] not tried yet; [None] unavailable; [lib] loaded
WHY: list[str] = []
"""Why the kernel is not used in this process (empty while it is, or before the first use)."""


def _cache_dir() -> Path:
    env = os.environ.get("TUNIX_RT_KERNEL_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tunix-rt" / "kernels"


FLAGS = ["-O3", "-fno-fast-math", "-ffp-contract=off", "-fPIC", "-shared", "-fopenmp"]
"""No fused multiply-adds and no fast-math reassociation: `qlinear` gives the torch ops' bits."""


def _compiler() -> list[str]:
    return [os.environ.get("CC", "cc"), *FLAGS]


def compiled(stem: str, source: str, cmd: list[str]):
    """The C `source` built by `cmd` (the compiler and its flags) into the cache directory as
    `<stem>-<hash>.so` on first use (named by the source's and the command's hash: a new
    compiler or flag, a new build), loaded with ctypes. Raises OSError or SubprocessError
    where it cannot be built or loaded."""
    digest = hashlib.sha256("\0".join([source, *cmd]).encode()).hexdigest()[:16]
    path = _cache_dir() / f"{stem}-{digest}.so"
    if not path.exists():
        _build(path, source, cmd)
    return ctypes.CDLL(str(path))


def _build(path: Path, source: str, cmd: list[str]) -> None:
    """Compile `source` into `path`, atomically (a concurrent build of the same source writes the
    same file; whichever rename lands last wins, and both are complete)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".build-") as tmp:
        src = Path(tmp) / (path.name.split("-")[0] + ".c")
        src.write_text(source)
        out = Path(tmp) / path.name
        full = cmd + ["-o", str(out), str(src), "-lm"]
        done = subprocess.run(full, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise OSError(f"{' '.join(full)} failed: {done.stderr.strip()[-500:]}")
        os.replace(out, path)


def _loaded():
    """The built library (ctypes) whatever the CPU, or None (`WHY` says why)."""
    if _LIB:
        return _LIB[0]
    with _LOCK:
        if _LIB:
            return _LIB[0]
        _LIB.append(_load())
        return _LIB[0]


ISAS = ("none", "avx2", "avx512")
"""The decode kernels' instruction sets (`decode_isa`), in the library's numbering."""
ISA_ENV = "TUNIX_RT_KERNEL_ISA"
"""`avx2` runs the AVX2 decode kernels on an AVX-512 CPU too (`none`: no decode kernel)."""


def decode_library():
    """The loaded library for the decode kernels (`qlinear`, `q4linear`, the decoder layers),
    or None where none runs here: no library, or a CPU with neither AVX-512 VNNI nor AVX2 with
    FMA and F16C (`decode_isa` says which)."""
    lib = _loaded()
    return lib if lib is not None and lib.decode_isa > 0 else None


def decode_isa() -> str:
    """Which decode kernels run here: "avx512", "avx2" or "none" (`ISAS`)."""
    lib = _loaded()
    return ISAS[lib.decode_isa] if lib is not None else "none"


def set_isa(isa: str) -> str:
    """Run the decode kernels of `isa` (one of ISAS; at most what the CPU has) in this
    process, as TUNIX_RT_KERNEL_ISA does at load: the tests run the AVX2 kernels on an AVX-512
    CPU so. Returns the one now in use."""
    if isa not in ISAS:
        raise ValueError(f"isa must be one of {'|'.join(ISAS)}, got {isa!r}")
    lib = _loaded()
    if lib is None:
        return "none"
    lib.decode_isa = int(lib.tunix_set_isa(ISAS.index(isa)))
    return ISAS[lib.decode_isa]


def library():
    """The loaded kernel (ctypes) for its int8 products (`int_mm`), or None where it does not
    apply: no library, or a CPU with neither AVX-512 VNNI nor AVX2 (`decode_isa`; `WHY` says
    why)."""
    return decode_library()


def f32_library():
    """The loaded library for its fp32 products (`f32_linear`, `f32_rows`), or None where it
    does not apply: no library, or a CPU with neither AVX-512 (the int8 kernel's) nor AVX2 with
    FMA. Both paths give the same bits (see SOURCE)."""
    lib = _loaded()
    return lib if lib is not None and lib.f32_path else None


def _load():
    import torch  # noqa: F401  (its OpenMP runtime is loaded first: the kernel shares it)

    if os.environ.get("TUNIX_RT_INT8_KERNEL", "vnni") == "torch":
        WHY.append("TUNIX_RT_INT8_KERNEL=torch")
        return None
    try:
        lib = compiled("int8_mm", SOURCE, _compiler())
    except (OSError, subprocess.SubprocessError) as e:
        WHY.append(f"no kernel: {e}")
        return None
    lib.i8_ok = bool(lib.tunix_i8mm_supported())
    lib.f32_path = int(lib.tunix_f32_supported())
    lib.tunix_decode_isa.restype = ctypes.c_int
    lib.tunix_set_isa.restype = ctypes.c_int
    lib.tunix_set_isa.argtypes = [ctypes.c_int]
    want = os.environ.get(ISA_ENV, "")
    if want:
        if want not in ISAS:
            raise ValueError(f"{ISA_ENV} must be one of {'|'.join(ISAS)}, got {want!r}")
        lib.tunix_set_isa(ISAS.index(want))
    lib.decode_isa = int(lib.tunix_decode_isa())
    if not lib.decode_isa:
        WHY.append("the CPU has neither AVX-512 VNNI nor AVX2 with FMA and F16C")
    lib.tunix_i8mm.restype = ctypes.c_int
    lib.tunix_i8mm.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3 + [ctypes.c_int]
    lib.tunix_i8mm_vnni.restype = ctypes.c_int
    lib.tunix_i8mm_vnni.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3 + [ctypes.c_int]
    lib.tunix_qlinear.restype = ctypes.c_int
    lib.tunix_qlinear.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_long] * 3 + [ctypes.c_int] * 2
    lib.tunix_q4linear.restype = ctypes.c_int
    lib.tunix_q4linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3 + [ctypes.c_int]
    lib.tunix_gemma_layers.restype = ctypes.c_int
    lib.tunix_gemma_layers.argtypes = ([ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_long] + [ctypes.c_void_p] * 4
                                       + [ctypes.c_long] * 2 + [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3
                                       + [ctypes.c_float] * 3 + [ctypes.c_int] * 3)
    lib.tunix_f32_rows.restype = ctypes.c_int
    lib.tunix_f32_rows.argtypes = ([ctypes.c_void_p] * 3 + [ctypes.c_long] + [ctypes.c_void_p] * 2
                                   + [ctypes.c_float, ctypes.c_long, ctypes.c_void_p] + [ctypes.c_long] * 2
                                   + [ctypes.c_int])
    lib.tunix_noise_bits.restype = None
    lib.tunix_noise_bits.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_long,
                                     ctypes.c_void_p, ctypes.c_long, ctypes.c_long]
    lib.tunix_noise_screen.restype = ctypes.c_long
    lib.tunix_noise_screen.argtypes = ([ctypes.c_void_p, ctypes.c_long] + [ctypes.c_void_p] * 4
                                       + [ctypes.c_long, ctypes.c_void_p, ctypes.c_long, ctypes.c_int])
    lib.tunix_noise_screen_comb.restype = ctypes.c_long
    lib.tunix_noise_screen_comb.argtypes = ([ctypes.c_void_p, ctypes.c_long] + [ctypes.c_void_p] * 2
                                            + [ctypes.c_long] * 2 + [ctypes.c_void_p] * 2 + [ctypes.c_double]
                                            + [ctypes.c_void_p] * 3 + [ctypes.c_long, ctypes.c_int])
    lib.noise_ok = lib.i8_ok and bool(lib.tunix_noise_supported())
    lib.tunix_argmax_rows.restype = None
    lib.tunix_argmax_rows.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
                                      ctypes.c_int]
    return lib


def argmax(logits: "torch.Tensor") -> "torch.Tensor":
    """`logits.argmax(dim=-1)` for [B, V] logits (the decode step's greedy pick): the same
    indices (the first NaN of a row, else the first entry equal to its maximum), through the
    kernel library where it loaded and the logits are CPU fp32 with unit stride along a row;
    torch's reduction otherwise. torch's took ~320 us for Gemma 3's [1, 262144] row on a 2-core
    Xeon, the kernel's ~20."""
    import torch

    lib = _loaded()
    if (lib is None or logits.dim() != 2 or logits.dtype != torch.float32 or logits.device.type != "cpu"
            or logits.stride(1) != 1 or logits.shape[1] == 0):
        return logits.argmax(dim=-1)
    rows, n = logits.shape
    out = torch.empty(rows, dtype=torch.int64)
    if rows:
        lib.tunix_argmax_rows(logits.data_ptr(), rows, n, logits.stride(0), out.data_ptr(), torch.get_num_threads())
    return out


def noise_bits(seed: "torch.Tensor", off: "torch.Tensor", bits: "torch.Tensor") -> bool:
    """bits [r, n] (int64) := the noise's bits for seeds [r] and offsets [n] or [r, n], as
    tunix_rt.eval.sampling's numpy path computes them (integer operations: the same bits),
    through the kernel: about 6x faster than numpy's ten passes. False (nothing written) where
    the kernel does not apply: no library, no AVX-512DQ, or operands not CPU int64 with unit
    stride along a row."""
    import torch

    lib = library()
    r, n = bits.shape
    if lib is None or not lib.noise_ok or r == 0 or n == 0:
        return False
    two_d = off.dim() == 2
    if (any(t.device.type != "cpu" or t.dtype != torch.int64 for t in (seed, off, bits))
            or seed.shape != (r,) or seed.stride(0) != 1 or off.shape[-1] != n or off.stride(-1) != 1
            or (two_d and off.shape[0] != r) or bits.stride(1) != 1):
        return False
    lib.tunix_noise_bits(seed.data_ptr(), r, off.data_ptr(), off.stride(0) if two_d else 0,
                         bits.data_ptr(), bits.stride(0), n)
    return True


def noise_screen(seed: "torch.Tensor", off: "torch.Tensor", sc: "torch.Tensor", thr: "torch.Tensor",
                 bits: "torch.Tensor", cap: int) -> "torch.Tensor | None":
    """bits [r, n] := noise_bits', and the flat indices r * n + i (int64, ascending) of the
    entries whose sc[r, i] (fp64) plus an upper bound on their noise reaches thr[r] (fp64 [r]):
    the bound-first draw's candidates (see the C source). None where there are more than `cap`
    (bits then written), and where the kernel does not apply (nothing written): no library, or
    operands not contiguous CPU tensors of those types. Vectorised with AVX-512DQ/CD where the
    int8 kernel runs, one entry at a time on any other x86-64 CPU (the same entries and bits)."""
    import torch

    lib = _loaded()
    r, n = bits.shape
    if lib is None or r == 0 or n == 0:
        return None
    want = ((seed, (r,), torch.int64), (off, (n,), torch.int64), (sc, (r, n), torch.float64),
            (thr, (r,), torch.float64), (bits, (r, n), torch.int64))
    if any(t.device.type != "cpu" or t.dtype != dt or tuple(t.shape) != shape or not t.is_contiguous()
           for t, shape, dt in want):
        return None
    pos = torch.empty(max(0, int(cap)), dtype=torch.int64)
    got = lib.tunix_noise_screen(seed.data_ptr(), r, off.data_ptr(), sc.data_ptr(), thr.data_ptr(),
                                 bits.data_ptr(), n, pos.data_ptr(), pos.numel(), torch.get_num_threads())
    if got == -2:
        raise MemoryError("noise screen: out of memory")
    return None if got < 0 else pos[:got]


def noise_screen_comb(seed: "torch.Tensor", off: "torch.Tensor", comb: "torch.Tensor", step: "torch.Tensor",
                      width: "torch.Tensor", t: float, thr: "torch.Tensor", bits: "torch.Tensor",
                      cap: int) -> "torch.Tensor | None":
    """noise_screen with sc = (comb * step + width) / t made on the fly from the screen's int32
    comb [r, groups, per] and per group step and width [r, groups] (fp64): no fp64 copy of the
    scores. bits [r, groups * per]. The same returns."""
    import torch

    lib = library()
    if lib is None or not lib.noise_ok or comb.dim() != 3 or comb.numel() == 0:
        return None
    r, groups, per = comb.shape
    want = ((seed, (r,), torch.int64), (off, (groups * per,), torch.int64), (comb, (r, groups, per), torch.int32),
            (step, (r, groups), torch.float64), (width, (r, groups), torch.float64), (thr, (r,), torch.float64),
            (bits, (r, groups * per), torch.int64))
    if any(x.device.type != "cpu" or x.dtype != dt or tuple(x.shape) != shape or not x.is_contiguous()
           for x, shape, dt in want):
        return None
    pos = torch.empty(max(0, int(cap)), dtype=torch.int64)
    got = lib.tunix_noise_screen_comb(seed.data_ptr(), r, off.data_ptr(), comb.data_ptr(), groups, per,
                                      step.data_ptr(), width.data_ptr(), float(t), thr.data_ptr(), bits.data_ptr(),
                                      pos.data_ptr(), pos.numel(), torch.get_num_threads())
    if got == -2:
        raise MemoryError("noise screen: out of memory")
    return None if got < 0 else pos[:got]


SUM_ROWS = 4096
"""Rows summed at a time by `row_sums` (a sum with dtype=int32 widens its input first: the whole
of Gemma 3's int8 head at once would be a 671 MB temporary)."""


def row_sums(w: "torch.Tensor") -> "torch.Tensor":
    """Σ_k w[n, k] as int32 [N]: what the kernel needs with a weight (compute it once per
    weight), a block of rows at a time."""
    import torch

    out = torch.empty(w.shape[0], dtype=torch.int32, device=w.device)
    for i in range(0, w.shape[0], SUM_ROWS):
        torch.sum(w[i: i + SUM_ROWS], dim=1, dtype=torch.int32, out=out[i: i + SUM_ROWS])
    return out


def _takes(x: "torch.Tensor", w: "torch.Tensor", dtype, lib) -> bool:
    """x [M, K] of `dtype` and int8 w [N, K], both contiguous on the CPU, K a multiple of 64
    (below MAX_K), and `lib` (the kernel for it) loaded."""
    import torch

    k = w.shape[-1]
    return (x.device.type == "cpu" and w.device.type == "cpu" and x.dtype == dtype and w.dtype == torch.int8
            and x.dim() == 2 and w.dim() == 2 and x.shape[1] == k and k % ALIGN_K == 0 and k < MAX_K
            and x.is_contiguous() and w.is_contiguous() and lib is not None)


def serves(k: int) -> bool:
    """Whether `int_mm` of contiguous int8 operands with inner dimension k runs on the kernel
    here: its sums are then exact by construction (vpdpbusd does not saturate, and k < MAX_K
    keeps every partial sum in int32), so no shape needs a probe (screened_head)."""
    return k % ALIGN_K == 0 and k < MAX_K and library() is not None


def applies(lhs: "torch.Tensor", w: "torch.Tensor") -> bool:
    """Whether `int_mm(lhs, w)` runs on the kernel here (else torch._int_mm)."""
    import torch

    return _takes(lhs, w, torch.int8, library())


def _sums(w: "torch.Tensor", wsum: "torch.Tensor | None") -> "torch.Tensor":
    import torch

    if wsum is None:
        return row_sums(w)
    if wsum.dtype != torch.int32 or wsum.shape != (w.shape[0],) or not wsum.is_contiguous():
        raise ValueError(f"wsum must be int32 [{w.shape[0]}] and contiguous (row_sums(w))")
    return wsum


def int_mm(lhs: "torch.Tensor", w: "torch.Tensor", wsum: "torch.Tensor | None" = None,
           vnni: bool = False) -> "torch.Tensor":
    """lhs int8 [M, K] @ w int8 [N, K].T -> int32 [M, N], exact: the same numbers as
    `torch._int_mm(lhs, w.t())`. `wsum`: `row_sums(w)` of the row-major weight, if the caller
    keeps it. `vnni`: w is in `pack_vnni`'s layout (where the kernel does not run, it is
    unpacked for torch: the same numbers, slower)."""
    import torch

    if not applies(lhs, w):
        return torch._int_mm(lhs, (unpack_vnni(w) if vnni else w).t())
    if vnni and wsum is None:
        wsum = row_sums(unpack_vnni(w))
    wsum = _sums(w, wsum)
    m, n = lhs.shape[0], w.shape[0]
    out = torch.empty((m, n), dtype=torch.int32)
    call = library().tunix_i8mm_vnni if vnni else library().tunix_i8mm
    rc = call(lhs.data_ptr(), w.data_ptr(), wsum.data_ptr(), out.data_ptr(), m, n, w.shape[1],
              torch.get_num_threads()) if m and n else 0
    if rc == -4:  # an activation of -128 on the AVX2 kernels (SOURCE): the same sums in fp64, exact
        rows = unpack_vnni(w) if vnni else w
        return (lhs.double() @ rows.double().t()).to(torch.int32)
    if rc != 0:
        raise MemoryError("int8 kernel: out of memory")
    return out


def pack_vnni(w: "torch.Tensor") -> "torch.Tensor":
    """int8 w [N, K] (K a multiple of 4) as `int_mm(..., vnni=True)` reads it: each whole block
    of 16 rows as K / 4 vectors of 64 bytes, vector q holding bytes 4q..4q+3 of the block's rows
    in row order, so one VNNI instruction adds four products to each of 16 outputs (no
    horizontal sums: the screened head's [16, 640] x [640, 262144] product at 2 levels x 8 rows
    ran ~2x faster than row-major). The last N % 16 rows stay row-major after the blocks. The
    same shape and bytes in another order (a new tensor); `unpack_vnni` undoes it."""
    return pack_vnni_(w.contiguous().clone())


PACK_ROWS = 16384
"""`pack_vnni_` reorders this many rows at a time (a multiple of 16): its only temporary."""


def pack_vnni_(w: "torch.Tensor") -> "torch.Tensor":
    """`pack_vnni` in place on a contiguous w (returned): a block of PACK_ROWS rows at a time,
    so no second copy of a large weight exists at any moment (the screened head's 168 MB)."""
    n, k = w.shape
    if not w.is_contiguous() or k % 4:
        raise ValueError("pack_vnni_ takes a contiguous int8 [N, K] with K a multiple of 4")
    whole = n // 16 * 16
    for i in range(0, whole, PACK_ROWS):
        part = w[i: min(i + PACK_ROWS, whole)]
        part.copy_(part.reshape(-1, 16, k // 4, 4).transpose(1, 2).reshape(part.shape))
    return w


def unpack_vnni(w: "torch.Tensor") -> "torch.Tensor":
    """`pack_vnni`'s inverse: the row-major [N, K] weight."""
    import torch

    n, k = w.shape
    whole = n // 16 * 16
    rows = w[:whole].reshape(n // 16, k // 4, 16, 4).transpose(1, 2).reshape(whole, k)
    return torch.cat([rows, w[whole:]]).contiguous()


def qlinear_applies(x: "torch.Tensor", w: "torch.Tensor") -> bool:
    """Whether `qlinear(x, w, ...)` runs on the kernel here."""
    import torch

    return _takes(x, w, torch.float32, decode_library())


def panel_layout() -> str:
    """The layout decoding keeps int8 weights in where the kernels run (QuantLinear.as_panels):
    "vnni" (`pack_vnni`) where the AVX2 kernels decode, else "rows" (`pack_rows`' panels)."""
    return "vnni" if decode_isa() == "avx2" else "rows"


def pack_rows(w: "torch.Tensor") -> "torch.Tensor":
    """int8 w [N, K] (K a multiple of 64) as `qlinear(..., packed=True)` reads it: each whole
    block of 16 rows a panel, its rows' 64-byte pieces interleaved (piece j of row r at byte
    1024 j + 64 r of the block), so the kernel reads the block front to back; the last N % 16
    rows stay row-major after the panels. The same shape and bytes in another order (a new
    tensor); `unpack_rows` undoes it."""
    import torch

    n, k = w.shape
    whole = n // 16 * 16
    panels = w[:whole].reshape(n // 16, 16, k // ALIGN_K, ALIGN_K).transpose(1, 2).reshape(whole, k)
    return torch.cat([panels, w[whole:]]).contiguous()


def unpack_rows(w: "torch.Tensor") -> "torch.Tensor":
    """The row-major [N, K] weight of a `pack_rows` result (a new tensor)."""
    import torch

    n, k = w.shape
    whole = n // 16 * 16
    rows = w[:whole].reshape(n // 16, k // ALIGN_K, 16, ALIGN_K).transpose(1, 2).reshape(whole, k)
    return torch.cat([rows, w[whole:]]).contiguous()


def qlinear(x: "torch.Tensor", w: "torch.Tensor", wsum: "torch.Tensor | None", scale: "torch.Tensor",
            packed: bool = False, vnni: bool = False) -> "torch.Tensor":
    """x fp32 [M, K] @ (scale[:, None] * w).T -> fp32 [M, N] with x taken as two int8 levels,
    in one call: the same bits as tunix_rt.eval.int8_weights's torch path (see SOURCE); the
    caller checks `qlinear_applies` first. `packed`: w is `pack_rows` of the weight (with
    `vnni`, `pack_vnni` of it: the layout the AVX2 kernels read best, `panel_layout`); the same
    numbers out, and `wsum` must be given (row_sums of the weight before packing)."""
    import torch

    if not qlinear_applies(x, w):
        raise ValueError("qlinear takes fp32 x [M, K] and int8 w [N, K], contiguous, K a multiple of 64, "
                         "on a CPU with the kernel (check qlinear_applies)")
    if packed and wsum is None:
        raise ValueError("a packed weight's row sums must be given (row_sums of the weight before packing)")
    wsum = _sums(w, wsum)
    if scale.dtype != torch.float32 or scale.shape != (w.shape[0],) or not scale.is_contiguous():
        raise ValueError(f"scale must be fp32 [{w.shape[0]}] and contiguous")
    m, n = x.shape[0], w.shape[0]
    out = torch.empty((m, n), dtype=torch.float32)
    if m and n and decode_library().tunix_qlinear(x.data_ptr(), w.data_ptr(), wsum.data_ptr(), scale.data_ptr(),
                                         out.data_ptr(), m, n, w.shape[1], torch.get_num_threads(),
                                         (2 if vnni else 1) if packed else 0) != 0:
        raise MemoryError("int8 kernel: out of memory")
    return out


F32_MAX_ROWS = 8
"""`f32_linear` takes up to this many activation rows (a decode step's batch); more go to torch,
whose blocked matmul reads each weight once for all of them."""


def f32_applies(x: "torch.Tensor", w: "torch.Tensor") -> bool:
    """Whether `f32_linear(x, w, ...)` runs on the kernel here: fp32 x [M, K] (1 <= M <= 8) and
    w [N, K], both contiguous on the CPU, and the library loaded."""
    import torch

    return (x.device.type == "cpu" and w.device.type == "cpu" and x.dtype == torch.float32
            and w.dtype == torch.float32 and x.dim() == 2 and w.dim() == 2 and x.shape[1] == w.shape[1]
            and 1 <= x.shape[0] <= F32_MAX_ROWS and x.is_contiguous() and w.is_contiguous()
            and f32_library() is not None)


def f32_linear(x: "torch.Tensor", w: "torch.Tensor", a: "torch.Tensor | None" = None,
               b: "torch.Tensor | None" = None, scale: float = 1.0, out: "torch.Tensor | None" = None) -> "torch.Tensor":
    """x @ w.T in fp32, plus (x @ a.T) @ b.T * scale with a live LoRA adapter (a [r, K], b [N, r]),
    for the few rows of a decode step: each weight row is read once and multiplied by every
    row of x while in cache (torch's fp32 matmul at M = 8 ran at about a third of the bandwidth
    bound here). Not the bits of F.linear (another order of the same sums, see SOURCE), but a
    row's bits do not depend on the other rows of the batch or on the thread count. The caller
    checks `f32_applies` first. `out`: where to write ([M, N] fp32, contiguous), else a new
    tensor (a decode step's head reuses one: fresh pages of 8 MB a step cost more than the
    product's reads of them)."""
    import torch

    if not f32_applies(x, w):
        raise ValueError("f32_linear takes fp32 x [M, K] (1 <= M <= 8) and w [N, K], contiguous, on a CPU with "
                         "the kernel (check f32_applies)")
    n, k = w.shape
    if (a is None) != (b is None):
        raise ValueError("an adapter needs both factors")
    if a is not None:
        r = a.shape[0]
        if (a.dtype != torch.float32 or b.dtype != torch.float32 or a.shape != (r, k) or b.shape != (n, r)
                or not a.is_contiguous() or not b.is_contiguous() or a.device.type != "cpu" or b.device.type != "cpu"):
            raise ValueError(f"adapter factors must be fp32 contiguous a [r, {k}] and b [{n}, r]")
    if out is None:
        out = torch.empty((x.shape[0], n), dtype=torch.float32)
    elif out.shape != (x.shape[0], n) or out.dtype != torch.float32 or not out.is_contiguous() or out.device.type != "cpu":
        raise ValueError(f"out must be fp32 contiguous [{x.shape[0]}, {n}] on the CPU")
    rc = f32_library().tunix_f32_rows(x.data_ptr(), w.data_ptr(), None, n, a.data_ptr() if a is not None else None,
                                  b.data_ptr() if b is not None else None, float(scale),
                                  a.shape[0] if a is not None else 0, out.data_ptr(), x.shape[0], k,
                                  torch.get_num_threads())
    if rc != 0:
        raise MemoryError("f32 kernel: out of memory")
    return out


def f32_rows(x: "torch.Tensor", w: "torch.Tensor", ids: "torch.Tensor") -> "torch.Tensor":
    """x @ w[ids].T (fp32 [M, len(ids)]) with w's rows read in place (no gathered copy): the
    same bits, column for column, as `f32_linear(x, w)[:, ids]` (each output one sum in the
    kernel's fixed order). The screened head's rescoring of an RL rollout's candidates. The
    caller checks `f32_applies(x, w)`; ids must be int64 in range."""
    import torch

    if not f32_applies(x, w):
        raise ValueError("f32_rows takes fp32 x [M, K] (1 <= M <= 8) and w [N, K], contiguous, on a CPU with "
                         "the kernel (check f32_applies)")
    ids = ids.contiguous()
    if ids.dtype != torch.int64 or ids.dim() != 1 or ids.device.type != "cpu":
        raise ValueError("ids must be a CPU int64 vector")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= w.shape[0]):
        raise ValueError(f"ids out of range for {w.shape[0]} rows")
    out = torch.empty((x.shape[0], ids.numel()), dtype=torch.float32)
    if ids.numel() and f32_library().tunix_f32_rows(x.data_ptr(), w.data_ptr(), ids.data_ptr(), ids.numel(), None, None,
                                               1.0, 0, out.data_ptr(), x.shape[0], w.shape[1],
                                               torch.get_num_threads()) != 0:
        raise MemoryError("f32 kernel: out of memory")
    return out


Q4_GROUP = 32
"""An int4 weight's group along K: one scale and one min per row and group (SOURCE)."""


def pack4(codes: "torch.Tensor") -> "torch.Tensor":
    """uint8 codes [N, K] (0..15; N a multiple of 16, K of 32) in `q4linear`'s layout (SOURCE:
    blocks of 16 rows, 256 bytes a group, each byte two codes 4 apart along K): uint8
    [N, K / 2], a new tensor; `unpack4` undoes it."""
    n, k = codes.shape
    if n % 16 or k % Q4_GROUP:
        raise ValueError(f"int4 weights need N a multiple of 16 and K of {Q4_GROUP}, got [{n}, {k}]")
    c = codes.reshape(n // 16, 16, k // 32, 4, 2, 4)  # block, row, group, chunk, half (k or k + 4), byte
    c = c.permute(0, 2, 3, 1, 5, 4)  # block, group, chunk, row, byte, half
    return (c[..., 0] | (c[..., 1] << 4)).reshape(n, k // 2).contiguous()


def unpack4(packed: "torch.Tensor") -> "torch.Tensor":
    """The uint8 codes [N, K] of a `pack4` result (a new tensor)."""
    import torch

    n, half = packed.shape
    k = half * 2
    p = packed.reshape(n // 16, k // 32, 4, 16, 4)  # block, group, chunk, row, byte
    c = torch.stack([p & 0x0F, p >> 4], dim=-1)  # ..., byte, half
    return c.permute(0, 3, 1, 2, 5, 4).reshape(n, k).contiguous()


def pack_scales4(scale: "torch.Tensor", mn: "torch.Tensor") -> "torch.Tensor":
    """fp16 scales and mins [N, K / 32] as `q4linear` reads them: [N / 16, K / 32, 2, 16]."""
    import torch

    n, g = scale.shape
    both = torch.stack([scale.reshape(n // 16, 16, g), mn.reshape(n // 16, 16, g)], dim=1)  # block, 2, row, group
    return both.permute(0, 3, 1, 2).contiguous().to(torch.float16)


def q4linear_applies(x: "torch.Tensor", n: int, k: int) -> bool:
    """Whether `q4linear` runs on the kernel here for fp32 x [M, k] and an [n, k] weight."""
    import torch

    return (x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and x.shape[1] == k
            and x.is_contiguous() and n % 16 == 0 and k % Q4_GROUP == 0 and 0 < k < MAX_K
            and decode_library() is not None)


def q4linear(x: "torch.Tensor", w: "torch.Tensor", sm: "torch.Tensor", n: int) -> "torch.Tensor":
    """x fp32 [M, K] @ dequantised(w).T -> fp32 [M, n] for an int4 weight (`pack4` codes w,
    `pack_scales4` sm), x taken as qlinear's two int8 levels: the bits of int8_weights's torch
    path (SOURCE). The caller checks `q4linear_applies`."""
    import torch

    k = x.shape[1]
    if not q4linear_applies(x, n, k) or w.dtype != torch.uint8 or w.shape != (n, k // 2) or not w.is_contiguous():
        raise ValueError("q4linear takes fp32 x [M, K] and pack4 codes [N, K / 2] (N % 16 == 0, K % 32 == 0), "
                         "on a CPU with the kernel (check q4linear_applies)")
    if sm.dtype != torch.float16 or sm.shape != (n // 16, k // Q4_GROUP, 2, 16) or not sm.is_contiguous():
        raise ValueError(f"sm must be pack_scales4's fp16 [{n // 16}, {k // Q4_GROUP}, 2, 16]")
    out = torch.empty((x.shape[0], n), dtype=torch.float32)
    if x.shape[0] and decode_library().tunix_q4linear(x.data_ptr(), w.data_ptr(), sm.data_ptr(), out.data_ptr(),
                                                x.shape[0], n, k, torch.get_num_threads()) != 0:
        raise MemoryError("int4 kernel: out of memory")
    return out
