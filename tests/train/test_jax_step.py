"""The JAX engine's own step (train.jax_engine, train.jax_loss), in this process:

- the chunked token objective (nll and the clipped policy objective with KL) and its
  gradient equal the full-logits reference to 1e-5, softcap and ragged chunks included;
- gradient accumulation 8 x 1 equals 1 x 8 (SFT, full fine-tuning; GRPO on the same rollouts);
- torch and JAX give the same policy loss and log-probabilities on the same rollouts (1e-4);
- GRPO through the driver on the JAX engine leaves a complete run with reward rows and
  committed checkpoints.
(That nothing in src/ touches a private name of tunix, qwix, flax or optax: tests/test_house.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from requires import require_module
import train_testlib  # noqa: E402
from train_testlib import write_traces  # noqa: E402

pytestmark = pytest.mark.jax

require_module("jax")

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def user_rewards_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


@pytest.mark.parametrize("kind", ["nll", "policy", "policy_on", "policy_kl"])
def test_chunked_objective_and_gradient_equal_the_full_logits_reference(kind):
    import jax
    import jax.numpy as jnp

    from tunix_rt.train.engine import Objective
    from tunix_rt.train.jax_loss import plain_objective, token_objective

    objective = {"nll": Objective(), "policy": Objective("policy", 0.2, 0.28),
                 "policy_on": Objective("policy", 0.2, 0.2, on_policy=True),
                 "policy_kl": Objective("policy", 0.2, 0.2, beta=0.1)}[kind]
    rng = np.random.default_rng(0)
    b, l, d, v = 3, 11, 16, 97
    h = jnp.asarray(rng.normal(size=(b, l, d)), jnp.float32)
    emb = jnp.asarray(rng.normal(size=(v, d)) * 0.3, jnp.float32)
    targets = jnp.asarray(rng.integers(0, v, size=(b, l)), jnp.int32)
    mask = jnp.asarray(rng.random((b, l)) < 0.6)
    coef = jnp.where(mask, jnp.asarray(rng.random((b, l)), jnp.float32), 0.0)
    aux = jnp.asarray(np.stack([rng.normal(size=(b, l)) - 3, rng.normal(size=(b, l)) - 3,
                                rng.normal(size=(b, l))], -1), jnp.float32)
    for softcap in (None, 5.0):
        def fused(h, emb):
            return token_objective(h, emb, targets, coef, mask, aux, 7, softcap, objective)[0]

        def plain(h, emb):
            return plain_objective(h, emb, targets, coef, mask, aux, softcap, objective)

        (lf, gf), (lp, gp) = (jax.value_and_grad(f, argnums=(0, 1))(h, emb) for f in (fused, plain))
        assert abs(float(lf) - float(lp)) < 1e-5 * max(1.0, abs(float(lp))), (kind, softcap)
        for a, r in zip(gf, gp):
            np.testing.assert_allclose(np.asarray(a), np.asarray(r), atol=1e-5, rtol=1e-5)
        assert float(jnp.abs(gf[0]).sum()) > 0


def _engine(home, cfg):
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.train.jax_engine import JaxEngine

    tok = load_tokenizer(cfg.model, home)
    engine = JaxEngine(cfg)
    engine.devices()
    engine.setup(ensure_model(cfg.model, home), tok)
    return engine, tok


def _flat(tree):
    from tunix_rt.train.jax_engine import flat

    return flat(tree)


def test_sft_accumulation_8x1_equals_1x8(home, tmp_path):
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.data import weighted
    from tunix_rt.train.engine import NLL
    from tunix_rt.train.sft import SFT

    out = []
    for batch, accum in ((8, 1), (1, 8)):
        cfg = TrainConfig(model="tiny-gemma3", dataset=write_traces(tmp_path / "t.jsonl", 16), split="all",
                          eval_split="all", eval_limit=2, batch_size=batch, grad_accum=accum, max_seq_len=128,
                          max_steps=1, finetune="full", engine="jax", device="cpu")
        engine, tok = _engine(home, cfg)
        sft = SFT(cfg, home, tok)
        loss, _, grads = engine.gradients(weighted([sft.stream.next_batch() for _ in range(accum)]), NLL)
        out.append((loss, _flat(grads)))
    assert len({len(e.ids) for e in sft.stream.examples}) > 3  # variable-length examples
    assert out[0][0] == pytest.approx(out[1][0], abs=1e-6)
    assert set(out[0][1]) == set(out[1][1]) and len(out[0][1]) > 10
    for name, g in out[0][1].items():
        np.testing.assert_allclose(out[1][1][name], g, atol=1e-6, rtol=0, err_msg=name)
    assert any(np.abs(g).sum() > 0 for g in out[0][1].values())


def rl_cfg(tmp_path, **over):
    return train_testlib.rl_cfg(tmp_path, **{"engine": "jax", **over})


def test_grpo_on_jax_is_complete_with_reward_rows_and_checkpoints(home, tmp_path):
    from tunix_rt.train import checkpoint
    from tunix_rt.train.driver import train
    from tunix_rt.train.metrics import read_jsonl

    run = train(rl_cfg(tmp_path), home)
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "succeeded" and manifest["summary"]["method"] == "grpo"
    assert manifest["identity"]["engine"] == "jax" if "identity" in manifest else True
    assert [p.name for p in checkpoint.committed(run)] == ["step-000002", "step-000004"]
    assert json.loads((run / "checkpoints/step-000004/state.json").read_text())["engine"] == "jax"
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for key in ("reward", "reward_rl_rewards:length_share", "reward_format", "rollout_accuracy",
                "zero_variance_share", "kl", "clip_fraction", "completion_tokens", "rollout_s", "update_s"):
        assert all(key in r for r in rows), key
    assert all(r["grad_norm"] > 0 for r in rows)
    assert any(r["kl"] > 0 for r in rows[1:])  # the policy moved away from the adapter-off reference
    assert (run / "final/adapter/adapter_model.safetensors").is_file()


def test_torch_and_jax_give_the_same_policy_loss_on_the_same_rollouts(home, tmp_path):
    """The rollouts of the torch engine, scored once; each engine computes the reference
    (adapter off) and the policy objective on them from the same initial weights (LoRA B = 0,
    so both start at the base model): log-probabilities and loss agree to 1e-4."""
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.train.grpo import GRPO
    from tunix_rt.train.torch_engine import TorchEngine

    cfg = rl_cfg(tmp_path, rl_loss="grpo", engine="torch")
    tok = load_tokenizer(cfg.model, home)
    t = TorchEngine(cfg)
    t.devices()
    t.setup(ensure_model(cfg.model, home), tok)
    method = GRPO(cfg, home, tok)
    groups, _ = method.rollouts(t, 0)
    batches = method.update_batches(groups)
    j, _ = _engine(home, rl_cfg(tmp_path, rl_loss="grpo"))
    t_loss = 0.0
    for b in batches:
        ref_t, ref_j = t.token_logprobs(b, adapter=False), j.token_logprobs(b, adapter=False)
        np.testing.assert_allclose(ref_j, ref_t, atol=1e-4, rtol=0)
        np.testing.assert_allclose(j.token_logprobs(b), t.token_logprobs(b), atol=1e-4, rtol=0)
        b.aux["ref_logp"] = ref_t
        b.aux["old_logp"] = t.token_logprobs(b)
        part, _ = t.objective_sum(b, method.objective)
        t_loss += float(part.detach())
    j_loss, stats, _ = j.gradients(batches, method.objective)
    assert abs(j_loss - t_loss) < 1e-4, (j_loss, t_loss)
    assert stats[3] == sum(int((b.labels != -100).sum()) for b in batches)  # every labelled token
    assert abs(t_loss) > 0 or any(np.abs(b.aux["adv"]).sum() > 0 for b in batches)
