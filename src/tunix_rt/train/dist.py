"""The processes of one run: one (the default), or several started by a launcher.

    torch   `torchrun --nproc-per-node N` (and --nnodes/--node-rank/--rdzv-endpoint across
            machines) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT;
            torch.distributed runs gloo for CPU tensors and NCCL for CUDA ones
    jax     JAX_COORDINATOR_ADDRESS (process 0's host:port), JAX_NUM_PROCESSES and
            JAX_PROCESS_ID, set on each process by hand or by a scheduler:
            jax.distributed.initialize joins them (gloo between CPU processes); the mesh
            spans every process's devices and each process drives its own

The rules of a multi-process run, once:
- every process reads the same config and data and builds the same global batches; the
  engine trains on its process's rows of each (torch: data.process_rows; JAX: the global
  arrays' shards on its devices), so the data order, and the loss normaliser, do not
  depend on the number of processes;
- process 0 alone writes the run directory, metrics, exports and the registry
  (`main_only`); a checkpoint is committed by it once every process has written its part
  and reached a barrier (train.checkpoint);
- one-time writes into the home (a model import, the vendored GSM8K) run on process 0
  first, the others wait (`main_first`);
- a process that dies takes the run down: the launcher stops the others with SIGTERM, which
  raises RankFailed here, or their next collective fails (JAX: a gloo connection closed), so
  process 0 leaves the run "failed" (never "running"; when process 0 itself died, JAX's
  distributed client may abort the others before they can say so);
  `--resume` continues from the last committed checkpoint;
- a run that finished on every process leaves the group (`leave`: a barrier, then the group
  torn down) before its process exits: torch's gloo group left alive into interpreter exit
  aborts a process now and then (`terminate called without an active exception`, SIGABRT),
  and the launcher fails a finished run.

Nothing here imports torch or JAX at module load.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import sys
from typing import Any, Callable, TypeVar

from tunix_rt.errors import BadInput, TunixRtError

T = TypeVar("T")


class RankFailed(TunixRtError):
    """Another process of this run stopped, or the process group broke."""


class _Single:
    """One process: every collective is the identity."""

    rank, world = 0, 1
    left = False

    def close(self) -> None:
        pass

    def barrier(self) -> None:
        pass

    def all_sum(self, values: list[float]) -> list[float]:
        return list(values)

    def broadcast(self, text: str, src: int = 0) -> str:
        return text

    def gather_texts(self, text: str) -> list[str]:
        return [text]


class _Torch:
    """torch.distributed from torchrun's environment (gloo on CPU, NCCL for CUDA tensors).
    The collectives here carry CPU tensors, so they run on gloo either way."""

    left = False

    def __init__(self, rank: int, world: int):
        import torch
        import torch.distributed as td

        self.rank, self.world = rank, world
        if not td.is_initialized():
            cuda = torch.cuda.is_available() and td.is_nccl_available()
            if cuda:
                torch.cuda.set_device(local_rank())
            td.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")

    def barrier(self) -> None:
        self.all_sum([0.0])  # gloo's barrier is an all-reduce too; this one fails loudly

    def all_sum(self, values: list[float]) -> list[float]:
        import torch
        import torch.distributed as td

        t = torch.tensor(values, dtype=torch.float64)
        td.all_reduce(t)
        return t.tolist()

    def broadcast(self, text: str, src: int = 0) -> str:
        import torch
        import torch.distributed as td

        data = torch.tensor(list(text.encode()), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64)
        td.broadcast(size, src)
        buf = data if self.rank == src else torch.empty(int(size), dtype=torch.uint8)
        td.broadcast(buf, src)
        return bytes(buf.tolist()).decode()

    def gather_texts(self, text: str) -> list[str]:
        return [self.broadcast(text, src) for src in range(self.world)]

    def close(self) -> None:
        """Destroy the group while the interpreter is whole: it shuts gloo's worker threads
        and connections down, which a process exiting with them alive may abort in."""
        import torch.distributed as td

        if td.is_initialized():
            td.destroy_process_group()
        self.left = True


class _Jax:
    """jax.distributed from JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID. The
    collectives gather host bytes with multihost_utils.process_allgather (over every process's
    devices: gloo between CPU processes), so float64 sums and texts pass exactly."""

    def __init__(self, rank: int, world: int):
        import jax

        self.rank, self.world = rank, world
        if not jax.distributed.is_initialized():
            address = os.environ.get("JAX_COORDINATOR_ADDRESS")
            if not address:
                raise BadInput(f"JAX_NUM_PROCESSES={world} needs JAX_COORDINATOR_ADDRESS=host:port "
                               "(where process 0 listens; the same on every process)")
            jax.config.update("jax_cpu_collectives_implementation", "gloo")  # cross-process CPU collectives
            try:
                jax.distributed.initialize(address, world, rank)
            except RuntimeError as e:
                raise BadInput(f"jax.distributed.initialize({address!r}, {world}, {rank}) failed: {e} (it must run "
                               "before JAX touches a device, and every process must reach the coordinator)") from e
        if (jax.process_index(), jax.process_count()) != (rank, world):
            raise BadInput(f"JAX runs as process {jax.process_index()} of {jax.process_count()}, the environment "
                           f"says {rank} of {world}")
        atexit.register(_leave_broken)

    left = False

    def close(self) -> None:
        """Nothing: JAX's own exit handler shuts jax.distributed down, at a barrier of every
        process (a finished run reaches it on each)."""

    def _gather(self, payload: bytes) -> list[bytes]:
        """Every process's bytes, in rank order (two all-gathers: the sizes, the padded bytes)."""
        import numpy as np
        from jax.experimental import multihost_utils

        data = np.frombuffer(payload, np.uint8)
        sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int32))).reshape(-1)
        buf = np.zeros(max(int(sizes.max()), 1), np.uint8)
        buf[:data.size] = data
        rows = np.asarray(multihost_utils.process_allgather(buf)).reshape(self.world, -1)
        return [rows[r, :int(sizes[r])].tobytes() for r in range(self.world)]

    def barrier(self) -> None:
        self._gather(b"")  # an all-gather every process must join; fails loudly when one cannot

    def all_sum(self, values: list[float]) -> list[float]:
        import numpy as np

        parts = [np.frombuffer(b, np.float64) for b in self._gather(np.asarray(values, np.float64).tobytes())]
        return np.sum(parts, axis=0).tolist()

    def broadcast(self, text: str, src: int = 0) -> str:
        return self.gather_texts(text)[src]

    def gather_texts(self, text: str) -> list[str]:
        return [b.decode() for b in self._gather(text.encode())]


_group: Any = _Single()


def init(engine: str) -> None:
    """Join the process group the environment describes for `engine` (nothing to do in one
    process; idempotent). Call before the framework touches a device."""
    global _group
    if _group.world > 1 and not _group.left:
        return
    rank, world = launcher(engine)
    if world == 1:
        return
    if engine == "torch":
        _group = _Torch(rank, world)
    elif engine == "jax":
        _group = _Jax(rank, world)
    else:
        raise BadInput(f"the {engine} engine runs in one process here; multi-process training needs "
                       "--engine torch or jax")
    signal.signal(signal.SIGTERM, _on_sigterm)


def leave() -> None:
    """The end of a run that finished on this process: wait for every process (none tears
    its connections down while another still reads from them), then tear the group down.
    Only after success: a process whose peer failed exits as it is (a barrier there would
    wait for a process that never comes). rank() and world() keep their values, so the
    caller still knows which process reports; a later init() joins a new group."""
    if _group.world == 1 or _group.left:
        return
    barrier("the end of the run")
    _group.close()


def launcher(engine: str) -> tuple[int, int]:
    """(rank, world size) as the launcher's environment gives them; (0, 1) without one."""
    names = ("RANK", "WORLD_SIZE") if engine == "torch" else ("JAX_PROCESS_ID", "JAX_NUM_PROCESSES")
    raw = [os.environ.get(n) for n in names]
    if raw[1] is None:
        return 0, 1
    try:
        rank, world = int(raw[0] or 0), int(raw[1])
    except ValueError:
        raise BadInput(f"{names[0]}={raw[0]!r} {names[1]}={raw[1]!r}: expected integers") from None
    if not 0 <= rank < world:
        raise BadInput(f"{names[0]}={rank} is outside 0..{names[1]}-1 ({world - 1})")
    return rank, world


def local_rank() -> int:
    """The process's index on its machine (its GPU under torchrun)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def _on_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: let the failure be recorded
    raise RankFailed("stopped by SIGTERM: the launcher stops every process when one of them fails "
                     "(its log names the process and why)")


def rank() -> int:
    return _group.rank


def world() -> int:
    return _group.world


def is_main() -> bool:
    return _group.rank == 0


def barrier(what: str) -> None:
    """Wait until every process gets here; RankFailed when one never will."""
    _collective(what, _group.barrier)


def all_sum(values: list[float], what: str = "sum") -> list[float]:
    """Element-wise sums over the processes (float64)."""
    return _collective(what, lambda: _group.all_sum(values))


def broadcast(text: str, what: str = "broadcast") -> str:
    """Process 0's `text` on every process (process 0 decides, every process gets it)."""
    return _collective(what, lambda: _group.broadcast(text))


def gather_texts(text: str, what: str = "gather") -> list[str]:
    """Every process's `text`, in rank order, on every process."""
    return _collective(what, lambda: _group.gather_texts(text))


def _collective(what: str, fn: Callable[[], T]) -> T:
    if _group.world == 1:
        return fn()
    try:
        return fn()
    except RankFailed:
        raise
    except (RuntimeError, ValueError) as e:  # gloo/NCCL: a peer's connection closed or timed out
        if isinstance(e, ValueError) and not _peer_gone(e):  # JAX raises gloo's failures as ValueError
            raise
        raise _rank_failed(what, e) from e


#: what the errors of a collective whose peer died say (gloo, JAX's coordination service)
_PEER_GONE = ("gloo", "connection closed", "connection reset", "socket closed", "heartbeat", "unavailable")


def _peer_gone(e: BaseException) -> bool:
    text = str(e).lower()
    return any(s in text for s in _PEER_GONE)


_broken = False


def _leave_broken() -> None:
    """At exit of a JAX process whose group broke: leave at once. (JAX's own exit waits at
    a shutdown barrier for every process, which a dead one never reaches: the survivor would
    hang until the heartbeat timeout, then abort.) Registered after JAX's, so it runs first."""
    if _broken:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(1)


def _rank_failed(what: str, e: BaseException) -> RankFailed:
    global _broken
    _broken = True
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the launcher's SIGTERM would only interrupt the record
    return RankFailed(f"{what}: the process group broke ({str(e)[:500]}); a process of this run stopped "
                      "(the launcher's log, or that process's own, names it)")


@contextlib.contextmanager
def peer_failures(what: str):
    """Around a computation whose collectives span processes (a JAX step on a mesh over
    several processes): an error that says a peer is gone becomes RankFailed; any other
    error passes as it is."""
    try:
        yield
    except RankFailed:
        raise
    except Exception as e:
        if _group.world > 1 and _peer_gone(e):
            raise _rank_failed(what, e) from e
        raise


def main_only(fn: Callable[..., T]) -> Callable[..., T | None]:
    """`fn` runs on process 0; elsewhere the call does nothing and returns None."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) if is_main() else None

    return wrapper


def main_first(what: str, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on process 0, then on the others (for writes into the home that must
    happen once, like a model import: the others find it done)."""
    if is_main():
        out = fn(*args)
        barrier(what)
        return out
    barrier(what)
    return fn(*args)


def on_main(cls: Callable[..., T], *args: Any) -> T:
    """`cls(*args)` on process 0; elsewhere a do-nothing stand-in (for writers of run files
    and terminal output: metrics log, progress bar)."""
    return cls(*args) if is_main() else _Nothing()  # type: ignore[return-value]


class _Nothing:
    """Accepts every call and does nothing; a context manager too."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None

    def __enter__(self) -> "_Nothing":
        return self

    def __exit__(self, *exc) -> None:
        return None


def check_same(value: Callable[[], str], what: str) -> None:
    """Fail every process when they disagree on `value()` (a digest of what they must share);
    computed only when there are several processes."""
    if _group.world == 1:
        return
    seen = gather_texts(value(), what)
    if len(set(seen)) > 1:
        raise TunixRtError(f"the processes of this run disagree on {what} (digests by rank: "
                           f"{[s[:12] for s in seen]}); every process must build the same global batches")
