"""The JAX generator: batched greedy / sampling decode with the Tunix Gemma model and its KV
cache, implementing `tunix_rt.eval.generate.Generator`.

Our own loop rather than Tunix's sampler: the sampler wants its tokenizer adapter and cache
config; ours reuses the eval stage's contract (prompt ids in, `Generation` out, the same
finish rules and RNG seeding per prompt) and needs nothing but the model.

How a batch decodes: prompts are left-padded to a bucketed length P, the cache holds
S = P + max_new_tokens slots, and every token's position is its slot index. RoPE depends
only on position differences, so the shift by the padding changes no attention score, and
the sliding window (which Tunix measures in slots) stays exact; padding keys are masked.
Prefill computes logits for the last position only (the 262K-vocabulary head over every
prompt position would be [B, P, 262144] floats).

An adapter (PEFT format, from either engine) is merged into the weights before loading.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from tunix_rt.errors import BadInput
from tunix_rt.eval.generate import DecodeConfig, Generation, ToolRow, finish, length_sorted_batches, tool_rows
from tunix_rt.eval.sampling import Key, check_keys

BUCKET = 64


def load_generator(model_dir: Path, adapter_dir: Path | None, tok, device: str = "auto") -> "JaxGenerator":
    """The eval stage's entry point: the model (with the adapter merged in) on `device`."""
    import jax

    from tunix_rt.models.jax_loader import load_model, make_mesh
    from tunix_rt.jax_devices import select_devices

    devices = select_devices(device if device in ("cpu", "gpu", "tpu", "cuda") else "auto")
    mesh = make_mesh({"fsdp": 1, "tp": 1}, devices)
    with jax.set_mesh(mesh):
        if adapter_dir is None:
            model, _ = load_model(model_dir, mesh, "fp32")
        else:
            with tempfile.TemporaryDirectory(prefix="tunix-rt-merged-") as tmp:
                write_merged(Path(model_dir), Path(adapter_dir), Path(tmp))
                model, _ = load_model(tmp, mesh, "fp32")
    return JaxGenerator(model, tok, mesh)


def write_merged(model_dir: Path, adapter_dir: Path, out: Path) -> Path:
    """An HF-layout copy of model_dir in `out` with a PEFT LoRA adapter merged into its
    weights (models.lora)."""
    from safetensors.numpy import save_file

    from tunix_rt.models.lora import merge_adapter

    save_file(merge_adapter(model_dir, adapter_dir), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_bytes((model_dir / "config.json").read_bytes())
    return out


class JaxGenerator:
    """Batched decode with a KV cache on a Tunix Gemma model (see the module docstring)."""

    def __init__(self, model, tok, mesh):
        import jax
        from flax import nnx

        self.tok, self.mesh = tok, mesh
        self.stop_ids = tuple(tok.stop_ids)
        self.graph, self.state = nnx.split(model)
        graph = self.graph

        def pure(fn):  # fn(model, ..., cache) as a function of the state; the cache donated
            def run(state, *args):
                return fn(nnx.merge(graph, state), *args)
            return jax.jit(run, donate_argnums=fn.__code__.co_argcount - 1)

        self._prefill, self._step = pure(_prefill), pure(_decode_step)

    @property
    def model(self):
        from flax import nnx

        return nnx.merge(self.graph, self.state)

    def load(self, model) -> "JaxGenerator":
        """Decode with `model`'s weights from now on (the same model, other weights: a GRPO
        step's current policy): the compiled prefill and decode step are kept."""
        from flax import nnx

        graph, self.state = nnx.split(model)
        if graph != self.graph:
            raise ValueError("JaxGenerator.load: another model (its graph differs)")
        return self

    def generate(self, prompts: Sequence[Sequence[int]], cfg: DecodeConfig,
                 on_tokens: Callable[[int], None] | None = None, *,
                 keys: Sequence[Key] | None = None) -> list[Generation]:
        """`keys`: one sampling key per prompt (default: its index); a prompt's draws come from
        its own generator seeded by (cfg.seed, key), one draw per decode step, so a prompt
        samples the same in any batch (a forced tool id takes its step's draw too)."""
        import jax

        if any(len(p) == 0 for p in prompts):
            raise BadInput("cannot generate from an empty prompt")
        keys = check_keys(keys, len(prompts)) if keys is not None else list(range(len(prompts)))
        out: list[Generation | None] = [None] * len(prompts)
        with jax.set_mesh(self.mesh):
            for batch in length_sorted_batches(prompts, cfg.batch_size):
                rngs = None if cfg.greedy else [np.random.default_rng([cfg.seed, *_parts(keys[i])]) for i in batch]
                tools = tool_rows([prompts[i] for i in batch], cfg, self.tok)
                rows = self._decode_batch([list(prompts[i]) for i in batch], cfg, rngs, on_tokens, tools)
                for r, (i, ids) in enumerate(zip(batch, rows)):
                    out[i] = finish(ids, self.stop_ids, self.tok, cfg.max_new_tokens, tools and tools[r])
        return out  # type: ignore[return-value]

    def _decode_batch(self, prompts, cfg: DecodeConfig, rngs, on_tokens,
                      tools: list[ToolRow] | None = None) -> list[list[int]]:
        """Decode one batch; `tools`: one ToolRow per row, which turns each pick into the id
        the row emits and is fed (see eval.generate.ToolRow)."""
        import jax.numpy as jnp

        b = len(prompts)
        width = -(-max(len(p) for p in prompts) // BUCKET) * BUCKET
        size = width + cfg.max_new_tokens
        ids = np.full((b, width), self.tok.pad_id, np.int32)
        valid = np.zeros((b, size), bool)
        for r, p in enumerate(prompts):
            ids[r, width - len(p):] = p
            valid[r, width - len(p):width] = True
        cache = _init_cache(self.model, b, size)
        logits, cache = self._prefill(self.state, jnp.asarray(ids), jnp.asarray(valid), cache)
        outs: list[list[int]] = [[] for _ in prompts]
        alive = np.ones(b, bool)
        for step in range(cfg.max_new_tokens):
            nxt = _pick(logits, cfg, rngs)
            producing = np.flatnonzero(alive)
            if tools is not None:  # forced ids replace picks
                nxt = np.array(nxt)
                for r in producing:
                    nxt[r] = tools[r].take(int(nxt[r]))
            for r in producing:
                outs[r].append(int(nxt[r]))
                if nxt[r] in self.stop_ids:
                    alive[r] = False
            if on_tokens:
                on_tokens(len(producing))
            if not alive.any() or step == cfg.max_new_tokens - 1:
                break
            valid[:, width + step] = True
            logits, cache = self._step(self.state, jnp.asarray(nxt[:, None].astype(np.int32)),
                                       jnp.int32(width + step), jnp.asarray(valid), cache)
        return outs


def _parts(key: Key) -> tuple[int, ...]:
    """A key as a tuple of ints (k is the same key as (k,))."""
    return key if isinstance(key, tuple) else (key,)


def _init_cache(model, batch: int, size: int) -> dict:
    """Tunix's cache layout: per layer k, v [B, S, K, H] and end_index [B] (left aligned)."""
    import jax.numpy as jnp

    cfg = model.config
    dtype = model.embedder.input_embedding[...].dtype
    shape = (batch, size, cfg.num_kv_heads, cfg.head_dim)
    return {f"layer_{i}": {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype),
                           "end_index": jnp.zeros((batch,), jnp.int32)}
            for i in range(cfg.num_layers)}


def _last_logits(model, h):
    """fp32 logits of the last position, with Gemma 2's final soft cap."""
    import jax.numpy as jnp

    logits = jnp.dot(h[:, -1], model.embedder.input_embedding[...].T, preferred_element_type=jnp.float32)
    cap = getattr(model, "final_logits_softcap", None)
    if cap is not None:
        logits = jnp.tanh(logits / cap) * cap
    return logits


def _prefill(model, ids, valid, cache):
    import jax.numpy as jnp

    b, p = ids.shape
    size = valid.shape[1]
    pos = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32)[None], (b, p))
    causal = jnp.arange(size)[None, :] <= jnp.arange(p)[:, None]  # [P, S]
    mask = causal[None] & valid[:, None, :]
    h, cache = model(ids, pos, cache, mask, return_hidden=True)
    return _last_logits(model, h), cache


def _decode_step(model, token, index, valid, cache):
    import jax.numpy as jnp

    b = token.shape[0]
    pos = jnp.full((b, 1), index, jnp.int32)
    mask = (valid & (jnp.arange(valid.shape[1])[None, :] <= index))[:, None, :]
    h, cache = model(token, pos, cache, mask, return_hidden=True)
    return _last_logits(model, h), cache


def _pick(logits, cfg: DecodeConfig, rngs) -> np.ndarray:
    """Argmax, or a per-prompt draw after temperature, top-k and top-p (as the torch one)."""
    import jax.numpy as jnp

    if cfg.greedy:
        return np.asarray(jnp.argmax(logits, axis=-1))
    z = np.asarray(logits, np.float64) / cfg.temperature
    if cfg.top_k and cfg.top_k < z.shape[-1]:
        kth = np.sort(z, axis=-1)[:, -cfg.top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if cfg.top_p < 1.0:
        order = np.argsort(-p, axis=-1)
        sp = np.take_along_axis(p, order, -1)
        drop_sorted = (np.cumsum(sp, -1) - sp) >= cfg.top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, -1)
        p = np.where(drop, 0.0, p)
        p /= p.sum(-1, keepdims=True)
    return np.array([g.choice(p.shape[-1], p=row) for g, row in zip(rngs, p)])
