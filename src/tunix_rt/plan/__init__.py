"""The memory plan: bytes per device before anything is allocated; fits, or says what to change.

The system we replace lost weeks to "Used 28.59G of 15.75G hbm" (Gemma 2B, full fine-tune,
one 16 GB v5e chip). A plan answers that before compiling: an analytic estimate of every
item that lives on a device at the peak of a training step, itemised, and, for the JAX
engine, XLA's own figure for the real train step lowered with abstract shapes
(`tunix_rt.plan.xla`, run in a subprocess because it fakes devices).

The package, one job a module (each imports only the ones above it):
- devices: the device catalogue, probing the live device, `device_spec`
- inputs: what a plan is asked (`PlanInputs`) and the model's preset (`resolve_preset`)
- step: the analytic estimate of a training step (what it counts, and the peak formula)
- rl: a step that samples (GRPO's, and rft's, dpo's rollout pairs', on-policy distill's),
  max(rollout, update), and `analytic`, the estimate of any step
- verdict: `Plan`, its JSON and its table
- suggest: the changes that make a plan fit
- make: the entry points, `make_plan` and `plan_train`, and the XLA subprocess
- xla: XLA's estimate (the subprocess itself); cli: `tunix-rt plan` (Typer: only the CLI
  imports it, never the training path)

This module only re-exports the public names.
"""

from __future__ import annotations

from tunix_rt.plan.devices import DEVICES, JAX_KINDS, DeviceSpec, GiB, MiB, device_spec
from tunix_rt.plan.inputs import ALL_TARGETS, QBYTES, PlanInputs, resolve_preset
from tunix_rt.plan.make import make_plan, plan_train, resolve_engine, xla_estimate
from tunix_rt.plan.rl import GREEDY_BUFFERS, SAMPLER_BUFFERS, analytic, update_inputs
from tunix_rt.plan.step import CPU_BASELINE, CUDA_CONTEXT, SLACK, check_lora_rank
from tunix_rt.plan.suggest import suggestions
from tunix_rt.plan.verdict import RL_ITEM_PHASE, Plan, fmt_bytes

__all__ = [
    "ALL_TARGETS", "CPU_BASELINE", "CUDA_CONTEXT", "DEVICES", "GREEDY_BUFFERS", "JAX_KINDS", "QBYTES",
    "RL_ITEM_PHASE", "SAMPLER_BUFFERS", "SLACK", "DeviceSpec", "GiB", "MiB", "Plan", "PlanInputs", "analytic",
    "check_lora_rank", "fmt_bytes", "make_plan", "plan_train", "device_spec", "resolve_engine",
    "resolve_preset", "suggestions", "update_inputs", "xla_estimate",
]
