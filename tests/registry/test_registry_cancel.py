"""Cancel a running train job: a real tiny-gemma3 LoRA run in a `tunix-rt worker` process
stops within a step or two of the cancel, its committed checkpoints stay, the job ends
cancelled, and the worker lives on to take the next job."""

from __future__ import annotations

import json
import time

from registry_testlib import import_tiny_dataset, start_worker, upload as _upload, wait_for as _wait
from tunix_rt.registry import queue


def test_cancel_a_running_train_job(home, tmp_path):
    import_tiny_dataset(home)
    jid = queue.enqueue("train", {"preset": "smoke", "evaluate": False, "overrides": {
        "dataset": "tiny@v1", "split": "all", "max_steps": 400, "batch_size": 2, "save_interval": 2,
        "keep_checkpoints": 2, "eval_interval": 0, "warmup_steps": 0, "max_seq_len": 256}})
    log = tmp_path / "worker.log"
    proc = start_worker(home, log, "--lease", "4", "--poll", "0.1")
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
