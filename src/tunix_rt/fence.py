"""Fencing for files: a job's writes happen only while its worker still holds the job's lease.

The queue fences database rows with the lease token (registry/queue.py). Files need the same
care: a retried train job resumes the *same* run directory, so a worker that was paused past
its lease (SIGSTOP, a long GC, a partition) and its successor could both write it. Before
every write that others rely on (a checkpoint commit and prune, a final export, the run
manifest, metrics lines, an evaluation dir, a registry row), the writer calls `guard(what)`:

- no fence installed (the `tunix-rt train` CLI, tests, the API): nothing happens;
- a fence installed (a worker running a job): one database round trip renews the lease
  under its token; if the token no longer holds, the refused write is logged and LeaseLost
  raised, and the writer stops (nothing more is written by it).

A renewal gives the writer a whole lease period in which nobody can take the job over, so a
write that follows its guard by milliseconds is safe. What no check-then-write scheme closes
is a process paused *between* its guard and its write; filesystems take no fencing tokens.

Temp directories carry their owner (`owner_tag()`: host, pid, lease token), so a writer
removes only its own leftovers or those of a process that is provably dead (`may_delete`).

Nothing here imports torch, JAX or the registry: the worker installs a checker
(`installed(checker, token)`), the engines only call `guard`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator

from tunix_rt.errors import TunixRtError

log = logging.getLogger("tunix_rt.fence")

TMP_PREFIX = ".tmp-"
SEP = "@"
"""Separates a temp dir's target name from its owner: `.tmp-<target>@<host>@<pid>@<token>`."""


class LeaseLost(TunixRtError):
    """This process no longer holds the lease of the job it is running: stop writing."""


Checker = Callable[[], bool]
"""Renews the lease (one round trip) and says whether it still holds; raises when it cannot
tell (the database unreachable for a whole lease period)."""

_checker: Checker | None = None
_token: str = "0"
_lock = threading.Lock()


@contextlib.contextmanager
def installed(checker: Checker, token: int | str) -> Iterator[None]:
    """Fence every `guard` of this process with `checker` while the block runs (the worker
    wraps one job in it). Process-wide, not thread-local, on purpose: the job writes from the
    main thread and the heartbeat thread indexes its run, and both must be fenced."""
    global _checker, _token
    with _lock:
        if _checker is not None:
            raise RuntimeError("a fence is already installed (one job per process at a time)")
        _checker, _token = checker, _safe(str(token))
    try:
        yield
    finally:
        with _lock:
            _checker, _token = None, "0"


def guard(what: str) -> None:
    """Confirm the lease before writing `what`; raise LeaseLost (logged) when it is gone.
    A no-op when no fence is installed."""
    checker = _checker
    if checker is None:
        return
    try:
        holds = checker()
    except Exception as e:  # noqa: BLE001 — cannot confirm the lease: do not write
        reason = f"cannot confirm the lease ({type(e).__name__}: {e})"
    else:
        if holds:
            return
        reason = "the lease was lost (another worker holds the job)"
    log.warning("fence: refused %s: %s", what, reason)
    raise LeaseLost(f"refused {what}: {reason}")


def owner_tag() -> str:
    """`<host>@<pid>@<token>`: who writes a temp dir (token 0 outside a job)."""
    return SEP.join((host_name(), str(os.getpid()), _token))


def tmp_name(target: str) -> str:
    """The name of this process's temp dir for building `target` beside it."""
    return f"{TMP_PREFIX}{target}{SEP}{owner_tag()}"


def may_delete(tmp_dir_name: str) -> bool:
    """Whether this process may remove the temp dir `tmp_dir_name`: its own (this process;
    a worker runs one job at a time, so an earlier job's leftovers are its own too), or one
    whose writer is provably dead (same host, pid gone). Another host's, a live process's, and
    a name without an owner are kept."""
    parts = tmp_dir_name.split(SEP)
    if not tmp_dir_name.startswith(TMP_PREFIX) or len(parts) != 4 or not parts[2].isdigit():
        return False
    host, pid = parts[1], int(parts[2])
    if host != host_name():
        return False
    return pid == os.getpid() or not pid_alive(pid)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (liveness asks too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def host_name() -> str:
    """This host's name, safe in a tag and a file name (the registry's liveness records it)."""
    return _safe(socket.gethostname())


def _safe(s: str) -> str:
    """Characters that keep a tag parseable and a valid file name."""
    return re.sub(r"[^A-Za-z0-9.-]", "-", s) or "host"
