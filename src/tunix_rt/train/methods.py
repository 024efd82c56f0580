"""The training methods and the one table that names them: config validation, the driver,
the plan and the JAX engine read it; nothing else names a method.

    sft     supervised fine-tuning on rendered traces (train.sft)
    grpo    reinforcement learning with verifiable rewards, the GRPO family (train.grpo)
    rft     rejection-sampling fine-tuning: SFT on the sampled completions the rewards accept (train.rft)
    distill knowledge distillation from a teacher's token distributions (train.distill)
    dpo     preference optimisation on chosen/rejected pairs: DPO, IPO, SimPO, ORPO (train.preference)

Each entry says where the method's class lives (it implements train.method.Method) and the
phases of one of its steps: "update" (forward + backward on batches), and before it
"rollout" (the engine's generator samples completions). The plan estimates each phase, and
what needs a generator (one process on the JAX engine, the rollout settings) follows from
the phases, not from a method's name. Nothing here imports the methods' modules.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

ROLLOUT, UPDATE = "rollout", "update"
#: a frozen teacher model runs (forward only) beside the trained one: the config requires a
#: `teacher`, and the plan counts its weights
TEACHER = "teacher"


@dataclass(frozen=True)
class MethodSpec:
    path: str
    """"module:class" of the method."""
    phases: tuple[str, ...]
    """What one step runs, in order."""


METHODS: dict[str, MethodSpec] = {
    "sft": MethodSpec("tunix_rt.train.sft:SFT", (UPDATE,)),
    "grpo": MethodSpec("tunix_rt.train.grpo:GRPO", (ROLLOUT, UPDATE)),
    "rft": MethodSpec("tunix_rt.train.rft:RFT", (ROLLOUT, UPDATE)),
    "distill": MethodSpec("tunix_rt.train.distill:Distill", (TEACHER, UPDATE)),
    "dpo": MethodSpec("tunix_rt.train.preference:Preference", (UPDATE,)),
}


def rolls_out(method: str) -> bool:
    """Whether a step of the method samples completions first (an RL method)."""
    return ROLLOUT in METHODS[method].phases


def uses_teacher(method: str) -> bool:
    """Whether a step of the method runs a frozen teacher beside the model (distillation)."""
    return TEACHER in METHODS[method].phases


def method_class(method: str) -> type:
    """The class of the named method (it implements train.method.Method)."""
    module, cls = METHODS[method].path.split(":")
    return getattr(importlib.import_module(module), cls)
