"""`tunix-rt worker`: claim a job, run it in this process while a heartbeat thread renews the
lease, stores the job's output as log chunks and watches for cancellation, then write the
outcome with the fencing token. Several workers (processes, machines) share one database.

Outcomes tell what happened to the run: a train job whose run stopped because this worker
is shutting down (SIGTERM) is handed back to the queue (its next worker resumes from the
committed checkpoint), a cancelled one ends cancelled, and a job succeeds only when its
stage did (a sweep trial stopped by its pruner did: its handler says so, tunix_rt.sweep.trial). While a job runs, its file and registry writes are fenced (tunix_rt.fence): a
worker that lost the lease, or could not reach the database for a whole lease period,
stops writing and drops its outcome.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass

from tunix_rt import fence
from tunix_rt.errors import BadInput
from tunix_rt.home import Home
from tunix_rt.registry import queue
from tunix_rt.registry.handlers import run_job
from tunix_rt.registry.jobs import JobContext

log = logging.getLogger("tunix_rt.worker")
LOST = "lost"
"""Not an outcome anyone writes: this worker no longer holds the job."""


class JobCancelled(KeyboardInterrupt):
    """Raised in the main thread to stop a cancelled stage (a KeyboardInterrupt, so the run
    directory records it as interrupted, as it would a Ctrl-C)."""


@dataclass
class WorkerConfig:
    lease_s: float = 30.0
    """A job whose worker has not heartbeated for this long is reclaimed by another worker."""
    poll_s: float = 1.0
    """Sleep between claims when the queue is empty."""
    max_idle_s: float | None = None
    """Exit after this long without work (None: run until stopped)."""
    max_jobs: int | None = None
    """Exit after this many jobs (None: no limit)."""
    url: str | None = None
    """Database URL (default: the home's)."""

    def __post_init__(self) -> None:
        if self.lease_s < 1:
            raise BadInput(f"lease must be >= 1 s, got {self.lease_s}")
        if self.poll_s <= 0:
            raise BadInput(f"poll must be > 0 s, got {self.poll_s}")

    @property
    def heartbeat_s(self) -> float:
        return self.lease_s / 3


class LogSink(io.TextIOBase):
    """A text stream that buffers what a job prints (and echoes it), flushed as chunks."""

    def __init__(self, echo) -> None:
        self._echo = echo
        self._buf: list[str] = []
        self._lock = threading.Lock()

    def write(self, s: str) -> int:
        with self._lock:
            self._buf.append(s)
        with contextlib.suppress(Exception):
            self._echo.write(s)
        return len(s)

    def flush(self) -> None:
        with contextlib.suppress(Exception):
            self._echo.flush()

    def isatty(self) -> bool:
        return False

    def take(self) -> str:
        with self._lock:
            out, self._buf = "".join(self._buf), []
        return out


class Worker:
    def __init__(self, home: Home, cfg: WorkerConfig) -> None:
        self.home = home
        self.cfg = cfg
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self.shutdown = threading.Event()
        self.current: JobContext | None = None

    def install_signals(self) -> None:
        """SIGTERM/SIGINT: stop claiming; ask the running job to stop; hand it back.
        SIGUSR1 (sent by the heartbeat thread to its own process): the running job was
        cancelled and its stage cannot poll should_stop(), so stop it where it is."""
        def _stop(_sig, _frame) -> None:
            self.shutdown.set()
            if self.current is not None:
                self.current.stop.set()

        def _cancel(_sig, _frame) -> None:
            ctx = self.current
            if ctx is not None and ctx.cancelled.is_set() and ctx.interruptible:
                raise JobCancelled(f"job {ctx.job_id} cancelled")

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGUSR1, _cancel)

    def run(self) -> int:
        """Work until stopped, idle too long, or max_jobs done; returns the jobs handled."""
        done, idle_since = 0, time.monotonic()
        while not self.shutdown.is_set():
            queue.reclaim_expired(url=self.cfg.url)
            c = queue.claim(self.owner, self.cfg.lease_s, url=self.cfg.url)
            if c is None:
                if self.cfg.max_idle_s is not None and time.monotonic() - idle_since > self.cfg.max_idle_s:
                    break
                self.shutdown.wait(self.cfg.poll_s)
                continue
            self.run_claim(c)
            done += 1
            idle_since = time.monotonic()
            if self.cfg.max_jobs is not None and done >= self.cfg.max_jobs:
                break
        return done

    def run_claim(self, c: queue.Claim) -> str:
        """Run one claimed job to its outcome; returns the status written (or "lost")."""
        ctx = JobContext(job_id=c.job_id, attempt=c.attempt, home=self.home)
        self.current = ctx
        sink = LogSink(sys.__stdout__)
        sink.write(f"[worker {self.owner}] job {c.job_id} ({c.kind}) attempt {c.attempt}\n")
        beat = _Heartbeat(self, c, ctx, sink)
        try:
            with fence.installed(beat.holds, c.token):
                beat.start()
                status, result, error = self._execute(c, ctx, sink)
                beat.stop()
                if status == LOST or beat.lost.is_set():
                    log.warning("job %s: lease lost; outcome of attempt %s dropped", c.job_id, c.attempt)
                    return LOST
                if ctx.cancelled.is_set() and status != queue.SUCCEEDED:  # a cancel wins over all but success
                    status, error = queue.CANCELLED, error or "cancelled while running"
                beat.flush(f"[worker] attempt {c.attempt}: {status}{': ' + error.splitlines()[-1] if error else ''}\n")
                written = queue.finish(c, status, result=result, error=error, url=self.cfg.url)
            return status if written else LOST
        finally:
            self.current = None

    def _execute(self, c: queue.Claim, ctx: JobContext, sink: LogSink) -> tuple[str, dict | None, str | None]:
        from tunix_rt.train.run import RunStopped

        handler = logging.StreamHandler(sink)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                result = run_job(ctx, c.kind, c.params)
            if ctx.cancelled.is_set():
                return queue.CANCELLED, result, "cancelled while running"
            return queue.SUCCEEDED, result, None
        except fence.LeaseLost as e:
            sink.write(f"lease lost: {e}\n")
            return LOST, None, str(e)
        except RunStopped as e:  # the stage stopped at a committed checkpoint, as asked
            sink.write(f"stopped: {e}\n")
            if ctx.cancelled.is_set():
                return queue.CANCELLED, None, "cancelled while running"
            if self.shutdown.is_set():
                return queue.HANDBACK, None, f"attempt {c.attempt} handed back: worker {self.owner} shut down ({e})"
            return queue.FAILED, None, f"RunStopped: {e}"
        except JobCancelled:
            sink.write("cancelled: stopped at the next step; committed checkpoints are kept\n")
            return queue.CANCELLED, None, "cancelled while running"
        except BadInput as e:  # bad parameters or data: retrying cannot help
            sink.write(f"error: {e}\n")
            return queue.DEAD, None, str(e)
        except Exception as e:  # noqa: BLE001 — any failure is the job's, retried by the queue
            sink.write(traceback.format_exc())
            return queue.FAILED, None, f"{type(e).__name__}: {e}"
        finally:
            root.removeHandler(handler)


class _Heartbeat(threading.Thread):
    """Renews the lease, stores output chunks, links a train job's run directory (and indexes
    its metrics so curves grow live), and turns a cancel request into ctx.stop. A database
    that stays unreachable for a whole lease period stops the job: by then another worker
    may have taken it over."""

    def __init__(self, worker: Worker, c: queue.Claim, ctx: JobContext, sink: LogSink) -> None:
        super().__init__(daemon=True, name=f"heartbeat-{c.job_id}")
        self.w, self.c, self.ctx, self.sink = worker, c, ctx, sink
        self.done = threading.Event()
        self.lost = threading.Event()
        self.last_ok = time.monotonic()
        """When the database last confirmed the lease (claim, heartbeat or fence guard)."""
        self.seq = 0
        self.linked: str | None = None
        self.interrupted = False
        self.on_main = threading.current_thread() is threading.main_thread()

    def run(self) -> None:
        while not self.done.wait(self.w.cfg.heartbeat_s):
            self.beat()

    def beat(self) -> None:
        try:
            state = self._renew()
        except Exception as e:  # noqa: BLE001 — a database hiccup: try again next beat
            silent = time.monotonic() - self.last_ok
            if silent < self.w.cfg.lease_s:
                log.warning("heartbeat failed (%.1f s without the database): %s", silent, e)
                return
            log.error("job %s: no database for %.1f s, a whole lease: stopping the job (%s)",
                      self.c.job_id, silent, e)
            self._lose()
            return
        if state == "lost":
            return
        if state == "cancel":
            self.ctx.cancelled.set()
            self.ctx.stop.set()
            self._interrupt()
        self.flush()
        try:
            self._index_run()
        except fence.LeaseLost:
            self._lose()

    def holds(self) -> bool:
        """The fence's checker: renew the lease now (one round trip). While the database does
        not answer it retries, for at most a lease period since the last confirmation, and
        then raises (the guard refuses the write)."""
        while True:
            if self.lost.is_set():
                return False
            try:
                return self._renew() != "lost"
            except Exception:  # noqa: BLE001
                if time.monotonic() - self.last_ok >= self.w.cfg.lease_s:
                    raise
                time.sleep(min(0.5, self.w.cfg.heartbeat_s / 4))

    def _renew(self) -> str:
        state = queue.heartbeat(self.c, self.w.cfg.lease_s, url=self.w.cfg.url)
        if state == "lost":
            self._lose()
        else:
            self.last_ok = time.monotonic()
        return state

    def _lose(self) -> None:
        self.lost.set()
        self.ctx.stop.set()

    def _interrupt(self) -> None:
        """A stage that cannot poll should_stop() is stopped with JobCancelled, once, through
        SIGUSR1 to the main thread (only in a worker process whose handler is installed)."""
        if self.interrupted or self.ctx.cooperative or not self.ctx.interruptible or not self.on_main:
            return
        import _thread

        self.interrupted = True
        _thread.interrupt_main(signal.SIGUSR1)  # does nothing where Python has no handler

    def _index_run(self) -> None:
        from tunix_rt.registry.record import record_run

        run_dir = self.ctx.run_dir or self.ctx.find_run_dir()
        if run_dir is None:
            return
        if self.linked != run_dir.name:
            queue.set_run(self.c, run_dir.name, url=self.w.cfg.url)
            self.linked = run_dir.name
        record_run(run_dir, url=self.w.cfg.url, job_id=self.c.job_id)

    def flush(self, extra: str = "") -> None:
        if extra:
            self.sink.write(extra)
        text = self.sink.take()
        if not text:
            return
        try:
            if not queue.append_log(self.c, self.seq, text, url=self.w.cfg.url):
                self._lose()
        except Exception as e:  # noqa: BLE001
            log.warning("storing log chunk failed: %s", e)
        self.seq += 1

    def stop(self) -> None:
        """Stop beating; store the last output; index the run once more (fenced)."""
        self.done.set()
        self.join()
        self.flush()
        if not self.lost.is_set() and (self.ctx.run_dir is not None or self.ctx.find_run_dir() is not None):
            try:
                self._index_run()
            except fence.LeaseLost:
                self._lose()
            except Exception as e:  # noqa: BLE001 — indexing is best effort; the files stay
                log.warning("indexing the run of job %s failed: %s", self.c.job_id, e)
