"""The wheel carries what an installed tunix-rt reads at run time: the vendored GSM8K split
(with its licence), the shipped presets, the tiny tokenizer, the registry migrations and the
web UI. A non-editable install (the Kaggle notebook's `pip install tunix-rt[jax,hub]`) has
nothing else."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_wheel_ships_the_runtime_data(tmp_path):
    """Built from a copy of the sources (setuptools writes build/ next to the project)."""
    import shutil

    src = tmp_path / "project"
    shutil.copytree(REPO / "src", src / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    out = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "-q", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = out.glob("tunix_rt-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for want in ("tunix_rt/assets/gsm8k/train.jsonl", "tunix_rt/assets/gsm8k/LICENSE",
                 "tunix_rt/assets/tiny_tokenizer.json", "tunix_rt/configs/cpu-demo.yaml",
                 "tunix_rt/configs/smoke.yaml", "tunix_rt/configs/gpu.yaml"):
        assert want in names, want
    assert any(n.startswith("tunix_rt/registry/migrations/") and n.endswith(".py") for n in names)
    assert any(n.startswith("tunix_rt/service/static/") for n in names)
    with zipfile.ZipFile(wheel) as z:
        data = z.read("tunix_rt/assets/gsm8k/train.jsonl")
    assert data == (REPO / "src/tunix_rt/assets/gsm8k/train.jsonl").read_bytes()
