"""Fault injection for the crash-safety tests: named points in training where a test can
kill or freeze the process (TUNIX_RT_FAULT). Checkpoints, both engines, GRPO and the driver
call it; it sits below them all."""

from __future__ import annotations

import os
import signal

from tunix_rt.train import dist

_FAULT_COUNTS: dict[str, int] = {}


def fault_point(name: str) -> None:
    """Test hook for crash safety: with TUNIX_RT_FAULT=<name>@<n>, the n-th time this process
    reaches the point named <name> it kills itself with SIGKILL (no cleanup can run);
    <name>@<n>:SIGSTOP freezes it there instead (a worker paused past its lease).
    TUNIX_RT_FAULT_RANK=<r> limits it to process r of a multi-process run."""
    spec = os.environ.get("TUNIX_RT_FAULT")
    if not spec or not spec.startswith(name + "@"):
        return
    only = os.environ.get("TUNIX_RT_FAULT_RANK")
    if only is not None and int(only) != dist.rank():
        return
    count, _, sig = spec.split("@", 1)[1].partition(":")
    _FAULT_COUNTS[name] = _FAULT_COUNTS.get(name, 0) + 1
    if _FAULT_COUNTS[name] == int(count):
        os.kill(os.getpid(), getattr(signal, sig or "SIGKILL"))
