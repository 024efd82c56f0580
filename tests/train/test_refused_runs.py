"""A run refused for its input leaves no run behind: `tunix-rt train` with a bad value exits 2
naming the field, before any run directory exists (no runs/.tmp-*, no `failed` run). What
fails once the run is under way is still recorded `failed`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from train_testlib import one_torch_thread, write_traces  # noqa: F401 (autouse fixture)

HERE = Path(__file__).resolve().parent

REFUSED = [  # (overrides, what stderr says); config, plan, data and rewards refusals
    (["lr=nan"], "config: lr must be a finite number, got nan"),
    (["lr=inf"], "config: lr must be a finite number, got inf"),
    (["weight_decay=.nan"], "config: weight_decay must be a finite number"),
    (["grad_clip=-.inf"], "config: grad_clip must be a finite number"),
    (["lora_alpha=inf"], "config: lora_alpha must be a finite number"),
    (["seed=-1"], "config: seed must be in [0, 4294967295], got -1"),
    (["lora_alpha=-5"], "config: lora_alpha must be > 0, got -5.0"),
    (["warmup_steps=1000000"], "config: warmup_steps (1000000) exceeds the run's 2 optimizer steps"),
    (["max_steps=null", "epochs=1", "warmup_steps=1000"], "config: warmup_steps (1000) exceeds the run's"),
    (["lora_rank=100000"], "plan: lora_rank 100000 is above the width of k_proj on tiny-gemma3"),
    (["max_seq_len=8"], "no training examples left"),
    (["drop_overlong=false", "max_seq_len=40"], "tokens exceed max_seq_len=40"),
    (["method=grpo", "max_seq_len=96", "rollout_max_new_tokens=8", "rewards={rl_rewards:nosuch: 1}"],
     "reward 'rl_rewards:nosuch': module 'rl_rewards' has no attribute 'nosuch'"),
]


def _train(args, capsys, monkeypatch) -> tuple[int, str]:
    """`tunix-rt train ARGS` through the CLI's own entry point (its exit codes and messages)."""
    from tunix_rt.cli import main

    monkeypatch.setattr(sys, "argv", ["tunix-rt", "train", *args])
    with pytest.raises(SystemExit) as info:
        main()
    return info.value.code, capsys.readouterr().err


def test_bad_values_exit_2_naming_the_field_and_leave_no_run_directory(home, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))  # rl_rewards, a user's reward module
    common = [f"dataset={write_traces(tmp_path / 'traces.jsonl', 8)}", "split=all", "eval_split=all",
              "eval_limit=2", "batch_size=2", "max_steps=2", "device=cpu", "engine=torch"]
    for overrides, needle in REFUSED:
        code, err = _train([*common, *overrides], capsys, monkeypatch)
        said = " ".join(err.split())  # rich wraps long lines
        assert code == 2 and needle in said and "Traceback" not in err, (overrides, code, err[-2000:])
        assert sorted(p.name for p in home.runs.iterdir()) == [], overrides  # no .tmp-*, no failed run


def test_jax_lora_targets_that_split_a_fused_projection_leave_no_run_directory(home, tmp_path, capsys, monkeypatch):
    code, err = _train([f"dataset={write_traces(tmp_path / 'traces.jsonl', 8)}", "split=all", "eval_split=all",
                        "batch_size=2", "max_steps=2", "device=cpu", "engine=jax", "lora_targets=[q_proj,k_proj]"],
                       capsys, monkeypatch)
    said = " ".join(err.split())
    assert code == 2 and "Tunix's Gemma fuses ['k_proj', 'v_proj'] into kv_einsum" in said, err[-2000:]
    assert sorted(p.name for p in home.runs.iterdir()) == []


def test_a_failure_once_the_run_is_under_way_is_recorded_failed(home, tmp_path):
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.driver import train

    def breaks() -> bool:  # the job worker's stop hook, failing after step 1
        raise RuntimeError("the worker's stop hook broke")

    cfg = TrainConfig(model="tiny-gemma3", dataset=write_traces(tmp_path / "traces.jsonl", 8), split="all",
                      eval_split="all", eval_limit=2, batch_size=2, max_seq_len=128, max_steps=3, device="cpu",
                      engine="torch")
    with pytest.raises(RuntimeError, match="stop hook broke"):
        train(cfg, home, should_stop=breaks)
    (run,) = home.runs.iterdir()
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "failed" and "RuntimeError: the worker's stop hook broke" in manifest["error"]
    assert manifest["finished_at"]


def test_the_plan_refuses_a_lora_rank_above_the_narrowest_targeted_projection():
    from tunix_rt.errors import BadInput
    from tunix_rt.plan import PlanInputs, make_plan

    # tiny-gemma3: hidden 128, one KV head of 32 (k_proj, v_proj: 128 x 32), MLP 256
    with pytest.raises(BadInput, match=r"lora_rank 33 is above the width of k_proj on tiny-gemma3 \(128 x 32: "
                                       r"a rank of at most 32\)"):
        make_plan(PlanInputs(model="tiny-gemma3", lora_rank=33))
    assert make_plan(PlanInputs(model="tiny-gemma3", lora_rank=32)).fits
    assert make_plan(PlanInputs(model="tiny-gemma3", lora_rank=128, lora_targets=("q_proj", "up_proj"))).fits
    with pytest.raises(BadInput, match="lora_rank 129 is above the width of q_proj"):
        make_plan(PlanInputs(model="tiny-gemma3", lora_rank=129, lora_targets=("q_proj", "up_proj")))
    assert make_plan(PlanInputs(model="tiny-gemma3", method="full", lora_rank=100000)).fits  # no adapter
