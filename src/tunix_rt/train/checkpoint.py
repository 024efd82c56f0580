"""Atomic, self-describing checkpoints: runs/<id>/checkpoints/step-000100/.

A checkpoint is written into a temporary directory beside the final one, every file is
fsynced, the directory is renamed into place, and only then is the COMMIT marker written
(and fsynced). A directory without COMMIT is a write that died: resume ignores it and the
next save removes it. Everything is safetensors or JSON, never pickle:

    weights.safetensors    trainable tensors by parameter name (the LoRA adapter, or all weights)
    optimizer.safetensors  every tensor of the optimizer state, as state.<index>.<key>
    optimizer.json         param groups, non-tensor state, and the parameter names by index
    rng.safetensors        torch CPU (and CUDA) generator states, numpy's MT19937 key
    state.json             step, data position and seed, python/numpy RNG scalars, model and
                           dataset sha256, engine, created_at
    config.yaml            the resolved run config
    COMMIT                 written last
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tunix_rt.errors import TunixRtError
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.data import DataPosition
from tunix_rt.train.run import fault_point

COMMIT = "COMMIT"
PREFIX = "step-"


@dataclass(frozen=True)
class Restored:
    """What a checkpoint gives back besides the tensors it loads in place."""

    step: int
    position: DataPosition
    state: dict[str, Any]
    path: Path


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"{PREFIX}{step:06d}"


def committed(run_dir: Path) -> list[Path]:
    """Committed checkpoints, oldest first (temp dirs and dirs without COMMIT ignored)."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / COMMIT).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def latest(run_dir: Path) -> Path | None:
    done = committed(run_dir)
    return done[-1] if done else None


def save(run_dir: Path, step: int, params: dict, optimizer, position: DataPosition,
         cfg: TrainConfig, meta: dict[str, Any], keep: int) -> Path:
    """Write the checkpoint of `step` atomically, then drop all but the newest `keep`."""
    from safetensors.torch import save_file

    final = step_dir(run_dir, step)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    _clear_stale(final.parent)
    if final.exists():  # an uncommitted leftover of the same step
        shutil.rmtree(final)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in params.items()}, str(tmp / "weights.safetensors"))
    opt_tensors, opt_json = flatten_optimizer(optimizer.state_dict(), list(params))
    save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
    rng_tensors, rng_json = capture_rng()
    save_file(rng_tensors, str(tmp / "rng.safetensors"))
    state = {"step": step, "data_position": {"epoch": position.epoch, "cursor": position.cursor},
             "data_seed": cfg.seed, "rng": rng_json, "created_at": _now(), **meta}
    _write_text(tmp / "optimizer.json", json.dumps(opt_json))
    _write_text(tmp / "state.json", json.dumps(state, indent=2))
    _write_text(tmp / "config.yaml", cfg.to_yaml())
    for f in tmp.iterdir():
        _fsync(f)
    _fsync(tmp)
    fault_point("ckpt-write")
    os.rename(tmp, final)
    _fsync(final.parent)
    _write_text(final / COMMIT, f"step {step}\n")
    _fsync(final)
    _prune(run_dir, keep)
    return final


def load(ckpt: Path, params: dict, optimizer, expect: dict[str, Any]) -> Restored:
    """Load weights and optimizer state in place and restore every RNG; refuse a checkpoint
    made from another model or dataset (`expect` holds the current sha256 values)."""
    from safetensors.torch import load_file

    if not (ckpt / COMMIT).is_file():
        raise TunixRtError(f"{ckpt}: no COMMIT marker (an interrupted write)")
    state = json.loads((ckpt / "state.json").read_text())
    for key, value in expect.items():
        if state.get(key) != value:
            raise TunixRtError(f"{ckpt}: {key} is {state.get(key)!r}, this run has {value!r}; refusing to resume")
    weights = load_file(str(ckpt / "weights.safetensors"))
    if set(weights) != set(params):
        missing, extra = sorted(set(params) - set(weights)), sorted(set(weights) - set(params))
        raise TunixRtError(f"{ckpt}: weights do not match the model (missing {missing[:3]}, extra {extra[:3]})")
    import torch

    with torch.no_grad():
        for name, p in params.items():
            p.copy_(weights[name])
    opt_json = json.loads((ckpt / "optimizer.json").read_text())
    if opt_json["param_names"] != list(params):
        raise TunixRtError(f"{ckpt}: optimizer parameter order differs from the model's")
    optimizer.load_state_dict(unflatten_optimizer(load_file(str(ckpt / "optimizer.safetensors")), opt_json))
    restore_rng(load_file(str(ckpt / "rng.safetensors")), state["rng"])
    pos = state["data_position"]
    return Restored(state["step"], DataPosition(pos["epoch"], pos["cursor"]), state, ckpt)


def flatten_optimizer(sd: dict, names: list[str]) -> tuple[dict, dict]:
    """torch optimizer state dict → (tensors for safetensors, JSON for the rest)."""
    import torch

    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for key, value in st.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{idx}.{key}"] = value.detach().contiguous().cpu()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars, "param_names": names}


def unflatten_optimizer(tensors: dict, meta: dict) -> dict:
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = value
    for idx, st in meta["scalars"].items():
        state.setdefault(int(idx), {}).update(st)
    return {"state": state, "param_groups": meta["param_groups"]}


def capture_rng() -> tuple[dict, dict]:
    """Generator states of python, numpy and torch (CPU and every CUDA device)."""
    import torch

    np_state = np.random.get_state()
    tensors = {"torch_cpu": torch.get_rng_state(), "numpy_key": torch.from_numpy(np_state[1].astype(np.int64))}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    py = random.getstate()
    scalars = {"python": [py[0], list(py[1]), py[2]],
               "numpy": {"pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])}}
    return tensors, scalars


def restore_rng(tensors: dict, scalars: dict) -> None:
    import torch

    torch.set_rng_state(tensors["torch_cpu"])
    cuda = sorted(k for k in tensors if k.startswith("torch_cuda_"))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda])
    n = scalars["numpy"]
    np.random.set_state(("MT19937", tensors["numpy_key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    v, key, gauss = scalars["python"]
    random.setstate((v, tuple(key), gauss))


def _prune(run_dir: Path, keep: int) -> None:
    for old in committed(run_dir)[:-keep]:
        (old / COMMIT).unlink()  # uncommit first: a crash mid-delete leaves an ignored dir
        shutil.rmtree(old)


def _clear_stale(root: Path) -> None:
    """Remove temp dirs and uncommitted step dirs left by a killed writer."""
    if not root.is_dir():
        return
    for p in root.iterdir():
        if p.name.startswith(".tmp-") or (p.name.startswith(PREFIX) and not (p / COMMIT).is_file()):
            shutil.rmtree(p, ignore_errors=True)


def _write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
