"""The analytic memory plan: the headline Gemma 2B cases, the CLI contract (DESIGN §2), the
suggestions, plan_train for both engines, and bad input. Pure arithmetic: milliseconds."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tunix_rt.cli import app
from tunix_rt.errors import BadInput
from tunix_rt.models.catalog import get_preset
from tunix_rt.plan import GiB, PlanInputs, make_plan, plan_train
from tunix_rt.train.config import TrainConfig

V5E = 15.75 * GiB


def gemma2b(**over) -> PlanInputs:
    base = dict(model="gemma-2b", method="full", seq=64, batch=1, device="tpu-v5e", devices=1,
                engine="jax", optimizer="adamw")
    base.update(over)
    return PlanInputs(**base)


def test_the_real_oom_is_reproduced_and_answered():
    """The failure we replace: "Used 28.59G of 15.75G hbm", Gemma 2B full fine-tune, AdamW,
    one v5e chip, batch 1 x 64. 12 bytes per parameter reproduce it: Tunix's Gemma 1 keeps
    fp32 weights (4 B), optax's AdamW two fp32 moments (8 B), and without global-norm
    clipping XLA feeds each gradient straight into its update (no gradient tree): 2.506e9
    params x 12 B = 28.0 GiB, plus activations, one loss chunk and the embedding's gradient.
    (All-bf16 would be 8 B/param = 18.7 GiB; fp32 with clipping 16 B = 37.3 GiB.)"""
    plan = make_plan(gemma2b(dtype="fp32", grad_clip=0.0))
    assert plan.capacity_bytes == int(V5E)
    assert not plan.fits
    assert 28.0 * GiB <= plan.peak_bytes_per_device <= 1.15 * 28.59 * GiB  # measured: 31.4 GiB
    params = get_preset("gemma-2b").param_count()
    assert 2.50e9 < params < 2.52e9
    assert plan.items["weights"] + plan.items["optimizer"] == pytest.approx(params * 12, rel=1e-3)
    changes = [s["change"].split(" ")[0] for s in plan.suggestions]
    assert "method=lora" in changes and any(c.startswith("devices=") for c in changes)
    for s in plan.suggestions:
        assert s["fits"] and s["peak_bytes_per_device"] <= plan.capacity_bytes
        # each suggestion is the plan of the changed inputs: re-plan one to check
    lora = next(s for s in plan.suggestions if s["change"].startswith("method=lora"))
    again = make_plan(gemma2b(dtype="fp32", grad_clip=0.0, method="lora"))
    assert lora["peak_bytes_per_device"] == again.peak_bytes_per_device and again.fits


def test_fsdp_over_eight_v5e_chips_fits():
    plan = make_plan(gemma2b(devices=8, seq=512, batch=8, dtype="bf16", remat=True))
    assert plan.fits and plan.peak_bytes_per_device < 16 * 10**9
    assert plan.details["fsdp"] == 8 and plan.details["tokens_per_device"] == 512
    # the JAX loss runs every chunk of the global batch on every device (XLA's buffer
    # assignment: a whole [chunk, V] block per device), 256 MiB / (256,000 x 4 B) tokens
    assert plan.details["loss_chunk_tokens"] == 262
    one = make_plan(gemma2b(devices=1, seq=512, batch=8, dtype="bf16", remat=True))
    # weights, gradients and optimizer state are split 8 ways
    for item in ("weights", "gradients", "optimizer"):
        assert plan.items[item] == pytest.approx(one.items[item] / 8, rel=1e-6)


def test_lora_at_1024_by_4_fits_one_16gb_device_with_remat_and_says_so_without():
    fits = make_plan(gemma2b(method="lora", seq=1024, batch=4, dtype="bf16", remat=True))
    assert fits.fits, fits.render()
    tight = make_plan(gemma2b(method="lora", seq=1024, batch=4, dtype="bf16", remat=False))
    assert not tight.fits
    assert tight.suggestions[0]["change"].startswith("remat")  # the cheapest change first
    assert tight.suggestions[0]["peak_bytes_per_device"] == fits.peak_bytes_per_device


def test_remat_adafactor_qlora_and_chunking_each_shrink_their_item():
    base = gemma2b(method="full", seq=512, batch=4, dtype="bf16")
    p0 = make_plan(base)
    assert make_plan(PlanInputs(**{**base.__dict__, "remat": True})).items["activations"] < p0.items["activations"] / 5
    assert make_plan(PlanInputs(**{**base.__dict__, "optimizer": "adafactor"})).items["optimizer"] < p0.items["optimizer"] / 50
    lora = make_plan(PlanInputs(**{**base.__dict__, "method": "lora"}))
    qlora = make_plan(PlanInputs(**{**base.__dict__, "method": "lora", "weight_qtype": "nf4"}))
    assert qlora.items["weights"] < 0.5 * lora.items["weights"]
    plain = make_plan(PlanInputs(**{**base.__dict__, "method": "lora", "loss_impl": "plain"}))
    assert plain.items["loss_head"] > 2 * lora.items["loss_head"]  # [B, L, V] logits vs one chunk


def test_cli_json_is_one_object_with_the_contract_fields():
    res = CliRunner().invoke(app, ["plan", "--model", "gemma-2b", "--method", "full", "--seq", "64",
                                   "--batch", "1", "--device", "tpu-v5e", "--devices", "1", "--no-xla", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["fits"] is False
    assert isinstance(out["peak_bytes_per_device"], int) and isinstance(out["capacity_bytes"], int)
    assert set(out["items"]) == {"weights", "gradients", "optimizer", "activations", "loss_head", "workspace"}
    assert out["estimators"]["analytic"] == out["peak_bytes_per_device"]
    assert out["suggestions"] and all({"change", "peak_bytes_per_device", "fits"} <= set(s) for s in out["suggestions"])
    assert out["inputs"]["engine"] == "jax"  # auto picks JAX for a TPU


def test_cli_human_output_has_a_verdict_and_the_changes():
    res = CliRunner().invoke(app, ["plan", "--model", "gemma-2b", "--method", "full", "--seq", "64",
                                   "--batch", "1", "--device", "tpu-v5e", "--no-xla"])
    assert res.exit_code == 0, res.output
    assert "DOES NOT FIT" in res.output and "method=lora" in res.output
    ok = CliRunner().invoke(app, ["plan", "--model", "tiny-gemma3", "--seq", "64", "--batch", "2", "--device", "cpu"])
    assert ok.exit_code == 0 and "FITS" in ok.output and "DOES NOT" not in ok.output


@pytest.mark.parametrize("args, needle", [
    (["--device", "tpu-v9"], "unknown device"),
    (["--model", "gemma-9b"], "unknown model preset"),
    (["--method", "half"], "method must be one of"),
    (["--weight-qtype", "nf4", "--engine", "torch"], "JAX engine"),
    (["--devices", "2", "--engine", "jax", "--strategy", "ddp"], "--strategy ddp is for --engine torch"),
    (["--engine", "torch", "--no-donate"], "--no-donate is the JAX step's"),
    (["--strategy", "zero3"], "strategy must be one of"),
    (["--device", "tpu-v5e", "--engine", "torch", "--xla"], "--xla needs --engine jax"),
])
def test_bad_input_exits_2_with_the_reason(args, needle):
    res = CliRunner().invoke(app, ["plan", "--model", "tiny-gemma3", "--device", "cpu", *args])  # last wins
    # cli.main() maps BadInput to exit code 2; the runner hands us the exception itself
    assert isinstance(res.exception, BadInput) and res.exception.exit_code == 2, res.output
    assert needle in str(res.exception)


def test_plan_train_reads_the_train_config_for_both_engines():
    cfg = TrainConfig(model="gemma3-270m", dataset="x", method="full", batch_size=4, max_seq_len=256,
                      optimizer="adafactor", gradient_checkpointing=True, loss_chunk_bytes=64 * 2**20)
    torch_plan = plan_train(cfg, "cpu", 1)
    assert torch_plan.inputs.engine == "torch" and torch_plan.inputs.remat and torch_plan.fits
    assert torch_plan.inputs == PlanInputs(model="gemma3-270m", method="full", seq=256, batch=4,
                                           optimizer="adafactor", remat=True, loss_chunk_bytes=64 * 2**20)
    assert torch_plan.details["loss_chunk_tokens"] == 64  # 64 MiB of fp32 logits over 262,144 entries
    jax_plan = plan_train(TrainConfig(model="gemma-2b", dataset="x", method="full", dtype="bf16",
                                      batch_size=8, max_seq_len=512, engine="jax"), "tpu-v5e", 8)
    assert jax_plan.inputs.devices == 8 and jax_plan.inputs.engine == "jax"
    text = jax_plan.render()
    assert "gemma-2b full on 8 x tpu-v5e (jax)" in text
    # a capacity the engine read from the device overrides the table
    small = plan_train(cfg, "cpu", 1, capacity_bytes=3 * 10**9)
    assert small.capacity_bytes == 3 * 10**9 and not small.fits and small.suggestions


def test_a_model_directory_is_planned_from_its_manifest(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "tunix_rt_model.json").write_text(json.dumps({"preset": "gemma3-270m"}))
    by_dir = make_plan(PlanInputs(model=str(d)))
    assert by_dir.peak_bytes_per_device == make_plan(PlanInputs(model="gemma3-270m")).peak_bytes_per_device


def test_without_donation_the_real_oom_figure_is_reproduced():
    """The failed run of the system we replace: Gemma 2B full FT, Flax params in fp32,
    Adafactor, 1 x 64, one v5e chip: "Used 28.59G of 15.75G hbm". Its trainer (Tunix's
    PeftTrainer) donates the optimizer but not the model, so the step's new weights are
    written beside the old ones: one more fp32 copy of the model. Our engine donates both."""
    args = ["plan", "--model", "gemma-2b", "--method", "full", "--seq", "64", "--batch", "1",
            "--device", "tpu-v5e", "--dtype", "fp32", "--optimizer", "adafactor", "--no-xla", "--json"]
    donated, undonated = (json.loads(CliRunner().invoke(app, args + extra).output) for extra in ([], ["--no-donate"]))
    assert not donated["fits"] and not undonated["fits"]
    assert abs(undonated["peak_bytes_per_device"] / (28.59 * GiB) - 1) < 0.05  # measured 28.86 GiB: +0.9%
    weights = donated["items"]["weights"]
    assert weights == pytest.approx(get_preset("gemma-2b").param_count() * 4, rel=1e-6)
    assert undonated["items"]["weights"] == 2 * weights and undonated["details"]["undonated_copy"] == weights
    assert undonated["inputs"]["donate"] is False and donated["inputs"]["donate"] is True


# ----------------------------------------------------------------- torch ranks (torchrun)

#: tiny-gemma3 (2 layers, width 128, vocab 1024) by hand: a layer is attention 128x128 (q) +
#: 2 x 128x32 (k, v) + 128x128 (o) = 40,960, MLP 3 x 128x256 = 98,304, norms 4 x 128 + q/k
#: norms 2 x 32 = 576: 139,840; the tied embedding 1024 x 128 = 131,072; the final norm 128
LAYER, EMB, PARAMS = 139_840, 131_072, 2 * 139_840 + 131_072 + 128


def torch_ranks(**over) -> PlanInputs:
    base = dict(model="tiny-gemma3", method="full", seq=64, batch=8, device="a100-80gb", engine="torch",
                dtype="fp32", optimizer="adamw")
    return PlanInputs(**{**base, **over})


def test_ddp_ranks_are_replicas_with_gradient_buckets():
    one = make_plan(torch_ranks())
    ddp = make_plan(torch_ranks(devices=4, strategy="ddp"))
    assert get_preset("tiny-gemma3").param_count() == PARAMS
    assert ddp.items["weights"] == one.items["weights"] == PARAMS * 4
    assert ddp.items["gradients"] == PARAMS * 4 and ddp.items["optimizer"] == 2 * PARAMS * 4
    assert ddp.details["workspace_parts"]["ddp_buckets"] == PARAMS * 4  # a second copy of the gradients
    assert ddp.details["workspace_parts"]["fsdp_gather"] == 0
    # each rank runs batch / 4 sequences: the activations of a 2-sequence micro-batch
    assert ddp.items["activations"] == make_plan(torch_ranks(batch=2)).items["activations"]
    assert ddp.details["tokens_per_device"] == 2 * 64 and ddp.details["ranks"] == 4


def test_fsdp_ranks_hold_shards_plus_the_gathered_root_and_two_layers():
    fsdp = make_plan(torch_ranks(devices=4, strategy="fsdp"))
    assert fsdp.items["weights"] == PARAMS * 4 // 4
    assert fsdp.items["gradients"] == PARAMS * 4 // 4 and fsdp.items["optimizer"] == 2 * PARAMS * 4 // 4
    # the root (tied embedding) gathered from forward to backward, two layers in flight, one
    # layer's unsharded gradients before their reduce-scatter
    assert fsdp.details["workspace_parts"]["fsdp_gather"] == (EMB + 2 * LAYER) * 4 + LAYER * 4
    assert fsdp.details["workspace_parts"]["ddp_buckets"] == 0
    # foreach AdamW on a GPU: one temporary per tensor of this rank's shard
    assert fsdp.details["workspace_parts"]["optimizer_temporaries"] == PARAMS * 4 // 4
    lora = make_plan(torch_ranks(devices=4, method="lora", lora_rank=4))
    assert lora.inputs.strategy == "ddp"  # auto: replicas for LoRA, shards for full FT
    assert make_plan(torch_ranks(devices=4)).inputs.strategy == "fsdp"


def test_the_plan_suggests_the_rank_count_that_fits():
    """Gemma 2 2B full FT in bf16 (AdamW, 4 x 512) on 16 GB GPUs: no single GPU holds it, and
    FSDP over the fewest ranks that fit is suggested; the suggestion is that plan's peak."""
    base = dict(model="gemma2-2b", method="full", seq=512, batch=4, device="l4-24gb", engine="torch",
                dtype="bf16", remat=True)
    one = make_plan(PlanInputs(**base), capacity_bytes=16 * 10**9)
    assert not one.fits
    ranks = next(s for s in one.suggestions if s["change"].startswith("devices="))
    n = int(ranks["change"].split("=")[1].split()[0])
    assert ranks["change"] == f"devices={n} (fsdp)"
    fits = make_plan(PlanInputs(**base, devices=n, strategy="fsdp"), capacity_bytes=16 * 10**9)
    assert fits.fits and ranks["peak_bytes_per_device"] == fits.peak_bytes_per_device
    fewer = make_plan(PlanInputs(**base, devices=n // 2, strategy="fsdp"), capacity_bytes=16 * 10**9)
    assert not fewer.fits


def test_cli_plans_torch_ranks_with_the_json_contract():
    res = CliRunner().invoke(app, ["plan", "--model", "gemma2-2b", "--method", "full", "--seq", "512",
                                   "--batch", "4", "--device", "t4-16gb", "--engine", "torch", "--devices", "8",
                                   "--strategy", "fsdp", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert {"fits", "peak_bytes_per_device", "capacity_bytes", "items", "estimators", "suggestions"} <= set(out)
    assert set(out["estimators"]) == {"analytic"}  # XLA's estimate is the JAX engine's
    assert out["inputs"]["strategy"] == "fsdp" and out["details"]["shards"] == 8
    human = CliRunner().invoke(app, ["plan", "--model", "gemma2-2b", "--method", "full", "--device", "t4-16gb",
                                     "--engine", "torch", "--devices", "8"])
    assert "on 8 x t4-16gb (torch, fsdp)" in human.output
