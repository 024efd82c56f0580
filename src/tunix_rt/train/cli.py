"""`tunix-rt train`: a YAML config or preset plus key=value overrides, then one engine.

torch and jax are imported inside the command, so `tunix-rt --help` stays fast."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from tunix_rt.errors import BadInput


def train_cmd(
    overrides: Annotated[Optional[list[str]], typer.Argument(
        help="Config overrides as key=value (values parsed as YAML), e.g. max_steps=20 lr=1e-4.",
        show_default=False)] = None,
    config: Annotated[Optional[str], typer.Option(
        "--config", "-c", help="A YAML config file or a shipped preset: smoke, cpu-demo, gpu.")] = None,
    engine: Annotated[Optional[str], typer.Option(
        "--engine", help="auto | torch | jax (default: the config's engine, auto).")] = None,
    device: Annotated[Optional[str], typer.Option(
        "--device", help="auto | cpu | cuda (torch) | gpu | tpu (jax) (default: the config's).")] = None,
    resume: Annotated[Optional[str], typer.Option(
        "--resume", help="Continue the run RUN (an id under <home>/runs, or its path) from its last checkpoint.")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Run even when the memory plan predicts the run will not fit.")] = False,
    merge: Annotated[bool, typer.Option(
        "--merge", help="Also write final/merged/ (HF layout) at the end of a LoRA run.")] = False,
) -> None:
    """Fine-tune a Gemma model on a trace dataset (LoRA or full); writes runs/<run_id>/."""
    from tunix_rt.home import Home
    from tunix_rt.train import engines
    from tunix_rt.train.config import TrainConfig

    home = Home.resolve()
    items = list(overrides or [])
    if resume:
        if config or items:
            raise BadInput("--resume continues a run with its own config; drop --config and key=value overrides "
                           "(--engine and --device must resolve to what its checkpoint was trained with)")
        from tunix_rt.rundir import CONFIG
        from tunix_rt.train.run import resolve_run

        config = str(resolve_run(resume, home) / CONFIG)
    for flag, value, allowed in (("engine", engine, engines.CHOICES), ("device", device, engines.DEVICES)):
        if value is not None:
            if value not in allowed:
                raise BadInput(f"--{flag} must be one of {'|'.join(allowed)}, got {value!r}")
            items.append(f"{flag}={value}")
    if force:
        items.append("force=true")
    if merge and not resume:
        items.append("merge=true")
    cfg = TrainConfig.load(config, items)
    from tunix_rt.registry.live import LiveIndex
    from tunix_rt.registry.record import record_run
    from tunix_rt.train import dist
    from tunix_rt.train.driver import train
    from tunix_rt.train.run import StopOnSigterm

    with StopOnSigterm() as stop:  # the registry shows the run while it trains (LiveIndex)
        run_dir = train(cfg, home, resume, should_stop=stop, on_update=LiveIndex())
    if not dist.is_main():  # under torchrun: process 0 records and reports the run
        return
    record_run(run_dir)  # the run directory stays the source of truth; the registry points at it
    typer.echo(str(run_dir))
