"""This process, and others on this host, as a run manifest records its writer.

A run records who writes it (`identity()`: host, pid, the process's start time, which tells
a reused pid apart, and its pid namespace) when it starts; `registry sync` later asks
whether that writer is still there (registry.liveness). It is about the process, not the
registry, so training records it without importing the registry.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tunix_rt import fence


def process_identity() -> dict[str, Any]:
    """This process, as a run manifest records its writer."""
    pid = os.getpid()
    return {"host": fence.host_name(), "pid": pid, "start": start_ticks(pid), "pidns": pid_namespace()}


def pid_namespace() -> str | None:
    """Which pid namespace this process sees (containers on one host name share none):
    only a process in the same one may ask about a pid."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks after boot); None where there is no /proc."""
    stat = proc_stat(pid)
    return int(stat[19]) if stat else None


def proc_stat(pid: int) -> list[str] | None:
    """Fields 3.. of Linux /proc/<pid>/stat (state, ppid, …; [19] is field 22, starttime)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # after "(comm)"
        int(fields[19])
        return fields
    except (OSError, ValueError, IndexError):
        return None
