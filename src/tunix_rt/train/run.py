"""The run directory both engines write: runs/<run_id>/.

    config.yaml         the resolved config
    run_manifest.json   command, config, engine, device facts, package versions, git sha,
                        dataset and model sha256, seed, started/finished, status, error
    metrics.jsonl, tensorboard/, loss.png   the metrics and their plot (train.metrics)
    checkpoints/, final/

`RunDir.recording()` wraps the work: whatever happens (an exception, Ctrl-C, a stop on
request), the manifest leaves the "running" state with the error recorded, and the exception
goes on to the caller. Only SIGKILL can leave a run marked running, and `--resume` takes such
a run over. In a job, every manifest update and metrics line is fenced (`fence.guard`): a
worker that lost the job's lease writes nothing more here, not even "failed".

In a multi-process run (train.dist) process 0 writes all of it; the others open the same
directory (its id decided by process 0) and write nothing here, except "failed" when the
process group broke (process 0 may be the process that died).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from tunix_rt import fence
from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.evidence import RUN_FACTS, environment_snapshot, find_fact_placeholders, git_sha, now_iso
from tunix_rt.fence import LeaseLost
from tunix_rt.files import write_bytes_atomic, write_json_atomic
from tunix_rt.home import Home
from tunix_rt.process import process_identity  # who writes it: `registry sync` asks
from tunix_rt.rundir import CONFIG, MANIFEST
from tunix_rt.train import dist
from tunix_rt.train.checkpoint import DIGEST_EXEMPT
from tunix_rt.train.config import TrainConfig


def new_run_id(cfg: TrainConfig, home: Home) -> str:
    """<method>-<base>-<YYYYmmdd-HHMMSS>-<4 hex> (sft-gemma3-270m-20261126-012716-5c89), or
    <run_name>-<YYYYmmdd-HHMMSS>-<4 hex> when the user named the run."""
    prefix = cfg.run_name or f"{cfg.method}-{base_model_name(cfg, home)}"
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in prefix).strip("-.") or "run"
    return f"{safe}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def base_model_name(cfg: TrainConfig, home: Home) -> str:
    """The model a run comes from, by name: the catalog name (a model path: its dir name);
    for a run started from a run (init), that run's base, through any chain of such runs
    (its own model is then a merged copy under models/init-<run>/ or <run>/final/merged/)."""
    model, init, seen = cfg.model, cfg.init, set()
    while init and init not in seen:
        seen.add(init)
        held = RunDir.open(resolve_run(init, home)).manifest.get("config", {})  # as run, not re-validated
        model, init = held.get("model", model), held.get("init")
    return Path(model).name


def resolve_run(ref: str, home: Home) -> Path:
    """A run id under <home>/runs, or a path to a run directory."""
    path = Path(ref)
    if not (path / MANIFEST).is_file():
        path = home.runs / ref
    if not (path / MANIFEST).is_file():
        known = sorted(p.name for p in home.runs.glob("*") if (p / MANIFEST).is_file())[-10:]
        raise BadInput(f"run {ref!r}: no such run (no {MANIFEST}); recent runs: {known}")
    return path


@dataclass
class RunDir:
    """A run directory and its manifest, kept in memory and rewritten atomically."""

    path: Path
    manifest: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def create(cls, cfg: TrainConfig, home: Home, engine: str) -> "RunDir":
        home.ensure()
        run_id = new_run_id(cfg, home)
        tmp = home.runs / f".tmp-{run_id}"
        tmp.mkdir(parents=True)
        write_bytes_atomic(tmp / CONFIG, cfg.to_yaml().encode())
        run = cls(home.runs / run_id, {
            "run_id": run_id,
            "command": " ".join(sys.argv) if sys.argv and sys.argv[0] else "python api: tunix_rt.train",
            "engine": engine,
            "config": cfg.to_dict(),
            "seed": cfg.seed,
            "git_sha": git_sha(),
            "started_at": now_iso(),
            "status": "created",
        })
        write_json_atomic(tmp / MANIFEST, run._clean(run.manifest))
        os.rename(tmp, run.path)  # the run appears complete with its config, or not at all
        return run

    @classmethod
    def open(cls, path: Path) -> "RunDir":
        return cls(path, json.loads((path / MANIFEST).read_text()))

    @property
    def run_id(self) -> str:
        return self.path.name

    def update(self, **fields: Any) -> None:
        """Update the manifest (written by process 0 only; the others keep it in memory)."""
        fence.guard(f"update {MANIFEST} of {self.run_id}")
        self.manifest.update(fields)
        self.manifest = self._clean(self.manifest)
        if dist.is_main():
            write_json_atomic(self.path / MANIFEST, self.manifest)

    def config(self) -> TrainConfig:
        return TrainConfig.load(self.path / CONFIG)

    @staticmethod
    def _clean(obj: Any) -> Any:
        """Drop keys whose value is None: a manifest holds real values or omits the key.
        (Config fields left unset, like limit, are omitted the same way.)"""
        if isinstance(obj, dict):
            return {k: RunDir._clean(v) for k, v in obj.items() if v is not None}
        if isinstance(obj, list):
            return [RunDir._clean(v) for v in obj]
        return obj

    @contextlib.contextmanager
    def recording(self) -> Iterator["RunDir"]:
        """Mark the run running; on the way out, succeeded, stopped, failed or interrupted.
        A stopped run (RunStopped: a cancelled job, a worker shutting down) is re-raised:
        the caller decides what a stop means (a job goes back to the queue), never success."""
        self.manifest.pop("error", None)  # a resumed run starts clean
        self.update(status="running", environment=environment_snapshot(), process=process_identity())
        try:
            yield self
        except RunStopped as e:  # asked to stop between steps: a checkpoint was committed
            self._leave("stopped", str(e))
            raise
        except KeyboardInterrupt:
            self._leave("interrupted", "interrupted by the user (Ctrl-C)")
            raise
        except LeaseLost:
            raise  # another worker owns the run now: write nothing more
        except BaseException as e:  # a broken process group: whichever process is left says so
            self._leave("failed", f"{type(e).__name__}: {e}", any_process=isinstance(e, dist.RankFailed))
            raise
        finished = now_iso()
        bad = find_fact_placeholders({**self.manifest, "status": "succeeded", "finished_at": finished}, RUN_FACTS)
        if bad:  # evidence with holes is a failed run, said so in the manifest
            self.update(status="failed", finished_at=finished, error=f"manifest holds placeholder values at {bad}")
            raise TunixRtError(f"{self.path / MANIFEST}: placeholder values at {bad}")
        self.update(status="succeeded", finished_at=finished)

    def _leave(self, status: str, error: str, any_process: bool = False) -> None:
        with contextlib.suppress(LeaseLost):  # a fenced-out writer leaves the manifest alone
            self.update(status=status, finished_at=now_iso(), error=error)
            if any_process and not dist.is_main():  # process 0 may be the one that died
                write_json_atomic(self.path / MANIFEST, self.manifest)


class RunStopped(TunixRtError):
    """Raised by the driver's loop when its should_stop() hook says so (a cancelled job, a
    worker shutting down), after the step just done was checkpointed. `recording()` marks
    the run stopped and re-raises it."""


def never() -> bool:
    """The default should_stop hook: a run stops only when its steps are done."""
    return False


class StopOnSigterm:
    """A should_stop hook for `tunix-rt train` in one process. The first SIGTERM (a scheduler
    preempting the job, `kill`, `timeout`) stops the run after the step in progress: a
    committed checkpoint, the manifest `stopped`, exit code 1, `--resume` continues. A second
    SIGTERM stops it at once, from the last committed checkpoint. Without it the process died
    and left its run `running`. Under torchrun or jax.distributed, dist.join() replaces the
    handler (there a SIGTERM means that another process failed)."""

    def __init__(self) -> None:
        self.asked = False

    def __enter__(self) -> "StopOnSigterm":
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGTERM, self._previous)

    def _on_sigterm(self, signum, frame) -> None:
        if self.asked:
            raise RunStopped("stopped by a second SIGTERM; its last committed checkpoint is kept")
        self.asked = True
        sys.stderr.write("SIGTERM: the run stops after this step with a checkpoint (a second SIGTERM: at once)\n")

    def __call__(self) -> bool:
        return self.asked


def open_run(cfg: TrainConfig, home: Home, resume: str | None, engine: str) -> "RunDir":
    """A new run directory, or the one `resume` names when its config is the same and it has
    not already succeeded. Whether its checkpoint can continue here (engine, device kind,
    config digest) is checked by the driver against the checkpoint itself. In a
    multi-process run, process 0 creates or checks it and the others open the same one."""
    if dist.is_main():
        run = _open_run(cfg, home, resume, engine)
        dist.broadcast(str(run.path), "run directory")
        return run
    return RunDir.open(Path(dist.broadcast("", "run directory")))


def _open_run(cfg: TrainConfig, home: Home, resume: str | None, engine: str) -> "RunDir":
    if not resume:
        return RunDir.create(cfg, home, engine)
    run = RunDir.open(resolve_run(resume, home))
    stored = run.config().to_dict()
    diff = sorted(k for k, v in cfg.to_dict().items() if k not in DIGEST_EXEMPT and stored.get(k) != v)
    if diff:
        held = ", ".join(f"{k}={stored.get(k)!r}" for k in diff)
        raise BadInput(f"--resume {run.run_id}: the run holds {held}; a resumed run continues its own "
                       "config (start a new run to change it)")
    if run.manifest.get("status") == "succeeded":
        raise BadInput(f"run {run.run_id} already succeeded; nothing to resume")
    return run
