"""The Kaggle notebook: the .ipynb is what jupytext makes of the .py, every `tunix-rt` command
and flag it writes exists in the real command line and every stage's preset and overrides
(SFT → SimPO → GRPO) load as `tunix-rt train` loads them, the accelerator check stops a CPU
run with a clear message, and every cell runs top to bottom on the CPU with the tiny model
(so no cell calls a command or a flag that does not exist)."""

from __future__ import annotations

import ast
import json
import os
import zipfile
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

REPO = Path(__file__).resolve().parents[1]
PY = REPO / "notebooks" / "kaggle_tpu.py"
IPYNB = REPO / "notebooks" / "kaggle_tpu.ipynb"


def _cells(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def test_ipynb_in_sync_with_py():
    """Regenerate with `jupytext --to ipynb notebooks/kaggle_tpu.py` when this fails."""
    assert _cells(jupytext.read(PY)) == _cells(nbformat.read(IPYNB, as_version=4))


def _literals(node: ast.AST, assigned: dict[str, list[ast.AST]]) -> list[str | None]:
    """The string literals an argument contributes, in order: a literal as itself, a starred
    list (or a name assigned a list anywhere in the notebook) as its literals, anything else
    (a value known only when it runs) as None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Starred):
        values = assigned.get(node.value.id, []) if isinstance(node.value, ast.Name) else [node.value]
        return [c.value for v in values for c in ast.walk(v) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    return [None]


def _tunix_calls() -> list[list[str | None]]:
    """Every `tunix(...)` call of the notebook, as its arguments' literals."""
    tree = ast.parse(PY.read_text(encoding="utf-8"))
    assigned: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    assigned.setdefault(t.id, []).append(node.value)
    return [[lit for a in node.args for lit in _literals(a, assigned)] for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "tunix"]


def test_every_command_and_flag_the_notebook_runs_exists():
    """Each `tunix(...)` call names a real command (group by group, as the parser walks them)
    and only options that command has (no TPU or jax needed to find a renamed flag)."""
    import typer

    from tunix_rt.cli import app

    def group(cmd) -> bool:  # typer >= 0.20 has its own click: no isinstance(click.Group)
        return isinstance(getattr(cmd, "commands", None), dict)

    root = typer.main.get_command(app)
    seen = set()
    for args in _tunix_calls():
        cmd, path = root, []
        for a in args:
            if not (group(cmd) and isinstance(a, str) and a in cmd.commands):
                break
            cmd, path = cmd.commands[a], [*path, a]
        assert not group(cmd) or args == ["--help"], f"tunix({args}): no such command"
        known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
        flags = [a for a in args if isinstance(a, str) and a.startswith("-")]
        assert set(flags) <= known, f"tunix {' '.join(path)}: unknown option(s) {sorted(set(flags) - known)}"
        seen.add(" ".join(path))
    assert {"model import", "model list", "plan", "train", "eval", "compare", "submit"} <= seen


def _cell(tag: str) -> str:
    return next(c.source for c in jupytext.read(PY).cells if tag in c.metadata.get("tags", []))


def test_every_stage_config_loads_as_train_loads_it():
    """The notebook's parameters and its configs cell, run as they are on a TPU: SFT, then
    SimPO (method dpo, pref_loss simpo, on-policy pairs, no reference), then GRPO; and with
    PREF_CONFIG = "" the chain is SFT → GRPO."""
    ns: dict = {}
    exec(_cell("parameters"), ns)
    ns.update(DEVICE="tpu")
    exec(_cell("configs"), ns)
    sft, pref, rl = ns["cfg"], ns["pref_cfg"], ns["rl_cfg"]
    assert (sft.method, pref.method, rl.method) == ("sft", "dpo", "grpo")
    assert (pref.pref_loss, pref.pairs, pref.pref_beta, pref.simpo_gamma) == ("simpo", "rollouts", 2.0, 1.0)
    assert {c.engine for c in (sft, pref, rl)} == {"jax"} and {c.model for c in (sft, pref, rl)} == {ns["MODEL"]}
    assert (pref.max_steps, rl.max_steps) == (ns["PREF_STEPS"], ns["RL_STEPS"])
    ns.update(PREF_CONFIG="")
    exec(_cell("configs"), ns)
    assert ns["pref_cfg"] is None
    ns.update(PREF_CONFIG="gpu-grpo")
    with pytest.raises(ValueError, match="not a preference method"):
        exec(_cell("configs"), ns)


def _with_params(params: dict) -> nbformat.NotebookNode:
    """The notebook with an injected cell after the `parameters` cell (papermill style)."""
    nb = jupytext.read(PY)
    idx = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    source = "\n".join(f"{k} = {v!r}" for k, v in params.items())
    nb.cells.insert(idx + 1, nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]}))
    return nb


def _execute(nb, tmp_path: Path, timeout: int) -> None:
    env_before = dict(os.environ)
    os.environ.update({"JAX_PLATFORMS": "cpu", "COLUMNS": "160"})
    os.environ.pop("DATABASE_URL", None)
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(env_before)


def test_stops_without_tpu_and_runs_nothing_after(tmp_path):
    nb = _with_params({"INSTALL": "", "ALLOW_CPU": False, "HOME_DIR": str(tmp_path / "home")})
    with pytest.raises(CellExecutionError, match="No TPU found"):
        _execute(nb, tmp_path, timeout=300)
    failed = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and any(
        o.get("output_type") == "error" for o in c.get("outputs", [])))
    assert "PROBE" in nb.cells[failed].source
    later = [c for c in nb.cells[failed + 1:] if c.cell_type == "code"]
    assert later and all(c.get("execution_count") is None and not c.get("outputs") for c in later)


@pytest.mark.jax
def test_runs_top_to_bottom_on_cpu_with_tiny_model(tmp_path):
    out_zip = tmp_path / "submission.zip"
    nb = _with_params({
        "ALLOW_CPU": True, "INSTALL": "", "MODEL": "tiny-gemma3", "WEIGHTS": "builtin",
        "CONFIG": "smoke", "STEPS": 2, "EVAL_N": 2, "MAX_NEW_TOKENS": 8,
        "PREF_CONFIG": "smoke", "PREF_STEPS": 2,
        "PREF_EXTRA": ["method=dpo", "pref_loss=simpo", "pref_beta=2.0", "simpo_gamma=1.0", "pairs=rollouts",
                       "rollout_max_new_tokens=8", "rl_prompts=2", "group_size=2", "batch_size=2"],
        "RL_CONFIG": "smoke", "RL_STEPS": 2,
        "RL_EXTRA": ["method=grpo", "rollout_max_new_tokens=8", "rl_prompts=2", "group_size=2"],
        "HOME_DIR": str(tmp_path / "home"), "OUT_ZIP": str(out_zip),
    })
    _execute(nb, tmp_path, timeout=600)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code)
    with zipfile.ZipFile(out_zip) as zf:
        info = json.loads(zf.read("submission.json"))
    assert info["engine"] == "jax" and info["eval_metrics"]["n"] == 2
    runs = {json.loads((d / "run_manifest.json").read_text())["config"]["method"]: d
            for d in (tmp_path / "home" / "runs").iterdir()}
    assert set(runs) == {"sft", "dpo", "grpo"}  # SFT → SimPO → GRPO, each from the one before
    pref = json.loads((runs["dpo"] / "run_manifest.json").read_text())["config"]
    rl = json.loads((runs["grpo"] / "run_manifest.json").read_text())["config"]
    assert pref["pref_loss"] == "simpo" and pref["init"] == runs["sft"].name and rl["init"] == runs["dpo"].name
    assert (runs["dpo"] / "eval" / "kaggle-pref" / "eval_summary.json").is_file()
