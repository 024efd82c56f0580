"""A google-tunix model from an HF-layout model directory (config.json + safetensors).

Tunix's safetensors loaders ignore config.json: they need a `ModelConfig` that matches the
weights. We build it from the directory's config.json (the same file transformers reads), so
the real presets and the tiny test presets load through one path. Two things Tunix 0.1.7
hard-codes are fixed here from config.json:

- Gemma 3's attention pattern: Tunix cycles 5 sliding + 1 global layers; we take the
  per-layer `layer_types` (the tiny preset alternates sliding/global every 2 layers).
- Gemma 1's norm names: HF calls the pre-MLP norm `post_attention_layernorm`; Tunix's
  Gemma loader maps that name to Gemma 2's post-attention norm, so we remap it.

Never reads gs:// or a hub: only local files.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from pathlib import Path
from typing import Any

from tunix_rt.errors import BadInput
from tunix_rt.models import tunix_lean

tunix_lean.install()  # before any tunix module: tunix/__init__.py imports every trainer (and torch)

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
FAMILIES = {"gemma3_text": "gemma3", "gemma3": "gemma3", "gemma2": "gemma2", "gemma": "gemma"}


def read_hf_config(model_dir: str | Path) -> dict[str, Any]:
    """config.json of a model directory, with the text config of a multimodal Gemma 3."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise BadInput(f"{model_dir}: not an HF-layout model directory (no config.json)")
    cfg = json.loads(path.read_text(encoding="utf-8"))
    if cfg.get("model_type") == "gemma3" and "text_config" in cfg:
        cfg = {**cfg["text_config"], "model_type": "gemma3_text"}
    if not list(Path(model_dir).glob("*.safetensors")):
        raise BadInput(f"{model_dir}: no *.safetensors weights")
    return cfg


def family_of(hf: dict[str, Any]) -> str:
    try:
        return FAMILIES[hf["model_type"]]
    except KeyError:
        raise BadInput(
            f"model_type {hf.get('model_type')!r} is not supported by the JAX engine; "
            f"supported: {sorted(FAMILIES)}"
        ) from None


def _rope_theta(hf: dict[str, Any], layer_type: str, default: float) -> float:
    """rope_theta from a transformers 4 (flat) or 5 (rope_parameters) config."""
    params = hf.get("rope_parameters") or {}
    if layer_type in params:
        return float(params[layer_type]["rope_theta"])
    if "rope_theta" in params:
        return float(params["rope_theta"])
    if layer_type == "sliding_attention" and "rope_local_base_freq" in hf:
        return float(hf["rope_local_base_freq"])
    return float(hf.get("rope_theta", default))


def _rope_factor(hf: dict[str, Any]) -> float:
    """Linear RoPE scaling of the global layers (Gemma 3 4B and up use 8)."""
    params = hf.get("rope_parameters") or {}
    scaling = params.get("full_attention", params) if isinstance(params, dict) else {}
    scaling = scaling if scaling.get("rope_type", "default") != "default" else hf.get("rope_scaling") or {}
    if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default", "linear"):
        raise BadInput(f"RoPE scaling {scaling} is not supported by Tunix's Gemma 3")
    return float(scaling.get("factor", 1.0)) if scaling else 1.0


def layer_types(hf: dict[str, Any]) -> list[str]:
    n = int(hf["num_hidden_layers"])
    types = hf.get("layer_types")
    if types is None:  # Gemma 2 before layer_types: sliding, global, sliding, ...
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    if len(types) != n:
        raise BadInput(f"config.json: {len(types)} layer_types for {n} layers")
    return list(types)


def _check_query_scale(hf: dict[str, Any]) -> str:
    """Tunix scales queries by 1/sqrt(head_dim) or 1/sqrt(width/heads); say which."""
    q = hf.get("query_pre_attn_scalar", hf["head_dim"])
    if q == hf["head_dim"]:
        return "head_dim"
    if q == hf["hidden_size"] // hf["num_attention_heads"]:
        return "embed_div_heads"
    raise BadInput(f"query_pre_attn_scalar={q} is neither head_dim nor width/heads")


def _shape_fields(hf: dict[str, Any]) -> dict[str, int]:
    """The sizes both Tunix ModelConfigs (Gemma 3, Gemma 1/2) take, from config.json."""
    return {
        "num_layers": int(hf["num_hidden_layers"]), "num_embed": int(hf["vocab_size"]),
        "embed_dim": int(hf["hidden_size"]), "hidden_dim": int(hf["intermediate_size"]),
        "num_heads": int(hf["num_attention_heads"]), "head_dim": int(hf["head_dim"]),
        "num_kv_heads": int(hf["num_key_value_heads"]),
    }


def gemma3_config(hf: dict[str, Any], param_dtype, remat: bool):
    from tunix.models.gemma3 import model as g3

    scale = _check_query_scale(hf)
    return g3.ModelConfig(
        **_shape_fields(hf),
        sliding_window_size=int(hf["sliding_window"]),
        local_base_frequency=_rope_theta(hf, "sliding_attention", 10_000.0),
        global_base_frequency=_rope_theta(hf, "full_attention", 1_000_000.0),
        global_scale_factor=_rope_factor(hf),
        query_pre_attn_norm=(
            g3.QueryPreAttentionNormalisation.BY_ONE_OVER_SQRT_HEAD_DIM
            if scale == "head_dim"
            else g3.QueryPreAttentionNormalisation.BY_ONE_OVER_SQRT_EMBED_DIM_DIV_NUM_HEADS
        ),
        remat_config=g3.RematConfig.DECODER if remat else g3.RematConfig.NONE,
        param_dtype=param_dtype,
    )


def gemma_config(hf: dict[str, Any], remat: bool):
    """Gemma 1 and Gemma 2 share Tunix's `tunix.models.gemma` code."""
    from tunix.models.gemma import model as g

    if _check_query_scale(hf) != "head_dim":
        raise BadInput("Tunix's Gemma 1/2 scales queries by 1/sqrt(head_dim) only")
    gemma2 = hf["model_type"] == "gemma2"
    kinds = {"sliding_attention": g.AttentionType.LOCAL_SLIDING, "full_attention": g.AttentionType.GLOBAL}
    types = layer_types(hf) if gemma2 else ["full_attention"] * int(hf["num_hidden_layers"])
    if _rope_theta(hf, "full_attention", 10_000.0) != 10_000.0:
        raise BadInput("Tunix's Gemma 1/2 uses rope_theta 10000 only")
    return g.ModelConfig(
        **_shape_fields(hf),
        final_logit_softcap=hf.get("final_logit_softcapping") if gemma2 else None,
        use_post_attn_norm=gemma2,
        use_post_ffw_norm=gemma2,
        attention_types=tuple(kinds[t] for t in types),
        attn_logits_soft_cap=hf.get("attn_logit_softcapping") if gemma2 else None,
        sliding_window_size=int(hf["sliding_window"]) if gemma2 else None,
        remat_config=g.RematConfig.DECODER if remat else g.RematConfig.NONE,
    )


def remat_on(model) -> bool:
    """The model was built with gradient checkpointing (Tunix's RematConfig.DECODER)."""
    return getattr(getattr(model.config, "remat_config", None), "name", "") == "DECODER"


def _tied_remat(model) -> bool:
    """Training forward through `_hidden`'s cotangent-tied remat (jax_remat.wanted)."""
    from tunix_rt.models.jax_remat import wanted

    return remat_on(model) and wanted()


def _hidden(model, tokens, positions, cache, attention_mask):
    """Embed, run the layers (with the KV cache when given), final norm: the hidden states
    before the vocabulary head, and the new cache. With gradient checkpointing and no cache
    (training), each layer goes through `jax_remat.checkpointed_layer`, whose recomputation
    XLA:CPU cannot hoist into the forward pass as it does Tunix's (see that module)."""
    from tunix_rt.models.jax_remat import checkpointed_layer, has_rng_state

    x = model.embedder.encode(tokens)
    new_cache = None if cache is None else {}
    remat = cache is None and _tied_remat(model)
    for i, layer in enumerate(model.layers):
        name = f"layer_{i}"
        if remat and not has_rng_state(layer):
            x = checkpointed_layer(layer, x, positions, attention_mask)
            continue
        layer_cache, x = layer(x, positions, cache[name] if cache else None, attention_mask)
        if cache is not None:
            new_cache[name] = layer_cache
    return model.final_norm(x), new_cache


def _logits_call(model, tokens, positions, attention_mask):
    """Tunix's forward without a cache (training with its default loss), through `_hidden`
    so that gradient checkpointing holds on CPU too: logits, then Gemma 2's final softcap."""
    import jax.numpy as jnp

    h, _ = _hidden(model, tokens, positions, None, attention_mask)
    logits = model.embedder.decode(h)
    cap = getattr(model, "final_logits_softcap", None)
    if cap is not None:
        logits = jnp.tanh(logits / cap) * cap
    return logits, None


def flat_einsum(eq: str) -> tuple[str, int] | None:
    """A projection's einsum with its batch axis B merged into the next one (T or S): the
    equation on [B·T, ...] inputs and where the merged axis sits in the output, or None when
    `eq` has no such pair ('BTD,NDH->BTNH' -> ('TD,NDH->TNH', 0); 'BSD,CKDH->CBSKH' ->
    ('SD,CKDH->CSKH', 1))."""
    lhs, rest = eq.split(",", 1)
    rhs, out = rest.split("->")
    if len(lhs) < 2 or lhs[0] != "B" or "B" in rhs or "." in eq or out.count(lhs[:2]) != 1:
        return None
    return f"{lhs[1:]},{rhs}->{out.replace(lhs[:2], lhs[1])}", out.index(lhs[:2])


@functools.cache
def _flat_class(base: type) -> type:
    """`base` (flax's nnx.Linear or a Tunix Einsum) computing on inputs whose leading axes are
    merged into one. Why: XLA:CPU lowers a dot that contracts two axes (B and T: the LoRA
    factors' gradients) by transposing an operand, and fuses that transpose into the
    elementwise op producing it, which then writes across rows. On Gemma 3 270M's MLP (LoRA
    r16, 4 x 192 tokens, 2-core Xeon) one layer's gradient took 122 ms on [B, T, D] inputs and
    54 ms on [B·T, D]. The same values (one reshape before, one after); qwix's LoRA factors
    have the same shapes, since they follow the weight's axes."""
    import jax.numpy as jnp

    if base.__module__ == __name__:  # flat already
        return base
    if base.__name__ == "Einsum":  # Tunix's: its equation in the einsum_str attribute
        class FlatEinsum(base):
            def __call__(self, x):
                flat = flat_einsum(self.einsum_str)
                if flat is None or x.ndim < 3:
                    return super().__call__(x)
                eq, at = flat
                y = jnp.einsum(eq, x.reshape(-1, *x.shape[2:]), self.w.value)  # qwix intercepts jnp.einsum
                return y.reshape(*y.shape[:at], x.shape[0], x.shape[1], *y.shape[at + 1:])

        cls = FlatEinsum
    else:
        class FlatLinear(base):
            def __call__(self, x):
                if x.ndim < 3:
                    return super().__call__(x)
                y = super().__call__(x.reshape(-1, x.shape[-1]))
                return y.reshape(*x.shape[:-1], y.shape[-1])

        cls = FlatLinear
    cls.__module__ = __name__
    cls.__qualname__ = f"{cls.__name__}[{base.__module__}.{base.__qualname__}]"
    return cls


def flatten_projections(model) -> None:
    """Every decoder layer's projections (attention einsums, MLP linears) compute on merged
    leading axes (`_flat_class`); the parameters and the values stay as they are."""
    for layer in model.layers:
        attn, mlp = layer.attn, layer.mlp
        for name in ("q_einsum", "kv_einsum", "qkv_einsum", "attn_vec_einsum"):
            mod = getattr(attn, name, None)
            if mod is not None and flat_einsum(mod.einsum_str) is not None:
                mod.__class__ = _flat_class(type(mod))
        for name in ("gate_proj", "up_proj", "down_proj"):
            mod = getattr(mlp, name, None)
            if mod is not None:
                mod.__class__ = _flat_class(type(mod))


def model_class(family: str, types: list[str]):
    """Tunix's Gemma class with two changes: `return_hidden=True` stops before the vocabulary
    projection (our chunked loss computes logits itself; it goes through `__call__` so that
    qwix's LoRA interception, which wraps only `__call__`, applies), and for Gemma 3 the
    attention type (and RoPE base) of each layer is taken from config.json."""
    if family != "gemma3":
        from tunix.models.gemma import model as g

        class Gemma(g.Gemma):
            def __init__(self, config, *, rngs):
                super().__init__(config, rngs=rngs)
                flatten_projections(self)

            def __call__(self, last_tokens, positions, cache, attention_mask,
                         output_hidden_states=False, return_hidden=False):
                if return_hidden:
                    return _hidden(self, last_tokens, positions, cache, attention_mask)
                if cache is None and not output_hidden_states and _tied_remat(self):
                    return _logits_call(self, last_tokens, positions, attention_mask)
                return super().__call__(last_tokens, positions, cache, attention_mask, output_hidden_states)

        Gemma.__module__ = __name__
        return Gemma

    from tunix.models.gemma3 import model as g3

    pattern = tuple(
        g3.AttentionType.LOCAL_SLIDING if t == "sliding_attention" else g3.AttentionType.GLOBAL
        for t in types
    )

    class Gemma3(g3.Gemma3):
        def __init__(self, config, *, rngs):
            super().__init__(config, rngs=rngs)
            for layer, kind in zip(self.layers, pattern):
                attn = layer.attn
                attn.attn_type = kind
                local = kind == g3.AttentionType.LOCAL_SLIDING
                attn.rope_base_frequency = config.local_base_frequency if local else config.global_base_frequency
                attn.rope_scale_factor = config.local_scale_factor if local else config.global_scale_factor
            flatten_projections(self)

        def __call__(self, last_tokens, positions=None, cache=None, attention_mask=None,
                     output_hidden_states=False, return_hidden=False):
            if return_hidden:
                return _hidden(self, last_tokens, positions, cache, attention_mask)
            if cache is None and not output_hidden_states and _tied_remat(self):
                return _logits_call(self, last_tokens, positions, attention_mask)
            return super().__call__(last_tokens, positions, cache, attention_mask, output_hidden_states)

    Gemma3.__module__ = __name__
    return Gemma3


#: HF decoder-layer norm -> Tunix norm, per family (Gemma 1's `post_attention_layernorm` is its
#: pre-MLP norm; Gemma 2 and 3 have four norms a layer)
NORMS = {
    "gemma": {"input_layernorm": "pre_attention_norm", "post_attention_layernorm": "pre_ffw_norm"},
    "gemma2": {"input_layernorm": "pre_attention_norm", "post_attention_layernorm": "post_attn_norm",
               "pre_feedforward_layernorm": "pre_ffw_norm", "post_feedforward_layernorm": "post_ffw_norm"},
    "gemma3": {"input_layernorm": "pre_attention_norm", "post_attention_layernorm": "post_attention_norm",
               "pre_feedforward_layernorm": "pre_ffw_norm", "post_feedforward_layernorm": "post_ffw_norm"},
}
_LAYER = re.compile(r"(?:language_model\.)?model\.layers\.([0-9]+)\.(.+)\.weight")
_TOP = {"model.embed_tokens.weight": "embedder.input_embedding", "model.norm.weight": "final_norm.scale"}


class WeightTable:
    """HF tensor names and layouts -> Tunix parameter keys and layouts (the inverse of
    `hf_state`): our own table, so nothing depends on a loader's private helpers.

    HF stores projections [out, in]; Tunix's einsums hold q as [N, D, H], k and v fused as
    kv [2, K, D, H] (or q, k and v as qkv [3, N, D, H] when every head has its own KV head),
    o as [N, H, D], the MLP kernels as [in, out]. q, k and v wait in `pending` until their
    layer's set is complete. A tensor the model has no parameter for (lm_head, a vision
    tower, rotary buffers) maps to nothing."""

    def __init__(self, family: str, cfg):
        self.norms, self.cfg = NORMS[family], cfg
        self.fused = cfg.num_heads == cfg.num_kv_heads
        self.pending: dict[str, dict[str, Any]] = {}

    def __call__(self, name: str, w) -> list[tuple[str, Any]]:
        top = _TOP.get(name.removeprefix("language_model."))
        if top:
            return [(top, w)]
        m = _LAYER.fullmatch(name)
        if not m:
            return []
        i, part = m.groups()
        pre, c = f"layers.{i}", self.cfg
        if part in self.norms:
            return [(f"{pre}.{self.norms[part]}.scale", w)]
        if part in ("self_attn.q_norm", "self_attn.k_norm"):
            return [(f"{pre}.attn.{'_query_norm' if part.endswith('q_norm') else '_key_norm'}.scale", w)]
        if part == "self_attn.o_proj":
            return [(f"{pre}.attn.attn_vec_einsum.w", w.T.reshape(c.num_heads, c.head_dim, c.embed_dim))]
        if part in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            return [(f"{pre}.{part}.kernel", w.T)]
        if part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
            slot = part[len("self_attn.")]
            heads = c.num_heads if slot == "q" else c.num_kv_heads
            got = self.pending.setdefault(i, {})
            got[slot] = w.reshape(heads, c.head_dim, c.embed_dim).transpose(0, 2, 1)  # [N, D, H]
            return self._fuse(pre, i, got)
        return []

    def _fuse(self, pre: str, i: str, got: dict[str, Any]) -> list[tuple[str, Any]]:
        import numpy as np

        out = []
        if self.fused:
            if len(got) == 3:
                out.append((f"{pre}.attn.qkv_einsum.w", np.stack([got.pop("q"), got.pop("k"), got.pop("v")])))
        else:
            if "q" in got:
                out.append((f"{pre}.attn.q_einsum.w", got.pop("q")))
            if "k" in got and "v" in got:
                out.append((f"{pre}.attn.kv_einsum.w", np.stack([got.pop("k"), got.pop("v")])))
        if not got:
            self.pending.pop(i, None)
        return out


def tunix_config(model_dir: str | Path, dtype: str = "fp32", remat: bool = False):
    """(family, Tunix ModelConfig) of an HF-layout model directory."""
    import jax.numpy as jnp

    hf = read_hf_config(model_dir)
    family = family_of(hf)
    if family == "gemma3":
        return family, gemma3_config(hf, getattr(jnp, DTYPES[dtype]), remat)
    return family, gemma_config(hf, remat)


def make_mesh(shape: dict[str, int] | str = "auto", devices=None):
    """An (fsdp, tp) mesh with Auto axes (Explicit axes fail in Tunix's embedding lookup).
    auto: every device on fsdp. A mesh smaller than the device count uses the first ones."""
    import jax

    devices = list(devices if devices is not None else jax.devices())
    if shape == "auto":
        shape = {"fsdp": len(devices), "tp": 1}
    fsdp, tp = int(shape.get("fsdp", 1)), int(shape.get("tp", 1))
    if fsdp * tp > len(devices):
        raise BadInput(
            f"mesh fsdp={fsdp} x tp={tp} needs {fsdp * tp} devices; {len(devices)} "
            f"{devices[0].platform} device(s) found"
        )
    return jax.make_mesh(
        (fsdp, tp), ("fsdp", "tp"),
        axis_types=(jax.sharding.AxisType.Auto,) * 2,
        devices=devices[: fsdp * tp],
    )


def load_model(model_dir: str | Path, mesh=None, dtype: str = "fp32", remat: bool = False):
    """(Tunix model, Tunix ModelConfig) with the directory's weights, sharded over `mesh`."""
    import jax
    import jax.numpy as jnp

    model_dir = str(Path(model_dir).resolve())
    family, cfg = tunix_config(model_dir, dtype, remat)
    mesh = mesh if mesh is not None else make_mesh("auto")
    jdtype = getattr(jnp, DTYPES[dtype])
    cls = model_class(family, layer_types(read_hf_config(model_dir)))
    with jax.set_mesh(mesh):
        model = stream_load(model_dir, cls, cfg, WeightTable(family, cfg), mesh, jdtype)
    _check_loaded(model, model_dir)
    return model, cfg


def read_safetensors(path: str | Path):
    """(name, numpy array) for each tensor of a safetensors file, in file order, read with
    plain reads into fresh buffers: no mmap, so the file's pages are page cache, not this
    process's memory (an mmap'd file counts in its RSS as it is touched)."""
    import struct

    import numpy as np
    from tunix.models.safetensors_loader import to_np_dtype

    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        items = sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                       key=lambda kv: kv[1]["data_offsets"][0])
        for name, meta in items:
            dtype = to_np_dtype(meta["dtype"])
            if dtype is None:
                raise BadInput(f"{path}: tensor {name} has dtype {meta['dtype']}; F32, F16, BF16 or F64 expected")
            start, end = meta["data_offsets"]
            arr = np.empty(meta["shape"], dtype=dtype)
            view = memoryview(arr.reshape(-1).view(np.uint8))
            if len(view) != end - start:
                raise BadInput(f"{path}: tensor {name}: {end - start} bytes for shape {meta['shape']} {meta['dtype']}")
            f.seek(base + start)
            got = 0
            while got < len(view):
                k = f.readinto(view[got:])
                if not k:
                    raise BadInput(f"{path}: truncated inside tensor {name}")
                got += k
            yield name, arr


def place(value, sharding):
    """A host array every process holds, on `sharding`: each process puts its own devices'
    shards (a mesh over several processes), the same as device_put within one process."""
    import jax

    if sharding.is_fully_addressable:
        return jax.device_put(value, sharding)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def stream_load(model_dir: str, model_class, cfg, table: WeightTable, mesh, dtype):
    """The model with the directory's weights, one tensor at a time: each is read, mapped
    (`WeightTable`), cast and put on its devices before the next is read. A loader that maps
    the whole file and keeps every tensor until all are on device peaks at about twice the
    model (measured with Tunix's on Gemma 3 270M fp32: 3.07 GiB peak RSS after loading 1.0 GiB
    of weights); here it is the model plus the largest tensor."""
    import gc

    import jax
    import numpy as np
    from flax import nnx
    from tunix.models.safetensors_loader import path_to_key

    abstract = nnx.eval_shape(lambda: model_class(cfg, rngs=nnx.Rngs(params=0)))
    graph_def, abs_state = nnx.split(abstract)
    shapes = abs_state.to_pure_dict()
    shardings = nnx.get_named_sharding(abs_state, mesh).to_pure_dict()
    by_key = {path_to_key(path): sh for path, sh in jax.tree_util.tree_flatten_with_path(shardings)[0]}
    np_dtype = np.dtype(dtype)
    loaded: dict[str, Any] = {}

    def put(key: str, value) -> None:
        sharding = by_key.get(key, by_key.get(key.removesuffix(".value")))
        if sharding is None:
            return  # a tensor the model has no parameter for (Tunix skips those too)
        loaded[key.removesuffix(".value")] = place(np.asarray(value).astype(np_dtype, copy=False), sharding)

    files = sorted(Path(model_dir).glob("*.safetensors"))
    for f in files:
        for name, arr in read_safetensors(f):
            for k, v in table(name, arr):
                put(k, v)
            del arr
    if table.pending:
        raise BadInput(f"{model_dir}: incomplete q/k/v projections in layers {sorted(table.pending)}")

    def pick(path, shape):
        value = loaded.pop(path_to_key(path), None)
        if value is not None and tuple(value.shape) != tuple(shape.shape):
            raise BadInput(f"{model_dir}: {path_to_key(path)} has shape {tuple(value.shape)}, "
                           f"the config needs {tuple(shape.shape)}")
        return value

    state = jax.tree_util.tree_map_with_path(pick, shapes)
    model = nnx.merge(graph_def, state)
    # the load leaves cyclic garbage as large as the biggest tensor: 0.6 GB of RSS on Gemma 3
    # 270M (its embedding) until a collection, which the next allocations would not wait for
    del state, loaded
    gc.collect()
    return model


def _check_loaded(model, model_dir: str) -> None:
    """The loader leaves a parameter it found no tensor for as None: say which."""
    from flax import nnx

    missing = [
        ".".join(map(str, path))
        for path, value in nnx.to_flat_state(nnx.state(model, nnx.Param))
        if getattr(value, "value", value) is None
    ]
    if missing:
        raise BadInput(f"{model_dir}: weights missing for {missing[:5]}{' …' if len(missing) > 5 else ''}")


def hf_state(model, family: str) -> dict:
    """The model's weights as HF-layout numpy tensors (the inverse of Tunix's loader
    mapping), for final/merged/ after full fine-tuning. Tied embeddings: no lm_head."""
    import numpy as np
    from flax import nnx

    norms = {tunix: hf for hf, tunix in NORMS[family].items()}
    out: dict[str, np.ndarray] = {}
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        keys = [str(k) for k in path]
        w = np.asarray(var[...], np.float32)
        if keys[:2] == ["embedder", "input_embedding"]:
            out["model.embed_tokens.weight"] = w
        elif keys[:2] == ["final_norm", "scale"]:
            out["model.norm.weight"] = w
        elif keys[0] == "layers":
            out.update(_layer_to_hf(f"model.layers.{keys[1]}", keys[2:], w, norms))
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def _layer_to_hf(pre: str, keys: list[str], w, norms: dict[str, str]) -> dict:
    """One Tunix layer parameter → HF tensor(s). Einsum weights are [N, D, H] (q), [2, K, D, H]
    (kv), [3, N, D, H] (qkv) and [N, H, D] (o); HF stores [out, in]."""
    def proj(x):  # [N, D, H] -> [N*H, D]
        return x.transpose(0, 2, 1).reshape(-1, x.shape[1])

    name = ".".join(keys)
    if keys[0] in norms and keys[-1] == "scale":
        return {f"{pre}.{norms[keys[0]]}.weight": w}
    table = {
        "attn.q_einsum.w": lambda: {"self_attn.q_proj": proj(w)},
        "attn.kv_einsum.w": lambda: {"self_attn.k_proj": proj(w[0]), "self_attn.v_proj": proj(w[1])},
        "attn.qkv_einsum.w": lambda: {"self_attn.q_proj": proj(w[0]), "self_attn.k_proj": proj(w[1]),
                                      "self_attn.v_proj": proj(w[2])},
        "attn.attn_vec_einsum.w": lambda: {"self_attn.o_proj": w.reshape(-1, w.shape[-1]).T},
        "attn._query_norm.scale": lambda: {"self_attn.q_norm": w},
        "attn._key_norm.scale": lambda: {"self_attn.k_norm": w},
        "mlp.gate_proj.kernel": lambda: {"mlp.gate_proj": w.T},
        "mlp.up_proj.kernel": lambda: {"mlp.up_proj": w.T},
        "mlp.down_proj.kernel": lambda: {"mlp.down_proj": w.T},
    }
    if name not in table:
        raise BadInput(f"cannot export Tunix parameter {pre}.{name} to HF layout")
    return {f"{pre}.{k}.weight": v for k, v in table[name]().items()}
