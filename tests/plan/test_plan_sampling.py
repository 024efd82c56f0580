"""The memory plan of every method that samples from the model it trains: rft (group_size
completions of rl_prompts prompts a round), dpo with pairs=rollouts (GRPO's rollouts) and
distill with kd_on_policy (one completion of each example of the step). Their rollouts are
counted by the one rule GRPO's are (plan.rl: the KV cache and decode batch of the rows), their
update is their own step; the plan grows by exactly the rollout phase's excess when sampling
is on. Tiny Gemma 3 (2 layers, width 128, MLP 256, 4 heads of 32, one KV head, vocabulary
1024) worked out by hand, as test_plan_rl.py does. Pure arithmetic: milliseconds."""

from __future__ import annotations

import dataclasses

import pytest

from tunix_rt.errors import BadInput
from tunix_rt.plan import SLACK, PlanInputs, make_plan, plan_train
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.methods import sampling

#: K and V of one token in every layer, fp32: 2 x 2 layers x 1 KV head x 32 x 4 B
KV_TOKEN = 512
#: the int8 screen of the tiny head a CPU decode holds: 1024 rows x (128 + 8) B
SCREEN = 1024 * 136
BASE = dict(model="tiny-gemma3", dataset="x.jsonl", device="cpu", engine="torch", max_seq_len=104, batch_size=4,
            rl_prompts=4, group_size=4, rollout_max_new_tokens=32)


def _plan(**over):
    return plan_train(TrainConfig(**{**BASE, **over}), "cpu", 1, engine="torch")


def _rollout_phase(plan, frozen=0):
    """The rollout phase from its items: what plan.rl's rule adds up."""
    i = plan.items
    core = i["weights"] + i["optimizer"] + frozen + i["rollout_cache"] + i["rollout_workspace"]
    return int(core * (1 + SLACK["cpu"]) + plan.details["rollout_workspace_parts"]["process_or_context"])


def test_the_table_says_which_configs_sample_and_how():
    assert sampling(TrainConfig(**BASE)) is None  # sft
    assert sampling(TrainConfig(**BASE, method="dpo")) is None  # dataset pairs
    assert sampling(TrainConfig(**BASE, method="distill", teacher="tiny-gemma3")) is None  # off-policy
    grpo = sampling(TrainConfig(**BASE, method="grpo"))
    assert (grpo.prompts, grpo.group, grpo.new_tokens, grpo.trains_on_rollouts) == (4, 4, 32, True)
    for over in ({"method": "rft"}, {"method": "dpo", "pairs": "rollouts"}):
        s = sampling(TrainConfig(**BASE, **over))
        assert (s.prompts, s.group, s.trains_on_rollouts, s.held_out_decode, s.prompt_room) == (4, 4, False, True, True)
    kd = sampling(TrainConfig(**BASE, method="distill", teacher="tiny-gemma3", kd_on_policy=True, grad_accum=3))
    assert (kd.prompts, kd.group, kd.new_tokens) == (12, 1, 32)  # batch_size x grad_accum examples, one each
    assert not kd.trains_on_rollouts and not kd.held_out_decode and not kd.prompt_room


@pytest.mark.parametrize("over", [{"method": "rft"}, {"method": "dpo", "pairs": "rollouts"}])
def test_rft_and_rollout_pairs_count_grpos_rollouts_and_their_own_update(over):
    """The same 16 rows as GRPO's (test_plan_rl.TINY_RL): the same rollout items and phase,
    by the same rule; the update is the method's own step (SFT's or DPO's with dataset pairs:
    batch x grad_accum), with no RL per-token arrays."""
    on = _plan(**over)
    grpo = _plan(method="grpo")
    off = _plan(method="sft") if over["method"] == "rft" else _plan(method="dpo")
    for k in ("rollout_cache", "rollout_workspace"):
        assert on.items[k] == grpo.items[k], k
    roll = on.details["decodes"]["rollouts"]
    assert roll["cache"] == 16 * 104 * KV_TOKEN + 16 * 72 * KV_TOKEN
    # each of the 4 prompts prefilled once: 1728 elements a token (2h + q + 2kv + 3i, sdpa,
    # + 2i for PEFT's LoRA forward of gate/up)
    assert roll["workspace"] == 4 * 72 * 1728 * 4 + 16 * 1024 * 4 + SCREEN
    assert on.details["decodes"] == grpo.details["decodes"]  # the rollouts and the held-out greedy decode
    assert on.details["phases"]["rollout"] == grpo.details["phases"]["rollout"] == _rollout_phase(on)
    assert "rl_aux" not in on.items and on.details["phases"]["update"] == off.peak_bytes_per_device
    assert on.peak_bytes_per_device == max(off.peak_bytes_per_device, _rollout_phase(on))
    # many long rollouts: the rollout phase is the peak, and the plan grows by exactly its excess
    big = dict(rl_prompts=32, group_size=8, rollout_max_new_tokens=256, max_seq_len=328, batch_size=2)
    on, off = _plan(**over, **big), (_plan(**big) if over["method"] == "rft" else _plan(method="dpo", **big))
    assert on.details["peak_phase"] == "rollout" and on.details["rollout_decode"] == "rollouts"
    assert on.items["rollout_cache"] == 256 * 328 * KV_TOKEN + 255 * 328 * KV_TOKEN // 2
    assert on.peak_bytes_per_device - off.peak_bytes_per_device == _rollout_phase(on) - off.peak_bytes_per_device > 0


def test_on_policy_distill_counts_one_completion_of_each_example_and_the_teacher():
    """batch 2 x grad_accum 2 = 4 rows, sampled from whole prompts (up to max_seq_len - 1 =
    103 tokens: the completion is cut to max_seq_len afterwards) plus 32 new tokens; the
    teacher's weights stay resident while the student decodes; no held-out decode (distill's
    eval is a loss)."""
    kd = dict(method="distill", teacher="tiny-gemma3", batch_size=2, grad_accum=2)
    off, on = _plan(**kd), _plan(**kd, kd_on_policy=True)
    i = on.items
    assert i["teacher_weights"] == off.items["teacher_weights"] > 0
    slots = 103 + 32
    assert i["rollout_cache"] == 4 * slots * KV_TOKEN + 4 * 103 * KV_TOKEN == 487_424
    # prefill: per prompt token 2h + q + 2kv + 3i + 2i (LoRA) = 1728 elements of 4 B (sdpa: no scores),
    # 4 x 103 tokens, the last position's logits, and the screen of the head
    assert i["rollout_workspace"] == 4 * 103 * 1728 * 4 + 4 * 1024 * 4 + SCREEN
    assert set(on.details["decodes"]) == {"rollouts"}
    assert on.details["phases"]["rollout"] == _rollout_phase(on, frozen=i["teacher_weights"])
    assert on.details["phases"]["update"] == off.peak_bytes_per_device  # the distill step itself
    assert on.details["teacher"] == off.details["teacher"]
    # 32 examples a step (micro-batches of 1), 512 new tokens each: the rollouts are the peak
    many = dict(kd, batch_size=1, grad_accum=32, rollout_max_new_tokens=512)
    off, on = _plan(**many), _plan(**many, kd_on_policy=True)
    assert on.details["peak_phase"] == "rollout" and on.details["decodes"]["rollouts"]["rows"] == 32
    assert on.items["rollout_cache"] == 32 * (103 + 512) * KV_TOKEN + 31 * 615 * KV_TOKEN // 2
    grown = on.peak_bytes_per_device - off.peak_bytes_per_device
    assert grown == _rollout_phase(on, frozen=on.items["teacher_weights"]) - off.peak_bytes_per_device > 0


def test_the_driver_refuses_a_sampling_run_that_does_not_fit_naming_the_rollouts():
    """The check train runs before it starts: off-policy fits a capacity that on-policy
    (its rollouts) does not, and the driver refuses that run; the suggestions shorten the
    rollouts (distill has no prompts or group to cut: its rows are the step's examples)."""
    from tunix_rt.train.driver import check_plan

    kd = dict(method="distill", teacher="tiny-gemma3", batch_size=1, grad_accum=32, rollout_max_new_tokens=512)
    off, on = _plan(**kd), _plan(**kd, kd_on_policy=True)
    cap = on.peak_bytes_per_device - 1
    assert plan_train(TrainConfig(**{**BASE, **kd}), "cpu", 1, capacity_bytes=cap, engine="torch").fits
    tight = plan_train(TrainConfig(**{**BASE, **kd, "kd_on_policy": True}), "cpu", 1, capacity_bytes=cap,
                       engine="torch")
    assert not tight.fits and "rollout phase (the peak)" in tight.render()
    changes = {s["change"]: s["peak_bytes_per_device"] for s in tight.suggestions}
    assert changes.get("rollout_max_new_tokens=256") == _plan(**{**kd, "rollout_max_new_tokens": 256},
                                                              kd_on_policy=True).peak_bytes_per_device
    assert not any("rl_prompts" in c or "group_size" in c for c in changes), changes
    # the driver's check: a CPU whose memory is the off-policy peak refuses the on-policy run
    huge = dict(kd, grad_accum=2 ** 20, rollout_max_new_tokens=8192)  # ~4 TB of KV cache
    check_plan(TrainConfig(**{**BASE, **huge}), "torch", {"platform": "cpu", "count": 1})
    with pytest.raises(BadInput, match="rollout phase"):
        check_plan(TrainConfig(**{**BASE, **huge, "kd_on_policy": True}), "torch", {"platform": "cpu", "count": 1})


def test_a_jax_sampling_plan_counts_the_same_rows():
    """The JAX engine: the rollouts' bucketed caches (input and output of the undonated step),
    as GRPO's; rft's update is its own step."""
    cfg = TrainConfig(**{**BASE, "method": "rft", "engine": "jax"})
    grpo = TrainConfig(**{**BASE, "method": "grpo", "engine": "jax"})
    a, b = plan_train(cfg, "cpu", 1, engine="jax"), plan_train(grpo, "cpu", 1, engine="jax")
    assert a.items["rollout_cache"] == b.items["rollout_cache"] == 2 * 16 * 160 * KV_TOKEN


def test_plan_inputs_of_whole_prompts():
    inp = PlanInputs(model="tiny-gemma3", seq=104, rl_prompts=4, group_size=1, rollout_tokens=256,
                     trains_on_rollouts=False, held_out_decode=False, long_prompts=True)
    assert inp.rollout_prompt == 103  # more new tokens than seq is fine: the completion is cut after
    assert make_plan(inp).items["rollout_cache"] == 4 * (103 + 256) * KV_TOKEN + 3 * 359 * KV_TOKEN // 2
    with pytest.raises(BadInput, match="leave room for the prompt"):
        dataclasses.replace(inp, long_prompts=False)


CLI = ["plan", "--model", "tiny-gemma3", "--device", "cpu", "--engine", "torch", "--dtype", "fp32", "--json"]


@pytest.mark.parametrize("flags, over", [
    (["--train-method", "rft", "--batch", "4", "--rl-prompts", "4", "--group-size", "4", "--rollout-tokens", "32"],
     {"method": "rft"}),
    (["--train-method", "dpo", "--pairs", "rollouts", "--batch", "4", "--rl-prompts", "4", "--group-size", "4",
      "--rollout-tokens", "32"], {"method": "dpo", "pairs": "rollouts"}),
    (["--train-method", "distill", "--on-policy", "--teacher", "tiny-gemma3", "--batch", "2", "--grad-accum", "2",
      "--rollout-tokens", "32"],
     {"method": "distill", "teacher": "tiny-gemma3", "kd_on_policy": True, "batch_size": 2, "grad_accum": 2}),
    # full fine-tuning with a reference policy: the frozen copy of the starting weights
    (["--method", "full", "--reference", "--train-method", "grpo", "--batch", "4", "--rl-prompts", "4",
      "--group-size", "4", "--rollout-tokens", "32"], {"method": "grpo", "finetune": "full"}),
    (["--method", "full", "--reference", "--train-method", "dpo", "--pairs", "rollouts", "--batch", "4",
      "--rl-prompts", "4", "--group-size", "4", "--rollout-tokens", "32"],
     {"method": "dpo", "pairs": "rollouts", "finetune": "full"}),
])
def test_tunix_rt_plan_plans_each_methods_sampling_as_train_does(flags, over):
    """`tunix-rt plan --train-method ...` is the plan `train` checks for that config."""
    import json

    from typer.testing import CliRunner

    from tunix_rt.cli import app

    res = CliRunner().invoke(app, [*CLI, "--seq", "104", *flags])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    want = _plan(**over)
    assert out["peak_bytes_per_device"] == want.peak_bytes_per_device and out["items"] == want.items
    assert out["peak_phase"] == want.details["peak_phase"] and out["details"]["decodes"] == want.details["decodes"]
    assert ("reference_weights" in out["items"]) == ("--reference" in flags)


@pytest.mark.parametrize("flags, needle", [
    (["--train-method", "rft"], "needs --rl-prompts, --group-size, --rollout-tokens together; got none"),
    (["--train-method", "distill", "--on-policy", "--teacher", "tiny-gemma3", "--rl-prompts", "4",
      "--rollout-tokens", "8"], "needs --rollout-tokens (its rows are --batch x --grad-accum examples)"),
    (["--train-method", "dpo", "--rl-prompts", "4", "--group-size", "4", "--rollout-tokens", "8"], "samples nothing"),
    (["--train-method", "distill", "--on-policy", "--rollout-tokens", "8"], "needs --teacher"),
    (["--train-method", "ppo"], "--train-method must be one of"),
    (["--reference"], "with --method lora the reference is the adapter-off model"),
    (["--method", "full", "--reference", "--train-method", "rft", "--rl-prompts", "4", "--group-size", "4",
      "--rollout-tokens", "8"], "--train-method rft never compares with a reference policy"),
])
def test_tunix_rt_plan_sampling_flags_bad_input(flags, needle):
    from typer.testing import CliRunner

    from tunix_rt.cli import app

    res = CliRunner().invoke(app, [*CLI, "--seq", "64", *flags])
    assert isinstance(res.exception, BadInput) and res.exception.exit_code == 2, res.output
    assert needle in str(res.exception)
