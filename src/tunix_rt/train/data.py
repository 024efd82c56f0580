"""Rendered examples → micro-batches: a seeded order, right padding, labels, optional packing.

The order is an endless stream of epochs, each a permutation drawn from (seed, epoch); a
micro-batch takes the next examples of the stream. The whole data state is therefore the
`DataPosition` (epoch, cursor): a checkpoint stores it and a resumed run sees exactly the
examples an uninterrupted run would have seen.

Packing puts consecutive examples of the stream into one row while they fit. Attention is
kept inside each example by the position ids: they restart at 0 for every example, and transformers' mask builder turns a restart into a block boundary
(`masking_utils.find_packed_sequence_indices`), giving a block-diagonal causal mask for both
full and sliding-window layers with no 4D mask built here. RoPE positions are the same as
unpacked, so a packed example has the same loss as alone.

GRPO's update writes a group's prompt once and its completions after it as branches
(`collate_shared`): `segments` says which branch a position belongs to, and the torch engine
builds the 4D mask from it (loss.shared_prefix_masks).

Labels come from each example's loss mask (render.py): a token a tool wrote (render with
`tools`) has mask 0, so it is never a label here, in either engine, since both read these
batches.

Batches are numpy arrays: the JAX engine feeds them as they are and the torch engine makes
tensors of them on its device (`torch_engine.on_device`), so this module needs no torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tunix_rt.errors import BadInput
from tunix_rt.render import Rendered

IGNORE = -100  # the label of a position without loss (torch's cross_entropy ignore_index default)


@dataclass(frozen=True)
class DataPosition:
    """Where the stream is: the epoch and the index of the next example in its permutation."""

    epoch: int = 0
    cursor: int = 0


def position_state(pos: DataPosition) -> dict[str, Any]:
    """A method's checkpoint state: where its data stream is (Method.state)."""
    return {"data_position": {"epoch": pos.epoch, "cursor": pos.cursor}}


def position_of(state: dict[str, Any]) -> DataPosition:
    """The data position a checkpoint's state holds (Method.load_state)."""
    pos = state["data_position"]
    return DataPosition(pos["epoch"], pos["cursor"])


@dataclass
class Batch:
    """One micro-batch as int64 arrays [B, L] plus what the logs need. `collate` builds numpy
    arrays; the torch engine's `on_device` returns a copy holding torch tensors."""

    input_ids: Any
    labels: Any  # next-token targets, IGNORE where no loss
    position_ids: Any
    example_ids: list[str]
    n_tokens: int  # real (non-padding) tokens
    n_supervised: int  # positions with a target
    coef: Any = None
    """float32 [B, L]: each position's loss coefficient (train.engine), 0 without a target;
    set by the method for the whole optimizer step (None: not yet weighted)."""
    aux: dict[str, Any] = field(default_factory=dict)
    """float32 [B, L] arrays a policy objective needs (old_logp, ref_logp, adv)."""
    segments: Any = None
    """int64 [B, L] for rows that share a prefix (`collate_shared`): 0 on the shared prefix,
    k >= 1 on the k-th branch, -1 on padding; a branch sees the prefix and itself only.
    None: plain rows (causal, or block-diagonal when packed)."""


def weighted(batches: list[Batch], norm: float | None = None) -> list[Batch]:
    """SFT's coefficients: 1 / (supervised positions of the whole window) at every labelled
    position, so the window's loss is the mean per supervised token however it is split."""
    n = norm if norm is not None else sum(b.n_supervised for b in batches)
    for b in batches:
        b.coef = (b.labels != IGNORE).astype(np.float32) / np.float32(max(n, 1))
    return batches


def weighted_spans(batch: Batch, spans: list[tuple[int, slice, Any, float]]) -> Batch:
    """The RL counterpart of `weighted`: coefficients computed for the whole window elsewhere
    (train.advantages.token_coefficients) written at each sequence's predicting positions
    (row, span), with the sequence's advantage there (aux "adv"); 0 at every other position."""
    batch.coef = np.zeros(batch.labels.shape, np.float32)
    batch.aux = {"adv": np.zeros(batch.labels.shape, np.float32)}
    for row, at, coef, adv in spans:
        batch.coef[row, at] = coef
        batch.aux["adv"][row, at] = adv
    return batch


def coef_of(batch: Batch) -> np.ndarray:
    """The batch's coefficients; an unweighted batch counts each labelled position once."""
    return batch.coef if batch.coef is not None else (batch.labels != IGNORE).astype(np.float32)


def process_rows(batch: Batch, rank: int, world: int) -> Batch:
    """Process `rank`'s share of a global micro-batch of a multi-process run: a contiguous
    block of its rows, coefficients (normalised over the whole window) and aux kept, so
    the sum of every process's loss is the one-process loss. A process left without a row
    (fewer rows than processes) gets the first row with zero coefficients: it takes part in
    every collective and adds nothing. (Example ids and token counts stay with the global
    batch: the method logs those.)"""
    if world == 1:
        return batch
    n = batch.input_ids.shape[0]
    lo, hi = n * rank // world, n * (rank + 1) // world
    rows, keep = (slice(lo, hi), 1.0) if hi > lo else (slice(0, 1), 0.0)
    labels = batch.labels[rows]
    return dataclasses.replace(
        batch, input_ids=batch.input_ids[rows], labels=labels, position_ids=batch.position_ids[rows],
        example_ids=[], n_tokens=0, n_supervised=int((labels != IGNORE).sum()) if keep else 0,
        coef=coef_of(batch)[rows] * np.float32(keep),
        aux={k: v[rows] for k, v in batch.aux.items()},
        segments=None if batch.segments is None else batch.segments[rows])


def window_digest(batches: list[Batch]) -> str:
    """sha256 of a step's global batches (ids, labels, positions, coefficients, aux): the
    processes of a run compare it before they train on their rows."""
    h = hashlib.sha256()
    for b in batches:
        extra = () if b.segments is None else (b.segments,)
        for a in (b.input_ids, b.labels, b.position_ids, coef_of(b), *(b.aux[k] for k in sorted(b.aux)), *extra):
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


class SeededOrder:
    """An endless stream of indices into n items: epoch after epoch, each a permutation drawn
    from (seed, epoch). Its whole state is a DataPosition (SFT batches and RL prompts alike)."""

    def __init__(self, n: int, seed: int, position: DataPosition = DataPosition()):
        self.n, self.seed, self.position = n, seed, position
        self._perm_epoch, self._perm = -1, np.empty(0, dtype=np.int64)

    def _order(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            self._perm_epoch = epoch
        return self._perm

    def peek(self) -> int:
        return int(self._order(self.position.epoch)[self.position.cursor])

    def take(self) -> int:
        i = self.peek()
        epoch, cursor = self.position.epoch, self.position.cursor + 1
        if cursor == self.n:
            epoch, cursor = epoch + 1, 0
        self.position = DataPosition(epoch, cursor)
        return i


class BatchStream:
    """Deterministic micro-batches from rendered examples, resumable from a DataPosition."""

    def __init__(self, examples: list[Rendered], batch_size: int, max_seq_len: int, packing: bool,
                 seed: int, pad_id: int, position: DataPosition = DataPosition()):
        if not examples:
            raise BadInput("no training examples left (empty split, or all dropped as too long)")
        self.examples, self.batch_size, self.max_seq_len = examples, batch_size, max_seq_len
        self.packing, self.seed, self.pad_id = packing, seed, pad_id
        self.order = SeededOrder(len(examples), seed, position)

    @property
    def position(self) -> DataPosition:
        return self.order.position

    @position.setter
    def position(self, value: DataPosition) -> None:
        self.order.position = value

    def _peek(self) -> Rendered:
        return self.examples[self.order.peek()]

    def _take(self) -> Rendered:
        return self.examples[self.order.take()]

    def next_rows(self) -> list[list[Rendered]]:
        """The examples of the next micro-batch, one list per row."""
        if not self.packing:
            return [[self._take()] for _ in range(self.batch_size)]
        rows: list[list[Rendered]] = []
        for _ in range(self.batch_size):
            row = [self._take()]
            used = len(row[0].ids)
            while used + len(self._peek().ids) <= self.max_seq_len:
                row.append(self._take())
                used += len(row[-1].ids)
            rows.append(row)
        return rows

    def next_batch(self) -> Batch:
        return collate(self.next_rows(), self.pad_id)


def collate(rows: list[list[Rendered]], pad_id: int) -> Batch:
    """Right-pad rows to the longest; labels[t] = ids[t+1] where the loss mask of t+1 is on,
    inside the same example only. numpy int64 arrays."""
    width = max(sum(len(ex.ids) for ex in row) for row in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    labels = np.full((len(rows), width), IGNORE, dtype=np.int64)
    pos = np.zeros((len(rows), width), dtype=np.int64)
    for r, row in enumerate(rows):
        at = 0
        for ex in row:
            n = len(ex.ids)
            x, m = np.asarray(ex.ids), np.asarray(ex.loss_mask, dtype=bool)
            ids[r, at:at + n] = x
            lab = np.where(m[1:], x[1:], IGNORE)
            labels[r, at:at + n - 1] = lab
            pos[r, at:at + n] = np.arange(n)
            at += n
        # The padding tail continues the last example's positions: it comes after it (causal)
        # and carries no label, so it changes nothing, and an unpacked batch stays a plain
        # arange, which keeps attention on the fast causal path.
        pos[r, at:] = np.arange(n, n + width - at) if row else np.arange(width)
    n_tokens = sum(len(ex.ids) for row in rows for ex in row)
    return Batch(
        input_ids=ids, labels=labels, position_ids=pos,
        example_ids=[ex.id for row in rows for ex in row],
        n_tokens=n_tokens, n_supervised=int((labels != IGNORE).sum()),
    )


def collate_shared(rows: list[tuple[list[int], list[list[int]]]], pad_id: int) -> tuple[Batch, list[list[int]]]:
    """Rows of one prefix and several branches each (a GRPO group: the prompt and its
    completions), the prefix written once. A row is prefix[:-1], then each branch as
    [prefix[-1]] + branch: the copy of the prefix's last token is what predicts the branch's
    first token, so every branch has its own label there. Positions continue the prefix in
    every branch (RoPE sees each branch exactly as prefix + branch), labels cover the branch
    tokens, and `segments` gives the mask: a branch attends to the prefix and to itself.
    Returns the batch and, per row, the column where each branch's first prediction sits
    (its labels run from there for len(branch) positions)."""
    width = max(len(p) - 1 + sum(1 + len(b) for b in branches) for p, branches in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    labels = np.full((len(rows), width), IGNORE, dtype=np.int64)
    pos = np.zeros((len(rows), width), dtype=np.int64)
    seg = np.full((len(rows), width), -1, dtype=np.int64)
    starts: list[list[int]] = []
    for r, (prefix, branches) in enumerate(rows):
        if not prefix:
            raise ValueError("a shared prefix needs at least one token")
        n = len(prefix) - 1
        ids[r, :n], pos[r, :n], seg[r, :n] = prefix[:-1], np.arange(n), 0
        at, row_starts = n, []
        for k, branch in enumerate(branches, start=1):
            x = np.asarray([prefix[-1], *branch], dtype=np.int64)
            m = len(x)
            ids[r, at:at + m], pos[r, at:at + m], seg[r, at:at + m] = x, np.arange(n, n + m), k
            labels[r, at:at + m - 1] = x[1:]
            row_starts.append(at)
            at += m
        pos[r, at:] = np.arange(width - at)  # padding: its own segment, no label
        starts.append(row_starts)
    return Batch(input_ids=ids, labels=labels, position_ids=pos, example_ids=[],
                 n_tokens=int((seg >= 0).sum()), n_supervised=int((labels != IGNORE).sum()),
                 segments=seg), starts
