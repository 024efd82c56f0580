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
    xla: Annotated[Optional[bool], typer.Option("--xla/--no-xla", help="Also ask XLA (JAX engine only; on by default there).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Predict peak bytes per device of a training step (SFT, or with --rl-prompts,
    --group-size and --rollout-tokens an RL step: rollouts, then the update), say whether it
    fits and what would."""
    rl = (rl_prompts, group_size, rollout_tokens)
    if any(v is not None for v in rl) and any(v is None for v in rl):
        raise BadInput("plan: an RL step needs --rl-prompts, --group-size and --rollout-tokens together")
    plan_command(xla, as_json, model=model, method=method, seq=seq, batch=batch, device=device,
                 devices=devices, strategy=strategy, optimizer=optimizer, dtype=dtype, engine=engine,
                 remat=remat, donate=donate, lora_rank=lora_rank, weight_qtype=weight_qtype,
                 grad_accum=grad_accum, grad_clip=grad_clip, loss_chunk_bytes=loss_chunk_bytes,
                 rl_prompts=rl_prompts or 0, group_size=group_size or 0, rollout_tokens=rollout_tokens or 0,
                 teacher=teacher_model(teacher))


def register(app) -> None:
    """Mount `plan` on the root Typer app (one line in cli._mount)."""
    app.command("plan")(plan_cmd)
