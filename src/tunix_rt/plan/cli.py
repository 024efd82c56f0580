"""`tunix-rt plan`: the memory plan on the command line (Typer). Only the CLI imports this
module: training asks tunix_rt.plan directly and never loads Typer."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from tunix_rt.errors import BadInput
from tunix_rt.plan import DEVICES, PlanInputs, make_plan, device_spec, resolve_engine
from tunix_rt.plan.teacher import teacher_model
from tunix_rt.train.chunking import DEFAULT_CHUNK_BYTES
from tunix_rt.train.methods import METHODS, uses_teacher


def plan_command(xla: bool | None, as_json: bool, **fields) -> None:
    """`tunix-rt plan`: print the plan (rich table, verdict, suggestions) or its JSON.
    `fields` are PlanInputs' with engine and dtype possibly "auto"."""
    fields["engine"] = resolve_engine(fields["engine"], fields["device"])
    if fields["dtype"] == "auto":  # what a run on that device would use: bf16 where it is native
        spec = device_spec(fields["device"])
        fields["dtype"] = "bf16" if spec.bf16 and spec.kind != "cpu" else "fp32"
    inp = PlanInputs(**fields)
    run_xla = inp.engine == "jax" if xla is None else xla
    if run_xla and inp.engine != "jax":
        raise BadInput("--xla needs --engine jax (it compiles the JAX train step)")
    if as_json:
        plan = make_plan(inp, xla=run_xla)
        print(json.dumps(plan.to_json()))
        return
    from rich.console import Console

    console = Console()
    if run_xla:
        with console.status(f"compiling the JAX train step on {inp.devices} fake CPU device(s) for XLA's estimate…"):
            plan = make_plan(inp, xla=True)
    else:
        plan = make_plan(inp)
    console.print(plan.renderable())


def plan_cmd(
    model: Annotated[str, typer.Option("--model", help="Catalog preset or model directory.")],
    method: Annotated[str, typer.Option("--method", help="lora or full.")] = "lora",
    seq: Annotated[int, typer.Option("--seq", help="Sequence length (tokens).")] = 512,
    batch: Annotated[int, typer.Option("--batch", help="Sequences per micro-batch, over all devices.")] = 4,
    device: Annotated[str, typer.Option("--device", help="cpu, cuda, or a named kind: " + ", ".join(DEVICES))] = "cpu",
    devices: Annotated[int, typer.Option("--devices", help="Devices (JAX: the fsdp x tp mesh; torch: torchrun ranks).")] = 1,
    strategy: Annotated[str, typer.Option("--strategy", help="Several devices: fsdp (shard weights, gradients, optimizer) or ddp (torch: replicas); auto: fsdp for JAX and full fine-tuning, ddp for torch LoRA.")] = "auto",
    optimizer: Annotated[str, typer.Option("--optimizer", help="adamw or adafactor.")] = "adamw",
    dtype: Annotated[str, typer.Option("--dtype", help="Parameter dtype: fp32, bf16 or auto (bf16 on TPUs and bf16 GPUs).")] = "auto",
    engine: Annotated[str, typer.Option("--engine", help="torch, jax or auto (train's rule: jax on TPUs, torch where it is installed).")] = "auto",
    remat: Annotated[bool, typer.Option("--remat/--no-remat", help="Rematerialise layer activations in backward.")] = False,
    donate: Annotated[bool, typer.Option("--donate/--no-donate", help="JAX: the step donates the model, as our engine does (--no-donate: Tunix's PeftTrainer, old and new weights both live).")] = True,
    lora_rank: Annotated[int, typer.Option("--lora-rank", help="LoRA rank.")] = 16,
    weight_qtype: Annotated[Optional[str], typer.Option("--weight-qtype", help="QLoRA base weights: nf4 or int8 (JAX).")] = None,
    grad_accum: Annotated[int, typer.Option("--grad-accum", help="Micro-batches per optimizer step.")] = 1,
    grad_clip: Annotated[float, typer.Option("--grad-clip", help="Global-norm clip (0: none; JAX then streams gradients into the update).")] = 1.0,
    loss_chunk_bytes: Annotated[int, typer.Option("--loss-chunk-bytes", help="Bytes of one chunk's fp32 logits in the chunked loss (train config loss_chunk_bytes).")] = DEFAULT_CHUNK_BYTES,
    rl_prompts: Annotated[Optional[int], typer.Option("--rl-prompts", help="RL step (GRPO): prompts per step (rl_prompts); with --group-size and --rollout-tokens.")] = None,
    group_size: Annotated[Optional[int], typer.Option("--group-size", help="RL step: completions sampled per prompt (group_size).")] = None,
    rollout_tokens: Annotated[Optional[int], typer.Option("--rollout-tokens", help="RL step: most new tokens per completion (rollout_max_new_tokens); prompts get --seq minus these.")] = None,
    teacher: Annotated[Optional[str], typer.Option("--teacher", help="Distillation: the teacher (catalog preset, model directory or run); its weights, forward and loss terms are added.")] = None,
    train_method: Annotated[Optional[str], typer.Option("--train-method", help="The training method whose sampling to plan (train config `method`): grpo (the default with --rl-prompts: its update trains on the rollouts), rft or dpo with --pairs rollouts (the rollouts, then the method's own step), distill with --on-policy (one completion of each of the step's --batch x --grad-accum examples).")] = None,
    pairs: Annotated[str, typer.Option("--pairs", help="dpo: dataset or rollouts (GRPO's rollouts paired: planned with them).")] = "dataset",
    on_policy: Annotated[bool, typer.Option("--on-policy", help="distill: the student samples its completions (kd_on_policy), --rollout-tokens each.")] = False,
    reference: Annotated[bool, typer.Option("--reference", help="--method full with a loss that compares with the reference policy (dpo, ipo, GRPO's beta > 0): a frozen copy of the starting weights is resident (LoRA's reference is the adapter-off model: nothing added).")] = False,
    xla: Annotated[Optional[bool], typer.Option("--xla/--no-xla", help="Also ask XLA (JAX engine only; on by default there).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Predict peak bytes per device of a training step (SFT, or with --rl-prompts,
    --group-size and --rollout-tokens an RL step: rollouts, then the update; --train-method
    plans another method's sampling), say whether it fits and what would."""
    sampled = _sampling(train_method, rl_prompts, group_size, rollout_tokens, batch, grad_accum, pairs, on_policy)
    if train_method and uses_teacher(train_method) and not teacher:
        raise BadInput(f"plan: --train-method {train_method} needs --teacher (its weights, forward and loss terms)")
    if reference and method != "full":
        raise BadInput("plan: --reference counts full fine-tuning's frozen copy of the weights; with --method lora "
                       "the reference is the adapter-off model (nothing to add): drop --reference")
    if reference and train_method and METHODS[train_method].reference is None:
        raise BadInput(f"plan: --train-method {train_method} never compares with a reference policy: drop --reference")
    plan_command(xla, as_json, model=model, method=method, seq=seq, batch=batch, device=device,
                 devices=devices, strategy=strategy, optimizer=optimizer, dtype=dtype, engine=engine,
                 remat=remat, donate=donate, lora_rank=lora_rank, weight_qtype=weight_qtype,
                 grad_accum=grad_accum, grad_clip=grad_clip, loss_chunk_bytes=loss_chunk_bytes,
                 teacher=teacher_model(teacher), reference=reference, **sampled)


#: the flags of a step's sampling, in PlanInputs' order (rl_prompts, group_size, rollout_tokens)
RL_FLAGS = ("--rl-prompts", "--group-size", "--rollout-tokens")


def _sampling(train_method: str | None, rl_prompts: int | None, group_size: int | None, rollout_tokens: int | None,
              batch: int, grad_accum: int, pairs: str, on_policy: bool) -> dict:
    """The PlanInputs of the sampling the flags describe, by the training path's own rule
    (train.methods.sampling, plan.make.sampling_inputs); {} for a step that does not sample."""
    from types import SimpleNamespace

    from tunix_rt.plan.make import sampling_inputs
    from tunix_rt.train.methods import METHODS

    rl = (rl_prompts, group_size, rollout_tokens)
    name = train_method or ("grpo" if any(v is not None for v in rl) else "sft")
    if name not in METHODS:
        raise BadInput(f"plan: --train-method must be one of {'|'.join(METHODS)}, got {name!r}")
    if pairs not in ("dataset", "rollouts"):
        raise BadInput(f"plan: --pairs must be dataset or rollouts, got {pairs!r}")
    flags = SimpleNamespace(method=name, rl_prompts=rl_prompts, group_size=group_size,
                            rollout_max_new_tokens=rollout_tokens, batch_size=batch, grad_accum=grad_accum,
                            pairs=pairs, kd_on_policy=on_policy)
    out = sampling_inputs(flags)
    asked = [f for f, v in zip(RL_FLAGS, rl) if v is not None]
    if not out:
        if asked:
            raise BadInput(f"plan: {', '.join(asked)}: --train-method {name} samples nothing (grpo and rft do; dpo "
                           "with --pairs rollouts; distill with --on-policy)")
        return {}
    used = RL_FLAGS[2:] if out["long_prompts"] else RL_FLAGS  # one completion of each example: tokens only
    if asked != list(used):
        raise BadInput(f"plan: a {name} step that samples needs {', '.join(used)}"
                       + (" together" if len(used) > 1 else " (its rows are --batch x --grad-accum examples)")
                       + f"; got {', '.join(asked) or 'none'}")
    return out


def register(app) -> None:
    """Mount `plan` on the root Typer app (one line in cli._mount)."""
    app.command("plan")(plan_cmd)
