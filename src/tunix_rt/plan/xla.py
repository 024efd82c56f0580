"""XLA's own memory estimate of the JAX engine's train step, with no weight allocated.

    python -m tunix_rt.plan.xla '<PlanInputs as JSON>'   # prints one JSON line

The step is the engine's own: Tunix's Gemma (`models.jax_loader`: the config built from the
preset's config.json fields, hidden states without the vocabulary head), qwix LoRA/QLoRA
(`train.jax_engine.apply_lora`), split as the engine splits it, and the engine's jitted
gradient and update functions (`jax_engine.make_grad_fn`, `make_update_fn`: its loss and its
optax optimizer, clipping included), the update donating parameters and optimizer state
(`donate`; without it only the optimizer state, as Tunix's own PeftTrainer). The model is
built under `nnx.eval_shape` (abstract shapes with Tunix's sharding annotations), both
functions are lowered with `jax.ShapeDtypeStruct` arguments sharded over an ('fsdp', 'tp')
mesh of fake CPU devices and compiled; `memory_analysis()` gives argument + output - alias
+ temp bytes per device of each, plus what waits on the device meanwhile, and the step's
peak is the larger call.

Why a subprocess: the fake device count (`--xla_force_host_platform_device_count`) is read
once, when jax is first imported; `tunix_rt.plan.xla_estimate` sets it and runs this module.

What the CPU compiler does differently from a TPU's: Tunix skips its activation sharding
constraints on CPU, so we apply them (`_force_activation_sharding`), and we ask for XLA's
memory-optimised CPU scheduler. It still keeps more all-gathered FSDP weights alive at once
than a TPU's memory-aware scheduler would, so on many devices this estimate is an upper
bound (see tunix_rt.plan and the tests for measured agreement). bf16 has no matmul on most CPUs:
a bf16 plan for an accelerator is compiled in f16 with XLA:CPU's dot upcast off
(`_sixteen_bit`). Without donation XLA:CPU computes each new weight into its output buffer
in place of the gradient's temporary, so its figure barely grows (Gemma 2B fp32 Adafactor
on one v5e: 18.81 -> 20.77 GiB); the TPU compile of the failed run held both copies
(28.59 GiB), which the analytic plan counts.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

SCHEDULER_FLAG = "--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"
#: the XLA:CPU pass that rewrites 16-bit dots as f32 dots (see `_sixteen_bit`)
UPCAST_PASS = "change-op-data-type"


def _target_is_cpu(spec: dict[str, Any]) -> bool:
    from tunix_rt.plan.devices import DEVICES

    name = spec["device"]
    return DEVICES[name].kind == "cpu" if name in DEVICES else name == "cpu"


def _sixteen_bit(spec: dict[str, Any]) -> bool:
    """A bf16 plan for an accelerator. XLA:CPU has no bf16 matmul on most hosts: its
    change-op-data-type pass turns every bf16 dot into an f32 dot, converting the operands,
    and without remat backward keeps those f32 copies (the all-gathered layer weights and
    the MLP activations: 6.75 GiB of f32 MLP weights alone at the peak of Gemma 2B full FT
    on a v5e-8 without remat, read from XLA's buffer assignment). A TPU or GPU multiplies bf16 natively and holds none of them. So the
    step is built in f16, the same two bytes, whose dots XLA:CPU's emitter takes as they
    are, with that pass off: every buffer keeps the target's size (the headline above:
    14.42 GiB compiled in bf16, 9.67 GiB in f16 with 1024-token loss chunks)."""
    return spec["dtype"] == "bf16" and not _target_is_cpu(spec)


def _setup_env(spec: dict[str, Any]) -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        flags += f" --xla_force_host_platform_device_count={spec['devices']}"
    if "xla_cpu_scheduler_type" not in flags:
        flags += " " + SCHEDULER_FLAG
    if _sixteen_bit(spec) and "xla_disable_hlo_passes" not in flags:
        flags += f" --xla_disable_hlo_passes={UPCAST_PASS}"
    os.environ["XLA_FLAGS"] = flags.strip()
    os.environ["JAX_PLATFORMS"] = "cpu"


def _force_activation_sharding(mesh) -> None:
    """Tunix's `shard()` returns its input unchanged on a CPU platform; a TPU run applies
    the constraints (batch on fsdp). Make the fake CPU devices behave like the TPU."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from tunix_rt.models import tunix_lean

    tunix_lean.install()
    from tunix.models.gemma import model as gemma
    from tunix.utils import sharding_utils

    def shard(x, s, eager: bool = False):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(*s)))

    gemma.shard = shard
    sharding_utils.shard = shard


def _train_config(spec: dict[str, Any]):
    from tunix_rt.train.config import TrainConfig

    return TrainConfig(
        model=spec["model"], dataset="(plan)", method=spec["method"], lora_rank=spec["lora_rank"],
        lora_targets=list(spec["lora_targets"]), lora_weight_qtype=spec["weight_qtype"],
        optimizer=spec["optimizer"], batch_size=spec["batch"], grad_accum=spec["grad_accum"],
        max_seq_len=spec["seq"], dtype=spec["dtype"], loss_impl=spec["loss_impl"],
        loss_chunk_bytes=spec["loss_chunk_bytes"], gradient_checkpointing=spec["remat"],
        grad_clip=spec["grad_clip"], engine="jax", max_steps=1,
    )


def _abstract_model(spec: dict[str, Any], mesh):
    """Tunix's Gemma (with LoRA when asked) as abstract arrays: no weight is allocated."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from tunix_rt.models import jax_loader
    from tunix_rt.plan.inputs import resolve_preset
    from tunix_rt.train.jax_engine import apply_lora

    hf = dict(resolve_preset(spec["model"]).hf_config)
    family = jax_loader.family_of(hf)
    dtype = jnp.float32 if spec["dtype"] == "fp32" else jnp.float16 if _sixteen_bit(spec) else jnp.bfloat16
    if family == "gemma3":
        tcfg = jax_loader.gemma3_config(hf, dtype, spec["remat"])
    else:
        tcfg = jax_loader.gemma_config(hf, spec["remat"])
    cls = jax_loader.model_class(family, jax_loader.layer_types(hf))
    cfg = _train_config(spec)

    def build():
        model = cls(tcfg, rngs=nnx.Rngs(0))
        if family != "gemma3" and dtype != jnp.float32:  # Tunix's Gemma 1/2 is built in fp32
            state = nnx.state(model, nnx.Param)
            nnx.update(model, jax.tree.map(lambda x: x.astype(dtype), state))
        if spec["method"] == "lora":
            model = apply_lora(model, cfg, tcfg)
        return model

    with jax.set_mesh(mesh):
        model = nnx.eval_shape(build)
    return model, cfg


def _sharded(tree, mesh, n: int):
    """ShapeDtypeStructs with NamedShardings: the model's own annotations where they divide
    the shape, else the largest dimension divisible by the fsdp size, else replicated."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    def one(x):
        spec = getattr(getattr(x, "sharding", None), "spec", None)
        if spec is not None and _divides(x.shape, spec, mesh):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, spec))
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, _largest_dim_spec(x.shape, n)))

    return jax.tree.map(one, tree)


def _divides(shape, spec, mesh) -> bool:
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        size = 1
        for a in names:
            size *= mesh.shape[a]
        if dim % size:
            return False
    return True


def _largest_dim_spec(shape, n: int):
    from jax.sharding import PartitionSpec

    order = sorted(range(len(shape)), key=lambda i: -shape[i])
    for i in order:
        if n > 1 and shape[i] % n == 0:
            spec = [None] * len(shape)
            spec[i] = "fsdp"
            return PartitionSpec(*spec)
    return PartitionSpec()


def _device_bytes(tree) -> int:
    """Bytes per device of sharded ShapeDtypeStructs."""
    import math

    import jax

    return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _abstract_batch(b: int, seq: int, data) -> dict[str, Any]:
    """One micro-batch as the engine's `_device_batch` puts it on the mesh: rows right-padded
    to a width bucket, rows over fsdp, the [B, L, L] attention mask built from them."""
    import jax
    import jax.numpy as jnp

    from tunix_rt.train.engine import POLICY_AUX
    from tunix_rt.train.jax_engine import width_bucket
    from tunix_rt.train.jax_loss import attention_mask

    width = width_bucket(seq)

    def sds(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=data)

    real, pos = sds((b, width), jnp.bool_), sds((b, width), jnp.int32)
    attn = jax.eval_shape(attention_mask, real, pos)
    return {"ids": sds((b, width), jnp.int32), "pos": pos, "targets": sds((b, width), jnp.int32),
            "coef": sds((b, width), jnp.float32), "mask": sds((b, width), jnp.bool_),
            "aux": sds((b, width, len(POLICY_AUX)), jnp.float32), "attn": sds(attn.shape, attn.dtype)}


def _phase(compiled, resident: int) -> dict[str, int]:
    ma = compiled.memory_analysis()
    used = ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes + ma.temp_size_in_bytes
    return {"peak_bytes_per_device": int(used + resident), "resident_bytes": int(resident),
            "argument_bytes": int(ma.argument_size_in_bytes), "output_bytes": int(ma.output_size_in_bytes),
            "alias_bytes": int(ma.alias_size_in_bytes), "temp_bytes": int(ma.temp_size_in_bytes)}


def estimate(spec: dict[str, Any]) -> dict[str, Any]:
    """Lower and compile the engine's own step (`jax_engine.make_grad_fn` and `make_update_fn`)
    with abstract arguments. It peaks in one of its two calls: the gradient of a micro-batch
    (the optimizer state, and when accumulating the gradient sum, wait on the device) or the
    update (the frozen rest and the RNG state wait). Argument, output, alias and temp bytes
    are the two calls' together; `phases` has each."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec

    from tunix_rt.train.engine import NLL
    from tunix_rt.train.jax_engine import make_grad_fn, make_optimizer, make_update_fn

    t0 = time.perf_counter()
    n, tp = spec["devices"], spec.get("tp", 1)
    from tunix_rt.models import jax_remat

    # Model the target's remat: the CPU engine ties each recomputation to its cotangent
    # (XLA:CPU drops optimization barriers); accelerators keep Tunix's own remat.
    jax_remat.use("tied" if _target_is_cpu(spec) else "tunix")
    if len(jax.devices()) < n:
        raise SystemExit(f"need {n} devices, jax sees {len(jax.devices())} (XLA_FLAGS set too late?)")
    mesh = jax.make_mesh((n // tp, tp), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    _force_activation_sharding(mesh)
    model, cfg = _abstract_model(spec, mesh)
    kind = nnx.LoRAParam if spec["method"] == "lora" else nnx.Param
    graph, params, rngs, rest = nnx.split(model, kind, nnx.RngState, ...)  # as the engine splits it
    params, rngs, rest = (_sharded(x, mesh, n // tp) for x in (params, rngs, rest))
    tx = make_optimizer(cfg)
    opt_shapes = jax.eval_shape(tx.init, params)
    by_shape = {}
    for leaf in jax.tree.leaves(params):
        by_shape.setdefault((leaf.shape, leaf.dtype), leaf.sharding)
    opt_state = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=by_shape.get((x.shape, x.dtype))
                                       or NamedSharding(mesh, _largest_dim_spec(x.shape, n // tp))),
        opt_shapes)
    b = spec["batch"]
    data = NamedSharding(mesh, PartitionSpec("fsdp") if b % (n // tp) == 0 else PartitionSpec())
    batch = _abstract_batch(b, spec["seq"], data)
    # our engine donates parameters and optimizer state; Tunix's PeftTrainer only the optimizer
    update = make_update_fn(tx, (0, 1) if spec["donate"] else (1,))
    t1 = time.perf_counter()
    with jax.set_mesh(mesh):
        grad = make_grad_fn(graph, cfg, NLL).lower(params, rngs, rest, batch).compile()
        upd = update.lower(params, opt_state, params, jax.ShapeDtypeStruct((), jnp.float32)).compile()
    t2 = time.perf_counter()
    summed = _device_bytes(params) if spec["grad_accum"] > 1 else 0  # the engine's gradient sum
    phases = {"gradient": _phase(grad, _device_bytes(opt_state) + summed),
              "update": _phase(upd, _device_bytes(rest) + _device_bytes(rngs))}
    keys = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes")
    return {
        "peak_bytes_per_device": max(ph["peak_bytes_per_device"] for ph in phases.values()),
        **{k: sum(ph[k] for ph in phases.values()) for k in keys},
        "peak_phase": max(phases, key=lambda k: phases[k]["peak_bytes_per_device"]), "phases": phases,
        "devices": n, "build_s": round(t1 - t0, 2), "compile_s": round(t2 - t1, 2),
        "compiled_dtype": {"fp32": "f32", "bf16": "f16" if _sixteen_bit(spec) else "bf16"}[spec["dtype"]],
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tunix_rt.plan.xla '<PlanInputs JSON>'", file=sys.stderr)
        return 2
    spec = json.loads(argv[0])
    _setup_env(spec)
    print(json.dumps(estimate(spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
