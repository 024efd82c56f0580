"""A lean decode step for the Gemma 3 and Gemma 2 architectures, on a transformers model's
own weights.

Why: at batch 8 a decode step of Gemma 3 270M is memory-bound (about 1 GB of fp32 weights
read per token), and transformers' forward adds a large eager overhead around the matmuls:
masks rebuilt every step, the DynamicCache concatenated (every layer's K/V copied each
token), RoPE recomputed, the generate machinery. This module keeps only the arithmetic.

What it keeps identical to transformers' eager forward (so greedy ids match HF `generate`):
the same fp32 operations in the same order for RMSNorm (x * rsqrt(mean(x²) + eps) * (1 + w)),
q/k norms, RoPE (its cos/sin come from the model's own rotary module, tabulated once),
attention (scores * scaling, softcap on Gemma 2, additive mask with the dtype's minimum,
softmax in fp32, then @ V), the MLP, the final norm, the tied head and Gemma 2's final
softcap. Sliding-window layers see the last `sliding_window` cache entries, as
transformers' sliding cache does. Prefill stays with the transformers model's decoder (one call;
the first token comes from its last hidden state through this step's head, `pick_next`);
its cache is copied once into a preallocated [B, kv_heads, T, head_dim] buffer per layer
that each step writes in place.

A projection that PEFT adapted with plain LoRA (a training run's live adapter) is applied as
PEFT's own forward applies it in eval mode, x @ W.T + B(A(x)) * scaling (`LoraWeight`): no
merged copy of W + scale * B @ A is made (on Gemma 3 270M that copy was 0.4 GB, held for a
whole rollout, and the peak of a GRPO step), the factors are read live, and a rollout's
numbers are those of the policy the update trains.

With `f32_kernel` (an RL run's rollouts and in-run evals: train.torch_engine's live generator)
every projection of up to 8 rows, its adapter included, is one call of the kernel library's
fp32 product (eval.int8_kernel.f32_linear; AVX-512 or AVX2), and the screened head rescores on
that kernel's logits (ScreenedArgmax.kernel_view), or, where no screen applies (a CPU without
the int8 kernel), the head is that product too: the same arithmetic with the sums in another fixed order,
so not transformers' bits; a GRPO step of bench_grpo's shape took 29.2 s against 40.4 (its
rollouts 13.2 against 23.7 s) on the 2-core EPYC. Eval, serving and chat keep the exact path.

`LeanGemma.for_model(model)` returns None for anything else (another architecture, a model
still wrapped by PeftModel, an adapter kind other than plain LoRA), and the caller keeps the
plain transformers path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SUPPORTED = ("gemma3_text", "gemma2")
SEQ_DEPENDENT_ROPE = {"dynamic", "longrope"}
HEAD_CHUNK = 4096
"""Vocabulary rows per head matmul (measured fastest of 4K/16K/64K on the 2-core CPU)."""


@dataclass(frozen=True)
class LoraWeight:
    """A projection with a live plain-LoRA adapter: y = x @ base.T + ((x @ a.T) @ b.T) * scale,
    PEFT's own order of operations in eval mode (so the same bits as its forward at the same
    shapes); the tensors are the module's parameters themselves (no copies)."""

    base: "torch.Tensor"
    a: "torch.Tensor"  # [r, in]
    b: "torch.Tensor"  # [out, r]
    scale: float

    def __call__(self, x: "torch.Tensor") -> "torch.Tensor":
        import torch.nn.functional as F

        return F.linear(x, self.base) + F.linear(F.linear(x, self.a), self.b) * self.scale


def projection(mod) -> "torch.Tensor | LoraWeight":
    """The weight a decode step multiplies by for one nn.Linear projection: its weight, or a
    LoraWeight for a PEFT LoRA layer with one active plain adapter (its base weight alone when
    the adapters are disabled). ValueError for what is not served here (a bias, DoRA or another
    variant, several active adapters, an adapter merged in place, a non-Linear base)."""
    import torch.nn as nn

    base = getattr(mod, "base_layer", None)
    if base is None:
        if type(mod).__name__ != "Linear" or mod.bias is not None:
            raise ValueError("unexpected projection")
        return mod.weight
    if type(base) is not nn.Linear or base.bias is not None or getattr(mod, "merged", False):
        raise ValueError("unexpected LoRA layer")
    if mod.disable_adapters:
        return base.weight
    active = [a for a in mod.active_adapters if a in mod.lora_A]
    if len(active) != 1 or active[0] in getattr(mod, "lora_variant", {}):
        raise ValueError("not one plain LoRA adapter")
    name = active[0]
    a, b = mod.lora_A[name], mod.lora_B[name]
    if type(a) is not nn.Linear or type(b) is not nn.Linear or a.bias is not None or b.bias is not None:
        raise ValueError("unexpected LoRA factors")
    if a.weight.dtype != base.weight.dtype or b.weight.dtype != base.weight.dtype:
        raise ValueError("LoRA factors in another dtype than the base weight")
    return LoraWeight(base.weight, a.weight, b.weight, float(mod.scaling[name]))


@dataclass
class _Layer:
    """One decoder layer's weights (the model's parameters themselves, no copies) and kind."""

    in_norm: "torch.Tensor"  # 1 + weight, as Gemma's RMSNorm applies it
    post_attn_norm: "torch.Tensor"
    pre_ff_norm: "torch.Tensor"
    post_ff_norm: "torch.Tensor"
    q_norm: "torch.Tensor | None"  # Gemma 3 only
    k_norm: "torch.Tensor | None"
    wq: "torch.Tensor | LoraWeight"
    wk: "torch.Tensor | LoraWeight"
    wv: "torch.Tensor | LoraWeight"
    wo: "torch.Tensor | LoraWeight"
    w_gate: "torch.Tensor | LoraWeight"
    w_up: "torch.Tensor | LoraWeight"
    w_down: "torch.Tensor | LoraWeight"
    window: int | None  # sliding window, or None for global attention
    rope: str  # key into the RoPE tables


@dataclass
class DecodeState:
    """A batch in flight: the preallocated cache, the padding mask, where each row is."""

    keys: list["torch.Tensor"]  # per layer [B, kv_heads, T, head_dim]
    values: list["torch.Tensor"]
    mask: "torch.Tensor"  # [B, 1, 1, T] additive: 0 for real tokens, dtype min for pads
    pos: "torch.Tensor"  # [B] RoPE position of the next token (counts real tokens only)
    cur: int  # cache index the next token is written to (same for every row)

    def select(self, keep: "torch.Tensor") -> None:
        """Keep only the rows in `keep` (distinct indices; finished rows leave the batch).

        In place: each kept row that must move is copied down over a finished one, and only
        its written entries (`:cur`), then every buffer becomes a view of its first rows. An
        index_select of every layer's whole [B, kv, T, hd] buffer (future entries included)
        took about a decode step's time per removal in a profile on the 2-core CPU (under
        load); here rows before the first finished one do not move at all."""
        import torch

        idx = keep.tolist()
        moved = [(j, r) for j, r in enumerate(idx) if j != r]
        if moved:
            dst = torch.tensor([j for j, _ in moved], device=keep.device)
            src = torch.tensor([r for _, r in moved], device=keep.device)
            for buf in (*self.keys, *self.values):  # gather first, then write: rows never overlap mid-copy
                buf[dst, :, : self.cur] = buf[src, :, : self.cur]
        n = len(idx)
        self.keys = [k[:n] for k in self.keys]
        self.values = [v[:n] for v in self.values]
        self.mask, self.pos = self.mask.index_select(0, keep), self.pos.index_select(0, keep)


class LeanGemma:
    """The decode step; build with `LeanGemma.for_model(model)`."""

    def __init__(self, model, f32_kernel: bool = False):
        import torch

        cfg = model.config
        inner = model.model
        self.model = model
        self.eps = cfg.rms_norm_eps
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scaling = cfg.query_pre_attn_scalar ** -0.5
        self.attn_softcap = getattr(cfg, "attn_logit_softcapping", None)
        self.final_softcap = getattr(cfg, "final_logit_softcapping", None)
        self.embed = inner.embed_tokens.weight
        self.embed_scale = inner.embed_tokens.embed_scale.to(self.embed.dtype)
        self.head = model.lm_head.weight
        self.final_norm = 1.0 + inner.norm.weight.float()
        self.gemma3 = cfg.model_type == "gemma3_text"
        self.layers = [self._layer(cfg, i, lyr) for i, lyr in enumerate(inner.layers[: cfg.num_hidden_layers])]
        self.lora = any(isinstance(w, LoraWeight) for lyr in self.layers for w in _weights(lyr))
        """Whether some projection carries a live LoRA adapter."""
        self.rotary = inner.rotary_emb
        self._tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._screen = False  # not built yet (None: does not apply)
        self._logit_buf: "torch.Tensor | None" = None  # the kernel's head logits, step after step
        self._screen_version = self._head_version()
        self.f32_kernel = f32_kernel and self.embed.device.type == "cpu" and self.embed.dtype == torch.float32
        """Whether the projections of up to 8 rows go through the kernel library's fp32
        product (`int8_kernel.f32_linear`, adapter included) where it loaded: about twice
        torch's speed at a decode step's shapes, the same sums in another order, so logits equal
        the torch ops' to float rounding, not to the bit (an RL run's rollouts use it; eval,
        serving and chat keep transformers' bits)."""

    @classmethod
    def for_model(cls, model, f32_kernel: bool = False) -> "LeanGemma | None":
        """The lean step for a Gemma 3 / Gemma 2 causal LM (plain, merged, or with live plain
        LoRA adapters on its projections), else None. `f32_kernel`: see the attribute."""
        import torch.nn as nn

        cfg = getattr(model, "config", None)
        if getattr(cfg, "model_type", None) not in SUPPORTED or not hasattr(model, "lm_head"):
            return None
        if not hasattr(getattr(model, "model", None), "layers"):
            return None
        kinds = getattr(model.model.rotary_emb, "rope_type", "default")
        if set(kinds.values() if isinstance(kinds, dict) else [kinds]) & SEQ_DEPENDENT_ROPE:
            return None  # cos/sin would depend on the sequence length: no fixed table
        if type(model.lm_head) is not nn.Linear or model.lm_head.bias is not None:
            return None  # a PEFT layer or anything unexpected: keep transformers' forward
        if hasattr(model.model.embed_tokens, "base_layer"):
            return None  # an adapted embedding
        try:
            return cls(model, f32_kernel=f32_kernel)
        except ValueError:
            return None

    def _layer(self, cfg, i: int, lyr) -> _Layer:
        att, mlp = lyr.self_attn, lyr.mlp
        sliding = cfg.layer_types[i] == "sliding_attention"

        def n(norm):
            return 1.0 + norm.weight.float()

        return _Layer(
            in_norm=n(lyr.input_layernorm), post_attn_norm=n(lyr.post_attention_layernorm),
            pre_ff_norm=n(lyr.pre_feedforward_layernorm), post_ff_norm=n(lyr.post_feedforward_layernorm),
            q_norm=n(att.q_norm) if self.gemma3 else None, k_norm=n(att.k_norm) if self.gemma3 else None,
            wq=projection(att.q_proj), wk=projection(att.k_proj), wv=projection(att.v_proj),
            wo=projection(att.o_proj), w_gate=projection(mlp.gate_proj), w_up=projection(mlp.up_proj),
            w_down=projection(mlp.down_proj),
            window=cfg.sliding_window if sliding else None,
            rope=cfg.layer_types[i] if self.gemma3 else "default",
        )

    # -----------------------------------------------------------------------------------
    # Setup

    def rope_tables(self, n_pos: int) -> dict[str, tuple["torch.Tensor", "torch.Tensor"]]:
        """cos/sin [n_pos, head_dim] per RoPE kind, from the model's own rotary module (the
        same fp32 formula transformers evaluates each step), grown on demand."""
        import torch

        have = next(iter(self._tables.values()))[0].shape[0] if self._tables else 0
        if have < n_pos:
            pos = torch.arange(n_pos, device=self.embed.device)[None, :]
            probe = self.embed[:1]
            kinds = sorted({lyr.rope for lyr in self.layers})
            for kind in kinds:
                cos, sin = self.rotary(probe, pos, kind) if self.gemma3 else self.rotary(probe, pos)
                self._tables[kind] = (cos[0], sin[0])
        return self._tables

    def start(self, cache, attn_mask: "torch.Tensor", next_pos: "torch.Tensor", max_new: int) -> DecodeState:
        """Copy a transformers prefill cache (prompt width L) into preallocated buffers of
        L + max_new entries; sliding layers hold only their window's tail, placed at the end."""
        import torch

        b, width = attn_mask.shape
        total = width + max_new
        keys, values = [], []
        for layer in cache.layers:
            k, v = layer.keys, layer.values
            kb = k.new_zeros((b, k.shape[1], total, k.shape[3]))
            vb = v.new_zeros((b, v.shape[1], total, v.shape[3]))
            kb[:, :, width - k.shape[2]: width] = k
            vb[:, :, width - v.shape[2]: width] = v
            keys.append(kb)
            values.append(vb)
        dtype = self.embed.dtype
        mask = torch.zeros((b, 1, 1, total), dtype=dtype, device=attn_mask.device)
        mask[:, 0, 0, :width].masked_fill_(attn_mask == 0, torch.finfo(dtype).min)
        self.rope_tables(int(next_pos.max()) + max_new + 1)
        return DecodeState(keys, values, mask, next_pos.clone(), width)

    # -----------------------------------------------------------------------------------
    # The step

    def _rms(self, x: "torch.Tensor", w: "torch.Tensor") -> "torch.Tensor":
        import torch

        if self.f32_kernel:  # an RL run's rollouts: one C pass (transformers' values to fp32 rounding)
            from tunix_rt.train import cpu_kernels

            if cpu_kernels.applies(x, w):
                return cpu_kernels.rms_norm(x, w, self.eps)[0]
        xf = x.float()  # as transformers' Gemma RMSNorm: fp32 inside, the input's dtype out
        return ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)) * w).to(x.dtype)

    def step(self, tokens: "torch.Tensor", st: DecodeState) -> "torch.Tensor":
        """Feed one token per row ([B]); returns the next-token logits [B, vocab] (fp32)."""
        return self._logits(self._hidden(tokens, st))

    def step_pick(self, tokens: "torch.Tensor", st: DecodeState, cfg, noise) -> "torch.Tensor":
        """Feed one token per row; returns the next token of each row ([B]): greedy when
        `cfg.greedy`, else drawn with the Gumbel noise (a [B, vocab] tensor or a lazy
        `sampling.Noise`, tunix_rt.eval.sampling).
        The same ids as `step(...)` then argmax / `sample_full`, through the int8-screened
        head where it applies (tunix_rt.eval.screened_head: a proven bound, then exact fp32
        logits)."""
        return self.pick_next(self._hidden(tokens, st), cfg, noise)

    def pick_next(self, x: "torch.Tensor", cfg, noise) -> "torch.Tensor":
        """The next token of each row from its last hidden state x [B, D] (after the final
        norm): step_pick's head and pick, which the prefill's last position takes too
        (TorchGenerator: the int8 screen or the quantised head instead of a full fp32 head)."""
        from tunix_rt.eval.int8_kernel import argmax
        from tunix_rt.eval.sampling import sample_full

        screen = self.screen()
        if screen is not None and self.f32_kernel:
            screen = screen.kernel_view()  # its rescoring on the kernel's logits, as the projections
        if screen is not None:
            return screen.argmax(x) if cfg.greedy else screen.sample(x, noise, cfg)
        logits = self._logits(x, reuse=True)  # read only here: the step's buffer may be the last step's
        return argmax(logits) if cfg.greedy else sample_full(logits, noise, cfg)

    def _logits(self, x: "torch.Tensor", reuse: bool = False) -> "torch.Tensor":
        import torch

        logits = self._head(x, reuse)
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits

    def screen(self):
        """The int8 screen of the head, or None where it does not apply (not CPU fp32, small
        vocabulary, non-finite weights, an int8 kernel that saturates). Built on first use
        (~1 s, an fp32 |head| temporary and an int8 copy of the head) and again whenever the
        head was changed in place since (an optimizer step, load_state_dict: its version
        counter moved), so a screen never bounds weights that are gone. Shared by every
        decoder of the same head tensor at the same version (`_SCREENS`): an RL run's
        rollouts and held-out decodes, a new generator each step, build it once while the
        head is frozen (LoRA)."""
        version = self._head_version()
        if self._screen is False or version != self._screen_version:
            self._screen = _shared_screen(self.head, version, self.final_softcap)
            self._screen_version = version
        return self._screen

    def _head_version(self) -> int | None:
        """The head's in-place version counter; None for an inference tensor (made under
        torch.inference_mode), which keeps none."""
        try:
            return self.head._version
        except RuntimeError:
            return None

    def _hidden(self, tokens: "torch.Tensor", st: DecodeState) -> "torch.Tensor":
        """Run the layers on one token per row and advance the state; the final-normed
        hidden state [B, D]."""
        import torch.nn.functional as F

        if st.cur >= st.mask.shape[-1]:  # a write past the buffers' end would be dropped silently
            raise RuntimeError(f"decode state full: all {st.mask.shape[-1]} cache entries written (start() "
                               "allots max_new entries after the prompt)")
        x = F.embedding(tokens[:, None], self.embed) * self.embed_scale  # [B, 1, D]
        rope = {kind: (c[st.pos][:, None, None, :].to(x.dtype), s[st.pos][:, None, None, :].to(x.dtype))
                for kind, (c, s) in self._tables.items()}  # fp32 tables, cast as transformers does
        for i, lyr in enumerate(self.layers):
            x = self._layer_step(x, lyr, st.keys[i], st.values[i], st, rope[lyr.rope])
        st.cur += 1
        st.pos = st.pos + 1
        return self._rms(x[:, 0], self.final_norm)

    def _head(self, x: "torch.Tensor", reuse: bool = False) -> "torch.Tensor":
        """x @ head.T in vocabulary chunks: the same sums per logit (bit-identical to one
        matmul, checked in the tests) but each chunk's packed weights stay in cache, where
        one [B, 640] x [640, 262144] matmul streams the whole head through memory twice.
        With `f32_kernel` (where no screen applies: a CPU without the int8 kernel), one call
        of the kernel library's product instead, the logits a screen's kernel_view decides
        on (Gemma 3 270M's head at 8 rows on a 2-core AVX2 EPYC: 39 ms against torch's 109),
        written into one buffer kept for the next step where `reuse` (the caller reads it within
        the step)."""
        import torch

        if self.f32_kernel:
            from tunix_rt.eval.int8_kernel import f32_applies, f32_linear

            if f32_applies(x, self.head):
                shape = (x.shape[0], self.head.shape[0])
                if not reuse:
                    return f32_linear(x, self.head)
                if self._logit_buf is None or self._logit_buf.shape != shape:
                    self._logit_buf = torch.empty(shape, dtype=torch.float32)
                return f32_linear(x, self.head, out=self._logit_buf)
        vocab = self.head.shape[0]
        out = torch.empty((x.shape[0], vocab), dtype=x.dtype, device=x.device)
        for i in range(0, vocab, HEAD_CHUNK):
            torch.mm(x, self.head[i: i + HEAD_CHUNK].t(), out=out[:, i: i + HEAD_CHUNK])
        return out

    def linear(self, x: "torch.Tensor", w) -> "torch.Tensor":
        """x @ w.T for one of a layer's projections, its adapter added for a LoraWeight (a
        hook: tunix_rt.eval.int8_weights passes its int8 weights here instead); through the
        kernel library where `f32_kernel` is set and the shapes are its own."""
        import torch.nn.functional as F

        if self.f32_kernel:
            from tunix_rt.eval.int8_kernel import f32_applies, f32_linear

            flat = x.reshape(-1, x.shape[-1])
            base = w.base if isinstance(w, LoraWeight) else w
            if f32_applies(flat, base) and (not isinstance(w, LoraWeight)
                                             or (w.a.is_contiguous() and w.b.is_contiguous())):
                y = (f32_linear(flat, base, w.a, w.b, w.scale) if isinstance(w, LoraWeight)
                     else f32_linear(flat, base))
                return y.view(*x.shape[:-1], base.shape[0])
        return w(x) if isinstance(w, LoraWeight) else F.linear(x, w)

    def _layer_step(self, x, lyr: _Layer, kc, vc, st: DecodeState, rope) -> "torch.Tensor":
        import torch.nn.functional as F

        b, hd = x.shape[0], self.head_dim
        h = self._rms(x, lyr.in_norm)
        q = self.linear(h, lyr.wq).view(b, 1, self.n_heads, hd).transpose(1, 2)  # [B, H, 1, hd]
        k = self.linear(h, lyr.wk).view(b, 1, self.n_kv, hd).transpose(1, 2)
        v = self.linear(h, lyr.wv).view(b, 1, self.n_kv, hd).transpose(1, 2)
        if lyr.q_norm is not None:
            q, k = self._rms(q, lyr.q_norm), self._rms(k, lyr.k_norm)
        q, k = self._rope(q, k, *rope)
        cur = st.cur
        kc[:, :, cur: cur + 1] = k
        vc[:, :, cur: cur + 1] = v
        lo = max(0, cur + 1 - lyr.window) if lyr.window else 0
        attn = self._attend(q, kc[:, :, lo: cur + 1], vc[:, :, lo: cur + 1], st.mask[..., lo: cur + 1])
        x = x + self._rms(self.linear(attn, lyr.wo), lyr.post_attn_norm)
        h = self._rms(x, lyr.pre_ff_norm)
        m = self.linear(self._gelu_mul(self.linear(h, lyr.w_gate), self.linear(h, lyr.w_up)), lyr.w_down)
        return x + self._rms(m, lyr.post_ff_norm)

    def _rope(self, q, k, cos, sin):
        """q, k [B, H, 1, hd] rotated by cos, sin [B, 1, 1, hd]; with `f32_kernel`, one C pass each
        (train.cpu_kernels.rope: transformers' formula, its bits)."""
        if self.f32_kernel:
            from tunix_rt.train import cpu_kernels

            c3, s3 = cos[:, 0], sin[:, 0]  # [B, 1, hd]
            if cpu_kernels.applies(q, c3, s3) and cpu_kernels.applies(k) and c3.is_contiguous() and s3.is_contiguous():
                return cpu_kernels.rope(q, c3, s3), cpu_kernels.rope(k, c3, s3)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin

    def _gelu_mul(self, gate, up):
        """gelu(gate, tanh) * up; with `f32_kernel`, one C pass (train.cpu_kernels: transformers'
        values to fp32 rounding)."""
        import torch.nn.functional as F

        if self.f32_kernel:
            from tunix_rt.train import cpu_kernels

            if gate.shape == up.shape and cpu_kernels.applies(gate, up):
                return cpu_kernels.gelu_tanh_mul(gate, up)
        return F.gelu(gate, approximate="tanh") * up

    def _attend(self, q, keys, values, mask) -> "torch.Tensor":
        """One query per row against the cached keys; [B, 1, H * hd]. The query heads that
        share a KV head are one [rep, hd] @ [hd, S] matmul against the cache slice itself
        (transformers' repeat_kv would copy every layer's keys and values 4 times a step)."""
        import torch

        b, rep = q.shape[0], self.n_heads // self.n_kv
        q = q.reshape(b, self.n_kv, rep, self.head_dim)
        scores = torch.matmul(q, keys.transpose(2, 3)) * self.scaling  # [B, kv, rep, S]
        if self.attn_softcap is not None:
            scores = torch.tanh(scores / self.attn_softcap) * self.attn_softcap
        probs = torch.softmax(scores + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, values).reshape(b, 1, -1)  # heads in transformers' order


def _weights(lyr: _Layer) -> tuple:
    return (lyr.wq, lyr.wk, lyr.wv, lyr.wo, lyr.w_gate, lyr.w_up, lyr.w_down)


def _rotate_half(x: "torch.Tensor") -> "torch.Tensor":
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


#: id(head tensor) -> (weakref to it, its version, where its data is, its screen): one screen
#: per head version and storage
_SCREENS: dict[int, tuple] = {}


def _storage(head) -> tuple:
    """Where the head's numbers are: `module.to(...)` (another device or dtype) swaps a
    parameter's data without moving its version counter, so the version alone would hand a
    CPU screen to a head that now lives on the GPU."""
    return head.device, head.dtype, head.data_ptr()


def _shared_screen(head, version: int | None, softcap):
    import weakref

    from tunix_rt.eval.screened_head import ScreenedArgmax

    key = id(head)
    hit = _SCREENS.get(key)
    if hit is not None and hit[0]() is head and version is not None and hit[1:3] == (version, _storage(head)):
        return hit[3]
    screen = ScreenedArgmax.build(head.detach(), softcap)
    if version is not None:  # an inference tensor keeps no version: nothing proves it unchanged
        _SCREENS[key] = (weakref.ref(head, lambda _r, k=key: _SCREENS.pop(k, None)), version, _storage(head), screen)
    return screen

