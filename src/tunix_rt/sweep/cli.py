"""`tunix-rt sweep --config BASE --space SPACE.yaml --trials N` (create the study, enqueue the
trial jobs for any number of `tunix-rt worker`s), `tunix-rt sweep show NAME`, `sweep list`."""

from __future__ import annotations

import json
import re
import time
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from tunix_rt.errors import BadInput

app = typer.Typer(help="Hyperparameter sweeps (Optuna TPE + median pruning), one queue job per trial.",
                  invoke_without_command=True)
out = Console()


@app.callback()
def sweep_cmd(
    ctx: typer.Context,
    config: Annotated[Optional[str], typer.Option(
        "--config", "-c", help="The base config: a YAML file or a shipped preset (smoke, cpu-demo, gpu).")] = None,
    space: Annotated[Optional[str], typer.Option("--space", help="SPACE.yaml: params, enqueue, sampler, pruner, objective (default eval_loss, minimize).")] = None,
    trials: Annotated[Optional[int], typer.Option("--trials", help="How many trials (one job each).")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="The sweep (study) name (default: sweep-<time>).")] = None,
    overrides: Annotated[Optional[list[str]], typer.Option(
        "--set", help="A key=value override of the base config (repeatable), e.g. --set max_steps=40.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seeds the sampler (per job).")] = 0,
    max_attempts: Annotated[int, typer.Option("--max-attempts", help="Attempts per trial job.")] = 3,
) -> None:
    """Create a sweep: the study in the registry's database and one `trial` job per trial.
    Start `tunix-rt worker`s (any machines, the same DATABASE_URL) to run them."""
    if ctx.invoked_subcommand is not None:
        if config or space or trials is not None:
            raise BadInput(f"`sweep {ctx.invoked_subcommand}` takes no --config/--space/--trials")
        return
    if not (config and space and trials is not None):
        raise BadInput("give --config BASE --space SPACE.yaml --trials N (or: sweep show NAME, sweep list)")
    from tunix_rt.registry.jobs import NAME
    from tunix_rt.sweep.space import load_space
    from tunix_rt.sweep.study import create_sweep
    from tunix_rt.train.config import TrainConfig

    name = name or time.strftime("sweep-%Y%m%d-%H%M%S", time.gmtime())
    if not re.match(NAME, name):
        raise BadInput(f"--name {name!r}: letters, digits, '.', '_' and '-' only (at most 100)")
    base = TrainConfig.load(config, list(overrides or []))
    spec = load_space(space)
    jobs = create_sweep(name, base.to_dict(), spec, trials, seed=seed, max_attempts=max_attempts)
    out.print(f"sweep {name}: {trials} trial job(s) queued (jobs {jobs[0]}..{jobs[-1]}); "
              f"objective {spec.objective.metric}, {spec.objective.direction}d; params {', '.join(spec.params)}",
              highlight=False)
    if not base.eval_interval:
        out.print(f"note: eval_interval is 0, so trials report only their final {spec.objective.metric} and none "
                  "can be pruned", highlight=False)
    out.print(f"run them with `tunix-rt worker` (as many as you like); then `tunix-rt sweep show {name}`",
              highlight=False)


@app.command("show")
def show_cmd(
    name: Annotated[str, typer.Argument(help="The sweep (study) name.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the sweep as one JSON object.")] = False,
) -> None:
    """The trials table (one row per trial job) and the best config so far."""
    from tunix_rt.sweep.study import describe

    d = describe(name)
    if as_json:
        typer.echo(json.dumps(d, indent=2, default=str))
        return
    params = list(d["space"]["params"])
    table = Table("trial", "state", d["objective"], *params, "last step", "job", "run",
                  title=f"sweep {name}: {len(d['trials'])} trial(s) of {d['trials_requested']}")
    for r in d["trials"]:
        table.add_row("-" if r["trial"] is None else str(r["trial"]), r["state"], _num(r["value"]),
                      *[_num(r["params"].get(p)) for p in params], _num(r["last_step"]),
                      f"#{r['job_id']} {r['job_status']}", r["run_id"] or "")
    out.print(table)
    best = d["best"]
    if best is None:
        out.print("best: none yet (no trial completed)", highlight=False)
        return
    out.print(f"best: trial {best['trial']}, {d['objective']} {best['value']:.6g}, "
              + ", ".join(f"{k}={_num(v)}" for k, v in best["params"].items())
              + (f" (run {best['run_id']})" if best["run_id"] else ""), highlight=False)
    out.print("best config (the base with these values; `--json` prints it whole):", highlight=False)
    for k, v in best["params"].items():
        out.print(f"  {k}: {json.dumps(v)}", highlight=False)


@app.command("list")
def list_cmd() -> None:
    """Every sweep, newest first."""
    from tunix_rt.sweep.study import list_sweeps

    table = Table("sweep", "created", "trials asked", "objective", "best", "params")
    for s in list_sweeps():
        table.add_row(s["name"], s["created_at"][:19], f"{s['trials_asked']}/{s['trials_requested']}",
                      f"{s['objective']} ({s['direction'][:3]})", _num(s["best_value"]), ", ".join(s["params"]))
    out.print(table)


def _num(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)
