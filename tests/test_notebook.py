"""The Kaggle notebook: the .ipynb is what jupytext makes of the .py, the accelerator check
stops a CPU run with a clear message, and every cell runs top to bottom on the CPU with the
tiny model (so no cell calls a command or a flag that does not exist)."""

from __future__ import annotations

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
