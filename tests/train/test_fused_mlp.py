"""The fused Gemma MLP (train.fused_mlp): the torch engine's models get it, it gives the same
loss and gradients as transformers' own forward (to the bit on torch's ops, to fp32 rounding
through train.cpu_kernels), and it keeps one [tokens, intermediate] tensor fewer for backward."""

from __future__ import annotations

import pytest
import torch

from tunix_rt.train import cpu_kernels
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.data import collate, weighted
from tunix_rt.train.fused_mlp import GATED_GELU_MLPS, GeluTanhMul, fuse_gated_mlps
from test_torch_loss import _engine, _examples, _loss_and_grads
from train_testlib import one_torch_thread  # noqa: E402,F401 (autouse fixture)


def _mlps(model):
    return [m for m in model.modules() if type(m).__name__ in GATED_GELU_MLPS]


def fused_and_plain(home, tiny_tok, preset, finetune, kinds):
    """The engine's (loss, gradients) on a batch, then again with transformers' own forward for
    every module whose class is in `kinds` (the engine's patch deleted); and those modules."""
    from tunix_rt.models.store import ensure_model

    cfg = TrainConfig(model=preset, dataset="unused.jsonl", finetune=finetune, device="cpu")
    engine = _engine(cfg, ensure_model(preset, home), tiny_tok)
    mods = [m for m in engine.model.modules() if type(m).__name__ in kinds]
    assert mods and all("forward" in m.__dict__ for m in mods)  # the engine patched them
    batch = weighted([collate([[ex] for ex in _examples(tiny_tok)], tiny_tok.pad_id)])[0]
    fused = _loss_and_grads(engine, batch)
    for m in mods:
        del m.forward  # transformers' forward again
    plain = _loss_and_grads(engine, batch)
    assert fused[1].keys() == plain[1].keys() and len(fused[1]) > 0
    return fused, plain, engine, mods


def _fused_and_plain(home, tiny_tok, preset, finetune):
    fused, plain, engine, mlps = fused_and_plain(home, tiny_tok, preset, finetune, GATED_GELU_MLPS)
    layers = engine.module.base().config.num_hidden_layers
    assert len(mlps) == layers and fuse_gated_mlps(engine.model) == layers
    return fused, plain


@pytest.mark.parametrize("preset", ["tiny-gemma3", "tiny-gemma2"])
@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_fused_mlp_equals_transformers_forward_to_the_bit(home, tiny_tok, preset, finetune, monkeypatch):
    monkeypatch.setenv(cpu_kernels.ENV, "torch")  # torch's ops: the two ops' bits
    fused, plain = _fused_and_plain(home, tiny_tok, preset, finetune)
    assert fused[0] == plain[0]
    for name in plain[1]:
        assert torch.equal(fused[1][name], plain[1][name]), name


@pytest.mark.parametrize("preset", ["tiny-gemma3", "tiny-gemma2"])
def test_fused_mlp_in_the_cpu_library_equals_transformers_forward_to_rounding(home, tiny_tok, preset):
    assert cpu_kernels.library() is not None, cpu_kernels.WHY
    fused, plain = _fused_and_plain(home, tiny_tok, preset, "full")
    assert fused[0] == pytest.approx(plain[0], rel=1e-6)
    differ = 0
    for name in plain[1]:
        torch.testing.assert_close(fused[1][name], plain[1][name], rtol=1e-4, atol=1e-6, msg=name)
        differ += not torch.equal(fused[1][name], plain[1][name])
    assert differ  # the library ran: its bits are not torch's


def test_fused_mlp_keeps_one_tensor_fewer(home):
    """Bytes autograd keeps for one Gemma 3 MLP's backward (its weights aside): gate, up and
    the product (down_proj's input) fused, gelu(gate) as well unfused."""
    from tunix_rt.models.hf import load_causal_lm
    from tunix_rt.models.store import ensure_model

    model = load_causal_lm(ensure_model("tiny-gemma3", home))
    mlp = _mlps(model)[0]
    mlp.requires_grad_(True)
    weights = {p.untyped_storage().data_ptr() for p in mlp.parameters()}
    x = torch.randn(3, 5, model.config.hidden_size, requires_grad=True)

    def saved_bytes() -> int:
        kept: dict[int, int] = {}

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in weights and ptr != x.untyped_storage().data_ptr():
                kept[ptr] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            mlp(x).sum().backward()
        return sum(kept.values())

    one = 3 * 5 * model.config.intermediate_size * 4  # one [3, 5, intermediate] fp32 tensor
    unfused = saved_bytes()
    assert fuse_gated_mlps(model) == model.config.num_hidden_layers
    assert saved_bytes() == unfused - one == 3 * one


def test_gelu_tanh_mul_gradient_in_fp64():
    torch.manual_seed(0)
    gate = torch.randn(4, 7, dtype=torch.float64, requires_grad=True) * 3
    up = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    gate.retain_grad()
    assert torch.autograd.gradcheck(GeluTanhMul.apply, (gate.detach().requires_grad_(), up))
    only_up = GeluTanhMul.apply(gate.detach(), up)  # no gradient asked for gate
    (g,) = torch.autograd.grad(only_up.sum(), up)
    torch.testing.assert_close(g, torch.nn.functional.gelu(gate.detach(), approximate="tanh"))
