"""`init` along a chain of runs (SFT → SimPO → GRPO, the Kaggle notebook's recipe): each stage
names the first model and the run before it, as a single SFT → GRPO step does; a model the
chain never trained on is still refused, naming the chain."""

from __future__ import annotations

import json

import pytest

from tunix_rt.errors import BadInput
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.driver import train
from train_testlib import one_torch_thread, write_traces  # noqa: F401 (autouse fixture)

BASE = dict(model="tiny-gemma3", split="all", eval_split="all", eval_limit=2, batch_size=4, max_seq_len=96, max_steps=1,
            lr=1e-2, warmup_steps=0, save_interval=0, log_interval=1, device="cpu", engine="torch",
            system_prompt="Be brief.", group_size=2, rl_prompts=2, rollout_max_new_tokens=8)


def test_sft_then_simpo_then_grpo_each_from_the_run_before(home, tmp_path):
    data = write_traces(tmp_path / "traces.jsonl", 8)
    sft = train(TrainConfig(**BASE, dataset=data, method="sft"), home)
    simpo = train(TrainConfig(**BASE, dataset=data, method="dpo", pref_loss="simpo", pairs="rollouts", init=sft.name), home)
    grpo = train(TrainConfig(**BASE, dataset=data, method="grpo", init=simpo.name), home)
    models = [json.loads((r / "run_manifest.json").read_text())["config"]["model"] for r in (sft, simpo, grpo)]
    assert models == ["tiny-gemma3", str(home.models / f"init-{sft.name}"), str(home.models / f"init-{simpo.name}")]
    assert json.loads((grpo / "run_manifest.json").read_text())["status"] == "succeeded"
    # the chain's middle model, named as a path, is the SimPO run's base too
    again = train(TrainConfig(**{**BASE, "model": models[1]}, dataset=data, method="grpo", init=simpo.name), home)
    assert json.loads((again / "run_manifest.json").read_text())["config"]["model"] == models[2]
    with pytest.raises(BadInput, match=r"init: run .* was trained on .*init-sft.* \(from 'tiny-gemma3'\), not model "
                                       r"'gemma3-270m'"):
        train(TrainConfig(**{**BASE, "model": "gemma3-270m"}, dataset=data, method="grpo", init=simpo.name), home)
