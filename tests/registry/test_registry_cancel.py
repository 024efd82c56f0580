"""Cancel a running train job: a real tiny-gemma3 LoRA run in a `tunix-rt worker` process
stops within a step or two of the cancel, its committed checkpoints stay, the job ends
cancelled, and the worker lives on to take the next job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from registry_testlib import import_tiny_dataset, upload as _upload
from tunix_rt.registry import queue


def _wait(pred, timeout: float, what: str, proc=None, log=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"worker exited: {log.read_text()[-3000:] if log else ''}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}: {log.read_text()[-3000:] if log else ''}")


def test_cancel_a_running_train_job(home, tmp_path):
    import_tiny_dataset(home)
    jid = queue.enqueue("train", {"preset": "smoke", "evaluate": False, "overrides": {
        "dataset": "tiny@v1", "split": "all", "max_steps": 400, "batch_size": 2, "save_interval": 2,
        "keep_checkpoints": 2, "eval_interval": 0, "warmup_steps": 0, "max_seq_len": 256}})
    log = tmp_path / "worker.log"
    env = dict(os.environ, TUNIX_RT_HOME=str(home.root), PYTHONUNBUFFERED="1")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tunix_rt.cli", "worker", "--lease", "4", "--poll", "0.1"],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        run_id = _wait(lambda: queue.get_job(jid).run_id, 150, "the run to start", proc, log)
        run = home.runs / run_id
        _wait(lambda: list(run.glob("checkpoints/*/COMMIT")), 120, "a committed checkpoint", proc, log)
        assert queue.cancel(jid) == "running"
        t0 = time.monotonic()
        _wait(lambda: queue.get_job(jid).status == "cancelled", 30, "the job to stop", proc, log)
        stop_s = time.monotonic() - t0
        manifest = json.loads((run / "run_manifest.json").read_text())
        steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert manifest["status"] == "stopped" and max(steps) < 400, manifest
        # The engine polls the worker's should_stop hook: the step it stopped at is checkpointed.
        committed = sorted(int(p.parent.name.split("-")[1]) for p in run.glob("checkpoints/*/COMMIT"))
        assert committed and committed[-1] == max(steps), (committed, max(steps))
        logs = "".join(c.text for c in queue.read_logs(jid))
        assert "cancelled" in logs
        print(f"cancel: stopped {stop_s:.1f} s after the request, at step {max(steps)}; run {manifest['status']}")
        # The worker survives the cancel and takes the next job.
        nxt = queue.enqueue("import", {"upload": _upload(home), "name": "after"})
        _wait(lambda: queue.get_job(nxt).status == "succeeded", 60, "the next job", proc, log)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
