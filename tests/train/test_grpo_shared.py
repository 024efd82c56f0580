"""A GRPO group's prompt written once for its G completions (data.collate_shared, the torch
engine's shared-prefix masks): the same per-token log-probabilities, loss and gradient as
one prompt + completion row per sample, on Gemma 3 and Gemma 2 (sliding windows of 16
tokens, so the sliding masks are exercised), with the fused and the plain loss, with and
without recomputation, and with micro-batches that split a group."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import train_testlib
from train_testlib import one_torch_thread, write_traces  # noqa: F401 (autouse fixture)
from tunix_rt.train.data import IGNORE, collate_shared


@pytest.fixture(autouse=True)
def user_rewards_importable(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))


def test_collate_shared_layout():
    b, starts = collate_shared([([5, 6, 7], [[8, 9], [10]]), ([3, 4], [[]])], pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9, 7, 10], [3, 4, 0, 0, 0, 0, 0]]
    assert b.position_ids[0].tolist() == [0, 1, 2, 3, 4, 2, 3]  # each branch continues the prompt
    assert b.segments.tolist() == [[0, 0, 1, 1, 1, 2, 2], [0, 1, -1, -1, -1, -1, -1]]
    assert b.labels[0].tolist() == [IGNORE, IGNORE, 8, 9, IGNORE, 10, IGNORE]
    assert (b.labels[1] == IGNORE).all()  # an empty completion has nothing to predict
    assert starts == [[2, 5], [1]]
    assert b.n_tokens == 9 and b.n_supervised == 3


def _update(engine, method, groups, shared: bool):
    """Per-token log-probs (the policy's and the adapter-off reference's, in sequence order),
    the summed objective and the gradients of one update over every micro-batch."""
    batches = method.update_batches(groups, shared=shared)
    lps, refs, loss = [], [], 0.0
    for b in batches:
        assert (b.segments is not None) == shared
        on = np.asarray(b.labels) != IGNORE
        b.aux["ref_logp"] = engine.token_logprobs(b, adapter=False)
        b.aux["old_logp"] = engine.token_logprobs(b)
        lps.append(b.aux["old_logp"][on])
        refs.append(b.aux["ref_logp"][on])
        part, _ = engine.objective_sum(b, method.objective)
        part.backward()
        loss += float(part.detach())
    grads = {n: p.grad.clone() for n, p in engine.trainable.items()}
    engine.optimizer.zero_grad(set_to_none=True)
    return (np.concatenate(lps), np.concatenate(refs), loss, grads,
            sum(b.n_tokens for b in batches), sum(b.input_ids.size for b in batches))


@pytest.mark.parametrize("model,loss_impl,remat", [
    ("tiny-gemma3", "chunked", False), ("tiny-gemma3", "plain", False), ("tiny-gemma3", "chunked", True),
    ("tiny-gemma2", "chunked", False), ("tiny-gemma2", "plain", True),
])
def test_shared_prompt_rows_equal_one_row_per_sample(home, tmp_path, model, loss_impl, remat):
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.train.grpo import GRPO
    from tunix_rt.train.torch_engine import TorchEngine

    # batch 3 with G = 4: micro-batches of 3, 3, 2 sequences, the second holding two groups;
    # 24 new tokens: completions past the 16-token sliding window of the tiny models;
    # mu = 2: the clipped ratio against old log-probs, as an off-policy update sees it.
    cfg = train_testlib.rl_cfg(tmp_path, model=model, engine="torch", lora_dropout=0.0, batch_size=3,
                               loss_impl=loss_impl, gradient_checkpointing=remat, rollout_max_new_tokens=24,
                               mu=2, beta=0.1, rollout_temperature=1.5)
    tok = load_tokenizer(cfg.model, home)
    engine, method = TorchEngine(cfg), GRPO(cfg, home, tok)
    engine.devices()
    engine.setup(ensure_model(cfg.model, home), tok)
    assert engine.shares_prefix()
    # a LoRA that is not zero, so the adapter-off reference differs from the policy
    with torch.no_grad():
        for name, p in engine.trainable.items():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    groups, _ = method.rollouts(engine, 0)
    assert max(len(c.ids) for g in groups for c in g.completions) > 16
    flat = _update(engine, method, groups, shared=False)
    shared = _update(engine, method, groups, shared=True)
    assert flat[0].shape == shared[0].shape == (sum(len(c.ids) for g in groups for c in g.completions),)
    assert np.abs(flat[0] - flat[1]).max() > 1e-3  # the reference is another model
    np.testing.assert_allclose(shared[0], flat[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(shared[1], flat[1], atol=1e-5, rtol=0)
    assert shared[2] == pytest.approx(flat[2], abs=1e-5)
    assert any(g.abs().sum() > 0 for g in flat[3].values())
    for name, g in flat[3].items():
        torch.testing.assert_close(shared[3][name], g, atol=1e-5, rtol=1e-4, msg=name)
    assert shared[4] < flat[4] and shared[5] < flat[5]  # fewer tokens, smaller arrays


def test_the_jax_engine_refuses_shared_rows(tmp_path):
    from tunix_rt.train.jax_engine import JaxEngine

    engine = JaxEngine(train_testlib.rl_cfg(tmp_path, engine="jax"))
    assert engine.shares_prefix() is False
    b, _ = collate_shared([([1, 2], [[3]])], pad_id=0)
    with pytest.raises(ValueError, match="shared-prefix"):
        engine._device_batch(b)
