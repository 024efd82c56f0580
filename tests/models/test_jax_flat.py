"""The JAX models' projections on merged leading axes (jax_loader.flatten_projections): XLA:CPU
transposes an operand of a dot that contracts two axes (B and T, the LoRA factors' gradients)
inside the elementwise op that makes it; on [B·T, D] inputs it does not. The values, the LoRA
factors' names and shapes and their gradients are those of Tunix's own modules."""

from __future__ import annotations

import numpy as np
import pytest
from requires import require_module

pytestmark = pytest.mark.jax

jax = require_module("jax")

NAMES = ("tiny-gemma3", "tiny-gemma2")


def test_flat_einsum_merges_the_batch_axis_into_the_next():
    from tunix_rt.models.jax_loader import flat_einsum

    assert flat_einsum("BTD,NDH->BTNH") == ("TD,NDH->TNH", 0)
    assert flat_einsum("BSD,CKDH->CBSKH") == ("SD,CKDH->CSKH", 1)
    assert flat_einsum("BTD,SNDH->SBTNH") == ("TD,SNDH->STNH", 1)
    assert flat_einsum("BTNH,NHD->BTD") == ("TNH,NHD->TD", 0)
    for eq in ("TD,DF->TF", "...TM,MD->...TD", "BTD,BD->BT", "BTD,DF->TBF", "TBD,DF->TBF"):
        assert flat_einsum(eq) is None, eq


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    from tunix_rt.models.catalog import get_preset
    from tunix_rt.models.tiny import build_tiny

    root = tmp_path_factory.mktemp("models")
    return {n: build_tiny(get_preset(n), root / n) for n in NAMES}


def _unflatten(model) -> int:
    """Put Tunix's own classes back on the flattened modules; how many there were."""
    n = 0
    for layer in model.layers:
        for mod in (layer.attn, layer.mlp):
            for child in vars(mod).values():
                if type(child).__name__ in ("FlatEinsum", "FlatLinear"):
                    child.__class__ = type(child).__bases__[0]
                    n += 1
    return n


@pytest.mark.parametrize("name", NAMES)
def test_flat_projections_keep_the_values_and_the_lora_factors(name, tiny_dirs):
    import jax.numpy as jnp
    from flax import nnx

    from tunix_rt.models.jax_loader import load_model, make_mesh
    from tunix_rt.train import jax_loss
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.jax_engine import apply_lora

    mesh = make_mesh()
    cfg = TrainConfig(dataset="x", lora_rank=4, lora_alpha=8.0, seed=3)
    with jax.set_mesh(mesh):
        models = []
        for flat in (True, False):
            model, tcfg = load_model(tiny_dirs[name], mesh)
            n = _unflatten(model) if not flat else 0
            if not flat:
                assert n >= 5 * len(model.layers), n  # q(kv) or qkv, o, gate, up, down
            models.append(apply_lora(model, cfg, tcfg))
        rng = np.random.default_rng(0)
        ids = rng.integers(3, 200, (3, 24)).astype(np.int32)
        ids[0, 15:] = 0
        mask = (ids != 0).astype(np.int32)
        inputs = jax_loss.model_inputs(jnp.asarray(ids), jnp.asarray(ids != 0),
                                       loss_weights=jnp.asarray(jax_loss.weights(mask, mask[:, 1:].sum())))
        loss_fn = jax_loss.make_loss_fn(8 * 1024 * 4)
        out = [nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, nnx.LoRAParam))(m, **inputs) for m in models]
    (l_flat, g_flat), (l_own, g_own) = out
    np.testing.assert_allclose(float(l_flat), float(l_own), rtol=1e-6)
    a, b = dict(nnx.to_flat_state(g_flat)), dict(nnx.to_flat_state(g_own))
    assert a.keys() == b.keys() and len(a) >= 2 * 5 * len(models[0].layers)
    for k in a:
        x, y = np.asarray(a[k].value), np.asarray(b[k].value)
        assert x.shape == y.shape, k
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6 * max(np.abs(y).max(), 1e-30))
    kinds = {type(m).__name__ for layer in models[0].layers for m in (*vars(layer.attn).values(),
                                                                      *vars(layer.mlp).values())}
    assert {"FlatEinsum", "FlatLinear"} <= kinds


def test_flattening_twice_changes_nothing(tiny_dirs):
    from tunix_rt.models.jax_loader import flatten_projections, load_model, make_mesh

    mesh = make_mesh()
    with jax.set_mesh(mesh):
        model, _ = load_model(tiny_dirs["tiny-gemma3"], mesh)
    before = [type(m) for layer in model.layers for m in (*vars(layer.attn).values(), *vars(layer.mlp).values())]
    flatten_projections(model)
    after = [type(m) for layer in model.layers for m in (*vars(layer.attn).values(), *vars(layer.mlp).values())]
    assert before == after and {c.__name__ for c in after} >= {"FlatEinsum", "FlatLinear"}
