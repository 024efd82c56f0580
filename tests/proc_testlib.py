"""Processes found by a marker they carry (Linux /proc), for the tests that must leave none behind."""

from __future__ import annotations

import time
from pathlib import Path


def processes_with(marker: str, where: str = "cmdline", wait: float = 0.0) -> list[int]:
    """pids whose /proc/PID/`where` (cmdline or environ) holds `marker`, after up to `wait`
    seconds for them to go; a process gone meanwhile, or not ours to read, is not counted."""
    deadline = time.monotonic() + wait
    while True:
        found = []
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and marker.encode() in (d / where).read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)
