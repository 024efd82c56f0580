"""Is the process writing a run still there?

A run records its writer in run_manifest.json when it starts (`process`: host, pid, the
process's start time, which tells a reused pid apart, and its pid namespace). A SIGKILL
leaves the manifest saying `running` for ever, so `registry sync` asks here about every run
still `created` or `running`: on this host (and pid namespace: not another container),
whether that process lives; elsewhere (or for a run from before the record existed),
whether any of the run's files changed in the last STALE_AFTER_S. A run whose writer is
gone is marked `interrupted` in its manifest, with the reason and its last committed
checkpoint, as the process marks itself on a Ctrl-C: the files stay the source of truth,
and `--resume` continues it.

Nothing here imports the registry's database; the trainer records its writer with
tunix_rt.process.process_identity(), which this module asks about.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from pathlib import Path
from typing import Any

from tunix_rt import fence
from tunix_rt.files import write_json_atomic
from tunix_rt.process import pid_namespace, proc_stat
from tunix_rt.rundir import CHECKPOINTS, MANIFEST

LIVE = ("created", "running")
"""Manifest statuses that only the run's own process leaves."""
STALE_AFTER_S = 3600.0
"""A run whose writer cannot be asked (another host) is presumed gone after this long with
no file of it changed (every step appends to data_order.jsonl)."""
STEP_DIR = re.compile(r"^step-(\d+)$")


def gone_reason(run_dir: Path, manifest: dict[str, Any], stale_after_s: float = STALE_AFTER_S) -> str | None:
    """Why the writer of this `created`/`running` run is gone, or None while it may live."""
    proc = manifest.get("process") if isinstance(manifest.get("process"), dict) else {}
    if (proc.get("host"), proc.get("pidns")) == (fence.host_name(), pid_namespace()) and isinstance(proc.get("pid"), int):
        return _pid_gone(proc)
    silent = time.time() - last_sign_of_life(run_dir)
    if silent <= stale_after_s:
        return None
    who = f"its process {proc.get('pid')} on {proc.get('host')}" if proc else "its process"
    return f"no file of the run changed for {silent:.0f} s (over {stale_after_s:.0f} s): {who} is presumed gone"


def _pid_gone(proc: dict[str, Any]) -> str | None:
    pid, start = proc["pid"], proc.get("start")
    stat = proc_stat(pid)
    if not fence.pid_alive(pid) or (stat and stat[0] == "Z"):  # a zombie waits only for its parent
        return f"its process {pid} on {proc['host']} is gone (killed?)"
    if start is not None and stat and int(stat[19]) != start:
        return f"its process {pid} on {proc['host']} is gone (that pid is another process now)"
    return None


def last_sign_of_life(run_dir: Path) -> float:
    """The newest modification time of the run's files and checkpoint directories."""
    paths = [run_dir, *run_dir.iterdir(), *(run_dir / CHECKPOINTS).glob("*")]
    return max(_mtime(p) for p in paths)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile (a pruned checkpoint)
        return 0.0


def mark_if_gone(run_dir: Path, stale_after_s: float = STALE_AFTER_S) -> str | None:
    """Mark the run `interrupted` in its manifest when its writer is gone; returns the reason
    (None: left as it is). The manifest is read again just before the write, and left alone
    if its writer changed meanwhile (a --resume that just started)."""
    manifest = _read(run_dir)
    if manifest is None or manifest.get("status") not in LIVE:
        return None
    reason = gone_reason(run_dir, manifest, stale_after_s)
    if reason is None:
        return None
    now = _read(run_dir)
    if now is None or now.get("status") != manifest.get("status") or now.get("process") != manifest.get("process"):
        return None
    ended = dt.datetime.fromtimestamp(last_sign_of_life(run_dir), dt.timezone.utc)
    error = f"{reason}; {_resume_hint(run_dir)}"
    write_json_atomic(run_dir / MANIFEST, {**now, "status": "interrupted", "error": error,
                                           "finished_at": ended.isoformat(timespec="seconds")})
    return reason


def _resume_hint(run_dir: Path) -> str:
    steps = sorted(int(m.group(1)) for p in (run_dir / "checkpoints").glob("*/COMMIT")
                   if (m := STEP_DIR.match(p.parent.name)))
    if not steps:
        return f"no committed checkpoint: `tunix-rt train --resume {run_dir.name}` starts it again"
    return f"last committed checkpoint step-{steps[-1]:06d}: `tunix-rt train --resume {run_dir.name}` continues it"


def _read(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((run_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
