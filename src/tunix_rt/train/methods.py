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

Some methods sample only when their config asks (`sampling_on`: distill's kd_on_policy, dpo's
pairs=rollouts); `sampling` says, for a config, whether and how a step samples, which is what
the memory plan counts (the KV cache and decode batch of the rollouts).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

ROLLOUT, UPDATE = "rollout", "update"
#: how a sampling step's rows are made: "groups" (GRPO's rollouts: group_size completions of
#: each of rl_prompts prompts, and GRPO's greedy held-out eval) or "batch" (one completion of
#: each of the step's batch_size x grad_accum examples, in one generate call)
GROUPS, BATCH = "groups", "batch"
#: a frozen teacher model runs (forward only) beside the trained one: the config requires a
#: `teacher`, and the plan counts its weights
TEACHER = "teacher"


@dataclass(frozen=True)
class MethodSpec:
    path: str
    """"module:class" of the method."""
    phases: tuple[str, ...]
    """What one step runs, in order."""
    rows: str = ""
    """A step that samples: how its rows are made (GROUPS or BATCH); "": it never samples."""
    sampling_on: tuple[str, Any] | None = None
    """(config field, value) that turns sampling on for a method without a rollout phase;
    None: the phases decide."""
    trains_on_rollouts: bool = False
    """The update is an RL step over every rollout sequence (GRPO: P x G of them, with their
    per-token advantages); False: the method's own batches (rft's kept completions, dpo's
    pairs, distill's examples) at batch_size x grad_accum."""
    reference: tuple[str, Any] | None = None
    """(config field, values) under which a step compares with the reference policy, the
    model the run started from: the field's value among `values`, or POSITIVE (above 0).
    LoRA's reference is the adapter-off model; full fine-tuning's a frozen copy of the starting
    weights, which the engine loads at its first reference pass and the plan counts. None:
    never."""
    check: str = ""
    """"module:function" that takes a TrainConfig of this method and refuses what the method
    cannot run (BadInput), called when the config is validated: the CLI and the job API
    build the config before anything is queued or loaded, so the method's own rules, kept in
    its own file, are checked at the door. "": none."""


#: MethodSpec.reference's "the field's value is above 0"
POSITIVE = "positive"
#: the pref_loss values that compare with the reference policy (train.preference)
REFERENCE_LOSSES = ("dpo", "ipo")

METHODS: dict[str, MethodSpec] = {
    "sft": MethodSpec("tunix_rt.train.sft:SFT", (UPDATE,)),
    "grpo": MethodSpec("tunix_rt.train.grpo:GRPO", (ROLLOUT, UPDATE), GROUPS, trains_on_rollouts=True,
                       reference=("beta", POSITIVE)),
    "rft": MethodSpec("tunix_rt.train.rft:RFT", (ROLLOUT, UPDATE), GROUPS),
    "distill": MethodSpec("tunix_rt.train.distill:Distill", (TEACHER, UPDATE), BATCH, ("kd_on_policy", True)),
    "dpo": MethodSpec("tunix_rt.train.preference:Preference", (UPDATE,), GROUPS, ("pairs", "rollouts"),
                      reference=("pref_loss", REFERENCE_LOSSES), check="tunix_rt.train.preference:check_config"),
}


@dataclass(frozen=True)
class Sampling:
    """What the rollouts of one step of a config decode (plan.rl plans their memory)."""

    prompts: int
    """Prompts per generate call."""
    group: int
    """Completions per prompt."""
    new_tokens: int
    """Most new tokens per completion (rollout_max_new_tokens)."""
    trains_on_rollouts: bool
    """MethodSpec.trains_on_rollouts."""
    held_out_decode: bool
    """The held-out eval decodes greedily too (GRPO's eval: the GROUPS methods)."""
    prompt_room: bool
    """Prompts leave their completion its room (GRPO keeps the prompts of at most
    max_seq_len - rollout_max_new_tokens tokens); False: a prompt may take up to
    max_seq_len - 1 tokens (an example's prompt; distill cuts the completion afterwards)."""


def sampling(cfg: Any) -> Sampling | None:
    """How a step of `cfg` (a TrainConfig) samples from the model it trains; None: it does not."""
    spec = METHODS[cfg.method]
    on = ROLLOUT in spec.phases or (spec.sampling_on is not None
                                    and getattr(cfg, spec.sampling_on[0]) == spec.sampling_on[1])
    if not on or not spec.rows:
        return None
    if spec.rows == GROUPS:
        return Sampling(cfg.rl_prompts, cfg.group_size, cfg.rollout_max_new_tokens, spec.trains_on_rollouts,
                        held_out_decode=True, prompt_room=True)
    return Sampling(cfg.batch_size * cfg.grad_accum, 1, cfg.rollout_max_new_tokens, spec.trains_on_rollouts,
                    held_out_decode=False, prompt_room=False)


def draws_groups(cfg: Any) -> bool:
    """Whether a step of `cfg` (a TrainConfig) samples GRPO's rollouts (groups of completions
    of rl_prompts prompts): what a curriculum and filter_pass_rate choose the prompts of
    (grpo, rft, and dpo with pairs=rollouts)."""
    return sampling(cfg) is not None and METHODS[cfg.method].rows == GROUPS


def groups_methods() -> str:
    """The methods (and settings) whose steps sample GRPO's rollouts, in words: what
    draws_groups accepts."""
    words = [name + ("" if ROLLOUT in spec.phases or spec.sampling_on is None
                     else f" with {spec.sampling_on[0]}={spec.sampling_on[1]}")
             for name, spec in METHODS.items() if spec.rows == GROUPS]
    return ", ".join(f"method={w}" for w in words)


def uses_reference(cfg: Any) -> bool:
    """Whether a step of `cfg` (a TrainConfig) compares with the reference policy (GRPO's
    KL with beta > 0, pref_loss dpo or ipo): under finetune=full a frozen copy of the starting
    weights sits beside the trained ones (the engines' token_logprobs(adapter=False))."""
    rule = METHODS[cfg.method].reference
    if rule is None:
        return False
    field, values = rule
    value = getattr(cfg, field)
    return value > 0 if values == POSITIVE else value in values


def rolls_out(method: str) -> bool:
    """Whether a step of the method samples completions first (an RL method)."""
    return ROLLOUT in METHODS[method].phases


def uses_teacher(method: str) -> bool:
    """Whether a step of the method runs a frozen teacher beside the model (distillation)."""
    return TEACHER in METHODS[method].phases


def check_config(cfg: Any) -> None:
    """The method's own refusals of a validated TrainConfig (MethodSpec.check)."""
    spec = METHODS[cfg.method]
    if spec.check:
        module, fn = spec.check.split(":")
        getattr(importlib.import_module(module), fn)(cfg)


def method_class(method: str) -> type:
    """The class of the named method (it implements train.method.Method)."""
    module, cls = METHODS[method].path.split(":")
    return getattr(importlib.import_module(module), cls)
