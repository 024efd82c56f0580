"""Tree attention over shared-prefix rows (tunix_rt.train.tree_attention): the prefix causal,
each branch against the prefix and itself, as separate sdpa calls on the key/value heads as
they are. Its outputs and gradients equal sdpa under the dense additive mask
(loss.shared_prefix_masks with TUNIX_RT_SHARED_ATTENTION=dense) to fp32 rounding, with
grouped-query heads and with sliding windows that bind inside the prefix and the branches;
a layout it does not know keeps the dense mask; an engine's DPO step is the same either way."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from tunix_rt.train import tree_attention
from tunix_rt.train.data import collate_shared
from tunix_rt.train.loss import shared_prefix_masks
from test_preference import dpo_cfg, our_loss_and_grads, torch_setup
from train_testlib import one_torch_thread  # noqa: F401 (autouse fixture)


def _config(window):
    return types.SimpleNamespace(layer_types=["sliding_attention", "full_attention"], sliding_window=window)


def _batch():
    """Two rows: a 9-token prompt with branches of 7, 1 and 12 tokens, and a 4-token prompt with
    one branch of 5 (then padding to the first row's width)."""
    rows = [(list(range(1, 10)), [list(range(20, 27)), [30], list(range(40, 52))]),
            (list(range(60, 64)), [list(range(70, 75))])]
    b, _ = collate_shared(rows, 0)
    return torch.as_tensor(b.segments), torch.as_tensor(b.position_ids)


def _dense(q, k, v, mask, scale):
    rep = q.shape[1] // k.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                                           attn_mask=mask, scale=scale)
    return out.transpose(1, 2)


@pytest.mark.parametrize("kv", [1, 2, 4])
@pytest.mark.parametrize("window", [None, 6, 1000])
def test_tree_attention_is_the_dense_masks_attention(kv, window, monkeypatch):
    seg, pos = _batch()
    g = torch.Generator().manual_seed(kv * 10 + (window or 0))
    b, t = seg.shape
    q = torch.randn(b, 4, t, 16, generator=g, requires_grad=True)
    k = torch.randn(b, kv, t, 16, generator=g, requires_grad=True)
    v = torch.randn(b, kv, t, 16, generator=g, requires_grad=True)
    cfg = _config(window)
    tree = shared_prefix_masks(cfg, "sdpa", seg, pos, torch.float32)
    monkeypatch.setenv("TUNIX_RT_SHARED_ATTENTION", "dense")
    dense = shared_prefix_masks(cfg, "sdpa", seg, pos, torch.float32)
    assert all(isinstance(m, torch.Tensor) for m in dense.values())
    real = (seg >= 0)[:, :, None, None]  # padding: zero here, whatever the dense mask gives it
    up = torch.randn(b, t, 4, 16, generator=g) * real
    for kind in ("sliding_attention", "full_attention"):
        assert isinstance(tree[kind], tree_attention.TreeMask)
        got, none = tree_attention.attend(None, q, k, v, tree[kind], scaling=0.25)
        assert none is None and got.shape == (b, t, 4, 16)
        grads = torch.autograd.grad((got * up).sum(), (q, k, v))
        want = _dense(q, k, v, dense[kind], 0.25)
        wgrads = torch.autograd.grad((want * up).sum(), (q, k, v))
        torch.testing.assert_close(got * real, want * real, atol=2e-6, rtol=1e-5)
        assert torch.equal(got[~real.expand_as(got)], torch.zeros_like(got[~real.expand_as(got)]))
        for a, w in zip(grads, wgrads):
            torch.testing.assert_close(a, w, atol=1e-5, rtol=1e-5)
    if window == 6:  # the window binds: the sliding layers' attention differs from the full ones'
        s, _ = tree_attention.attend(None, q, k, v, tree["sliding_attention"], scaling=0.25)
        f, _ = tree_attention.attend(None, q, k, v, tree["full_attention"], scaling=0.25)
        assert (s - f).abs().max() > 1e-3


def test_an_unknown_layout_or_the_switch_keeps_the_dense_mask(monkeypatch):
    seg, pos = _batch()
    bad = seg.clone()
    bad[0, 8:16], bad[0, 16:18] = 2, 1  # the first two branches in the other order
    assert tree_attention.layout(bad, pos) is None
    assert all(isinstance(m, torch.Tensor) for m in shared_prefix_masks(_config(6), "sdpa", bad, pos, torch.float32).values())
    late = seg.clone()
    late[1, -1] = 1  # a branch token after the padding
    assert tree_attention.layout(late, pos) is None
    rows = tree_attention.layout(seg, pos)
    assert [(r.n, r.spans, r.end) for r in rows] == [(8, [(8, 16), (16, 18), (18, 31)], 31), (3, [(3, 9)], 9)]
    assert isinstance(shared_prefix_masks(types.SimpleNamespace(), "sdpa", seg, pos, torch.float32), torch.Tensor)
    assert isinstance(shared_prefix_masks(_config(6), "eager", seg, pos, torch.float32)["full_attention"], torch.Tensor)
    monkeypatch.setenv("TUNIX_RT_SHARED_ATTENTION", "sparse")
    with pytest.raises(ValueError, match="tree or dense"):
        shared_prefix_masks(_config(6), "sdpa", seg, pos, torch.float32)


def test_the_wrapped_sdpa_passes_other_masks_through():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    tree_attention.install()
    tree_attention.install()  # idempotent: one wrapper
    fn = ALL_ATTENTION_FUNCTIONS["sdpa"]
    assert fn.tunix_rt_tree and fn.__closure__ is not None
    inner = [c.cell_contents for c in fn.__closure__ if callable(c.cell_contents)][0]
    assert not getattr(inner, "tunix_rt_tree", False)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g) for _ in range(3))
    module = types.SimpleNamespace(is_causal=True)
    assert torch.equal(fn(module, q, k, v, None)[0], inner(module, q, k, v, None)[0])


def test_a_dpo_step_is_the_same_with_tree_and_dense_attention(home, tmp_path, monkeypatch):
    cfg = dpo_cfg(tmp_path, batch_size=4)
    runs = []
    for mode in ("tree", "dense"):
        monkeypatch.setenv("TUNIX_RT_SHARED_ATTENTION", mode)
        engine, method, _ = torch_setup(cfg, home)
        assert engine.shares_prefix()
        runs.append(our_loss_and_grads(engine, method, method.train_pairs[:4]))
    (loss, grads), (loss2, grads2) = runs
    assert loss.loss == pytest.approx(loss2.loss, abs=1e-6)
    assert grads.keys() == grads2.keys() and any(g.abs().sum() > 0 for g in grads.values())
    for name in grads:
        np.testing.assert_allclose(grads[name].numpy(), grads2[name].numpy(), atol=1e-6, rtol=1e-4, err_msg=name)
