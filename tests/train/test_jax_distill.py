"""Distillation on the JAX engine (train.jax_kd_loss):

- the chunked kernel and its gradient equal its full-logits reference and the torch kernel
  (train.kd_loss) to 1e-5, for each kd_loss, with temperature, NLL mix and softcap;
- the torch and JAX engines give the same loss and statistics on the same batches (1e-4);
- accumulation 8 x 1 equals 1 x 8 (full fine-tuning);
- `method=distill engine=jax` through the driver leaves a complete run with checkpoints, and a
  stopped one resumes to the bit (on-policy: tests/train/test_jax_methods.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from requires import require_module
from train_testlib import one_torch_thread, write_traces  # noqa: F401

pytestmark = pytest.mark.jax

require_module("jax")

SPECS = [(("forward_kl", 0.5, 1.0, 0.0), None), (("reverse_kl", 0.5, 0.7, 0.5), 30.0), (("jsd", 0.2, 2.0, 0.25), 30.0),
         (("jsd", 0.5, 1.0, 0.0), None)]


@pytest.mark.parametrize("spec,cap", SPECS)
def test_jax_kd_kernel_equals_its_reference_and_the_torch_kernel(spec, cap):
    import jax
    import jax.numpy as jnp

    from tunix_rt.train.distill import Distillation
    from tunix_rt.train.jax_kd_loss import kd_objective, plain_kd
    from tunix_rt.train.kd_loss import kd_objective as torch_kd

    rng = np.random.default_rng(0)
    b, n, d, dt, v = 2, 9, 16, 24, 300
    h, w = rng.standard_normal((b, n, d)).astype(np.float32), (rng.standard_normal((v, d)) * .5).astype(np.float32)
    ht, wt = rng.standard_normal((b, n, dt)).astype(np.float32), (rng.standard_normal((v, dt)) * .5).astype(np.float32)
    y = rng.integers(0, v, (b, n))
    mask = rng.random((b, n)) < 0.7
    coef = (mask / mask.sum()).astype(np.float32)
    args = tuple(jnp.asarray(x) for x in (ht, wt, y, coef, mask))

    def fused(a, e):
        return kd_objective(a, e, *args, spec, chunk=5, softcaps=(cap, cap))[0]

    def plain(a, e):
        return plain_kd(a, e, *args, spec, (cap, cap))

    (lf, gf), (lp, gp) = (jax.value_and_grad(f, argnums=(0, 1))(jnp.asarray(h), jnp.asarray(w)) for f in (fused, plain))
    assert float(lf) > 1e-3
    assert abs(float(lf) - float(lp)) < 1e-5 * max(1.0, abs(float(lp)))
    for a, r in zip(gf, gp):
        np.testing.assert_allclose(np.asarray(a), np.asarray(r), atol=1e-5, rtol=1e-5)
    th, tw = torch.tensor(h, requires_grad=True), torch.tensor(w, requires_grad=True)
    k = torch.tensor(mask)
    obj = Distillation(kd_loss=spec[0], kd_beta=spec[1], temperature=spec[2], alpha=spec[3])
    tl, _ = torch_kd(th[k], tw, torch.tensor(ht)[k], torch.tensor(wt), torch.tensor(y)[k], torch.tensor(coef)[k],
                     obj, chunk_bytes=5 * v * 4, softcaps=(cap, cap))
    tgh, tgw = torch.autograd.grad(tl, (th, tw))
    assert abs(float(lf) - float(tl.detach())) < 1e-5 * max(1.0, abs(float(lf)))
    np.testing.assert_allclose(np.asarray(gf[0]), tgh.numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(gf[1]), tgw.numpy(), atol=1e-5, rtol=1e-5)


@pytest.fixture
def teacher_dir(tmp_path):
    from tunix_rt.models.catalog import get_preset
    from tunix_rt.models.tiny import build_tiny

    return build_tiny(get_preset("tiny-gemma3"), tmp_path / "teacher", seed=1)


def _cfg(tmp_path, teacher, **over):
    from tunix_rt.train.config import TrainConfig

    base = dict(model="tiny-gemma3", dataset=write_traces(tmp_path / "traces.jsonl", 16), split="all",
                eval_split="all", eval_limit=2, system_prompt="Be brief.", method="distill", teacher=str(teacher),
                kd_loss="jsd", kd_temperature=2.0, kd_alpha=0.1, batch_size=2, max_seq_len=96, max_steps=2,
                lr=1e-2, warmup_steps=0, save_interval=1, log_interval=1, device="cpu", engine="jax")
    base.update(over)
    return TrainConfig(**base)


def _setup(engine_cls, cfg, home):
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.train.distill import Distill

    tok = load_tokenizer(cfg.model, home)
    engine = engine_cls(cfg)
    engine.devices()
    engine.setup(ensure_model(cfg.model, home), tok)
    return engine, Distill(cfg, home, tok), tok


def test_torch_and_jax_distill_the_same_and_accumulation_8x1_equals_1x8(home, tmp_path, teacher_dir):
    """Full fine-tuning from the same weights: the same loss and KL statistics from both
    engines on the same batches (1e-4); on JAX, 8 micro-batches of 1 give the 1 x 8 gradient."""
    from tunix_rt.train.data import weighted
    from tunix_rt.train.jax_engine import JaxEngine, flat
    from tunix_rt.train.torch_engine import TorchEngine

    out = []
    for batch, accum in ((8, 1), (1, 8)):
        cfg = _cfg(tmp_path, teacher_dir, batch_size=batch, grad_accum=accum, finetune="full")
        engine, method, _ = _setup(JaxEngine, cfg, home)
        batches = weighted([method.stream.next_batch() for _ in range(accum)])
        loss, stats, grads = engine.gradients(batches, method.teacher_objective(engine))
        out.append((loss, stats, flat(grads), batches))
    assert out[0][0] == pytest.approx(out[1][0], abs=1e-6) and out[0][0] > 1e-4
    for name, g in out[0][2].items():
        np.testing.assert_allclose(out[1][2][name], g, atol=1e-6, rtol=0, err_msg=name)
    t, tm, _ = _setup(TorchEngine, _cfg(tmp_path, teacher_dir, batch_size=8, finetune="full", engine="torch"), home)
    t_loss, t_stats = t.objective_sum(out[0][3][0], tm.teacher_objective(t))
    assert abs(float(t_loss.detach()) - out[0][0]) < 1e-4
    np.testing.assert_allclose(out[0][1], t_stats.numpy(), rtol=1e-4, atol=1e-4)
