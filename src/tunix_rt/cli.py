"""The `tunix-rt` command: a thin Typer app. Each stage owns its commands (traces/cli.py,
models/cli.py, …); this file mounts them, sets the home, and maps errors to exit codes:
0 success, 1 failure, 2 bad input or bad usage."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from tunix_rt import __version__
from tunix_rt.errors import TunixRtError

app = typer.Typer(
    name="tunix-rt",
    help="Teach small Gemma models to show their reasoning, and prove what they learned.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
err = Console(stderr=True)


@app.callback(invoke_without_command=True)
def _root(
    home: Annotated[Optional[str], typer.Option("--home", help="Home directory (default: $TUNIX_RT_HOME or ~/.tunix-rt).")] = None,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        print(__version__)
        raise typer.Exit(0)
    if home:
        # One place sets it; every stage (and any subprocess it starts) reads Home.resolve().
        os.environ["TUNIX_RT_HOME"] = os.path.abspath(os.path.expanduser(home))


def _mount() -> None:
    """Each stage registers its own commands. Imports stay light: heavy libraries (torch,
    jax) are imported inside the commands that need them."""
    from tunix_rt.traces.cli import app as data_app
    from tunix_rt.models.cli import app as model_app

    app.add_typer(data_app, name="data", help="Import, validate, list and render trace datasets.")
    app.add_typer(model_app, name="model", help="Import and list Gemma checkpoints.")
    from tunix_rt.train.cli import train_cmd

    app.command("train")(train_cmd)
    from tunix_rt.demo import demo_command
    from tunix_rt.submit import submit_command

    app.command("demo")(demo_command)
    app.command("submit")(submit_command)
    from tunix_rt.registry.cli import registry_app, runs_app, worker
    from tunix_rt.service.cli import serve

    app.add_typer(runs_app, name="runs", help="List and show training runs in the registry.")
    app.add_typer(registry_app, name="registry", help="Index the home into the registry; list jobs.")
    app.command("worker")(worker)
    app.command("serve")(serve)
    from tunix_rt.chat import chat_cmd

    app.command("chat")(chat_cmd)
    from tunix_rt.eval.cli import compare_cmd, eval_cmd

    app.command("eval")(eval_cmd)
    app.command("compare")(compare_cmd)
    from tunix_rt.sweep.cli import app as sweep_app

    app.add_typer(sweep_app, name="sweep", help="Hyperparameter sweeps on the job queue; `sweep show NAME`.")
    from tunix_rt.plan.cli import register as register_plan

    register_plan(app)


_mount()


#: the commands that train, sample or serve a model: run with jemalloc (heap.reexec_with_jemalloc)
COMPUTE_COMMANDS = frozenset({"train", "demo", "eval", "chat", "serve", "worker"})


def _command(args: list[str]) -> str | None:
    """The command of `tunix-rt ARGS` (the first word after the root options)."""
    it = iter(args)
    for a in it:
        if a == "--home":
            next(it, None)
        elif not a.startswith("-"):
            return a
    return None


def _own_command_line(orig: list[str]) -> bool:
    """`orig` (sys.orig_argv) runs this program: the tunix-rt script or `-m tunix_rt.cli`,
    behind any interpreter options (torchrun's -u); not a test runner that calls main()."""
    it = iter(orig[1:])
    for a in it:
        if a == "-m":
            return next(it, None) == "tunix_rt.cli"
        if a in ("-X", "-W", "-Q"):
            next(it, None)
        elif not a.startswith("-"):
            return os.path.basename(a) == "tunix-rt" or a.replace(os.sep, "/").endswith("tunix_rt/cli.py")
    return False


def main() -> None:
    orig = list(getattr(sys, "orig_argv", []))
    if _command(sys.argv[1:]) in COMPUTE_COMMANDS and _own_command_line(orig):
        from tunix_rt.heap import reexec_with_jemalloc

        reexec_with_jemalloc(orig)
    try:
        app()
    except TunixRtError as e:
        err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
