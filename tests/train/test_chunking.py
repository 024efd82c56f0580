"""The loss chunk rule (train/chunking.py): a byte budget for one chunk's fp32 logits, turned
into tokens from the vocabulary; and XLA's compiled memory of the JAX chunked loss at Gemma 3
270M's head shapes staying within what that budget allows (abstract arrays: no weight is
allocated, one compile per budget)."""

from __future__ import annotations

import pytest

from tunix_rt.models.catalog import get_preset
from tunix_rt.train.chunking import DEFAULT_CHUNK_BYTES, chunk_tokens
from tunix_rt.train.config import TrainConfig

MiB = 2**20


def test_budget_to_tokens():
    assert chunk_tokens(256 * MiB, 262_144) == 256  # 1 MiB of fp32 logits per token
    assert chunk_tokens(256 * MiB, 256_000) == 262
    assert chunk_tokens(256 * MiB, 262_144, logits_bytes=2) == 512
    assert chunk_tokens(7 * 1024 * 4, 1024) == 7
    assert chunk_tokens(1, 262_144) == 1  # below one row: still one token a chunk
    assert chunk_tokens(10 * MiB, 262_144) < chunk_tokens(20 * MiB, 262_144)


def test_default_keeps_a_4x256_gemma3_270m_batch_to_a_quarter_block():
    cfg = TrainConfig(model="gemma3-270m", dataset="x", batch_size=4, max_seq_len=256)
    assert cfg.loss_chunk_bytes == DEFAULT_CHUNK_BYTES
    rows = cfg.batch_size * cfg.max_seq_len
    assert chunk_tokens(cfg.loss_chunk_bytes, get_preset("gemma3-270m").vocab_size) <= rows // 4


def test_config_takes_bytes_and_refuses_the_old_token_field():
    from tunix_rt.errors import BadInput

    assert TrainConfig.from_dict({"dataset": "x", "loss_chunk_bytes": 64 * MiB}).loss_chunk_bytes == 64 * MiB
    with pytest.raises(BadInput, match="loss_chunk_tokens"):
        TrainConfig.from_dict({"dataset": "x", "loss_chunk_tokens": 256})
    with pytest.raises(BadInput, match="loss_chunk_bytes must be >= 1"):
        TrainConfig(dataset="x", loss_chunk_bytes=0)


def _loss_temp_bytes(budget: int, rows: int = 1024, width: int = 640, vocab: int = 262_144) -> int:
    """XLA's temp bytes of value_and_grad of the JAX chunked loss (gradient for the hidden
    states only, as LoRA: no [V, D] accumulator) with the chunk the rule gives."""
    import jax
    import jax.numpy as jnp

    from tunix_rt.train.jax_loss import chunked_ce_sum

    chunk = chunk_tokens(budget, vocab)

    def loss(h, emb, t, w):
        return chunked_ce_sum(h, emb, t, w, chunk)

    args = (jax.ShapeDtypeStruct((rows, width), jnp.float32), jax.ShapeDtypeStruct((vocab, width), jnp.float32),
            jax.ShapeDtypeStruct((rows,), jnp.int32), jax.ShapeDtypeStruct((rows,), jnp.float32))
    compiled = jax.jit(jax.value_and_grad(loss)).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.jax
def test_compiled_jax_loss_stays_within_its_chunk_budget(monkeypatch):
    """4 x 256 rows through Gemma 3 270M's [262144, 640] head. With the vocabulary formed whole
    (a head of at most JAX_SLICE_ROWS rows, forced here) the loss holds one to three
    chunk-sized blocks (logits, softmax, dlogits; measured two) plus row-sized buffers, so
    the full [1024, V] block (1 GiB) is never formed, and a larger budget costs more. A larger
    frozen head goes JAX_SLICE_ROWS rows at a time (jax_loss._online_head) for the labelled
    rows of as many chunks as keep that block within the budget (jax_loss.online_chunks): under
    two such blocks plus the row-sized buffers."""
    from tunix_rt.train import jax_loss

    full_block = 1024 * 262_144 * 4
    rows_bytes = 16 * 1024 * 640 * 4  # h-sized buffers: sorted h, dh, their copies (loose)
    sliced = {b: _loss_temp_bytes(b) for b in (16 * MiB, 64 * MiB)}
    for budget, temp in sliced.items():
        chunk = chunk_tokens(budget, 262_144)
        passes = jax_loss.online_chunks(-(-1024 // chunk), chunk, 262_144) * chunk
        slice_block = min(passes, 1024) * jax_loss.JAX_SLICE_ROWS * 4
        assert slice_block <= budget and temp <= 2 * slice_block + rows_bytes, (budget, temp)
    monkeypatch.setattr(jax_loss, "JAX_SLICE_ROWS", 262_144)
    temps = {b: _loss_temp_bytes(b) for b in (16 * MiB, 64 * MiB)}
    for budget, temp in temps.items():
        assert budget <= temp <= 3 * budget + rows_bytes, (budget, temp)
        assert temp < full_block / 4
    # measured: 37 -> 133 MiB (2 blocks); 21.1 -> 69.3 on the 2-core Xeon (2026-12-07)
    assert temps[64 * MiB] - temps[16 * MiB] >= 48 * MiB
    # one pass's block ([512, JAX_SLICE_ROWS], 16 MiB) against a chunk's whole-vocabulary one
    assert sliced[64 * MiB] < temps[64 * MiB] * 0.75


def test_balanced_chunks_keep_the_count_and_shrink_the_largest():
    from tunix_rt.train.chunking import balanced

    assert balanced(671, 256) == 224  # the 270M DPO step's rows: 3 chunks of 224, not 256, 256, 159
    assert balanced(512, 256) == 256 and balanced(100, 256) == 100 and balanced(257, 256) == 129
    for rows in range(1, 700, 7):
        for chunk in (1, 7, 64, 256):
            b = balanced(rows, chunk)
            assert b <= chunk and -(-rows // b) == -(-rows // chunk), (rows, chunk)
