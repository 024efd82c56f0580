"""fp32 matrix products on the CPU through oneDNN where torch's own leave half the machine idle
(PyTorch engine, training).

torch's fp32 CPU products (aten::mm, F.linear) call MKL's sgemm. On an AMD CPU MKL runs its
AVX2 code whatever the CPU can do; on a 2-core AMD EPYC with full-width AVX-512 (measured
2026-12-07, 2 threads, GFLOP/s, MKL against oneDNN): a layer's [756, 640] x [640, 2048] 194
against 444, [756, 2048] x [2048, 640] 208 against 458, the head's [338, 640] x [640, 16384]
176 against 427 and its backward [338, 16384] x [16384, 640] 200 against 388 (the weight a
transposed view), rank-16 LoRA products 156-163 against 286-316; XLA:CPU's dot 362-436 on the
same shapes. oneDNN ships in every torch CPU build (`torch.ops.mkldnn._linear_pointwise`,
x @ W^T for a [N, K] W, any strides) and picks its kernels by the instructions the CPU has.
The sums are fp32 (no bf16 or tf32 rounding: `tests/train/test_cpu_matmul.py` holds them
to fp64's within fp32's rounding), in another order than MKL's, so a step's values equal
torch's own to float rounding, not to the bit.

Which library a process uses (`backend()`), decided once and the same for the whole process
(so a resumed run on the same machine repeats its bits):
- `TUNIX_RT_CPU_MATMUL=onednn` or `=mkl` forces one (benchmarks A/B with it);
- otherwise (`auto`) oneDNN on an AMD CPU with AVX-512 (torch's CPU capability), where it
  was measured faster; torch's own (MKL) everywhere else: on Intel CPUs MKL uses their full
  width, and on AVX2-only CPUs nothing was measured.
Where it applies: fp32 tensors on the CPU (`applies`). The training model's nn.Linear layers
and PEFT LoRA layers (`route_linears`; a plain LoRA layer as one fused op, _LoraLinear), a
full fine-tuning run's reference model (so its log-probs equal the policy's at step 0), and
the fused loss head's products (train.loss, train.fused_head, train.kd_loss through `mm`).
So whatever a run computes with its own model goes through them too: its held-out loss, the
prefill of its rollouts and in-run evaluations. `tunix-rt eval`, serving and chat load their
own models and keep torch's products (their logits equal transformers' to the bit); the
rollouts' decode steps have their own kernel (eval.int8_kernel.f32_linear).
"""

from __future__ import annotations

import functools
import os
import types

import torch
import torch.nn as nn

ENV = "TUNIX_RT_CPU_MATMUL"
CHOICES = ("auto", "onednn", "mkl")
SLICE_ROWS = 4096
"""A whole-vocabulary block of logits (a trained head's chunk) is written into its buffer this
many of the head's rows at a time (oneDNN's products have no out=)."""
routed = 0
"""Layers route_linears has given oneDNN's products in this process (benchmarks report it)."""


def _cpu_vendor() -> str:
    """/proc/cpuinfo's vendor_id ('AuthenticAMD', 'GenuineIntel'), '' where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


@functools.lru_cache(maxsize=None)
def backend() -> str:
    """'onednn' or 'mkl' (torch's own products) for this process: see the module docstring."""
    want = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if want not in CHOICES:
        raise ValueError(f"{ENV}={os.environ.get(ENV)!r}: expected one of {', '.join(CHOICES)}")
    if not torch.backends.mkldnn.is_available():
        return "mkl"
    if want != "auto":
        return want
    amd = _cpu_vendor() == "AuthenticAMD"
    return "onednn" if amd and torch.backends.cpu.get_cpu_capability() == "AVX512" else "mkl"


def applies(*ts: torch.Tensor) -> bool:
    """Whether a product of these tensors goes through oneDNN: fp32, on the CPU, plain tensors
    (not a DTensor or another subclass), and this process's backend is oneDNN."""
    return (backend() == "onednn"
            and all(t.device.type == "cpu" and t.dtype == torch.float32
                    and type(t) in (torch.Tensor, nn.Parameter) for t in ts))


def _onednn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ w.T for w [N, K] (any strides), through oneDNN; no autograd."""
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [None], "")


def _autograd(*ts: torch.Tensor) -> bool:
    """Whether autograd would record a product of these (oneDNN's op has no gradient formula)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in ts)


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ b [K, N] (b may be a transposed view), through oneDNN where it applies and no
    gradient is recorded (the loss head's products run inside its Function's forward); empty
    operands go to torch (oneDNN builds no product with an empty side)."""
    if applies(a, b) and a.dim() == 2 and b.dim() == 2 and a.numel() and b.numel() and not _autograd(a, b):
        return _onednn(a, b.t())
    return a @ b


def _onednn_flops(x_shape, *args, **kwargs) -> int:
    """torch.utils.flop_counter's count of one oneDNN product: 2·M·K·N (its add post-op not
    counted, as FlopCounterMode counts no addition). Overloads: (X, W, B, attr, ...) and
    .binary (X, other, W, B, attr)."""
    w_shape = args[0] if isinstance(args[2], str) else args[1]  # .default's attr, or .binary's B
    m = 1
    for d in x_shape[:-1]:
        m *= d
    return 2 * m * x_shape[-1] * w_shape[0]


def _count_flops() -> None:
    """Let FlopCounterMode count oneDNN's products (benchmarks and tests count the FLOPs a step
    runs; tests/benchmarks/test_sft_flops)."""
    from torch.utils.flop_counter import flop_registry, register_flop_formula

    packet = torch.ops.mkldnn._linear_pointwise
    if packet not in flop_registry:
        register_flop_formula(packet)(_onednn_flops)


_count_flops()


class _Linear(torch.autograd.Function):
    """x @ W^T (+ bias) with oneDNN's products forward and backward: dx = dy @ W, and where W
    trains dW = dy^T @ x (x is kept only then)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        ctx.want = ctx.needs_input_grad[:3]  # (x, weight, bias), as _LoraLinear reads its own
        ctx.save_for_backward(x if ctx.want[1] else None, weight)
        y = _onednn(x.reshape(-1, x.shape[-1]), weight)
        if bias is not None:
            y.add_(bias)
        # detached: not a view of the Function's own tensor, so callers may change it in place
        # (PEFT's adapter_names path adds into it), as they may F.linear's output
        return y.view(*x.shape[:-1], weight.shape[0]).detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        dx = dw = db = None
        g = grad.reshape(-1, grad.shape[-1])
        if ctx.want[0]:
            dx = _onednn(g, weight.t()).view(*grad.shape[:-1], weight.shape[1])
        if ctx.want[1]:  # dW = g^T x [N, K]; the narrower factor (a LoRA rank) goes first, as oneDNN's
            xs = x.reshape(-1, x.shape[-1])  # source, which it copies when it is a transposed view
            dw = _onednn(g.t(), xs.t()) if g.shape[1] <= xs.shape[1] else _onednn(xs.t(), g.t()).t()
        if ctx.want[2]:
            db = g.sum(dim=0)
        return dx, dw, db


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through oneDNN (with autograd) where it applies."""
    if applies(x, weight) and (bias is None or applies(bias)) and weight.dim() == 2 and x.dim() >= 1 \
            and x.numel() and weight.numel():  # (oneDNN builds no product with an empty side)
        return _Linear.apply(x, weight, bias)
    return torch.nn.functional.linear(x, weight, bias)


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x, self.weight, self.bias)


def _add_product(x: torch.Tensor, w: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """other + x @ w.T in one oneDNN product (its add post-op): no separate [M, N] add."""
    return torch.ops.mkldnn._linear_pointwise.binary(x, other, w, None, "add")


class _LoraLinear(torch.autograd.Function):
    """x @ W^T + s * (x @ A^T) @ B^T: a plain LoRA layer (frozen base W [N, K], factors A [r, K]
    and B [N, r]) in oneDNN's products. s scales the [M, r] factor, not the [M, N] product (so
    the bits of PEFT's order where s is a power of two, as alpha = 2r makes it; to rounding
    otherwise), and B's product adds onto the base's in the same call, so no [M, N] multiply
    or add runs, forward or backward; autograd keeps x (a recipe where train.recompute
    registered it) and the [M, r] factor."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, s: float):
        x2 = x.reshape(-1, x.shape[-1])
        t = _onednn(x2, a).mul_(s)
        y = _add_product(t, b, _onednn(x2, w))
        ctx.s, ctx.want = s, ctx.needs_input_grad[:4]
        ctx.save_for_backward(x, t, w, a, b)
        return y.view(*x.shape[:-1], w.shape[0]).detach()  # not a view: see _Linear

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, t, w, a, b = ctx.saved_tensors
        g, x2 = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
        dx = dw = da = db = None
        dt = _onednn(g, b.t()).mul_(ctx.s)  # [M, r]
        if ctx.want[0]:  # g @ W + dt @ A
            dx = _add_product(dt, a.t(), _onednn(g, w.t())).view(*x.shape)
        if ctx.want[1]:
            dw = _onednn(x2.t(), g.t()).t()
        if ctx.want[2]:
            da = _onednn(dt.t(), x2.t())  # [r, K] = dt^T x
        if ctx.want[3]:
            db = _onednn(t.t(), g.t()).t()  # [N, r] = g^T (s t)
        return dx, dw, da, db, None


def _plain_lora(m) -> tuple | None:
    """(W, A, B, scaling) of a PEFT LoRA layer that is one plain adapter in use (not merged, not
    disabled, no dropout in effect, no DoRA or other variant, no biases), else None."""
    if m.disable_adapters or m.merged:
        return None
    active = [n for n in m.active_adapters if n in m.lora_A]
    if len(active) != 1 or active[0] in getattr(m, "lora_variant", {}):
        return None
    name = active[0]
    base, a, b, drop = m.base_layer, m.lora_A[name], m.lora_B[name], m.lora_dropout[name]
    if not (type(base) is nn.Linear and type(a) is nn.Linear and type(b) is nn.Linear):
        return None
    if base.bias is not None or a.bias is not None or b.bias is not None:
        return None
    if not (isinstance(drop, nn.Identity) or not drop.training or getattr(drop, "p", 1.0) == 0.0):
        return None
    return base.weight, a.weight, b.weight, float(m.scaling[name])


def _lora_forward(orig):
    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        parts = None if args or kwargs or not x.numel() else _plain_lora(self)
        if parts is None or not applies(x, *parts[:3]):
            return orig(self, x, *args, **kwargs)
        return _LoraLinear.apply(x, *parts)
    return forward


def route_linears(model: nn.Module) -> int:
    """When the process's backend is oneDNN: give every plain nn.Linear of `model` whose weight
    is fp32 on the CPU oneDNN's product (checked again at each call: a layer moved elsewhere
    falls back to F.linear), and every PEFT LoRA layer the fused _LoraLinear where it is one
    plain adapter in use (checked at each call: anything else, PEFT's own forward, through
    the routed factors); the number of layers changed."""
    if backend() != "onednn":
        return 0
    try:
        from peft.tuners.lora.layer import Linear as LoraLayer
    except ImportError:  # no PEFT: no LoRA layers to find
        LoraLayer = None
    n = 0
    for m in model.modules():
        if type(m) is nn.Linear and applies(m.weight):
            m.forward = types.MethodType(_forward, m)
            n += 1
        elif LoraLayer is not None and type(m) is LoraLayer:
            m.forward = types.MethodType(_lora_forward(type(m).forward), m)
            n += 1
    global routed
    routed += n
    return n
