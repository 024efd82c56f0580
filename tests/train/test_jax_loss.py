"""The chunked loss equals the plain reference (full logits + log_softmax) on the tiny
models, in value and in gradient, and it covers the model turn only."""

from __future__ import annotations

import numpy as np
import pytest
from requires import require_module

pytestmark = pytest.mark.jax

jax = require_module("jax")


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    from tunix_rt.models.catalog import get_preset
    from tunix_rt.models.tiny import build_tiny

    root = tmp_path_factory.mktemp("models")
    return {n: build_tiny(get_preset(n), root / n) for n in ("tiny-gemma2",)}


def _batch(tok, n=3, seq=48):
    """Real rendered examples (prompt masked out), right-padded."""
    from tunix_rt.render import render_example

    rows = [render_example(f"x{i}", f"What is {i} plus {i}?", [f"{i} + {i} = {2 * i}"], str(2 * i), tok,
                           system_prompt="Think.") for i in range(n)]
    ids = np.zeros((n, seq), np.int32)
    mask = np.zeros((n, seq), np.int32)
    for i, r in enumerate(rows):
        ids[i, : len(r.ids)] = r.ids[:seq]
        mask[i, : len(r.ids)] = r.loss_mask[:seq]
    return ids, mask


@pytest.mark.parametrize("name", ["tiny-gemma2"])  # softcap + GQA; Gemma 3 is in test_cross_engine
def test_chunked_equals_plain(name, tiny_dirs, tiny_tok):
    import jax.numpy as jnp
    from flax import nnx

    from tunix_rt.models.jax_loader import load_model, make_mesh
    from tunix_rt.train import jax_loss

    ids, lmask = _batch(tiny_tok)
    assert lmask.sum() > 0 and lmask[:, :5].sum() == 0  # the prompt is not supervised
    mesh = make_mesh()
    model, _ = load_model(tiny_dirs[name], mesh)
    w = jax_loss.weights(lmask, lmask[:, 1:].sum())
    inputs = jax_loss.model_inputs(jnp.asarray(ids), jnp.asarray(ids != 0), loss_weights=jnp.asarray(w))

    def loss(impl, chunk=7):
        fn = jax_loss.make_loss_fn(chunk * 4 * model.embedder.input_embedding.shape[0], impl)
        return nnx.value_and_grad(fn)(model, **inputs)

    with jax.set_mesh(mesh):
        ref, gref = loss("plain")
        got, gget = loss("chunked")
        # independent reference: the model's own logits, sliced the textbook way
        logits, _ = model(inputs["input_tokens"], inputs["positions"], None, inputs["attention_mask"])
    logp = jax.nn.log_softmax(np.asarray(logits)[:, :-1], axis=-1)
    tgt = np.take_along_axis(np.asarray(logp), ids[:, 1:, None], axis=-1)[..., 0]
    textbook = -(tgt * lmask[:, 1:]).sum() / lmask[:, 1:].sum()
    assert abs(float(ref) - textbook) < 1e-5
    assert abs(float(got) - float(ref)) < 1e-5
    for a, b in zip(jax.tree.leaves(gget), jax.tree.leaves(gref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_chunk_padding_and_weights():
    """Chunks that do not divide the token count and zero-weight tokens change nothing."""
    import jax.numpy as jnp

    from tunix_rt.train.jax_loss import chunked_ce_sum, plain_ce_sum

    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.normal(size=(2, 11, 8)), jnp.float32)
    emb = jnp.asarray(rng.normal(size=(50, 8)), jnp.float32)
    t = jnp.asarray(rng.integers(0, 50, size=(2, 11)), jnp.int32)
    w = jnp.asarray(rng.integers(0, 2, size=(2, 11)), jnp.float32)
    for cap in (None, 3.0):
        ref = plain_ce_sum(h, emb, t, w, cap)
        for chunk in (1, 4, 5, 22, 100):
            assert abs(float(chunked_ce_sum(h, emb, t, w, chunk, cap)) - float(ref)) < 1e-4
    assert float(chunked_ce_sum(h, emb, t, jnp.zeros_like(w), 4)) == 0.0
    for cap in (None, 3.0):  # gradients of the custom VJP against autodiff of the reference
        g_ref = jax.grad(lambda a, b: plain_ce_sum(a, b, t, w, cap), argnums=(0, 1))(h, emb)
        g_got = jax.grad(lambda a, b: chunked_ce_sum(a, b, t, w, 4, cap), argnums=(0, 1))(h, emb)
        for a, b in zip(g_got, g_ref):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_one_logits_buffer_per_chunk(monkeypatch):
    """With the head frozen (LoRA), a chunk's gradient over a vocabulary of at most
    JAX_SLICE_ROWS takes one [chunk, V] buffer, written over its logits: XLA's temporary
    memory stays under two such buffers (before the target's term was kept apart from the
    dense part, a scatter into it made XLA keep two). Over a larger vocabulary the logits are
    formed a slice at a time, for the labelled rows of as many chunks at once as keep that
    [rows, JAX_SLICE_ROWS] block within one chunk's [chunk, V] and ONLINE_PASS_ROWS
    (online_chunks): the temp stays under two such blocks (here 512 rows a pass, an eighth of
    a chunk's logits; with slices of 16384 rows 256 rows a pass). Gemma 3 has no final
    softcap; with one (Gemma 2) tanh's output takes a second buffer."""
    import jax.numpy as jnp

    from tunix_rt.train import jax_loss
    from tunix_rt.train.jax_loss import chunked_ce_sum

    n, d, v, chunk = 512, 64, 32768, 128
    rng = np.random.default_rng(1)
    h = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
    emb = jnp.asarray(rng.normal(size=(v, d)), jnp.float32)
    t = jnp.asarray(rng.integers(0, v, size=n), jnp.int32)
    w = jnp.ones(n, jnp.float32)

    def temp() -> int:
        fn = jax.jit(jax.grad(lambda a: chunked_ce_sum(a, emb, t, w, chunk)))
        return fn.lower(h).compile().memory_analysis().temp_size_in_bytes

    for slice_rows, rows in ((2048, n), (16384, 2 * chunk)):
        monkeypatch.setattr(jax_loss, "JAX_SLICE_ROWS", slice_rows)
        assert jax_loss.online_chunks(n // chunk, chunk, v) * chunk == rows
        sliced, one_pass = temp(), rows * slice_rows * 4
        assert one_pass <= chunk * v * 4 and sliced < 2 * one_pass, (slice_rows, sliced / one_pass)
    monkeypatch.setattr(jax_loss, "JAX_SLICE_ROWS", v)
    whole, one = temp(), chunk * v * 4
    assert one <= whole < 1.5 * one, whole / one


def test_a_chunk_runs_only_the_prefix_that_holds_its_labelled_rows():
    """The labelled rows are sorted first, so the last chunk that holds any runs the head on the
    smallest prefix size that covers them (a quarter of a chunk at a time) and a chunk without
    any runs nothing (the losses at each count: the next test)."""
    import jax.numpy as jnp

    from tunix_rt.train.jax_loss import _by_prefix, prefix_sizes

    assert prefix_sizes(256) == (64, 128, 192, 256) and prefix_sizes(5) == (2, 3, 4, 5) and prefix_sizes(1) == (1,)
    for chunk in (1, 5, 8, 256):
        sizes = prefix_sizes(chunk)
        pick = jax.jit(lambda m: _by_prefix(m, lambda: jnp.int32(0), lambda r: jnp.int32(r)))
        for n in range(chunk + 1):
            got = int(pick(jnp.arange(chunk) < n))
            assert got == (0 if n == 0 else min(s for s in sizes if s >= n)), (chunk, n, got)


def _prefix_case(slice_rows, cap, monkeypatch):
    import jax.numpy as jnp

    from tunix_rt.train import jax_loss
    from tunix_rt.train.jax_loss import chunked_ce_sum, plain_ce_sum

    if slice_rows:
        monkeypatch.setattr(jax_loss, "JAX_SLICE_ROWS", slice_rows)
    rng = np.random.default_rng(3)
    h = jnp.asarray(rng.normal(size=(2, 12, 8)), jnp.float32)
    emb = jnp.asarray(rng.normal(size=(40, 8)), jnp.float32)
    t = jnp.asarray(rng.integers(0, 40, size=(2, 12)), jnp.int32)
    for labelled in (1, 2, 3, 6, 7, 8, 9, 13, 24):  # chunk 8: prefixes 2, 4, 6, 8
        w = np.zeros(24, np.float32)
        w[rng.permutation(24)[:labelled]] = rng.uniform(0.5, 1.5, size=labelled)
        w = jnp.asarray(w.reshape(2, 12))
        ref = plain_ce_sum(h, emb, t, w, cap)
        assert abs(float(chunked_ce_sum(h, emb, t, w, 8, cap)) - float(ref)) < 1e-4, labelled
        # the head frozen (only h differentiated: the prefixes) and trained (whole chunks)
        g_ref = jax.grad(lambda a, b: plain_ce_sum(a, b, t, w, cap), argnums=(0, 1))(h, emb)
        g_got = jax.grad(lambda a, b: chunked_ce_sum(a, b, t, w, 8, cap), argnums=(0, 1))(h, emb)
        g_h = jax.grad(lambda a: chunked_ce_sum(a, emb, t, w, 8, cap))(h)
        for a, b in zip((*g_got, g_h), (*g_ref, g_ref[0])):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    # a policy objective (clipped ratio, KL to a reference) through the same paths
    from tunix_rt.train.engine import Objective
    from tunix_rt.train.jax_loss import plain_objective, token_objective

    pol = Objective("policy", 0.2, 0.28, 0.04, False)
    mask = jnp.asarray(rng.uniform(size=(2, 12)) < 0.6)
    coef = jnp.where(mask, jnp.asarray(rng.uniform(0.5, 1.5, size=(2, 12)), jnp.float32), 0.0)
    aux = jnp.asarray(np.stack([rng.normal(-3, 0.5, (2, 12)), rng.normal(-3, 0.5, (2, 12)),
                                rng.normal(0, 1, (2, 12))], -1), jnp.float32)
    ref = jax.value_and_grad(lambda a: plain_objective(a, emb, t, coef, mask, aux, cap, pol))(h)
    got = jax.value_and_grad(lambda a: token_objective(a, emb, t, coef, mask, aux, 8, cap, pol)[0])(h)
    assert abs(float(got[0]) - float(ref[0])) < 1e-4
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(ref[1]), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("slice_rows,cap", [(None, None), (16, None), (16, 3.0), (7, 3.0), (40, None)])
def test_a_frozen_head_over_vocabulary_slices_equals_the_plain_loss(slice_rows, cap, monkeypatch):
    """A frozen head larger than JAX_SLICE_ROWS goes over the vocabulary a slice at a time (an
    online softmax; vocabulary 40 here in slices of 16 and a remainder of 8, of 7 and 5, or
    whole), with and without a final softcap: loss and gradients are the plain reference's
    at every labelled count around the chunk's prefix sizes."""
    _prefix_case(slice_rows, cap, monkeypatch)
