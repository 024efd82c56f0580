"""Weight-only int8 and int4 inference for the lean Gemma decode step (`--weights int8|int4` of
eval, serve and chat; never training).

Why: single-stream decoding of Gemma 3 270M reads every weight once per token (about 1.1 GB
in fp32), so the weights' format, not the arithmetic, bounds tokens/s. Stored as int8 they are
a quarter of the bytes.

What is quantised: every linear weight of the model (q/k/v/o, gate/up/down and the tied
head, which is also the embedding table), per output channel (row) and symmetric:
scale_n = max_k |w_nk| / 127, q_nk = round(w_nk / scale_n) in [-127, 127], so
|w − scale·q| ≤ scale / 2 per element (an all-zero row gets scale 1 and q = 0, exact).
Norms, RoPE and the KV cache stay fp32.

int4 (`weights="int4"`, `quantize4`): every linear weight in groups of 32 along its input
(INT4_GROUP), asymmetric, w = scale·code + min with a code in 0..15 and an fp16 scale and min
per row and group: 5 bits a weight, 0.17 GB a step for Gemma 3 270M against int8's 0.27. The
group's min and range set them (min = least value, scale = range / 15, both rounded to fp16),
so |w − scale·code − min| ≤ scale/2 plus the fp16 roundings' share, and a group's extreme
weights are kept. Least-squares fits over a few grids were tried and not kept: they lowered the
weights' relative error on the layer-0 projections from 0.081–0.083 to 0.070–0.072 (and found
the GGUF's Q4_K tensors again, 0.045 → 0.0007) but clipped extremes, and the next-token
agreement with fp32 fell (16 GSM8K prompts, 768 positions teacher-forced on fp32's greedy
text: base model 97.9% → 95.7%, mean KL 0.096 → 0.100; the demo's SFT model 89.3% → 88.7%,
KL 0.131 → 0.153; int8: 99.6% and 98.0%). Activations are the same
two int8 levels as int8's; the product is the kernel's `q4linear` (int8_kernel: the group's
integer sums by vpdpbusd on 16 rows at once, then scale and min in fp32), and where it does
not run, `int4_reference`, its torch twin with the same bits. The layers run as one kernel
call each, as int8's (`tunix_gemma_layer` with its int4 switch). The tied head is also the
token embedding: under int4 the prefill embeds through its int4 values too (as int8's through
its int8 ones). It needs every projection's rows in whole blocks of 16 and its input width a
multiple of 32 (Gemma's are), checked for every weight before any is changed, and it runs
where the kernel does (a CPU with AVX-512 VNNI, or AVX2 with FMA and F16C, and a C compiler;
`int4_problem` says why not): its torch twin, kept for the tests, is ~100x slower than fp32 (the whole matrix unpacked
each call), so elsewhere int4 is refused with a pointer to int8, which runs everywhere.

`quantize_model(model, weights)` writes the dequantised weights (in fp32) over the model's own
parameters in place, so the transformers prefill and the lean step compute with the same
numbers, and returns the quantised copies; `Int8Gemma` is the lean step (`LeanGemma`) whose
projections and head read them. The model's fp32 parameters are kept for the prefill (one
call per batch), so memory grows by the quantised copy (a quarter for int8, 5/32 for int4).

How a projection multiplies (`int8_linear`), chosen per process by `pick_kernel`:
- "int_mm": the activations get a two-level int8 quantisation per row (as
  tunix_rt.eval.screened_head: q1 = round(x / s), q2 = round((x − s·q1)·127 / s), s = max|x|/127,
  so |x − x̂| ≤ s/254 per element, about 15 bits: the weights' 8 bits dominate the error) and
  one int8 matmul `[q1; q2] @ q.T` (tunix_rt.eval.int8_kernel.int_mm: our AVX-512 VNNI or AVX2
  kernel, else torch._int_mm) gives both levels' exact int32 sums, combined in fp32. Where our kernel
  runs, all of it is one call (`int8_kernel.qlinear`: the quantisation, both levels' sums and
  the combination, the same bits as the torch ops), which took a single-stream decode step of
  Gemma 3 270M from ~22 to ~13 ms (benchmarks/bench_generate.py --weights int8 --batch 1),
  and with each decoder layer one call of the same library (`Int8Gemma.fused`, the layer's
  ~70 small torch ops gone) to ~10 ms. Where the layers run so, every int8 weight is kept in
  the kernel's panel layout (`QuantLinear.as_panels`, int8_kernel.pack_rows), read front to
  back: on a 2-core AMD EPYC with AVX512-VNNI (2 threads; a noisy shared machine; 3 of 4
  rounds, alternated) a step took 12.2-12.7 ms against 16.7-18.2 row-major (the head 5.8-6.2
  ms against 8.4-9.2, the layers 5.7-6.6 against 7.8-8.6): 68-73 tokens/s against 51-55 end
  to end, the prefill included (128 tokens, batch 1). Where the AVX2 kernels decode, the
  layout is `pack_vnni`'s instead (int8_kernel.panel_layout; its module doc has why).
  Where our kernel runs, always; elsewhere only where the int8 matmul sums exactly at that shape (`int8_matmul_is_exact`) and is faster
  than fp32 (`int8_matmul_is_fast`); else
- "dequant": the weight rows are dequantised a block at a time (the block stays in cache) and
  multiplied in fp32: the same numbers as the model's dequantised parameters.
q/k/v and gate/up read the same input: each group is one fused int8 matrix (`Part`), one
matmul per group, so a layer is 4 int8 matmuls; the head is one over the whole vocabulary.

Measured (2-core AMD EPYC with AVX512-VNNI, shared with other jobs, torch threads 1; median
decode-step ms, benchmarks/bench_int8_weights.py --threads 1): Gemma 3 270M (real weights),
batch 1: fp32 full logits 162, int_mm 87, dequant 189; batch 8: 275, 135, 270. Random
weights of the same shapes: 208 / 116 / 218 (B=1). The dequant path never wins (it writes
each fp32 block it reads), so it is the fallback only. Tiny models are overhead-bound (int8
slower than fp32 there). In generation the fp32 side already screens its head in int8, so
the end-to-end gain is smaller: benchmarks/bench_generate.py --weights int8 --batch 1.

Bounds (tests/eval/test_int8_weights.py): the round trip error is at most scale/2 per element;
logits of int8 decoding track fp32's and greedy ids agree on most steps (quantisation changes
the model, so ids need not agree everywhere: this is not an exact option, unlike the screened
head, and eval_summary.json's `decoding.weights` records it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tunix_rt.errors import BadInput
from tunix_rt.eval.fast_gemma import HEAD_CHUNK, LeanGemma
from tunix_rt.eval.int8_kernel import (Q4_GROUP, int_mm, pack4, pack_rows, pack_scales4, pack_vnni, panel_layout, q4linear,
                                      q4linear_applies, qlinear, qlinear_applies, row_sums, unpack4, unpack_rows,
                                      unpack_vnni)

if TYPE_CHECKING:
    import torch

WEIGHTS = ("fp32", "int8", "int4")
"""The weight formats inference can decode with (`weights` of eval, serve and chat)."""
INT4_GROUP = Q4_GROUP
"""int4 weights: one fp16 scale and min per row and this many weights along K."""
KERNELS = ("int_mm", "dequant")
DEQUANT_ROWS = 512
"""Weight rows dequantised at a time on the "dequant" path (640 x 512 fp32 = 1.3 MB, in L2)."""


def check_weights(value: str, engine: str = "torch", field: str = "weights") -> str:
    """`value` if it is a known weight format the engine can decode with, else BadInput."""
    if value not in WEIGHTS:
        raise BadInput(f"{field} must be one of {'|'.join(WEIGHTS)}, got {value!r}")
    if value != "fp32" and engine != "torch":
        raise BadInput(f"{field} {value} runs on the torch engine's lean Gemma decode step only, "
                       f"not engine {engine!r}: use --engine torch or {field} fp32")
    return value


@dataclass
class QuantLinear:
    """A weight [N, K] as int8 rows and one fp32 scale per row (output channel)."""

    q: "torch.Tensor"  # int8 [N, K]
    scale: "torch.Tensor"  # fp32 [N]
    sums: "torch.Tensor | None" = None  # int32 [N], Σ_k q[n, k]: what the int8 kernel needs
    packed: bool = False  # q is int8_kernel.pack_rows of the rows (the kernel's panels: `as_panels`)
    vnni: bool = False  # with packed: q is int8_kernel.pack_vnni of the rows instead (the AVX2 kernels')

    def __post_init__(self) -> None:
        if self.sums is None:
            if self.packed:
                raise ValueError("a packed QuantLinear needs its row sums")
            self.sums = row_sums(self.q)

    def dequantize(self) -> "torch.Tensor":
        return self.rows().float() * self.scale[:, None]

    def rows(self) -> "torch.Tensor":
        """q row-major, as quantised ([N, K])."""
        if not self.packed:
            return self.q
        return unpack_vnni(self.q) if self.vnni else unpack_rows(self.q)

    def as_panels(self) -> "QuantLinear":
        """The same weight with q in the kernel's panel layout (int8_kernel.pack_rows: each block
        of 16 rows read front to back; the module doc has the decode step's gain), which
        `int8_linear` then multiplies through `qlinear` only. Where the AVX2 kernels decode, the
        layout is `pack_vnni`'s instead (int8_kernel.panel_layout)."""
        if self.packed:
            return self
        if panel_layout() == "vnni":
            return QuantLinear(pack_vnni(self.q), self.scale, self.sums, packed=True, vnni=True)
        return QuantLinear(pack_rows(self.q), self.scale, self.sums, packed=True)

    @property
    def shape(self):
        return self.q.shape


def quantize(w: "torch.Tensor") -> QuantLinear:
    """Per-row symmetric int8 (module doc); `w` is not changed."""
    import torch

    w = w.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return QuantLinear(q.contiguous(), scale.contiguous())


def fuse(parts: list[QuantLinear]) -> QuantLinear:
    """Weights of the same input width stacked by rows (per-row scales stay exact)."""
    import torch

    return QuantLinear(torch.cat([p.rows() for p in parts]).contiguous(), torch.cat([p.scale for p in parts]).contiguous(),
                       torch.cat([p.sums for p in parts]).contiguous())


@dataclass
class Quant4Linear:
    """A weight [N, K] as int4 codes in groups of INT4_GROUP along K, w = scale * code + min
    (asymmetric; an fp16 scale and min per row and group), kept in the int4 kernel's layout:
    `q` uint8 [N, K / 2] (int8_kernel.pack4), `sm` fp16 [N / 16, K / 32, 2, 16]
    (int8_kernel.pack_scales4)."""

    q: "torch.Tensor"
    sm: "torch.Tensor"

    @property
    def shape(self):
        return (self.q.shape[0], self.q.shape[1] * 2)

    def scales(self) -> tuple["torch.Tensor", "torch.Tensor"]:
        """(scale, min), each fp32 [N, K / 32]."""
        n, g = self.sm.shape[0] * 16, self.sm.shape[1]
        both = self.sm.float().permute(0, 2, 3, 1)  # block, 2, row, group
        return both[:, 0].reshape(n, g), both[:, 1].reshape(n, g)

    def dequantize(self) -> "torch.Tensor":
        """scale * code + min in fp32 (a product, then a sum), [N, K]."""
        scale, mn = self.scales()
        return unpack4(self.q).float() * scale.repeat_interleave(INT4_GROUP, 1) + mn.repeat_interleave(INT4_GROUP, 1)


INT4_ROWS = 16384
"""Rows `quantize4` quantises at a time (its temporaries a few x rows x K floats)."""


def check_int4_shape(shape) -> None:
    """BadInput unless an [N, K] weight fits the int4 layout: N a multiple of 16, K of INT4_GROUP."""
    if shape[0] % 16 or shape[1] % INT4_GROUP:
        raise BadInput(f"int4 weights need rows a multiple of 16 and columns of {INT4_GROUP}, got {tuple(shape)}")


def quantize4(w: "torch.Tensor") -> Quant4Linear:
    """Asymmetric int4 per row and group of INT4_GROUP (module doc): min = the group's least
    value, scale = its range / 15, both rounded to fp16, code = round((w - min) / scale) in
    0..15; `w` is not changed. BadInput where the shape does not fit the layout (N a multiple
    of 16, K of 32) or a value is not finite or beyond fp16's range."""
    import torch

    n, k = w.shape
    check_int4_shape(w.shape)
    w = w.detach().float()
    if not bool(torch.isfinite(w).all()) or float(w.abs().max()) > float(torch.finfo(torch.float16).max) / 2:
        raise BadInput("int4 weights need finite values within fp16's range")
    codes = torch.empty((n, k), dtype=torch.uint8)
    scales, mins = torch.empty((n, k // INT4_GROUP), dtype=torch.float16), torch.empty((n, k // INT4_GROUP), dtype=torch.float16)
    for i in range(0, n, INT4_ROWS):
        g = w[i: i + INT4_ROWS].reshape(-1, k // INT4_GROUP, INT4_GROUP)
        lo, hi = g.amin(dim=-1), g.amax(dim=-1)
        mn = lo.half()
        sc = ((hi - mn.float()) / 15.0).half()
        sc = torch.where(sc.float() > 0, sc, torch.ones_like(sc))  # a constant group: code 0, value min
        c = torch.round((g - mn.float()[..., None]) / sc.float()[..., None]).clamp_(0, 15)
        codes[i: i + INT4_ROWS] = c.reshape(-1, k).to(torch.uint8)
        scales[i: i + INT4_ROWS], mins[i: i + INT4_ROWS] = sc, mn
    return Quant4Linear(pack4(codes), pack_scales4(scales, mins))


def fuse4(parts: list[Quant4Linear]) -> Quant4Linear:
    """int4 weights of the same input width stacked by rows (whole 16-row blocks: the layout
    of the stack is the stack of the layouts)."""
    import torch

    return Quant4Linear(torch.cat([p.q for p in parts]).contiguous(), torch.cat([p.sm for p in parts]).contiguous())


def int4_reference(x2: "torch.Tensor", w: Quant4Linear, rows: int = 16384) -> "torch.Tensor":
    """x2 fp32 [M, K] @ dequantised(w).T through torch, the int4 kernel's operations in its
    order (int8_kernel.SOURCE): the same bits as `q4linear`, its reference in the tests and
    `int4_linear`'s path where the kernel does not run (decoding refuses int4 there: ~100x
    slower than fp32). `rows`: weight rows at a time (their exact integer sums held in fp64)."""
    import torch

    m, k = x2.shape
    n, groups = w.shape[0], k // INT4_GROUP
    lhs, step = quantize_activations(x2.float())
    q = lhs.double().reshape(2, m, groups, INT4_GROUP).permute(0, 2, 1, 3)  # level, group, row, k
    gs = lhs.reshape(2, m, groups, INT4_GROUP).sum(dim=-1, dtype=torch.int32).float()
    gs = gs[0] * 127.0 + gs[1]  # [m, groups]
    scale, mn = w.scales()
    codes = unpack4(w.q)
    out = torch.empty((m, n), dtype=torch.float32)
    for i in range(0, n, rows):
        c = codes[i: i + rows].double().reshape(-1, groups, INT4_GROUP).permute(1, 2, 0)  # group, k, rows
        d = torch.matmul(q, c).float()  # level, group, m, rows: exact integers
        t = d[0] * 127.0 + d[1]
        acc = torch.zeros((m, c.shape[-1]), dtype=torch.float32)
        for j in range(groups):
            acc = acc + scale[i: i + rows, j] * t[j]
            acc = acc + mn[i: i + rows, j] * gs[:, j: j + 1]
        out[:, i: i + rows] = acc * step
    return out


def int4_linear(x: "torch.Tensor", w: Quant4Linear) -> "torch.Tensor":
    """x [..., K] @ dequantised(w).T -> [..., N], fp32: the int4 kernel where it runs, else its
    torch twin (`int4_reference`, the same bits)."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k).float().contiguous()
    n = w.shape[0]
    out = q4linear(x2, w.q, w.sm, n) if q4linear_applies(x2, n, k) else int4_reference(x2, w)
    return out.view(*lead, n).to(x.dtype)


def quantize_model(model, weights: str = "int8") -> "dict[int, QuantLinear | Quant4Linear]":
    """Quantise every nn.Linear weight of `model` (tied ones once) to `weights` (int8 or int4)
    and write the dequantised values over the parameters in place; returns id(parameter) ->
    its quantised copy."""
    import torch

    quant = quantize4 if weights == "int4" else quantize
    if weights == "int4":  # every shape first: a refused weight leaves the model as it was
        for module in model.modules():
            w = getattr(module, "weight", None)
            if isinstance(module, torch.nn.Linear) and w is not None:
                check_int4_shape(w.shape)
    out: dict = {}
    with torch.no_grad():
        for module in model.modules():
            w = getattr(module, "weight", None)
            if not isinstance(module, torch.nn.Linear) or w is None or id(w) in out:
                continue
            ql = quant(w)
            w.copy_(ql.dequantize().to(w.dtype))
            out[id(w)] = ql
    return out


def quantize_activations(x: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
    """x [M, K] fp32 -> ([q1; q2] int8 [2M, K], s/127 [M, 1]) with x ≈ (s/127)(127·q1 + q2)."""
    import torch

    s = (x.abs().amax(dim=1, keepdim=True) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    q1 = torch.round(x / s)
    q2 = torch.round((x - s * q1) * (127.0 / s))
    return torch.cat([q1, q2]).to(torch.int8), s / 127.0


@dataclass
class Part:
    """Rows `rows` of a fused weight: the projections that read the same input (q/k/v,
    gate/up) are one matmul, whose output each of them slices (`Int8Gemma.linear`)."""

    fused: QuantLinear
    rows: slice


def int8_linear(x: "torch.Tensor", w: QuantLinear, kernel: str) -> "torch.Tensor":
    """x [..., K] @ dequantised(w).T -> [..., N], fp32 (see the module doc for the kernels)."""
    import torch

    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    m, n = x2.shape[0], w.q.shape[0]
    if w.packed:  # panels: only the kernel's qlinear reads them (Int8Gemma packs where it runs)
        x2 = x2.float().contiguous()
        if not qlinear_applies(x2, w.q):
            raise ValueError("a packed int8 weight multiplies through the int8 kernel's qlinear only")
        return qlinear(x2, w.q, w.sums, w.scale, packed=True, vnni=w.vnni).view(*lead, n).to(x.dtype)
    if kernel == "int_mm" and qlinear_applies(x2, w.q):  # the same bits, in one call
        out = qlinear(x2, w.q, w.sums, w.scale)
    elif kernel == "int_mm" and kernel_ok(2 * m, k, n):
        lhs, step = quantize_activations(x2)
        acc = int_mm(lhs, w.q, w.sums)
        out = (acc[:m].float() * 127.0 + acc[m:].float()) * step * w.scale
    else:
        out = torch.empty((m, n), dtype=torch.float32, device=x.device)
        for i in range(0, n, DEQUANT_ROWS):
            blk = w.q[i: i + DEQUANT_ROWS].float() * w.scale[i: i + DEQUANT_ROWS, None]
            torch.mm(x2, blk.t(), out=out[:, i: i + DEQUANT_ROWS])
    return out.view(*lead, n).to(x.dtype)


def kernel_ok(rows: int, dim: int, cols: int) -> bool:
    """The int8 kernel sums exactly at this shape (probed once per shape and process)."""
    from tunix_rt.eval.screened_head import int8_matmul_is_exact

    return int8_matmul_is_exact(rows, dim, cols)


def pick_kernel(device) -> str:
    """"int_mm" on a CPU where the decode kernels run (int8_kernel.decode_library: `qlinear`
    does the whole product) or whose int8 matmul beats fp32 (measured once per process), else
    "dequant"."""
    import torch

    from tunix_rt.eval.int8_kernel import decode_library
    from tunix_rt.eval.screened_head import int8_matmul_is_fast

    if torch.device(device).type != "cpu":
        return "dequant"
    if decode_library() is not None:
        return "int_mm"
    if not hasattr(torch, "_int_mm"):
        return "dequant"
    return "int_mm" if int8_matmul_is_fast() else "dequant"


def int4_problem(device) -> str | None:
    """Why int4 weights cannot decode here (None: they can): the int4 kernel runs on the CPU
    only, where the int8 library's decode kernels loaded (AVX-512 VNNI or AVX2, and a C
    compiler: int8_kernel.decode_library)."""
    import torch

    from tunix_rt.eval import int8_kernel

    if torch.device(device).type != "cpu":
        return f"decodes on the CPU only, not {torch.device(device).type}"
    if int8_kernel.decode_library() is None:
        why = "; ".join(int8_kernel.WHY) or "the CPU has neither AVX-512 VNNI nor AVX2 with FMA and F16C"
        return f"needs the int4 kernel ({why})"
    return None


class Int8Gemma(LeanGemma):
    """The lean decode step on int8 (or, `weights="int4"`, int4) weights; build with
    `Int8Gemma.for_model(model)`, which quantises the model in place (module doc)."""

    def __init__(self, model, kernel: str | None = None, weights: str = "int8"):
        if weights not in ("int8", "int4"):
            raise BadInput(f"quantised weights are int8 or int4, got {weights!r}")
        if weights == "int4":
            why = int4_problem(next(model.parameters()).device)
            if why:
                raise BadInput(f"weights int4 {why}; weights int8 runs everywhere")
        self.weights = weights
        quant = quantize_model(model, weights)
        super().__init__(model)
        # int4's products are the kernel's (int4_problem checked it): no int8 speed probe
        self.kernel = kernel or ("int_mm" if weights == "int4" else pick_kernel(self.embed.device))
        if self.kernel not in KERNELS:
            raise BadInput(f"int8 kernel must be one of {'|'.join(KERNELS)}, got {self.kernel!r}")
        for lyr in self.layers:
            for group in (("wq", "wk", "wv"), ("w_gate", "w_up")):
                parts = [quant[id(getattr(lyr, name))] for name in group]
                fused = fuse4(parts) if weights == "int4" else fuse(parts)
                at = 0
                for name, part in zip(group, parts):
                    setattr(lyr, name, Part(fused, slice(at, at + part.q.shape[0])))
                    at += part.q.shape[0]
            lyr.wo, lyr.w_down = quant[id(lyr.wo)], quant[id(lyr.w_down)]
        self.qhead = quant[id(self.head)]
        self._last: tuple = (None, None, None)  # (input, fused weight, its output): see linear
        self.fused = (self.kernel == "int_mm" or weights == "int4") and fused_layers_apply(self)
        """Each layer one call of the kernel library (`tunix_gemma_layer`; all of a step's layers
        in one ctypes call, `tunix_gemma_layers`) instead of ~70 torch
        ops: where the library loaded, the model is fp32 and every projection's input width
        is a multiple of 64 (see `_hidden`)."""
        if self.fused and weights == "int8":  # every projection and the head through qlinear: its panels
            self._to_panels()
        self.huge_pages = self._to_huge_pages()
        """Whether the quantised weights now lie in one mapping advised for transparent huge
        pages (`on_huge_pages`)."""
        self._layer_table = self._table() if self.fused else None

    @classmethod
    def for_model(cls, model, kernel: str | None = None, weights: str = "int8") -> "Int8Gemma":
        """The int8 step for a plain (or merged) Gemma 3 / Gemma 2 model; BadInput for anything
        the lean step does not serve (int8 weights have no other decode path)."""
        lean = LeanGemma.for_model(model)
        if lean is None:
            kind = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
            raise BadInput(f"weights {weights} needs a Gemma 3 / Gemma 2 model (the lean decode step), got {kind!r}")
        if lean.lora:
            raise BadInput(f"weights {weights} quantises a plain or merged model, not one with a live LoRA adapter")
        return cls(model, kernel, weights)

    def linear(self, x: "torch.Tensor", w) -> "torch.Tensor":
        """One projection; a Part's fused matmul runs once per input (the first of q/k/v or
        gate/up computes all of them, the others take their rows of its output)."""
        if not isinstance(w, Part):
            return self._linear(x, w)
        last_x, last_w, out = self._last
        if last_x is not x or last_w is not w.fused:
            out = self._linear(x, w.fused)
            self._last = (x, w.fused, out)
        return out[..., w.rows]

    def _linear(self, x: "torch.Tensor", w) -> "torch.Tensor":
        return int4_linear(x, w) if isinstance(w, Quant4Linear) else int8_linear(x, w, self.kernel)

    def screen(self):
        return None  # the screen bounds fp32 head logits; here the head itself is quantised

    def _to_panels(self) -> None:
        """Every int8 weight in the kernel's panel layout (QuantLinear.as_panels; one matrix at a
        time, so the extra memory is the largest one's copy while it is made)."""
        for lyr in self.layers:
            for group in (("wq", "wk", "wv"), ("w_gate", "w_up")):
                parts = [getattr(lyr, name) for name in group]
                fused = parts[0].fused.as_panels()
                for name, part in zip(group, parts):
                    setattr(lyr, name, Part(fused, part.rows))
            lyr.wo, lyr.w_down = lyr.wo.as_panels(), lyr.w_down.as_panels()
        self.qhead = self.qhead.as_panels()

    def _to_huge_pages(self) -> bool:
        """Every quantised weight tensor (codes, scales, sums; the fused ones once) moved into
        one mapping advised for transparent huge pages (`on_huge_pages`), the objects updated in
        place (a Part sees its fused weight's new tensors)."""
        mats = [getattr(w, "fused", w) for lyr in self.layers for w in (lyr.wq, lyr.wk, lyr.wv, lyr.wo, lyr.w_gate,
                                                                      lyr.w_up, lyr.w_down)] + [self.qhead]
        mats = list({id(m): m for m in mats}.values())
        names = [[n for n in ("q", "scale", "sums", "sm") if getattr(m, n, None) is not None] for m in mats]
        moved = on_huge_pages([getattr(m, n) for m, ns in zip(mats, names) for n in ns])
        if moved is None:
            return False
        it = iter(moved)
        for m, ns in zip(mats, names):
            for n in ns:
                setattr(m, n, next(it))
        return True

    def _pointers(self, lyr) -> tuple:
        """A layer's weights as the kernel library's layer call takes them (the tensors stay
        alive: the layer holds them)."""
        qkv, gu = lyr.wq.fused, lyr.w_gate.fused
        norms = (lyr.in_norm, lyr.post_attn_norm, lyr.pre_ff_norm, lyr.post_ff_norm)
        ptrs = [t.data_ptr() for t in norms]
        ptrs += [lyr.q_norm.data_ptr() if lyr.q_norm is not None else None,
                 lyr.k_norm.data_ptr() if lyr.k_norm is not None else None]
        for w in (qkv, lyr.wo, gu, lyr.w_down):
            ptrs += ([w.q.data_ptr(), w.sm.data_ptr(), None] if isinstance(w, Quant4Linear)
                     else [w.q.data_ptr(), w.sums.data_ptr(), w.scale.data_ptr()])
        return (*ptrs, self.n_heads, self.n_kv, self.head_dim, lyr.w_down.shape[1])

    def _table(self) -> tuple:
        """The layers' pointers as `tunix_gemma_layers` takes them: int64 [L, 18] (0 for none)
        and each layer's MLP width, long [L] (kept alive here, with the layers' tensors)."""
        import torch

        args = [self._pointers(lyr) for lyr in self.layers]
        ptrs = torch.tensor([[p or 0 for p in a[:18]] for a in args], dtype=torch.int64)
        widths = torch.tensor([a[21] for a in args], dtype=torch.int64)
        return ptrs.contiguous(), widths.contiguous()

    def _fits(self, b: int, st) -> bool:
        """The state is what the layer call reads and writes in place: the cache index inside
        the buffers, every buffer contiguous fp32 [b, kv_heads, T, head_dim], the mask
        [b, 1, 1, T] (anything else takes the torch ops, which raise where a write would not fit)."""
        import torch

        total = st.mask.shape[-1]
        shape = (b, self.n_kv, total, self.head_dim)
        return (0 <= st.cur < total and tuple(st.mask.shape) == (b, 1, 1, total) and st.mask.is_contiguous()
                and st.mask.dtype == torch.float32 and st.pos.shape == (b,)
                and all(tuple(t.shape) == shape and t.is_contiguous() and t.dtype == torch.float32
                        for t in (*st.keys, *st.values)))

    def _hidden(self, tokens: "torch.Tensor", st) -> "torch.Tensor":
        """The layers on one token per row, each layer one call of the kernel library where it
        applies (`fused`); else LeanGemma's torch ops on the int8 projections. The same
        operations (RMSNorm, q/k norms, RoPE, the cache write, attention with the window, the
        mask and Gemma 2's softcap, GELU-tanh MLP); sums in another order, so logits equal the
        torch ops' to float rounding, not to the bit (tests/eval/test_int8_weights.py)."""
        import ctypes

        import torch
        import torch.nn.functional as F

        from tunix_rt.eval.int8_kernel import decode_library

        if not (self.fused and self._fits(tokens.shape[0], st)):
            return super()._hidden(tokens, st)
        x = (F.embedding(tokens, self.embed) * self.embed_scale).contiguous()  # [B, D]
        rope = {kind: (c[st.pos].contiguous(), s[st.pos].contiguous()) for kind, (c, s) in self._tables.items()}
        lib, threads = decode_library(), torch.get_num_threads()
        b, d = x.shape
        total = st.mask.shape[-1]
        softcap = float(self.attn_softcap or 0.0)
        n = len(self.layers)
        lo = (ctypes.c_long * n)(*[max(0, st.cur + 1 - lyr.window) if lyr.window else 0 for lyr in self.layers])
        ptrs = {kind: (c.data_ptr(), sn.data_ptr()) for kind, (c, sn) in rope.items()}
        cos = (ctypes.c_void_p * n)(*[ptrs[lyr.rope][0] for lyr in self.layers])
        sin = (ctypes.c_void_p * n)(*[ptrs[lyr.rope][1] for lyr in self.layers])
        keys = (ctypes.c_void_p * n)(*[k.data_ptr() for k in st.keys])
        values = (ctypes.c_void_p * n)(*[v.data_ptr() for v in st.values])
        table, widths = self._layer_table
        if lib.tunix_gemma_layers(x.data_ptr(), b, d, n, table.data_ptr(), widths.data_ptr(), keys, values, total,
                                  st.cur, lo, st.mask.data_ptr(), cos, sin, self.n_heads, self.n_kv, self.head_dim,
                                  self.scaling, softcap, self.eps, threads, 2 if getattr(self.qhead, "vnni", False) else 1,
                                  int(self.weights == "int4")) != 0:
            raise MemoryError("int8 kernel: out of memory in a decoder layer")
        st.cur += 1
        st.pos = st.pos + 1
        return self._rms(x, self.final_norm)

    def _head(self, x: "torch.Tensor", reuse: bool = False) -> "torch.Tensor":
        """x @ dequantised(head).T: one int8 matmul over the whole vocabulary (measured
        fastest here: 27 ms against 55 ms in 16K-row chunks for Gemma 3's head at batch 1,
        one thread), or on the dequant path in vocabulary chunks (as LeanGemma's head); a new
        tensor every step (`reuse` is LeanGemma's kernel buffer, not kept here)."""
        import torch

        self._last = (None, None, None)
        if self.weights == "int4":
            return int4_linear(x, self.qhead)
        if self.kernel == "int_mm":
            return int8_linear(x, self.qhead, self.kernel)
        vocab = self.qhead.q.shape[0]
        out = torch.empty((x.shape[0], vocab), dtype=x.dtype, device=x.device)
        for i in range(0, vocab, HEAD_CHUNK):
            part = QuantLinear(self.qhead.q[i: i + HEAD_CHUNK], self.qhead.scale[i: i + HEAD_CHUNK],
                               self.qhead.sums[i: i + HEAD_CHUNK])
            out[:, i: i + HEAD_CHUNK] = int8_linear(x, part, self.kernel)
        return out


HUGE_PAGES_ENV = "TUNIX_RT_HUGE_PAGES"
"""`off` keeps the quantised weights where quantisation made them (`on_huge_pages`)."""
HUGE_ALIGN = 64
"""Each tensor's offset in the mapping: a whole 64-byte vector (the kernels' aligned loads)."""


def on_huge_pages(tensors: "list[torch.Tensor]") -> "list[torch.Tensor] | None":
    """Copies of contiguous CPU tensors in one anonymous mapping advised for transparent huge
    pages (madvise MADV_HUGEPAGE: Linux's default THP mode, `madvise`, gives 2 MB pages only
    where asked), or None where it does not apply (another OS, TUNIX_RT_HUGE_PAGES=off, a
    tensor not contiguous or not on the CPU). Why: a decode step streams every weight once
    (Gemma 3 270M on int4: 168 MB a token, ~41,000 pages of 4 KB, each a TLB miss); in one
    process on a 2-core Xeon (my script, 30 alternating rounds, twice) the 18 layers' int4
    products took 2.80-2.96 ms on 2 MB pages against 3.03-3.21 on 4 KB pages of one such mapping
    (and 3.21-3.28 where quantisation had left them), the head's 4.06-4.19 against 4.15-4.35 ms.
    The mapping lives as long as its tensors (torch.frombuffer holds it)."""
    import mmap
    import os

    import torch

    if (os.environ.get(HUGE_PAGES_ENV, "on") == "off" or not hasattr(mmap, "MADV_HUGEPAGE") or not tensors
            or any(t.device.type != "cpu" or not t.is_contiguous() for t in tensors)):
        return None
    sizes = [t.numel() * t.element_size() for t in tensors]
    offsets, at = [], 0
    for n in sizes:
        offsets.append(at)
        at += -(-n // HUGE_ALIGN) * HUGE_ALIGN
    try:
        mm = mmap.mmap(-1, max(at, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:
        return None
    try:
        mm.madvise(mmap.MADV_HUGEPAGE)
    except OSError:
        pass  # THP off in this kernel: the mapping still holds the weights, on 4 KB pages
    buf = torch.frombuffer(mm, dtype=torch.uint8)
    out = []
    for t, off, n in zip(tensors, offsets, sizes):
        view = buf[off: off + n].view(t.dtype).view(t.shape)
        view.copy_(t)
        out.append(view)
    return out


def fused_layers_apply(step: "Int8Gemma") -> bool:
    """Whether the kernel library can run `step`'s layers whole: loaded here, fp32 weights
    and norms, every projection's input width (hidden, heads x head_dim, MLP) a multiple of 64."""
    import torch

    from tunix_rt.eval.int8_kernel import ALIGN_K, MAX_K, decode_library

    lyr = step.layers[0] if step.layers else None
    if lyr is None or step.embed.dtype != torch.float32 or step.embed.device.type != "cpu":
        return False
    widths = (step.embed.shape[1], step.n_heads * step.head_dim, lyr.w_down.shape[1])
    if any(w % ALIGN_K or w >= MAX_K for w in widths) or step.head_dim % 2:
        return False
    return decode_library() is not None


def use_weights(gen, weights: str) -> object:
    """Switch a TorchGenerator (tunix_rt.eval.generate) to `weights` (int8 or int4): its model
    is quantised in place and its decode steps run through `Int8Gemma`; returns `gen`."""
    gen.lean = Int8Gemma.for_model(gen.model, weights=weights)
    return gen
