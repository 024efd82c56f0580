"""tunix_rt.fence and the writers it fences: a writer that lost its lease commits no
checkpoint, prunes none, replaces no export, updates no manifest and appends no metrics line;
temp dirs are removed only by their owner or when their owner is provably dead."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import subprocess
import sys

import pytest

from tunix_rt import fence
from tunix_rt.train.export import publish
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.metrics import MetricsLog
from tunix_rt.train.run import RunDir, RunStopped


class Lease:
    """A checker as the worker installs it, whose answer the test flips."""

    def __init__(self) -> None:
        self.held, self.calls = True, 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.held


def _tree(root) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_guard_is_a_noop_without_a_fence_and_refuses_once_the_lease_is_lost(caplog):
    fence.guard("anything")  # the CLI: no fence, no database
    lease = Lease()
    with fence.installed(lease, 7):
        assert fence.owner_tag().endswith(f"@{os.getpid()}@7")
        fence.guard("a checkpoint")
        assert lease.calls == 1  # one check (one round trip in a worker) per guarded write
        lease.held = False
        with caplog.at_level(logging.WARNING, logger="tunix_rt.fence"), pytest.raises(fence.LeaseLost):
            fence.guard("the manifest of run r1")
        assert "fence: refused the manifest of run r1: the lease was lost" in caplog.text
        with pytest.raises(RuntimeError, match="already installed"):
            with fence.installed(Lease(), 8):
                pass
    fence.guard("after the job")
    assert fence.owner_tag().endswith("@0")


def test_guard_refuses_when_the_lease_cannot_be_confirmed(caplog):
    def unreachable() -> bool:
        raise OSError("connection refused")

    with fence.installed(unreachable, 1), caplog.at_level(logging.WARNING, logger="tunix_rt.fence"):
        with pytest.raises(fence.LeaseLost, match="cannot confirm the lease"):
            fence.guard("an export")
    assert "OSError: connection refused" in caplog.text


def test_temp_dirs_are_deleted_only_by_their_owner_or_when_it_is_provably_dead():
    host = fence.owner_tag().split("@")[0]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert fence.may_delete(fence.tmp_name("step-000004"))
        assert fence.may_delete(f".tmp-step-000004@{host}@{dead.pid}@3")
        assert not fence.may_delete(f".tmp-step-000004@{host}@{alive.pid}@3")  # a live writer (maybe paused)
        assert not fence.may_delete(f".tmp-step-000004@not-{socket.gethostname()}@{dead.pid}@3")  # no proof
        assert not fence.may_delete(".tmp-step-000010-1")  # no owner recorded: kept
        assert not fence.may_delete(f"step-000004@{host}@{dead.pid}@3")
    finally:
        alive.kill()
        alive.wait()


def _ckpt_args(tmp_path):
    """An engine payload writer, the driver's state and a config for checkpoint.save."""
    def payload(d):
        (d / "weights.safetensors").write_bytes(b"weights")
        return {"rng": {"engine": [1, 2]}}

    cfg = TrainConfig(model="tiny-gemma3", dataset=str(tmp_path / "traces.jsonl"))
    return payload, {"data_position": {"epoch": 0, "cursor": 2}}, cfg


def test_a_fenced_out_writer_commits_and_prunes_no_checkpoint(tmp_path):
    from tunix_rt.train import checkpoint

    payload, state, cfg = _ckpt_args(tmp_path)
    run = tmp_path / "run"
    for step in (1, 2):
        checkpoint.save(run, step, payload, state, cfg, keep=2)
    root = run / "checkpoints"
    host = fence.owner_tag().split("@")[0]
    foreign = root / f".tmp-step-000003@{host}@{os.getppid()}@9"  # a live writer's temp dir
    foreign.mkdir()
    (root / "step-000005").mkdir()  # renamed but never committed by a writer that died
    before = _tree(root)
    lease = Lease()
    lease.held = False
    with fence.installed(lease, 4), pytest.raises(fence.LeaseLost):
        checkpoint.save(run, 3, payload, state, cfg, keep=2)
    assert _tree(root) == before  # keep-N did not run, nothing renamed, nothing deleted
    assert sorted(p.name for p in root.iterdir()) == [foreign.name, "step-000001", "step-000002", "step-000005"]
    lease.held = True
    with fence.installed(lease, 5):
        checkpoint.save(run, 3, payload, state, cfg, keep=2)
    assert lease.calls == 1 + 2  # the refused commit; then the commit and the prune
    # The lease holder prunes by keep-N and removes the half commit; the live writer's temp stays.
    assert sorted(p.name for p in root.iterdir()) == [foreign.name, "step-000002", "step-000003"]
    assert [p.name for p in checkpoint.committed(run)] == ["step-000002", "step-000003"]


def test_a_fenced_out_export_leaves_the_committed_artifact(tmp_path):
    target = tmp_path / "final" / "adapter"
    target.mkdir(parents=True)
    (target / "adapter_model.safetensors").write_bytes(b"committed")

    def write(d):
        (d / "adapter_model.safetensors").write_bytes(b"late")

    lease = Lease()
    lease.held = False
    with fence.installed(lease, 2), pytest.raises(fence.LeaseLost):
        publish(target, write)
    assert [p.name for p in target.parent.iterdir()] == ["adapter"]
    assert (target / "adapter_model.safetensors").read_bytes() == b"committed"
    lease.held = True
    with fence.installed(lease, 3):
        publish(target, write)
    assert [p.name for p in target.parent.iterdir()] == ["adapter"]  # no temp or old dir left
    assert (target / "adapter_model.safetensors").read_bytes() == b"late"


def test_recording_writes_nothing_after_the_lease_is_lost_and_reraises_a_stop(home, tmp_path):
    cfg = TrainConfig(model="tiny-gemma3", dataset=str(tmp_path / "traces.jsonl"))
    run = RunDir.create(cfg, home, "torch")
    lease = Lease()
    with fence.installed(lease, 1):
        with pytest.raises(fence.LeaseLost), run.recording():
            log = MetricsLog(run.path)
            log.log({"step": 1, "loss": 2.0})
            lease.held = False
            log.log({"step": 2, "loss": 1.5})  # the late line is refused
        log.close()
    manifest = json.loads((run.path / "run_manifest.json").read_text())
    assert manifest["status"] == "running"  # no "failed" written over the new owner's run
    assert [json.loads(x)["step"] for x in (run.path / "metrics.jsonl").read_text().splitlines()] == [1]
    with pytest.raises(RunStopped), run.recording():
        raise RunStopped("stopped at step 1 of 4 on request")
    manifest = json.loads((run.path / "run_manifest.json").read_text())
    assert manifest["status"] == "stopped" and "step 1 of 4" in manifest["error"]
