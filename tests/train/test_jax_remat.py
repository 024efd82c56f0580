"""Gradient checkpointing in the JAX engine (tunix_rt.models.jax_remat): the same loss and
LoRA gradients as without it, through our loss and through Tunix's default forward, and it
really lowers the compiled train step's memory on CPU (Tunix's own remat does not there:
XLA:CPU hoists the recomputation back into the forward pass)."""

from __future__ import annotations

import numpy as np
import pytest
from requires import require_module

pytestmark = pytest.mark.jax

jax = require_module("jax")

NAMES = ("tiny-gemma3", "tiny-gemma2")


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    from tunix_rt.models.catalog import get_preset
    from tunix_rt.models.tiny import build_tiny

    root = tmp_path_factory.mktemp("models")
    return {n: build_tiny(get_preset(n), root / n) for n in NAMES}


def _lora_model(model_dir, mesh, remat: bool):
    from tunix_rt.models.jax_loader import load_model
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.jax_engine import apply_lora

    model, tcfg = load_model(model_dir, mesh, remat=remat)
    cfg = TrainConfig(dataset="x", lora_rank=4, lora_alpha=8.0, seed=3)
    return apply_lora(model, cfg, tcfg)


def _inputs(batch: int, seq: int, vocab: int):
    import jax.numpy as jnp

    from tunix_rt.train import jax_loss

    rng = np.random.default_rng(0)
    ids = rng.integers(3, vocab, (batch, seq)).astype(np.int32)
    ids[0, seq // 2:] = 0  # some padding
    mask = (ids != 0).astype(np.int32)
    w = jax_loss.weights(mask, mask[:, 1:].sum())
    return jax_loss.model_inputs(jnp.asarray(ids), jnp.asarray(ids != 0), loss_weights=jnp.asarray(w))


def _lora_grads(model, inputs, loss_fn):
    from flax import nnx

    return nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, nnx.LoRAParam))(model, **inputs)


def _tunix_default_loss(model, input_tokens, input_mask, positions, attention_mask, loss_weights):
    """What Tunix's default loss does: the model's plain forward (full logits)."""
    import jax.numpy as jnp

    del input_mask
    logits, _ = model(input_tokens, positions, None, attention_mask)
    logp = jax.nn.log_softmax(logits, axis=-1)
    targets = jnp.concatenate([input_tokens[:, 1:], jnp.zeros_like(input_tokens[:, :1])], axis=1)
    return -jnp.sum(jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0] * loss_weights)


@pytest.mark.parametrize("name", NAMES)
def test_remat_gives_the_same_loss_and_lora_gradients(name, tiny_dirs):
    from flax import nnx

    from tunix_rt.models.jax_loader import make_mesh, remat_on
    from tunix_rt.train.jax_loss import make_loss_fn

    mesh = make_mesh()
    with jax.set_mesh(mesh):
        plain, remat = (_lora_model(tiny_dirs[name], mesh, r) for r in (False, True))
        assert remat_on(remat) and not remat_on(plain)
        inputs = _inputs(2, 40, 200)
        for loss_fn in (make_loss_fn(16 * 1024 * 4), _tunix_default_loss):  # 16-token chunks
            (l0, g0), (l1, g1) = (_lora_grads(m, inputs, loss_fn) for m in (plain, remat))
            np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
            flat0, flat1 = (dict(nnx.to_flat_state(g)) for g in (g0, g1))
            assert flat0.keys() == flat1.keys() and len(flat0) > 0
            for k in flat0:
                a, b = np.asarray(flat0[k].value), np.asarray(flat1[k].value)
                np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6 * np.abs(a).max())


def _temp_bytes(model, inputs, loss_fn) -> int:
    from flax import nnx

    graphdef, state = nnx.split(model)

    def step(state, inputs):
        m = nnx.merge(graphdef, state)
        return _lora_grads(m, inputs, loss_fn)

    return jax.jit(step).lower(state, inputs).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("name", ["tiny-gemma3"])
def test_remat_lowers_the_compiled_step_memory_on_cpu(name, tiny_dirs):
    """Activations dominate at 8 x 256 tokens on the tiny model: with remat the step's XLA
    temp buffer must shrink by more than a third, through our loss and through the plain
    forward (both went through Tunix's remat before, and neither shrank on CPU)."""
    from tunix_rt.models.jax_loader import make_mesh
    from tunix_rt.train.jax_loss import make_loss_fn

    mesh = make_mesh()
    with jax.set_mesh(mesh):
        plain, remat = (_lora_model(tiny_dirs[name], mesh, r) for r in (False, True))
        inputs = _inputs(8, 256, 200)
        for loss_fn in (make_loss_fn(256 * 1024 * 4), _tunix_default_loss):  # 256-token chunks
            before, after = (_temp_bytes(m, inputs, loss_fn) for m in (plain, remat))
            assert after < 0.66 * before, (loss_fn, before, after)


def test_the_recomputation_does_not_share_the_weights_layout_copies(tmp_path):
    """XLA:CPU copies a weight into the layout its product wants (q's [N, D, H] as [N·H, D],
    o's transposed for the backward). Without the tie on the layer's weights too, the
    recomputation's copies were the forward's, computed once and alive through the whole
    step: every layer's copies at once (0.29 GB of Gemma 3 270M's 0.62 GB temp buffer). At
    one row of 8 tokens on 8 layers the activations are small, so the step's temp buffer
    must stay under the embedding plus two layers' weights (one layer's tied copy and its
    layout copies); with the shared copies it held 2.34 MB against this bound's 1.70."""
    import dataclasses

    from flax import nnx

    from tunix_rt.models.catalog import get_preset
    from tunix_rt.models.jax_loader import make_mesh
    from tunix_rt.models.tiny import build_tiny
    from tunix_rt.train.jax_loss import make_loss_fn

    p = get_preset("tiny-gemma3")
    hf = dict(p.hf_config, num_hidden_layers=8, layer_types=["sliding_attention", "full_attention"] * 4)
    model_dir = build_tiny(dataclasses.replace(p, hf_config=hf), tmp_path / "tiny8")
    mesh = make_mesh()
    with jax.set_mesh(mesh):
        model = _lora_model(model_dir, mesh, True)
        layers = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model.layers, nnx.Param)))
        emb = model.embedder.input_embedding[...].nbytes
        temp = _temp_bytes(model, _inputs(1, 8, 200), make_loss_fn(256 * 1024 * 4))
    assert len(model.layers) == 8
    assert temp < emb + 2 * layers / 8, (temp, emb, layers)


def test_apply_lora_does_not_run_the_vocabulary_head(tiny_dirs, monkeypatch):
    """qwix makes the LoRA factors in one eager call of the model: through the head that call
    held the [V, D] embedding's transposed copy and its executables (the load's peak RSS on
    Gemma 3 270M 2.15 GiB; 1.52 with the call stopping at the hidden states)."""
    from tunix_rt.models.jax_loader import load_model, make_mesh
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.jax_engine import apply_lora

    mesh = make_mesh()
    with jax.set_mesh(mesh):
        for name in NAMES:
            model, tcfg = load_model(tiny_dirs[name], mesh)
            cls = type(model.embedder)
            calls, decode = [], cls.decode
            monkeypatch.setattr(cls, "decode", lambda self, x: calls.append(1) or decode(self, x))
            lora = apply_lora(model, TrainConfig(dataset="x", lora_rank=4, lora_alpha=8.0), tcfg)
            assert calls == [], name
            ids = jax.numpy.ones((1, 4), jax.numpy.int32)
            pos = jax.numpy.arange(4)[None]
            logits, _ = lora(ids, pos, None, jax.numpy.tril(jax.numpy.ones((1, 4, 4), bool)))
            assert calls == [1] and logits.shape[-1] == model.embedder.input_embedding[...].shape[0], name
            monkeypatch.undo()
