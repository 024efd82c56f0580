"""One checkpoint contract for every engine and method: runs/<id>/checkpoints/step-000100/.

A checkpoint is written into a temporary directory beside the final one (its name carries
the writer: fence.tmp_name), every file is fsynced, the directory is renamed into place,
and only then is the COMMIT marker written (and fsynced). A directory without COMMIT is a
write that died: resume ignores it and the next save removes it. A job's writer commits,
and prunes, only after `fence.guard` confirms it still holds the job's lease; only the
owner of a temp dir (or whoever finds the owner dead) removes it. Inside:

    state.json     step, the method's data position, every RNG stream (python, numpy and the
                   engine's), config digest (of config.yaml minus DIGEST_EXEMPT), engine,
                   device kind, model and dataset sha256, created_at: enough to refuse a
                   checkpoint that is not this run's
    config.yaml    the resolved run config
    ...            the engine's payload: weights (trainable ones) and optimizer state as
                   safetensors (torch), or safetensors / orbax (JAX); never pickle
    COMMIT         written last

The engine writes its payload (`Engine.save`), the driver decides when; this module owns
the directory dance, keep-N and the checks on load.

In a multi-process run (train.dist) every process calls `save`: process 0 makes the temp dir,
every process's engine writes its part into it (or process 0 the state gathered from all),
and process 0 commits only after a barrier every process reached. The payload has the same
layout whatever the number of processes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from tunix_rt import fence
from tunix_rt.errors import BadInput
from tunix_rt.files import fsync_dir, fsync_tree, write_text_synced
from tunix_rt.rundir import CHECKPOINTS, CONFIG
from tunix_rt.train import dist
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.faults import fault_point

COMMIT = "COMMIT"
PREFIX = "step-"
STATE = "state.json"
#: config fields that may differ between a checkpoint and the run resuming it, as they change
#: nothing trained: how a run is watched or exported, a reward's time limit, and engine/device
#: as asked (what they resolve to is checked apart: state.json's engine and device_kind must
#: match the resuming process's). A field a later release adds needs no place here: resume
#: compares configs by meaning (config_changes), its default in an older checkpoint is no change.
DIGEST_EXEMPT = ("force", "merge", "log_interval", "engine", "device", "reward_timeout_s")


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS / f"{PREFIX}{step:06d}"


def committed(run_dir: Path) -> list[Path]:
    """Committed checkpoints, oldest first (temp dirs and dirs without COMMIT ignored)."""
    root = run_dir / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / COMMIT).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def latest(run_dir: Path) -> Path | None:
    done = committed(run_dir)
    return done[-1] if done else None


def config_digest(cfg: TrainConfig) -> str:
    """sha256 of the resolved config minus the fields a resume may change."""
    return _digest(_digested(cfg.to_dict()))


def _digest(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def config_changes(ckpt: Path, state: dict[str, Any], cfg: TrainConfig) -> list[str]:
    """What differs between the config `ckpt` was trained with and `cfg`, one line per field
    ([] when nothing does). Called when the digests differ, which a release that adds a
    config field causes by itself: the checkpoint's config.yaml (which must be the config its
    digest was taken of) is read by this version, so a field it lacks takes this version's
    default; a field absent there that `cfg` holds at that default is no change."""
    stored = yaml.safe_load((ckpt / CONFIG).read_text(encoding="utf-8")) if (ckpt / CONFIG).is_file() else None
    if not isinstance(stored, dict) or _digest(_digested(stored)) != state.get("config_digest"):
        return [f"config_digest: the checkpoint has {state.get('config_digest')!r}, this run "
                f"{config_digest(cfg)!r}, and its {CONFIG} is not the config that digest was taken of"]
    try:
        held = TrainConfig.from_dict(stored, source=f"{ckpt / CONFIG}").to_dict()
    except BadInput as e:  # a field this version no longer knows, or a value it refuses
        return [f"config: this version cannot read the checkpoint's config ({e})"]
    now = _digested(cfg.to_dict())
    return [f"config {k}: the checkpoint has {held[k]!r}, this run {v!r}" if k in stored else
            f"config {k}: not in the checkpoint (written before it existed; its default {held[k]!r}), "
            f"this run {v!r}" for k, v in now.items() if held[k] != v]


def _digested(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in DIGEST_EXEMPT}


def save(run_dir: Path, step: int, write_payload: Callable[[Path], dict[str, Any]],
         state: dict[str, Any], cfg: TrainConfig, keep: int) -> Path:
    """Write the checkpoint of `step` atomically, then drop all but the newest `keep`.
    `write_payload(tmp)` is the engine's save; `state` the driver's facts (step, data
    position, identities); the RNG streams of python and numpy are added here."""
    final = step_dir(run_dir, step)
    tmp = Path(dist.broadcast(str(_fresh_tmp(final)) if dist.is_main() else "", "checkpoint dir"))
    engine_facts = write_payload(tmp)
    dist.barrier(f"checkpoint {final.name}")  # every process's part is in
    if not dist.is_main():
        return final
    full = {"step": step, **state, "config_digest": config_digest(cfg),
            "rng": {"python": _python_rng(), "numpy": _numpy_rng(), **engine_facts.pop("rng", {})},
            **engine_facts, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_text_synced(tmp / STATE, json.dumps(full, indent=2))
    write_text_synced(tmp / CONFIG, cfg.to_yaml())
    fsync_tree(tmp)
    fault_point("ckpt-write")
    try:
        fence.guard(f"commit checkpoint {final}")
    except fence.LeaseLost:
        shutil.rmtree(tmp, ignore_errors=True)  # our own temp dir: nothing of ours stays behind
        raise
    clear_uncommitted(final.parent)  # under the lease: a half commit of a writer that lost it
    os.rename(tmp, final)
    fsync_dir(final.parent)
    write_text_synced(final / COMMIT, f"step {step}\n")
    fsync_dir(final)
    prune(run_dir, keep)
    return final


def _fresh_tmp(final: Path) -> Path:
    """An empty temp dir beside `final`, named after its writer; stale ones removed."""
    final.parent.mkdir(parents=True, exist_ok=True)
    clear_stale(final.parent)
    tmp = final.parent / fence.tmp_name(final.name)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def read_state(ckpt: Path) -> dict[str, Any]:
    if not (ckpt / COMMIT).is_file():
        raise BadInput(f"{ckpt}: no COMMIT marker (an interrupted write)")
    return json.loads((ckpt / STATE).read_text())


def check_resumable(ckpt: Path, expect: dict[str, Any], cfg: TrainConfig) -> dict[str, Any]:
    """state.json of `ckpt` when every expected fact (engine, device kind, model and dataset
    sha256) matches and the checkpoint's config means the same as `cfg` (config_changes);
    BadInput naming what the run holds otherwise."""
    state = read_state(ckpt)
    bad = [f"{k}: the checkpoint has {state.get(k)!r}, this run {v!r}" for k, v in expect.items()
           if k != "config_digest" and state.get(k) != v]
    if state.get("config_digest") != config_digest(cfg):  # equal digests: the same config, bit for bit
        bad += config_changes(ckpt, state, cfg)
    if bad:
        raise BadInput(f"{ckpt} cannot continue this run ({'; '.join(bad)}); resume it with what it "
                       "was trained with, or start a new run")
    return state


def restore_host_rng(state: dict[str, Any]) -> None:
    """python's and numpy's global RNG as the checkpoint recorded them."""
    py = state["rng"]["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["rng"]["numpy"]
    key = np.frombuffer(base64.b64decode(n["key"]), dtype=np.uint32)
    np.random.set_state(("MT19937", key, n["pos"], n["has_gauss"], n["cached_gaussian"]))


def _python_rng() -> list:
    v, key, gauss = random.getstate()
    return [v, list(key), gauss]


def _numpy_rng() -> dict[str, Any]:
    _name, key, pos, has_gauss, cached = np.random.get_state()
    return {"key": base64.b64encode(np.asarray(key, np.uint32).tobytes()).decode(), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def prune(run_dir: Path, keep: int) -> None:
    """Keep the newest `keep` committed checkpoints (only the lease holder gets here)."""
    old_ones = committed(run_dir)[:-keep]
    if old_ones:
        fence.guard(f"pruning the checkpoints of {run_dir}")
    for old in old_ones:
        (old / COMMIT).unlink()  # uncommit first: a crash mid-delete leaves an ignored dir
        shutil.rmtree(old)


def clear_stale(root: Path) -> None:
    """Remove the temp dirs this process may remove: its own, and those of dead writers."""
    if not root.is_dir():
        return
    for p in root.iterdir():
        if p.name.startswith(fence.TMP_PREFIX) and fence.may_delete(p.name):
            shutil.rmtree(p, ignore_errors=True)


def clear_uncommitted(root: Path) -> None:
    """Remove step dirs without COMMIT (a writer died between its rename and its marker).
    Called by the lease holder only, right after its guard."""
    for p in root.iterdir():
        if p.name.startswith(PREFIX) and not (p / COMMIT).is_file():
            shutil.rmtree(p, ignore_errors=True)
