"""Gemma's elementwise training ops on the CPU in one pass each: RMSNorm, RoPE and the MLP's
gelu_tanh(gate) * up, forward and backward (PyTorch engine, fp32).

Why: torch runs each of these as a chain of ops, each a full pass over its tensors, and autograd
adds as many again in backward. Measured on a 2-core AMD EPYC (Zen 4, 2 threads, ms, torch's
own against this library, outputs preallocated for the library): Gemma 3 270M's RMSNorm on
[756, 640], forward and backward, 2.24 against 0.11; its q/k norm on [3024, 256] 5.44 against
0.16; gelu_tanh(gate) * up on [756, 2048] 1.80 against 0.50 forward, 3.71 against 0.65
backward (both factors' gradients). A whole Gemma 3 270M LoRA r16 SFT step (4 x 189 tokens,
jemalloc, one process, steps alternating the library and torch's ops, medians of 6; a script
of mine, not in the repo): 3.79 -> 3.52 s (-7.0%) with train.recompute's recipes, 5.04 -> 4.65 s
(-7.9%) under gradient checkpointing.

What: plain C loops the compiler vectorises (`target_clones`: an AVX-512, an AVX2 and a
baseline build of each, picked at load by the CPU), threads over blocks of rows (OpenMP, the
runtime torch loaded). Every sum runs in 16 lanes added in a fixed order, and no multiply-add
is fused, so all three builds give the same bits, and so do 1 or 2 threads. The norm and
gelu values are torch's to fp32 rounding, not to its bits (tests/train/test_cpu_kernels.py
holds both against fp64); RoPE runs transformers' very multiplications and additions, so its
values are transformers' to the bit (train.fused_rope). gelu_tanh(x) = x·sigmoid(2u),
u = √(2/π)(x + 0.044715x³), the sigmoid from one exponential (Cephes' expf polynomial, ~1 ulp)
of −2|u|, so it neither overflows nor cancels.

Where: fp32 CPU tensors whose rows (last dimension) are contiguous and which cover their memory
densely in some order (a transposed [B, T, H, D] q/k view qualifies; the output keeps the
input's layout), when the library builds (the system's `cc`, as tunix_rt.eval.int8_kernel
builds its own, cached the same way). `TUNIX_RT_CPU_KERNELS=torch` turns it off (torch's ops,
transformers' bits); so does a build failure (`WHY` says why). A run's manifest says which
ran (`device.elementwise`).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading

import torch

ENV = "TUNIX_RT_CPU_KERNELS"
CHOICES = ("c", "torch")

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifndef CLONES /* tests build one target at a time: -DCLONES=... */
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#define CHUNK 16384L

/* 16 lane sums, combined in a fixed order: the same bits whatever the vector width. */
static inline float fold16(const float *a) {
    float s[8];
    for (int j = 0; j < 8; j++) s[j] = a[j] + a[j + 8];
    for (int j = 0; j < 4; j++) s[j] = s[j] + s[j + 4];
    return (s[0] + s[2]) + (s[1] + s[3]);
}

/* e^t for t in [-87, 0] (Cephes' expf: 2^n e^r, |r| <= ln2 / 2), within ~1 ulp. */
static inline float exp_neg(float t) {
    t = t < -87.0f ? -87.0f : t;
    float n = floorf(t * 1.44269504088896341f + 0.5f);
    float r = t - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    union { int32_t i; float f; } b;
    b.i = ((int32_t)n + 127) << 23;
    return p * b.f;
}

#define GC 0.7978845608028654f /* sqrt(2 / pi) */
#define GA 0.044715f

CLONES static void gelu_mul_span(const float *gate, const float *up, float *y, long n) {
    for (long i = 0; i < n; i++) {
        float x = gate[i];
        float u = GC * (x + GA * (x * x * x));
        float e = exp_neg(-2.0f * fabsf(u));
        float s = (u >= 0.0f ? 1.0f : e) / (1.0f + e); /* sigmoid(2u) = (1 + tanh u) / 2 */
        y[i] = (x * s) * up[i];
    }
}

static inline float gelu_parts(float x, float *s_out) {
    float x2 = x * x;
    float u = GC * (x + GA * (x2 * x));
    float e = exp_neg(-2.0f * fabsf(u));
    float s = (u >= 0.0f ? 1.0f : e) / (1.0f + e);
    *s_out = s;
    return s + (x * (2.0f * s * (1.0f - s))) * (GC * (1.0f + 3.0f * GA * x2)); /* gelu'(x) */
}

CLONES static void gelu_mul_back_span(const float *g, const float *gate, const float *up, float *dgate, float *dup, long n) {
    float s;
    if (dgate && dup)
        for (long i = 0; i < n; i++) {
            float d = gelu_parts(gate[i], &s);
            dgate[i] = (g[i] * up[i]) * d;
            dup[i] = g[i] * (gate[i] * s);
        }
    else if (dgate)
        for (long i = 0; i < n; i++) dgate[i] = (g[i] * up[i]) * gelu_parts(gate[i], &s);
    else
        for (long i = 0; i < n; i++) {
            gelu_parts(gate[i], &s);
            dup[i] = g[i] * (gate[i] * s);
        }
}

void tunix_gelu_mul(const float *gate, const float *up, float *y, long n) {
    #pragma omp parallel for schedule(static)
    for (long c = 0; c < n; c += CHUNK)
        gelu_mul_span(gate + c, up + c, y + c, n - c < CHUNK ? n - c : CHUNK);
}

void tunix_gelu_mul_back(const float *g, const float *gate, const float *up, float *dgate, float *dup, long n) {
    #pragma omp parallel for schedule(static)
    for (long c = 0; c < n; c += CHUNK)
        gelu_mul_back_span(g + c, gate + c, up + c, dgate ? dgate + c : 0, dup ? dup + c : 0,
                           n - c < CHUNK ? n - c : CHUNK);
}

CLONES static void rms_rows(const float *x, const float *w1, float *y, float *rstd, long r0, long r1, long D, float eps) {
    for (long r = r0; r < r1; r++) {
        const float *xr = x + r * D;
        float a[16] = {0};
        long k = 0;
        for (; k + 16 <= D; k += 16)
            for (int j = 0; j < 16; j++) a[j] += xr[k + j] * xr[k + j];
        for (; k < D; k++) a[k & 15] += xr[k] * xr[k];
        float rs = 1.0f / sqrtf(fold16(a) / (float)D + eps);
        rstd[r] = rs;
        float *yr = y + r * D;
        for (k = 0; k < D; k++) yr[k] = (xr[k] * rs) * w1[k];
    }
}

/* dx = rs (g w1 - xhat mean(g w1 xhat)), xhat = x rs; dw (per block of rows) += g xhat */
CLONES static void rms_back_rows(const float *g, const float *x, const float *w1, const float *rstd, float *dx,
                                 float *dw, long r0, long r1, long D) {
    for (long r = r0; r < r1; r++) {
        const float *xr = x + r * D, *gr = g + r * D;
        float rs = rstd[r];
        if (dx) {
            float a[16] = {0};
            long k = 0;
            for (; k + 16 <= D; k += 16)
                for (int j = 0; j < 16; j++) a[j] += (gr[k + j] * w1[k + j]) * (xr[k + j] * rs);
            for (; k < D; k++) a[k & 15] += (gr[k] * w1[k]) * (xr[k] * rs);
            float m = fold16(a) / (float)D;
            float *o = dx + r * D;
            for (k = 0; k < D; k++) o[k] = rs * ((gr[k] * w1[k]) - (xr[k] * rs) * m);
        }
        if (dw)
            for (long k = 0; k < D; k++) dw[k] += gr[k] * (xr[k] * rs);
    }
}

#define RB 64L

void tunix_rms_norm(const float *x, const float *w1, float *y, float *rstd, long rows, long D, float eps) {
    #pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r += RB)
        rms_rows(x, w1, y, rstd, r, r + RB < rows ? r + RB : rows, D, eps);
}

/* part: [ceil(rows / RB), D] scratch when dw is wanted (each block's sum, then added in order). */
void tunix_rms_norm_back(const float *g, const float *x, const float *w1, const float *rstd, float *dx, float *dw,
                         float *part, long rows, long D) {
    long nb = (rows + RB - 1) / RB;
    #pragma omp parallel for schedule(static)
    for (long b = 0; b < nb; b++) {
        float *p = dw ? part + b * D : 0;
        if (p) memset(p, 0, D * sizeof(float));
        long r = b * RB;
        rms_back_rows(g, x, w1, rstd, dx, p, r, r + RB < rows ? r + RB : rows, D);
    }
    if (dw) {
        memset(dw, 0, D * sizeof(float));
        for (long b = 0; b < nb; b++)
            for (long k = 0; k < D; k++) dw[k] += part[b * D + k];
    }
}
/* RoPE on rows of x [B, H, T, D] (strides sb, sh, st; 1 along D), cos/sin [B, T, D] (strides cb,
   ct; 1), into y (x's strides): transformers' (x * cos) + (rotate_half(x) * sin), rotate_half(x)
   = cat(-x2, x1), so y1 = x1 c1 + (-x2) s1, y2 = x2 c2 + x1 s2: its ops, its bits. back: the
   gradient through it, g c + rotate_half^T(g s): g1 c1 + g2 s2, g2 c2 + (-(g1 s1)). */
CLONES static void rope_rows(const float *x, const float *c, const float *s, float *y, long r0, long r1, long H,
                             long T, long D, long sb, long sh, long st, long cb, long ct, int back) {
    long h2 = D / 2;
    for (long r = r0; r < r1; r++) {
        long b = r / (H * T), h = (r / T) % H, t = r % T;
        const float *xr = x + b * sb + h * sh + t * st, *cr = c + b * cb + t * ct, *sr = s + b * cb + t * ct;
        float *yr = y + b * sb + h * sh + t * st;
        if (!back)
            for (long k = 0; k < h2; k++) {
                float x1 = xr[k], x2 = xr[k + h2];
                yr[k] = x1 * cr[k] + (-x2) * sr[k];
                yr[k + h2] = x2 * cr[k + h2] + x1 * sr[k + h2];
            }
        else
            for (long k = 0; k < h2; k++) {
                float g1 = xr[k], g2 = xr[k + h2];
                yr[k] = g1 * cr[k] + g2 * sr[k + h2];
                yr[k + h2] = g2 * cr[k + h2] + (-(g1 * sr[k]));
            }
    }
}

void tunix_rope(const float *x, const float *c, const float *s, float *y, long B, long H, long T, long D, long sb,
                long sh, long st, long cb, long ct, int back) {
    long rows = B * H * T;
    #pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r += RB)
        rope_rows(x, c, s, y, r, r + RB < rows ? r + RB : rows, H, T, D, sb, sh, st, cb, ct, back);
}
"""

FLAGS = ["-O3", "-fno-fast-math", "-fno-trapping-math", "-fno-math-errno", "-ffp-contract=off", "-fPIC", "-shared",
         "-fopenmp"]
"""No reassociation and no fused multiply-adds (the same bits in every build); trapping math
and errno off only so that the compiler may vectorise the branches and sqrt (no value changes)."""

_LOCK = threading.Lock()
_LIB: list = []  # [] not tried yet; [None] unavailable; [lib] loaded
WHY: list[str] = []
"""Why the library is not used in this process (empty while it is, or before the first use)."""


def choice() -> str:
    """TUNIX_RT_CPU_KERNELS: "c" (the default) or "torch"; anything else is refused."""
    v = os.environ.get(ENV, "c")
    if v not in CHOICES:
        raise ValueError(f"{ENV}={v!r}: expected one of {', '.join(CHOICES)}")
    return v


def library():
    """The loaded library, or None where it is off or cannot be built (`WHY`)."""
    if choice() == "torch":
        return None
    if not _LIB:
        with _LOCK:
            if not _LIB:
                _LIB.append(_load())
    return _LIB[0]


def _load():
    from tunix_rt.eval.int8_kernel import compiled

    try:
        lib = compiled("cpu_ops", SOURCE, [os.environ.get("CC", "cc"), *FLAGS])
    except (OSError, subprocess.SubprocessError) as e:
        WHY.append(f"no library: {e}")
        return None
    p, n, f = ctypes.c_void_p, ctypes.c_long, ctypes.c_float
    for name, args in (("tunix_gelu_mul", [p, p, p, n]), ("tunix_gelu_mul_back", [p] * 5 + [n]),
                       ("tunix_rms_norm", [p] * 4 + [n, n, f]), ("tunix_rms_norm_back", [p] * 7 + [n, n]),
                       ("tunix_rope", [p] * 4 + [n] * 9 + [ctypes.c_int])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = None, args
    return lib


def _dense_rows(t: torch.Tensor) -> bool:
    """t's memory is [rows, t.shape[-1]] row after row, in some order of its leading axes:
    contiguous along the last axis, non-overlapping and dense (empty_like keeps such strides)."""
    return t.stride(-1) == 1 and (t.is_contiguous() or torch.empty_like(t).stride() == t.stride())


def applies(*ts: torch.Tensor) -> bool:
    """The library runs on these tensors: all fp32 on the CPU, non-empty, densely laid out in
    rows of the same layout as the first, and it is built."""
    first = ts[0]
    return (all(t.device.type == "cpu" and t.dtype == torch.float32 for t in ts) and first.numel() > 0
            and first.dim() >= 1 and _dense_rows(first) and library() is not None)


def _ptr(t: torch.Tensor | None):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _like(t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """t in ref's memory layout (itself where it already is)."""
    return t if t.stride() == ref.stride() else torch.empty_like(ref).copy_(t)


def gelu_tanh_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gelu(gate, approximate="tanh") * up (same shapes, `applies`); the output in gate's layout."""
    up = _like(up, gate)
    y = torch.empty_like(gate)
    library().tunix_gelu_mul(_ptr(gate), _ptr(up), _ptr(y), gate.numel())
    return y


def gelu_tanh_mul_backward(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, need_gate: bool,
                           need_up: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(d gate, d up) of gelu_tanh_mul for the output's gradient `grad` (None where not needed)."""
    grad, up = _like(grad, gate), _like(up, gate)
    dg = torch.empty_like(gate) if need_gate else None
    du = torch.empty_like(gate) if need_up else None
    if dg is not None or du is not None:
        library().tunix_gelu_mul_back(_ptr(grad), _ptr(gate), _ptr(up), _ptr(dg), _ptr(du), gate.numel())
    return dg, du


def rms_norm(x: torch.Tensor, w1: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x · rsqrt(mean(x²) + eps) · w1 over the last axis, the rows' rsqrt) for x `applies` and a
    contiguous fp32 w1 [D]; y in x's layout, the rsqrt one per row in memory order."""
    d, w1 = x.shape[-1], w1.contiguous()  # held: the library reads it
    y, rstd = torch.empty_like(x), torch.empty(x.numel() // d, dtype=torch.float32)
    library().tunix_rms_norm(_ptr(x), _ptr(w1), _ptr(y), _ptr(rstd), x.numel() // d, d, eps)
    return y, rstd


ROW_BLOCK = 64
"""The backward's rows per block (the C source's RB): the weight's gradient sums blocks in order."""


def rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, w1: torch.Tensor, rstd: torch.Tensor, need_x: bool,
                      need_w: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(d x, d w1) of rms_norm for the output's gradient `grad` (None where not needed)."""
    d, w1 = x.shape[-1], w1.contiguous()
    rows = x.numel() // d
    grad = _like(grad, x)
    dx = torch.empty_like(x) if need_x else None
    dw = torch.empty(d, dtype=torch.float32) if need_w else None
    part = torch.empty((rows + ROW_BLOCK - 1) // ROW_BLOCK, d, dtype=torch.float32) if need_w else None
    if dx is not None or dw is not None:
        library().tunix_rms_norm_back(_ptr(grad), _ptr(x), _ptr(w1), _ptr(rstd), _ptr(dx), _ptr(dw),
                                      _ptr(part), rows, d)
    return dx, dw


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, back: bool = False) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb for one of x [B, H, T, D] (rows contiguous, any order of
    the leading axes) and cos, sin [B, T, D] (rows contiguous, the same strides), its bits; with
    `back`, the gradient wrt x of that for the output's gradient x. The output in x's layout."""
    b, h, t, d = x.shape
    y = torch.empty_like(x)
    library().tunix_rope(_ptr(x), _ptr(cos), _ptr(sin), _ptr(y), b, h, t, d, *x.stride()[:3], *cos.stride()[:2],
                         int(back))
    return y
