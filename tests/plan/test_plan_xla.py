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
    (measured xla/analytic 0.90) and 15% on real sizes (below)."""
    plan, analytic, xla, _ = both(model="tiny-gemma3", method="lora", seq=64, batch=4, devices=2)
    assert plan.details["xla"]["devices"] == 2
    assert plan.details["xla"]["argument_bytes"] > 0 and plan.details["xla"]["temp_bytes"] > 0
    assert abs(xla / analytic - 1) < 0.20


@pytest.mark.slow
def test_gemma3_270m_full_on_one_device_agrees_within_15_percent():
    _, analytic, xla, _ = both(model="gemma3-270m", method="full", seq=256, batch=4, devices=1,
                               loss_chunk_tokens=256)
    assert abs(xla / analytic - 1) < 0.15  # measured 1.015-1.058 (XLA's CPU schedule varies)


@pytest.mark.slow
def test_headline_gemma_2b_full_fsdp_over_eight_v5e_fits_and_estimators_agree():
    """Gemma 2B, full fine-tune, AdamW, bf16, remat, seq 512, global batch 8 over a v5e-8:
    both estimators under the chip's 15.75 GiB and within 15% of each other (measured:
    analytic 9.35 GiB, XLA 9.50-9.68 GiB). XLA's figure is the real step compiled for 8 fake
    devices: 63 s (compile 52 s) on 2 cores, 125-135 s when they were shared with other work."""
    plan, analytic, xla, took = both(model="gemma-2b", method="full", seq=512, batch=8, devices=8,
                                     dtype="bf16", remat=True)
    assert plan.fits and xla < plan.capacity_bytes
    assert abs(xla / analytic - 1) < 0.15
    assert took < 300
