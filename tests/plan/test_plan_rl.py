"""The memory plan of an RL (GRPO) step: the rollout phase's items pinned to byte counts
worked out by hand on the tiny Gemma 3 (2 layers, width 128, MLP 256, 4 heads of 32, one KV
head, vocabulary 1024), the update phase as the training step it is, the peak as the larger
phase, the CLI flags, suggestions, and the driver's check. Pure arithmetic: milliseconds."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tunix_rt.cli import app
from tunix_rt.errors import BadInput
from tunix_rt.plan import GiB, SLACK, PlanInputs, make_plan, plan_train, update_inputs
from tunix_rt.train.config import TrainConfig

#: 4 prompts x 4 samples, 32 new tokens, prompts up to 104 - 32 = 72 tokens
TINY_RL = dict(model="tiny-gemma3", method="lora", seq=104, batch=4, device="cpu", engine="torch",
               rl_prompts=4, group_size=4, rollout_tokens=32)
#: K and V of one token in every layer, fp32: 2 x 2 layers x 1 KV head x 32 x 4 B
KV_TOKEN = 512


def test_torch_lora_rollout_items_by_hand():
    plan = make_plan(PlanInputs(**TINY_RL))
    i, d = plan.items, plan.details
    # LoRA is applied live in the decode (eval.fast_gemma.LoraWeight): no merged copy
    assert "merged_view" not in i
    roll = d["decodes"]["rollouts"]
    # the rollouts' cache: 16 rows x 104 preallocated slots, plus the larger transient: the
    # prefill's 72-slot cache (its 4 prompts' rows repeated for their 4 samples) while it is
    # copied in (over half a cache as a row leaves)
    assert roll["cache"] == 16 * 104 * KV_TOKEN + 16 * 72 * KV_TOKEN == 1_441_792
    # prefill workspace: each distinct prompt once (a group's samples share it), per prompt
    # token 2h + q + 2kv + 3i = 1216 elements of 4 B (torch's sdpa holds no [L, L] scores),
    # plus 2i = 512 for PEFT's LoRA forward of gate/up (base, scaled adapter and sum at once),
    # for 4 x 72 tokens, and the last position's logits of the 16 rows, fp32; sampling goes
    # through the int8 screen of the head too: 1024 x (128 + 8)
    assert roll["prefilled"] == 4
    assert roll["workspace"] == 4 * 72 * 1728 * 4 + 16 * 1024 * 4 + 1024 * 136 == 2_195_456
    assert roll["step"] == 8 * 16 * 1024 * 4  # logits + sampler buffers: smaller
    # the held-out greedy decode (8 rows, 8 prompts to prefill) holds the same screen, and
    # is here the larger of the two decodes: the phase's items are its
    held = d["decodes"]["held-out eval"]
    assert held["screen"] == 1024 * 136 and held["cache"] == 8 * 104 * KV_TOKEN + 8 * 72 * KV_TOKEN
    assert held["workspace"] == 8 * 72 * 1728 * 4 + 8 * 1024 * 4 + 1024 * 136
    assert d["rollout_decode"] == "held-out eval"
    assert (i["rollout_cache"], i["rollout_workspace"]) == (held["cache"], held["workspace"])
    # the phase: resident weights + optimizer + the two rollout items, 5% slack, process
    core = i["weights"] + i["optimizer"] + i["rollout_cache"] + i["rollout_workspace"]
    assert d["phases"]["rollout"] == int(core * (1 + SLACK["cpu"]) + d["rollout_workspace_parts"]["process_or_context"])
    # host aux arrays of all 16 x 104 tokens (coef, adv, old/ref logp) + one micro-batch's 7 copies
    assert i["rl_aux"] == 4 * 16 * 104 * 4 + 7 * 4 * 104 * 4 == 38_272


def test_eager_attention_holds_the_prefills_scores():
    """Gemma 2 soft-caps its attention logits: the torch engine loads it with eager attention
    (torch_engine.attention_of), whose prefill holds the scores and probabilities [heads, L]
    of every prompt token; sdpa (every other Gemma) holds none. (5i: gate, up, their product,
    and PEFT's LoRA forward of the widest projection, two outputs more.)"""
    from tunix_rt.plan import resolve_preset

    p = resolve_preset("tiny-gemma2")
    dense = 2 * p.hidden_size + p.num_heads * p.head_dim + 2 * p.num_kv_heads * p.head_dim + 5 * p.intermediate_size
    roll = make_plan(PlanInputs(**{**TINY_RL, "model": "tiny-gemma2"})).details["decodes"]["rollouts"]
    assert roll["prefill"] == 4 * 72 * (dense + 2 * p.num_heads * 72) * 4 + 16 * p.vocab_size * 4


def test_jax_rollout_holds_both_caches_of_the_undonated_step():
    plan = make_plan(PlanInputs(**{**TINY_RL, "engine": "jax"}))
    i = plan.items
    # the 72-token prompt padded to a 64-multiple (128) + 32 new = 160 slots, input + output cache
    assert i["rollout_cache"] == 2 * 16 * 160 * KV_TOKEN == 2_621_440
    # the JAX prefill attends over all 160 slots: 2h + q + 2kv + 3i + 2 x 4 x 160 = 2496
    assert i["rollout_workspace"] == 16 * 72 * 2496 * 4 + 16 * 1024 * 4


def test_the_decodes_count_the_screen_build_on_a_cpu():
    """Gemma 3 270M, 16 rollouts: the first decode of a step (the rollouts, sampled through
    the screen: Gumbel-max) builds the int8 screen of the head, one group of 4,096 rows at a
    time (fp32 and fp64 temporaries, 32 B an element); both decodes count it, and the
    rollouts' 16 rows make them the larger decode."""
    inp = PlanInputs(model="gemma3-270m", seq=256, batch=1, remat=True, device="cpu", engine="torch",
                     rl_prompts=4, group_size=4, rollout_tokens=128)
    plan = make_plan(inp)
    held = plan.details["decodes"]["held-out eval"]
    assert held["screen"] == 262_144 * 648 and held["screen_build"] == held["screen"] + 4096 * 640 * 32
    assert held["workspace"] == max(max(held["prefill"], held["step"]) + held["screen"], held["screen_build"])
    assert plan.details["rollout_decode"] == "rollouts"
    roll = plan.details["decodes"]["rollouts"]
    assert roll["screen_build"] == held["screen_build"] and roll["screen"] == held["screen"]
    assert plan.items["rollout_workspace"] == max(roll["screen_build"], max(roll["prefill"], roll["step"]) + roll["screen"])
    # no screen where it does not apply: the JAX engine, or a GPU
    for other in ({"engine": "jax", "strategy": "fsdp"}, {"device": "a100-40gb"}):
        held = make_plan(PlanInputs(**{**inp.__dict__, **other})).details["decodes"]["held-out eval"]
        assert held["screen"] == held["screen_build"] == 0


def test_update_phase_is_the_training_step_over_the_rollouts_plus_the_aux_arrays():
    inp = PlanInputs(**TINY_RL)
    upd = update_inputs(inp)
    assert (upd.batch, upd.grad_accum, upd.rl) == (4, 4, False)  # 16 sequences in 4 micro-batches
    sft = make_plan(upd)
    rl = make_plan(inp)
    for k in ("weights", "gradients", "optimizer", "activations", "loss_head"):
        assert rl.items[k] == sft.items[k]
    assert rl.details["phases"]["update"] == int(sft.peak_bytes_per_device + rl.items["rl_aux"] * (1 + SLACK["cpu"]))
    assert rl.peak_bytes_per_device == max(rl.details["phases"].values())
    # a micro-batch larger than the rollouts: one micro-batch of all 16
    big = update_inputs(PlanInputs(**{**TINY_RL, "batch": 32}))
    assert (big.batch, big.grad_accum) == (16, 1)


def test_the_peak_phase_moves_with_the_rollout_size():
    """Few short rollouts: the update (backward through batch x seq) is the peak; many long
    ones on Gemma 3 270M: the KV cache of P x G rows is."""
    small = make_plan(PlanInputs(**{**TINY_RL, "rl_prompts": 1, "group_size": 2}))
    assert small.details["peak_phase"] == "update"
    big = make_plan(PlanInputs(model="gemma3-270m", seq=1024, batch=1, remat=True, device="cpu",
                               engine="torch", rl_prompts=16, group_size=8, rollout_tokens=512))
    assert big.details["peak_phase"] == "rollout"
    assert big.to_json()["peak_phase"] == "rollout"
    # 128 rows x 1024 slots x (2 x 18 layers x 256 x 4 B) for the preallocated cache alone
    assert big.items["rollout_cache"] >= 128 * 1024 * 36_864
    # the held-out decode (8 rows) is the larger one only when the rollouts are few
    few = make_plan(PlanInputs(**{**TINY_RL, "rl_prompts": 1, "group_size": 2}))
    assert few.details["rollout_decode"] == "held-out eval"


def test_rl_that_does_not_fit_gets_rl_suggestions_each_with_its_peak():
    inp = PlanInputs(model="gemma3-270m", seq=1024, batch=4, device="l4-24gb", engine="torch",
                     rl_prompts=32, group_size=16, rollout_tokens=768)
    plan = make_plan(inp)
    assert not plan.fits and plan.details["peak_phase"] == "rollout"
    changes = {s["change"].split("=")[0]: s for s in plan.suggestions}
    assert {"rl_prompts", "group_size", "rollout_max_new_tokens"} <= set(changes)
    for s in plan.suggestions:
        assert s["fits"] and s["peak_bytes_per_device"] <= plan.capacity_bytes
    # each suggestion is the plan of the changed inputs; shorter rollouts keep the prompts' room
    fewer = changes["rl_prompts"]
    n = int(fewer["change"].split("=")[1])
    again = make_plan(PlanInputs(**{**inp.__dict__, "rl_prompts": n}))
    assert again.peak_bytes_per_device == fewer["peak_bytes_per_device"]
    short = changes["rollout_max_new_tokens"]["change"]  # "rollout_max_new_tokens=T max_seq_len=S"
    t, s = (int(part.split("=")[1]) for part in short.split())
    assert s - t == 1024 - 768
    # one step fewer prompts would not fit: the suggestion is the largest P that does
    assert not make_plan(PlanInputs(**{**inp.__dict__, "rl_prompts": 2 * n})).fits


def test_cli_rl_flags_plan_the_rl_step_as_the_notebook_calls_them():
    """notebooks/kaggle_tpu.py's plan cell: the SFT flags, then --rl-prompts, --group-size,
    --rollout-tokens (here without XLA's compile)."""
    args = ["plan", "--model", "gemma3-1b", "--method", "lora", "--seq", "512", "--batch", "16",
            "--grad-accum", "1", "--dtype", "bf16", "--optimizer", "adamw", "--lora-rank", "32",
            "--engine", "jax", "--device", "tpu-v5e", "--devices", "8"]
    rl = ["--rl-prompts", "8", "--group-size", "4", "--rollout-tokens", "256"]
    res = CliRunner().invoke(app, [*args, *rl, "--no-xla", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert {"fits", "peak_bytes_per_device", "capacity_bytes", "items", "estimators", "suggestions"} <= set(out)
    assert {"rollout_cache", "rollout_workspace", "rl_aux"} <= set(out["items"])
    assert out["peak_phase"] in ("rollout", "update") and out["fits"]
    assert out["peak_bytes_per_device"] == max(out["details"]["phases"].values())
    assert (out["inputs"]["rl_prompts"], out["inputs"]["group_size"], out["inputs"]["rollout_tokens"]) == (8, 4, 256)
    sft = json.loads(CliRunner().invoke(app, [*args, "--no-xla", "--json"]).output)
    assert "peak_phase" not in sft and "rollout_cache" not in sft["items"]
    human = CliRunner().invoke(app, [*args, *rl, "--no-xla"])
    assert human.exit_code == 0 and "rollout phase" in human.output and "update phase" in human.output


@pytest.mark.parametrize("rl, needle", [
    (["--rl-prompts", "4"], "together"),
    (["--rl-prompts", "4", "--group-size", "4"], "together"),
    (["--rl-prompts", "4", "--group-size", "0", "--rollout-tokens", "8"], "each >= 1"),
    (["--rl-prompts", "4", "--group-size", "4", "--rollout-tokens", "64"], "leave room for the prompt"),
])
def test_rl_flags_bad_input(rl, needle):
    res = CliRunner().invoke(app, ["plan", "--model", "tiny-gemma3", "--device", "cpu", "--seq", "64", *rl])
    assert isinstance(res.exception, BadInput) and res.exception.exit_code == 2 and needle in str(res.exception)


def test_a_grpo_config_is_planned_as_rl_by_plan_train_and_the_driver(tmp_path):
    from tunix_rt.train.driver import check_plan

    cfg = TrainConfig(model="gemma3-270m", dataset="gsm8k", method="grpo", rl_prompts=4, group_size=4,
                      rollout_max_new_tokens=160, max_seq_len=416, batch_size=4)
    plan = plan_train(cfg, "cpu", 1, engine="torch")
    assert (plan.inputs.rl_prompts, plan.inputs.group_size, plan.inputs.rollout_tokens) == (4, 4, 160)
    assert plan.inputs.seq == 416 and "peak_phase" in plan.details
    facts = {"platform": "cpu", "count": 1}
    assert check_plan(cfg, "torch", facts)["predicted_peak_bytes"] == plan.peak_bytes_per_device
    sft = plan_train(TrainConfig(model="gemma3-270m", dataset="gsm8k", max_seq_len=416), "cpu", 1, engine="torch")
    assert not sft.inputs.rl
    # an RL step that does not fit is refused, the rollout named in the plan it prints
    huge = TrainConfig(model="gemma3-270m", dataset="gsm8k", method="grpo", rl_prompts=512, group_size=64,
                       rollout_max_new_tokens=1024, max_seq_len=2048, batch_size=1)
    with pytest.raises(BadInput, match="rollout phase"):
        check_plan(huge, "torch", facts)
    assert plan_train(huge, "cpu", 1, engine="torch").peak_bytes_per_device > 100 * GiB
