"""The plan's entry points: `make_plan` (inputs -> Plan, with XLA's figure when asked, run
in a subprocess by `xla_estimate`) and `plan_train` (a TrainConfig -> Plan)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, replace
from typing import Any

from tunix_rt.errors import TunixRtError
from tunix_rt.plan.devices import DEVICES, device_spec
from tunix_rt.plan.inputs import PlanInputs, resolve_preset
from tunix_rt.plan.rl import analytic, update_inputs
from tunix_rt.plan.step import check_lora_rank
from tunix_rt.plan.suggest import suggestions
from tunix_rt.plan.verdict import Plan
from tunix_rt.plan.teacher import teacher_model
from tunix_rt.train.methods import sampling, uses_reference, uses_teacher


def make_plan(inp: PlanInputs, xla: bool = False, xla_timeout: float = 300.0,
              capacity_bytes: int | None = None) -> Plan:
    """The analytic plan (and XLA's figure when asked, JAX engine only) with suggestions."""
    preset = resolve_preset(inp.model)
    check_lora_rank(inp, preset)
    device = device_spec(inp.device)
    notes = []
    if capacity_bytes:
        device = replace(device, capacity_bytes=int(capacity_bytes))
    elif device.kind == "cpu" and inp.devices > 1:  # fake CPU devices share the host's RAM
        device = replace(device, capacity_bytes=device.capacity_bytes // inp.devices)
        notes.append(f"{inp.devices} CPU devices share this host's RAM: capacity is a 1/{inp.devices} share")
    elif device.kind == "gpu" and inp.engine == "jax" and device.name in DEVICES:
        fraction = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75"))
        device = replace(device, capacity_bytes=int(device.capacity_bytes * fraction))
        notes.append(f"JAX preallocates {fraction:.0%} of a GPU (XLA_PYTHON_CLIENT_MEM_FRACTION)")
    items, details, peak = analytic(inp, preset, device)
    plan = Plan(inp, device, items, details, peak, {"analytic": peak}, notes=notes)
    if inp.engine == "jax" and inp.batch % inp.fsdp:
        plan.notes.append(f"batch {inp.batch} is not a multiple of fsdp={inp.fsdp}: the JAX engine needs it to be")
    if inp.dtype == "bf16" and not device.bf16:
        plan.notes.append(f"{device.name} has no fast bf16")
    if xla and inp.engine == "jax":
        try:
            res = xla_estimate(update_inputs(inp) if inp.rl else inp, timeout=xla_timeout)
        except TunixRtError as e:  # the analytic verdict stands; say why XLA has none
            plan.notes.append(f"no XLA estimate: {str(e).splitlines()[-1]}")
            res = None
    if xla and inp.engine == "jax" and res is not None:
        plan.estimators["xla"] = int(res["peak_bytes_per_device"])
        if inp.teacher or "reference_weights" in items:  # XLA compiles the trained model's step only
            plan.estimators["xla"] += sum(v for k, v in items.items()
                                          if k.startswith("teacher_") or k == "reference_weights")
            plan.notes.append("xla: the trained model's step compiled by XLA plus the frozen models' analytic items")
        if inp.rl:  # XLA compiles the update; the rollout phase has the analytic figure only
            plan.estimators["xla"] = max(plan.estimators["xla"] + items.get("rl_aux", 0), details["phases"]["rollout"])
            plan.notes.append("xla: the update step compiled by XLA (plus rl_aux), or the analytic rollout phase "
                              "when that is larger")
        plan.details["xla"] = res
        plan.details["xla_over_analytic"] = round(plan.estimators["xla"] / peak, 3)
    if not plan.fits:
        plan.suggestions = suggestions(inp, preset, device)
    return plan


def resolve_engine(engine: str, device: str) -> str:
    """torch or jax: what engine=auto means on a device (`train.engines.pick`, the rule
    `train` and `eval` use), given a plan's device name or kind."""
    if engine != "auto":
        return engine
    from tunix_rt.train import engines

    if device not in ("cpu", "cuda", "gpu", "tpu"):  # a named kind: the engine's device word
        device = {"tpu": "tpu", "gpu": "cuda", "cpu": "cpu"}[device_spec(device).kind]
    return engines.pick("auto", device)


def plan_train(cfg, device: str, devices: int, capacity_bytes: int | None = None, xla: bool = False,
               engine: str | None = None, strategy: str = "auto") -> Plan:
    """The plan of a TrainConfig on `devices` devices of a kind (a DEVICES name, cpu, cuda,
    or gpu/tpu inside a JAX process, where the live device's memory limit is read). Fast and
    jax-free unless xla=True. `engine` overrides cfg.engine (an engine planning itself should
    pass its name); torch on several devices is `torchrun` ranks (`strategy` ddp or fsdp)."""
    engine = resolve_engine(engine or cfg.engine, cfg.device if cfg.device != "auto" else device)
    tp = int(cfg.mesh.get("tp", 1)) if isinstance(cfg.mesh, dict) and engine == "jax" else 1
    n = devices
    if isinstance(cfg.mesh, dict) and engine == "jax":
        n = int(cfg.mesh.get("fsdp", 1)) * tp
    inp = PlanInputs(
        model=cfg.model, method=cfg.finetune, seq=cfg.max_seq_len, batch=cfg.batch_size,
        device=device, devices=n, optimizer=cfg.optimizer, dtype=cfg.dtype,
        engine=engine, remat=cfg.gradient_checkpointing, lora_rank=cfg.lora_rank,
        lora_targets=tuple(cfg.lora_targets),
        weight_qtype=cfg.lora_weight_qtype if engine == "jax" and cfg.finetune == "lora" else None,
        grad_accum=cfg.grad_accum, grad_clip=cfg.grad_clip, loss_impl=cfg.loss_impl,
        loss_chunk_bytes=cfg.loss_chunk_bytes, tp=tp, strategy=strategy,
        **sampling_inputs(cfg),
        teacher=teacher_model(cfg.teacher, cfg.model) if uses_teacher(cfg.method) else None,
        reference=cfg.finetune == "full" and uses_reference(cfg),
    )
    return make_plan(inp, xla=xla, capacity_bytes=capacity_bytes)


def sampling_inputs(cfg) -> dict[str, Any]:
    """The PlanInputs of a config's sampling (train.methods.sampling: every method that
    samples, each counted by the one rule of plan.rl); {} when its steps do not sample.
    `cfg`: a TrainConfig, or anything with the fields sampling reads (the plan CLI's flags)."""
    s = sampling(cfg)
    if s is None:
        return {}
    return {"rl_prompts": s.prompts, "group_size": s.group, "rollout_tokens": s.new_tokens,
            "trains_on_rollouts": s.trains_on_rollouts, "held_out_decode": s.held_out_decode,
            "long_prompts": not s.prompt_room}


def xla_estimate(inp: PlanInputs, timeout: float = 300.0) -> dict[str, Any]:
    """XLA's compiled memory analysis of the JAX train step on `inp.devices` fake CPU
    devices, in a subprocess (the device count must be set before jax is imported)."""
    env = dict(os.environ)
    flags = f"--xla_force_host_platform_device_count={inp.devices}"
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flags).strip()
    env["JAX_PLATFORMS"] = "cpu"
    payload = json.dumps({**asdict(inp), "lora_targets": list(inp.lora_targets)})
    try:
        proc = subprocess.run([sys.executable, "-m", "tunix_rt.plan.xla", payload], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TunixRtError(f"the XLA estimate took longer than {timeout:.0f} s") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise TunixRtError("the XLA estimate failed:\n" + "\n".join(tail))
    return json.loads(lines[-1])
