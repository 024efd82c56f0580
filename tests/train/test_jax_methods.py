"""The methods after SFT on the JAX engine (issue 26.5): stopped mid-run and resumed, each
gives the weights and metrics of a run never stopped, and its runs are complete.

A SIGKILL at each fault point, then a resume, is tested for every method on the torch
engine (tests/train/test_preference.py, test_rft.py, test_distill.py, test_gspo_rloo.py) and
for SFT on this engine (test_jax_engine.py): the checkpoint's writing and committing are the
driver's, the same for every engine and method. What differs per method and engine is the
state a checkpoint holds (the JAX engine's parameters, optimizer and RNG streams; the
method's prompt order, RFT's round and kept set, a curriculum), so here each method is
stopped in process after a step (the job worker's stop: that step is checkpointed), resumed
from the checkpoint, and compared with a run never stopped, to the bit.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import train_testlib
from requires import require_module
from train_testlib import one_torch_thread, write_traces  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.jax

LONG = "rl_rewards:length_share"


@pytest.fixture(autouse=True)
def user_rewards_importable(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))


def _config(kind: str, tmp_path):
    """A 2-step config of `kind` on the JAX engine, checkpointed every step, with LoRA
    dropout where the method allows it (its RNG stream is part of the state)."""
    from tunix_rt.models.catalog import get_preset
    from tunix_rt.models.tiny import build_tiny
    from tunix_rt.train.config import TrainConfig

    common = dict(engine="jax", max_steps=2, save_interval=1, lora_dropout=0.1, eval_interval=0)
    if kind in ("gspo", "rloo"):
        return train_testlib.rl_cfg(tmp_path, rl_loss=kind, batch_size=2, mu=2, **common)
    if kind == "rft":  # 2 steps a round: the stop after step 1 is mid-round
        return train_testlib.rl_cfg(tmp_path, method="rft", rewards={LONG: 1.0, "format": 0.5},
                                    rft_accept={LONG: 0.12}, rft_round_steps=2, **common)
    assert kind == "distill"  # on-policy: the student's own samples, as GKD
    teacher = build_tiny(get_preset("tiny-gemma3"), tmp_path / "teacher", seed=1)
    return TrainConfig(model="tiny-gemma3", dataset=write_traces(tmp_path / "traces.jsonl", 16), split="all",
                       eval_split="all", eval_limit=2, system_prompt="Be brief.", method="distill",
                       teacher=str(teacher), kd_loss="jsd", kd_on_policy=True, rollout_max_new_tokens=8,
                       batch_size=2, max_seq_len=96, lr=1e-2, warmup_steps=0, log_interval=1, device="cpu", **common)


#: per method, what its metrics rows must agree on besides step and loss
KEYS = {"rft": ("rft_round", "tokens"), "distill": ("kl_teacher",), "rloo": ("reward", "kl")}
# gspo: the same GRPO state and sequence-ratio code as rloo; dpo with pairs from a dataset: its
# state is the data order, as SFT's (test_jax_engine.py kills and resumes that), and the
# engine's; its loss on JAX is tested in test_preference.py (~35 s a case)


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_stop_then_resume_on_jax_equals_a_run_never_stopped(home, tmp_path, kind):
    from safetensors.numpy import load_file

    from tunix_rt.train import checkpoint
    from tunix_rt.train.driver import train
    from tunix_rt.train.metrics import read_jsonl
    from tunix_rt.train.run import RunStopped

    require_module("jax")
    cfg = _config(kind, tmp_path)
    with pytest.raises(RunStopped):
        train(cfg, home, should_stop=lambda: True)  # after step 1, checkpointed
    run = next(p for p in home.runs.iterdir() if not p.name.startswith("."))
    assert [p.name for p in checkpoint.committed(run)] == ["step-000001"]
    assert json.loads((run / "run_manifest.json").read_text())["status"] != "succeeded"
    train(cfg, home, resume=run.name)
    ref = train(cfg, home)
    for d in (run, ref):
        manifest = json.loads((d / "run_manifest.json").read_text())
        assert manifest["status"] == "succeeded" and manifest["summary"]["method"] == cfg.method
        assert [p.name for p in checkpoint.committed(d)][-1] == "step-000002"
    got = load_file(str(run / "final/adapter/adapter_model.safetensors"))
    want = load_file(str(ref / "final/adapter/adapter_model.safetensors"))
    assert got.keys() == want.keys() and len(want) > 0
    for name in want:
        assert np.array_equal(got[name], want[name]), name
    assert any(np.abs(want[k]).max() > 0 for k in want if "lora_B" in k)  # training moved B off zero
    keys = ("step", "loss", "grad_norm", *KEYS[kind])
    rows = lambda d: [tuple(r.get(k) for k in keys) for r in read_jsonl(d / "metrics.jsonl") if "loss" in r]
    assert rows(run) == rows(ref) and [r[0] for r in rows(ref)] == [1, 2]
    assert any(r[2] > 0 for r in rows(ref)), rows(ref)  # a step that learns (not an all-zero window)
    assert all(v is not None for r in rows(ref) for v in r), rows(ref)  # the method's own figures logged
    if kind == "distill":
        assert all(r[3] > 0 for r in rows(ref))  # the student is not its teacher
    assert read_jsonl(run / "data_order.jsonl") == read_jsonl(ref / "data_order.jsonl")
