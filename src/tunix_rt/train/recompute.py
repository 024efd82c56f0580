"""Activations a decoder layer need not keep: remade in backward from what it keeps anyway
(PyTorch engine).

Autograd keeps what each op needs for its gradient, and in Gemma's blocks several of those
tensors are cheap functions of tensors it keeps regardless:
- a LoRA projection keeps its input for A's gradient; the q/k/v/gate/up projections read an
  RMSNorm's output, and the norm keeps its own input;
- down_proj reads gelu(gate) * up, whose factors the fused MLP op keeps (train.fused_mlp);
- attention keeps the rotated queries and keys, rope(q_norm(q)): q_norm keeps q, and rope's
  cos/sin are kept by rope itself; with a mask, transformers' sdpa repeats k and v to every
  query head first, and keeps the copies (remade from k's recipe and from v).
Here each producer registers its output with the recipe that remakes it (`recipe`), and each
decoder layer runs under saved-tensor hooks (`keep_recipes`): when an op saves a registered
output (or a view of it), autograd keeps the recipe instead, and backward runs it (without
gradient, the producer's own code: the same values to the bit). The output itself is freed as
soon as the forward pass no longer uses it. Every other saved tensor is kept detached (the
same storage): an identity pack hook would tie an op's saved output back to that op, a
reference cycle that frees nothing when a step fails before its backward. (So no double
backward through these layers: nothing here asks for one.)

Measured on Gemma 3 270M (benchmarks/bench_dpo.py's pairs, LoRA r16, 2 x 381 tokens, the
step's peak RSS from its worker, 2-core AVX2 EPYC): the activations kept for backward
754 -> ~500 MiB, peak RSS 2.64 -> 2.39 GiB with the additive sdpa mask (loss.shared_prefix_masks),
losses equal to the bit. What backward spends remaking (benchmarks/bench_torch_vs_trl.py's SFT
batches, 4 x <= 256 tokens, the unpack hook timed): 0.41 s of a ~7 s step, rope's q most of it;
0.87 s before q/k/v shared one remade norm output and rope's recipe stopped rotating a second
full-width tensor.

The wrapped apply_rotary_pos_emb runs rope as one op each way on the CPU where its library
applies (train.fused_rope: transformers' bits), forward and in the recipes alike.
"""

from __future__ import annotations

import threading
import types
import weakref
from typing import Callable

import torch

from tunix_rt.train import fused_rope

#: the transformers classes this applies to: decoder layers run under the hooks, norms register
LAYERS = ("GemmaDecoderLayer", "Gemma2DecoderLayer", "Gemma3DecoderLayer")
NORMS = ("GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm")
#: the modelling modules whose apply_rotary_pos_emb registers its outputs
ROPE_MODULES = ("transformers.models.gemma.modeling_gemma", "transformers.models.gemma2.modeling_gemma2",
                "transformers.models.gemma3.modeling_gemma3")
#: where sdpa attention repeats the key/value heads for a masked call (its outputs are registered)
REPEAT_MODULES = ("transformers.integrations.sdpa_attention",)

_local = threading.local()


def _table() -> dict | None:
    """The registered outputs of this thread (None outside a layer run by keep_recipes)."""
    return getattr(_local, "table", None)


def active() -> bool:
    """Whether this thread is inside a layer run by keep_recipes (a `recipe` registers)."""
    return _table() is not None


class _Remade:
    """A registered output's recipe, shared by every op that saves it (q, k and v read the same
    norm output): remade once for all of them, dropped after the last one's backward."""

    __slots__ = ("fn", "uses", "value")

    def __init__(self, fn):
        self.fn, self.uses, self.value = fn, 0, None

    def take(self) -> torch.Tensor:
        value = self.value
        if value is None:
            with torch.no_grad():
                value = self.fn()
        self.uses -= 1
        self.value = value if self.uses > 0 else None
        return value


class _Recipe:
    """What autograd keeps in place of a saved view of a registered output."""

    __slots__ = ("remade", "size", "stride", "offset")

    def __init__(self, remade, size, stride, offset):
        self.remade, self.size, self.stride, self.offset = remade, size, stride, offset


def _dense(t: torch.Tensor) -> bool:
    """t covers its whole storage from offset 0 (a remade tensor has the same layout)."""
    return t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def recipe(out: torch.Tensor, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    """Register `out` as remade by `fn()` (run without gradient, it must give the same values in
    the same layout) for as long as `out` lives, inside a layer run by keep_recipes; returns
    `out`. Only a dense tensor is registered; it may need no gradient itself (the first
    layer's input under LoRA) and still be kept for an adapter's."""
    table = _table()
    if table is None or not (torch.is_grad_enabled() and _dense(out)):
        return out
    key = out.untyped_storage().data_ptr()

    def gone(ref, key=key):
        if table.get(key, (None,))[0] is ref:
            del table[key]

    table[key] = (weakref.ref(out, gone), out._version, _Remade(fn))
    return out


def remade(t: torch.Tensor) -> Callable[[], torch.Tensor] | None:
    """The recipe of `t` when `t` is a registered output itself (not a view), else None."""
    table = _table()
    e = table.get(t.untyped_storage().data_ptr()) if table is not None else None
    out = e[0]() if e is not None else None
    if out is None or out._version != e[1] or t.size() != out.size() or t.stride() != out.stride():
        return None
    return e[2].fn


def _pack(t: torch.Tensor):
    table = _table()
    e = table.get(t.untyped_storage().data_ptr()) if table is not None and t.layout == torch.strided else None
    if e is not None:
        out = e[0]()
        if out is not None and out._version == e[1] and t.dtype == out.dtype and t.device == out.device:
            e[2].uses += 1
            return _Recipe(e[2], t.size(), t.stride(), t.storage_offset())
    return t.detach()


def _unpack(x):
    if isinstance(x, _Recipe):
        return x.remade.take().as_strided(x.size, x.stride, x.offset)
    return x


def _layer_forward(orig):
    def forward(self, *args, **kwargs):
        if not torch.is_grad_enabled() or _table() is not None:
            return orig(*args, **kwargs)
        _local.table = {}
        try:
            with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
                return orig(*args, **kwargs)
        finally:
            _local.table = None
    return forward


def _norm_forward(orig):
    def forward(self, x):
        out = orig(x)
        if _table() is not None and out is not x:
            recipe(out, lambda: orig(x))
        return out
    return forward


def _rope(orig):
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        if not args and not kwargs and fused_rope.applies(q, cos, sin) and fused_rope.applies(k, cos, sin):
            q2, k2 = fused_rope.rope(q, cos, sin), fused_rope.rope(k, cos, sin)  # transformers' bits, 1 pass
        else:
            q2, k2 = orig(q, k, cos, sin, *args, **kwargs)
        if _table() is not None:
            for src, out in ((q, q2), (k, k2)):
                fn = remade(src)
                if fn is not None:
                    recipe(out, lambda fn=fn: _rope_one(orig, fn(), cos, sin, args, kwargs))
        return q2, k2
    apply_rotary_pos_emb.tunix_rt_recipe = True
    return apply_rotary_pos_emb


def _rope_one(orig, x, cos, sin, args, kwargs):
    """rope's first output alone (its second from one head of x: the least extra work)."""
    if not args and not kwargs and fused_rope.applies(x, cos, sin):
        return fused_rope.rope(x, cos, sin)
    return orig(x, x[:, :1], cos, sin, *args, **kwargs)[0]


def _repeat(orig):
    def repeat_kv(x, n_rep):
        out = orig(x, n_rep)
        if _table() is not None and out is not x:
            fn = remade(x)
            src = x.detach()  # held instead of the n_rep times larger copy
            recipe(out, (lambda: orig(fn(), n_rep)) if fn is not None else (lambda: orig(src, n_rep)))
        return out
    repeat_kv.tunix_rt_recipe = True
    return repeat_kv


def patch_modules() -> None:
    """Each Gemma modelling module's rope and sdpa's head repeat register their outputs
    (idempotent; outside a layer run by keep_recipes they only call through, rope as one op
    where train.fused_rope applies: transformers' bits). keep_recipes calls it; a model under
    gradient checkpointing gets it for the one-op rope alone."""
    import importlib

    for names, attr, wrap in ((ROPE_MODULES, "apply_rotary_pos_emb", _rope), (REPEAT_MODULES, "repeat_kv", _repeat)):
        for name in names:
            try:
                mod = importlib.import_module(name)
            except ImportError:
                continue
            fn = getattr(mod, attr, None)
            if fn is not None and not getattr(fn, "tunix_rt_recipe", False):
                setattr(mod, attr, wrap(fn))


def keep_recipes(model: torch.nn.Module) -> int:
    """Run `model`'s Gemma decoder layers under the hooks, with their norms' and rope's outputs
    registered; call it after any LoRA wrapping, and not with gradient checkpointing (which
    keeps nothing to remake). The number of layers changed (0 for other architectures, which
    keep theirs)."""
    n = 0
    for m in model.modules():
        kind = type(m).__name__
        if kind in NORMS:
            m.forward = types.MethodType(_norm_forward(m.forward), m)
        elif kind in LAYERS:
            m.forward = types.MethodType(_layer_forward(m.forward), m)
            n += 1
    if n:
        patch_modules()
    return n
