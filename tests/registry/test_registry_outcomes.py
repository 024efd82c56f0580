"""Job outcomes tell the truth. A real `tunix-rt worker` told to shut down (SIGTERM) mid-train
stops at a committed checkpoint, marks the run stopped and hands the job back (its attempt not
counted); a second worker resumes it and finishes with exactly the asked steps and the final
weights of an uninterrupted run, bit for bit. A train job whose run is not succeeded with its
final outputs never ends succeeded."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from registry_testlib import import_tiny_dataset, start_worker
from tunix_rt.registry import queue
from tunix_rt.registry.jobs import TrainParams
from tunix_rt.registry.worker import Worker, WorkerConfig
from tunix_rt.train import checkpoint
from tunix_rt.train.metrics import read_jsonl

STEPS = 24


def _params(steps: int = STEPS) -> dict:
    return {"preset": "smoke", "evaluate": False, "overrides": {
        "dataset": "tiny@v1", "split": "all", "max_steps": steps, "batch_size": 2, "save_interval": 2,
        "keep_checkpoints": 2, "eval_interval": 0, "warmup_steps": 0, "max_seq_len": 128}}


@pytest.fixture
def one_thread():
    """The workers train on one thread (start_worker); the reference run here does too."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _adapter(run) -> dict:
    return load_file(str(run / "final" / "adapter" / "adapter_model.safetensors"))


def test_sigterm_hands_the_job_back_and_the_next_worker_finishes_it_bit_exact(home, tmp_path, one_thread):
    from tunix_rt.train.driver import train

    import_tiny_dataset(home)
    jid = queue.enqueue("train", _params(), max_attempts=1)  # a counted hand-back would leave it dead
    log1, log2 = tmp_path / "worker-1.log", tmp_path / "worker-2.log"
    # SIGTERM reaches the worker at step 3, after step 2's checkpoint: sent by the worker to
    # itself there (TUNIX_RT_FAULT), since a signal sent from here once a checkpoint shows up
    # can arrive after the last of these fast tiny steps (it did in CI: the job succeeded)
    w1 = start_worker(home, log1, "--lease", "3", "--poll", "0.1", fault="step@3:SIGTERM")
    try:
        assert w1.wait(timeout=240) == 0, log1.read_text()[-3000:]
        run_id = queue.get_job(jid).run_id
        assert run_id, log1.read_text()[-3000:]
        run = home.runs / run_id
    finally:
        if w1.poll() is None:
            w1.kill()
            w1.wait()
    job = queue.get_job(jid)
    assert (job.status, job.attempts, job.max_attempts) == ("queued", 1, 2), (job.status, job.error)
    assert "handed back" in job.error
    manifest = json.loads((run / "run_manifest.json").read_text())
    stopped_at = int(checkpoint.latest(run).name.split("-")[1])
    assert manifest["status"] == "stopped" and f"stopped at step {stopped_at} of {STEPS}" in manifest["error"]
    assert stopped_at == 3 and not (run / "final").exists()

    w2 = start_worker(home, log2, "--lease", "3", "--poll", "0.1", "--max-jobs", "1")
    assert w2.wait(timeout=300) == 0, log2.read_text()[-3000:]
    job = queue.get_job(jid)
    assert (job.status, job.attempts, job.result) == ("succeeded", 2, {"run_id": run_id}), job.error
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "succeeded" and manifest["resumed_from_step"] == stopped_at
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert steps == list(range(1, STEPS + 1))  # exactly the asked steps, each once
    outcomes = [line for c in queue.read_logs(jid) for line in c.text.splitlines() if line.startswith("[worker] attempt")]
    assert [o.split(":")[0] for o in outcomes] == ["[worker] attempt 1", "[worker] attempt 2"]
    assert outcomes[0].startswith("[worker] attempt 1: handback") and outcomes[1] == "[worker] attempt 2: succeeded"

    cfg = TrainParams(**_params()).config()
    cfg.run_name = "uninterrupted"
    ref = train(cfg, home)
    got, want = _adapter(run), _adapter(ref)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert [r["ids"] for r in read_jsonl(run / "data_order.jsonl")] == [r["ids"] for r in read_jsonl(ref / "data_order.jsonl")]
    print(f"SIGTERM: stopped at step {stopped_at} of {STEPS}, handed back, finished by worker 2: "
          f"{len(want)} adapter tensors bit-exact")


def test_a_train_job_succeeds_only_with_its_run(home, one_thread):
    from tunix_rt.train.driver import train

    import_tiny_dataset(home)
    jid = queue.enqueue("train", _params(2), max_attempts=1)
    cfg = TrainParams(**_params(2)).config()
    cfg.run_name = f"job{jid}"
    run = train(cfg, home)  # an earlier attempt trained, then died before its outcome
    shutil.rmtree(run / "final" / "adapter")  # and its final weights are gone since
    assert Worker(home, WorkerConfig(lease_s=5, poll_s=0.05, max_jobs=1)).run() == 1
    job = queue.get_job(jid)
    assert job.status == "dead" and "final outputs are missing: ['adapter']" in job.error


def test_a_run_stopped_on_request_raises_and_says_stopped(home, one_thread):
    from tunix_rt.errors import TunixRtError
    from tunix_rt.train.driver import train
    from tunix_rt.train.run import RunStopped

    import_tiny_dataset(home)
    cfg = TrainParams(**_params(4)).config()
    with pytest.raises(RunStopped) as stopped:
        train(cfg, home, should_stop=lambda: True)
    assert isinstance(stopped.value, TunixRtError)  # the CLI prints it and exits 1
    run = next(p for p in home.runs.iterdir() if not p.name.startswith("."))
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "stopped" and "stopped at step 1 of 4" in str(stopped.value)
    assert [p.name for p in checkpoint.committed(run)] == ["step-000001"] and not (run / "final").exists()
