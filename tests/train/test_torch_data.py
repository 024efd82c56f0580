"""Batches: a seeded order that resumes from (epoch, cursor), next-token labels inside each
example only, and packing that keeps each example's loss what it is alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tunix_rt.render import render_example
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.data import BatchStream, DataPosition, collate
from tunix_rt.train.loss import IGNORE
from tunix_rt.train import torch_engine as te


def _examples(tok, n):
    out = []
    for i in range(n):
        steps = [f"{i} + {j} = {i + j}" for j in range(1 + i % 4)]
        out.append(render_example(f"ex{i}", f"Add up {i}, item {'x' * (i % 5)}?", steps, str(i), tok, "Be brief."))
    return out


def _ids(stream, n_batches):
    return [stream.next_batch().example_ids for _ in range(n_batches)]


def test_order_is_seeded_and_covers_each_epoch(tiny_tok):
    ex = _examples(tiny_tok, 10)
    a = _ids(BatchStream(ex, 5, 512, False, seed=3, pad_id=0), 4)
    b = _ids(BatchStream(ex, 5, 512, False, seed=3, pad_id=0), 4)
    c = _ids(BatchStream(ex, 5, 512, False, seed=4, pad_id=0), 4)
    assert a == b and a != c
    assert sorted(a[0] + a[1]) == sorted(e.id for e in ex)  # epoch 0: each example once
    assert sorted(a[2] + a[3]) == sorted(e.id for e in ex)  # epoch 1: reshuffled, each once
    assert a[0] + a[1] != a[2] + a[3]


def test_resuming_from_a_position_continues_the_same_stream(tiny_tok):
    ex = _examples(tiny_tok, 7)
    full = BatchStream(ex, 3, 512, False, seed=0, pad_id=0)
    first = _ids(full, 2)
    pos = full.position
    assert pos == DataPosition(epoch=0, cursor=6)
    rest = _ids(full, 3)  # crosses an epoch boundary inside a batch
    resumed = BatchStream(ex, 3, 512, False, seed=0, pad_id=0, position=pos)
    assert _ids(resumed, 3) == rest and first


def test_labels_are_next_tokens_of_the_target_only(tiny_tok):
    ex = _examples(tiny_tok, 2)
    b = collate([[e] for e in ex], tiny_tok.pad_id)
    for r, e in enumerate(ex):
        n = len(e.ids)
        want = [e.ids[t + 1] if e.loss_mask[t + 1] else IGNORE for t in range(n - 1)] + [IGNORE]
        assert b.labels[r, :n].tolist() == want
        assert (b.labels[r, n:] == IGNORE).all() and (b.input_ids[r, n:] == tiny_tok.pad_id).all()
        assert b.position_ids[r].tolist() == list(range(b.input_ids.shape[1]))  # unpacked: plain arange
    assert b.n_supervised == sum(sum(e.loss_mask) - 0 for e in ex)  # every target token is predicted
    assert b.n_tokens == sum(len(e.ids) for e in ex)


def test_packing_fills_rows_and_restarts_positions(tiny_tok):
    ex = _examples(tiny_tok, 12)
    longest = max(len(e.ids) for e in ex)
    stream = BatchStream(ex, 2, 3 * longest, True, seed=0, pad_id=0)
    rows = stream.next_rows()
    assert all(sum(len(e.ids) for e in row) <= 3 * longest for row in rows)
    assert any(len(row) > 1 for row in rows)
    b = collate(rows, 0)
    at = 0
    for e in rows[0]:
        assert b.position_ids[0, at:at + len(e.ids)].tolist() == list(range(len(e.ids)))
        assert b.labels[0, at + len(e.ids) - 1] == IGNORE  # no target across the boundary
        at += len(e.ids)


def test_packed_examples_have_the_same_loss_as_alone(home, tiny_tok):
    """Attention stays inside each packed example (block-diagonal via the position ids)."""
    from tunix_rt.models.store import ensure_model

    torch.set_num_threads(1)
    cfg = TrainConfig(model="tiny-gemma3", dataset="unused.jsonl", finetune="full", device="cpu")
    engine = te.TorchEngine(cfg)
    engine.devices()
    engine.setup(ensure_model("tiny-gemma3", home), tiny_tok)
    ex = _examples(tiny_tok, 3)
    packed = engine.loss_sum(collate([ex], 0))  # coefficients 1: summed loss
    alone = sum(engine.loss_sum(collate([[e]], 0)) for e in ex)
    # the same tokens run as one causal sequence (no block boundaries) differ
    b = collate([ex], 0)
    b.position_ids = np.arange(b.input_ids.shape[1])[None]
    leaky = engine.loss_sum(b)
    assert float(packed) == pytest.approx(float(alone), abs=1e-4)
    assert abs(float(leaky) - float(alone)) > 1e-3
