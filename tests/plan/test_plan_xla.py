"""The two estimators check each other: XLA's compiled memory analysis of the JAX engine's
real train step (abstract shapes, fake CPU devices, in a subprocess) against the analytic
plan. Each case compiles a whole train step: tens of seconds on 2 shared cores."""

from __future__ import annotations

import time

import pytest

from tunix_rt.plan import GiB, PlanInputs, make_plan

pytestmark = pytest.mark.jax


def both(**kw):
    t0 = time.perf_counter()
    plan = make_plan(PlanInputs(engine="jax", device="tpu-v5e", **kw), xla=True)
    took = time.perf_counter() - t0
    analytic, xla = plan.estimators["analytic"], plan.estimators["xla"]
    print(f"\n{kw}: analytic {analytic / GiB:.3f} GiB, xla {xla / GiB:.3f} GiB, "
          f"xla/analytic {xla / analytic:.3f}, {took:.0f} s (compile {plan.details['xla']['compile_s']} s)")
    return plan, analytic, xla, took


def test_tiny_lora_on_two_fake_devices_agrees():
    """Tiny shapes (2 layers, width 128, vocab 1024): a few MiB, where XLA's per-buffer
    alignment and the analytic's one-layer backward allowance weigh most; 20% holds here
    (measured xla/analytic 0.82: the analytic counts three chunk blocks where XLA holds one
    or two) and 15% on real sizes (below)."""
    plan, analytic, xla, _ = both(model="tiny-gemma3", method="lora", seq=64, batch=4, devices=2)
    assert plan.details["xla"]["devices"] == 2 and plan.details["xla"]["compiled_dtype"] == "f32"
    assert plan.details["xla"]["argument_bytes"] > 0 and plan.details["xla"]["temp_bytes"] > 0
    assert abs(xla / analytic - 1) < 0.20
    phases = plan.details["xla"]["phases"]  # the engine's two jitted calls, each compiled
    assert set(phases) == {"gradient", "update"} and xla == max(p["peak_bytes_per_device"] for p in phases.values())


def test_the_xla_step_donates_the_model_only_when_asked():
    """--no-donate compiles Tunix's PeftTrainer step (only the optimizer donated): the new
    model state no longer aliases the old, by exactly the weights' bytes. The analytic plan
    then counts both copies (the failed v5e run held them: 28.59 GiB). XLA:CPU does not grow
    by as much: it computes each new weight into its output buffer where the gradient's
    temporary was (measured: tiny +0 B; Gemma 2B fp32 Adafactor 18.81 -> 20.77 GiB, the
    tied embedding's copy), a reuse the TPU compile of that failed run did not make."""
    kw = dict(model="tiny-gemma3", method="full", seq=64, batch=2, devices=1)
    (d, a_d, x_d, _), (u, a_u, x_u, _) = both(**kw), both(**kw, donate=False)
    weights = d.items["weights"]
    assert d.details["xla"]["alias_bytes"] - u.details["xla"]["alias_bytes"] == weights
    assert a_u - a_d == pytest.approx(weights * 1.03, rel=1e-3)  # the copy and its allocator slack
    assert x_u >= 0.99 * x_d


@pytest.mark.slow
def test_gemma3_270m_full_on_one_device_agrees_within_15_percent():
    _, analytic, xla, _ = both(model="gemma3-270m", method="full", seq=256, batch=4, devices=1)
    assert abs(xla / analytic - 1) < 0.15  # measured 1.015-1.058 (XLA's CPU schedule varies); 1.067 with the engine's own two calls


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.parametrize("remat", [True, False])
def test_headline_gemma_2b_full_fsdp_over_eight_v5e_fits_and_estimators_agree(remat):
    """Gemma 2B, full fine-tune, AdamW, bf16, seq 512, global batch 8 over a v5e-8 (the
    README's headline): both estimators under the chip's 15.75 GiB and within 15% of each
    other, with remat (measured: analytic 8.64 GiB, XLA 9.39) and without (10.12, 9.41).
    Without remat the bf16 step used to compile to 14.42 GiB: XLA:CPU's f32 copies of bf16
    dot operands (plan.xla._sixteen_bit), which a TPU does not make. XLA's figure is the real
    step compiled for 8 fake devices: 63 s on 2 idle cores, 125-135 s shared, 320-340 s on a
    machine loaded 7x."""
    plan, analytic, xla, took = both(model="gemma-2b", method="full", seq=512, batch=8, devices=8,
                                     dtype="bf16", remat=remat)
    assert plan.fits and xla < plan.capacity_bytes
    assert plan.details["xla"]["compiled_dtype"] == "f16"
    assert abs(xla / analytic - 1) < 0.15
    assert took < 420


def test_rl_step_xla_compiles_the_update_and_keeps_the_analytic_rollout():
    """An RL plan asks XLA for its update (the P x G = 8 rollout sequences in 2 micro-batches
    of 4: optax.MultiSteps' accumulation compiled in); the rollout phase has no compiled
    figure, so XLA's estimate is the larger of its update and the analytic rollout."""
    plan, analytic, xla, _ = both(model="tiny-gemma3", method="lora", seq=64, batch=4, devices=2,
                                  rl_prompts=2, group_size=4, rollout_tokens=16)
    assert plan.details["xla"]["devices"] == 2 and plan.details["update_micro_batches"] == 2
    update_xla = plan.details["xla"]["peak_bytes_per_device"] + plan.items["rl_aux"]
    assert xla == max(update_xla, plan.details["phases"]["rollout"])
    assert abs(update_xla / plan.details["phases"]["update"] - 1) < 0.20
