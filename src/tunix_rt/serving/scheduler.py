"""Continuous batching on the eval generator: concurrent requests share decode steps.

One thread per served model owns the model and runs the loop

    admit waiting requests → drop cancelled rows → one decode step for every row → emit

A request of `n` choices is `n` rows. On Gemma 2/3 (the lean decode step of
`tunix_rt.eval.fast_gemma`) a request that arrives while a batch decodes joins it at the
next step: its prompt is prefilled by the transformers model (as in eval), and its cache
is merged into the running batch's preallocated cache. Every row keeps its tokens
right-aligned at the shared cache index with masked padding on the left, exactly the
layout eval's left-padded batches have, so a row decodes as it would alone (greedy output
equals `tunix-rt eval`'s). On any other architecture the transformers forward steps the
batch and newcomers join at the next batch.

With tools (a request whose DecodeConfig names them: a run's `tools`, by default), each row
decodes through its own `eval.generate.ToolRow`, the rule every generator follows: when the
model's token closes a call, the tool runs and its result's ids are fed to that row one per
step instead of its own picks, while the other rows go on decoding; the forced text streams
to the client like the model's (the reply holds the results as they were forced), and the
row's noise stays keyed by (seed, choice, step), so a row decodes as it would alone.

Rows leave the batch when they stop (a stop token, a stop string, max tokens) or when
their request is cancelled (a client that disconnects), so a slot frees at the next step.
Waiting requests beyond `max_queue` are refused (QueueFull → 429).
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.eval.generate import FINISH_LENGTH, FINISH_STOP, DecodeConfig, ToolRow, left_pad, pick, position_ids
from tunix_rt.eval.int8_kernel import argmax
from tunix_rt.eval.sampling import gumbel, row_seed

GREEDY = DecodeConfig(temperature=0.0)

if TYPE_CHECKING:
    import torch

    from tunix_rt.eval.generate import TorchGenerator

log = logging.getLogger(__name__)


class QueueFull(TunixRtError):
    """More requests are waiting than the queue holds."""


class Unloaded(TunixRtError):
    """The model was unloaded (the server is stopping): the request may be retried."""


UNLOADED = "the model was unloaded; retry"


@dataclass(frozen=True)
class Event:
    """What a request's sink receives, from the scheduler thread: text as it is decoded
    ("delta"), then "done" once per choice, or one "error" for the whole request."""

    kind: str  # delta | done | error (| gone: the HTTP layer's own note that the client left)
    index: int = 0
    text: str = ""
    finish_reason: str | None = None
    n_tokens: int = 0
    error: str | None = None
    retryable: bool = False
    """An error that is no fault of the request (the model was unloaded): retry it."""


class Request:
    """One chat completion: prompt ids, decoding, `n` choices, stop strings, and a sink."""

    def __init__(self, prompt: Sequence[int], cfg: DecodeConfig, sink: Callable[[Event], None],
                 n: int = 1, stop: Sequence[str] = ()) -> None:
        if not prompt:
            raise BadInput("cannot generate from an empty prompt")
        if n < 1:
            raise BadInput(f"n must be >= 1, got {n}")
        self.prompt = list(prompt)
        self.cfg = cfg
        self.sink = sink
        self.n = n
        self.stop = tuple(s for s in stop if s)
        self.cancelled = False
        self.generated = 0
        """Tokens produced so far over all choices (tests read it)."""

    def cancel(self) -> None:
        """Free this request's rows at the next step (set from any thread)."""
        self.cancelled = True


class _Row:
    """One choice in flight: its ids, how much of its text was already sent, and its side of
    decoding with tools (None without)."""

    def __init__(self, req: Request, index: int, tok) -> None:
        self.req, self.index = req, index
        self.ids: list[int] = []
        self.sent = 0
        self.tools = ToolRow(tok, req.cfg.tools, req.prompt) if req.cfg.tools else None

    def take(self, picked: int) -> int:
        """The id this row emits (and is fed next) for the model's pick: a forced one while
        a tool's result is pending (see eval.generate.ToolRow)."""
        return self.tools.take(picked) if self.tools is not None else picked

    @property
    def room(self) -> int:
        """Decode steps this row may still need."""
        return max(1, self.req.cfg.max_new_tokens - len(self.ids))

    def push(self, token: int, stop_ids: frozenset[int], decode: Callable[[list[int]], str]) -> bool:
        """Take the next token; emit the new text; True when the row is finished."""
        self.ids.append(token)
        self.req.generated += 1
        reason = FINISH_STOP if token in stop_ids else None
        text = decode(self.ids[:-1] if reason else self.ids)
        cut = min((j for j in (text.find(s) for s in self.req.stop) if j >= 0), default=-1)
        if cut >= 0:
            text, reason = text[: max(cut, self.sent)], FINISH_STOP
        elif reason is None and len(self.ids) >= self.req.cfg.max_new_tokens:
            reason = FINISH_LENGTH
        upto = len(text)
        if reason is None:  # hold back what may still become a stop string or a whole character
            upto -= max((len(s) for s in self.req.stop), default=1) - 1
            while upto > self.sent and text[upto - 1] == "\ufffd":
                upto -= 1
        if upto > self.sent:
            self.req.sink(Event("delta", self.index, text[self.sent: upto]))
            self.sent = upto
        if reason:
            self.req.sink(Event("done", self.index, finish_reason=reason, n_tokens=len(self.ids)))
        return reason is not None


class _LeanBatch:
    """Rows on LeanGemma's preallocated cache; newcomers merge in at any step."""

    can_join_running = True

    def __init__(self, gen: "TorchGenerator") -> None:
        self.gen, self.lean, self.state = gen, gen.lean, None

    def add(self, prompts: list[list[int]], room: int) -> "torch.Tensor":
        """Prefill `prompts` (the transformers forward, as eval does), merge their cache into
        the batch; returns their next-token logits."""
        from transformers import DynamicCache

        ids, mask = left_pad(prompts, self.gen.tok.pad_id, self.gen.device)
        pos = position_ids(mask)
        cache = DynamicCache(config=self.gen.model.config)
        logits = self.gen.last_logits(ids, mask, pos, cache)
        new = self.lean.start(cache, mask, pos[:, -1] + 1, room)
        self.state = new if self.state is None else merge_states([self.state, new], room)
        self.lean.rope_tables(int(self.state.pos.max()) + room + 1)
        return logits

    def step(self, tokens: "torch.Tensor", greedy: bool) -> "torch.Tensor":
        """Next-token ids when `greedy` (the int8-screened head), else logits."""
        if greedy:  # the int8-screened head, the same ids as argmax of the full logits
            return self.lean.step_pick(tokens, self.state, GREEDY, None)
        return self.lean.step(tokens, self.state)

    def select(self, keep: "torch.Tensor") -> None:
        self.state.select(keep)

    def reset(self) -> None:
        self.state = None


class _HFBatch:
    """Rows stepped by the transformers forward (architectures without the lean step);
    a DynamicCache cannot take new rows, so newcomers wait for the next batch."""

    can_join_running = False

    def __init__(self, gen: "TorchGenerator") -> None:
        self.gen, self.cache, self.mask, self.next_pos = gen, None, None, None

    def add(self, prompts: list[list[int]], room: int) -> "torch.Tensor":
        from transformers import DynamicCache

        ids, self.mask = left_pad(prompts, self.gen.tok.pad_id, self.gen.device)
        pos = position_ids(self.mask)
        self.cache = DynamicCache(config=self.gen.model.config)
        logits = self.gen.last_logits(ids, self.mask, pos, self.cache)
        self.next_pos = pos[:, -1] + 1
        return logits

    def step(self, tokens: "torch.Tensor", greedy: bool) -> "torch.Tensor":
        self.mask = _extend(self.mask)
        logits = self.gen.last_logits(tokens[:, None], self.mask, self.next_pos[:, None], self.cache)
        self.next_pos = self.next_pos + 1
        return argmax(logits) if greedy else logits

    def select(self, keep: "torch.Tensor") -> None:
        self.cache.batch_select_indices(keep)
        self.mask, self.next_pos = self.mask[keep], self.next_pos[keep]

    def reset(self) -> None:
        self.cache = self.mask = self.next_pos = None


def _extend(mask: "torch.Tensor") -> "torch.Tensor":
    import torch

    return torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def merge_states(states: list, room: int):
    """One DecodeState holding every row of `states`, each row's cache entries moved so
    they end at the new shared index (the longest row's length) with masked padding on
    their left, and `room` free entries after it. Left padding that no row needs any more
    (its rows have left) is dropped here."""
    import torch

    from tunix_rt.eval.fast_gemma import DecodeState

    spans = [int(s.pos.max()) for s in states]  # real tokens of the longest row of each part
    cur = max(spans)
    total = cur + room
    sizes = [s.pos.shape[0] for s in states]
    keys, values = [], []
    for i in range(len(states[0].keys)):
        k0, v0 = states[0].keys[i], states[0].values[i]
        kb = k0.new_zeros((sum(sizes), k0.shape[1], total, k0.shape[3]))
        vb = v0.new_zeros((sum(sizes), v0.shape[1], total, v0.shape[3]))
        r = 0
        for s, m, b in zip(states, spans, sizes):
            kb[r: r + b, :, cur - m: cur] = s.keys[i][:, :, s.cur - m: s.cur]
            vb[r: r + b, :, cur - m: cur] = s.values[i][:, :, s.cur - m: s.cur]
            r += b
        keys.append(kb)
        values.append(vb)
    dtype = states[0].mask.dtype
    mask = torch.zeros((sum(sizes), 1, 1, total), dtype=dtype, device=states[0].mask.device)
    r = 0
    for s, m, b in zip(states, spans, sizes):
        mask[r: r + b, ..., : cur - m] = torch.finfo(dtype).min
        mask[r: r + b, ..., cur - m: cur] = s.mask[..., s.cur - m: s.cur]
        r += b
    return DecodeState(keys, values, mask, torch.cat([s.pos for s in states]), cur)


class Scheduler:
    """The decode loop of one served model, on its own thread."""

    def __init__(self, gen: "TorchGenerator", max_batch: int, max_queue: int, name: str = "model",
                 on_idle: Callable[[], None] = lambda: None) -> None:
        self.gen = gen
        self.on_idle = on_idle
        """Called (on the decode thread, holding no lock) each time the batch empties."""
        self.max_batch, self.max_queue = max_batch, max_queue
        self.stop_ids = frozenset(gen.stop_ids)
        self.batch = _LeanBatch(gen) if gen.lean is not None else _HFBatch(gen)
        self.rows: list[_Row] = []
        self.next_tokens = None
        self.joined_running = 0
        """Admissions into a batch that was already decoding (step-level joins)."""
        self.peak_rows = 0
        self._pending: collections.deque[Request] = collections.deque()
        self._admitting: list[Request] = []
        """Requests taken from the queue whose rows are not in the batch yet."""
        self._cv = threading.Condition()
        self._closed = False
        self._threads = _torch_threads()
        self._thread = threading.Thread(target=self._loop, name=f"decode-{name}", daemon=True)
        self._thread.start()

    @property
    def step_level(self) -> bool:
        """True where requests join a running batch at the next step (Gemma 2/3)."""
        return self.batch.can_join_running

    @property
    def active(self) -> int:
        return len(self.rows)

    @property
    def idle(self) -> bool:
        """No request waiting, being admitted or decoding: unloading now fails nobody."""
        with self._cv:
            return not (self._pending or self._admitting or self.rows)

    def submit(self, req: Request) -> None:
        if req.n > self.max_batch:
            raise BadInput(f"n={req.n} is more than this server decodes at once ({self.max_batch})")
        with self._cv:
            if self._closed:
                raise Unloaded(UNLOADED)
            if len(self._pending) >= self.max_queue:
                raise QueueFull(f"{len(self._pending)} requests are waiting (queue limit {self.max_queue}); retry later")
            self._pending.append(req)
            self._cv.notify()

    def close(self) -> None:
        """Stop the loop; requests in flight or waiting end with an error event."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)

    # -----------------------------------------------------------------------------------

    def _loop(self) -> None:
        import torch

        torch.set_num_threads(self._threads)  # OpenMP's setting is per thread: take the creator's
        with torch.inference_mode():
            while True:
                with self._cv:
                    while not self._pending and not self.rows and not self._closed:
                        self._cv.wait()
                    if self._closed:
                        self._fail([r.req for r in self.rows] + list(self._pending), UNLOADED, retryable=True)
                        return
                    admitted = self._admitting = self._take()
                try:
                    if admitted:
                        self._admit(admitted)
                    self._drop_cancelled()
                    if self.rows:
                        self._step()
                except Exception as e:  # noqa: BLE001 - reported to every request in flight
                    log.exception("decode step failed")
                    failed = {id(q): q for q in [r.req for r in self.rows] + admitted}
                    self._fail(failed.values(), f"{type(e).__name__}: {e}")
                    self.rows, self.next_tokens = [], None
                    self.batch.reset()
                self._admitting = []
                if not self.rows:
                    self.on_idle()

    def _take(self) -> list[Request]:
        """Waiting requests that fit in the free rows (in arrival order)."""
        out, free = [], self.max_batch - len(self.rows)
        if self.rows and not self.batch.can_join_running:
            return out
        while self._pending and (self._pending[0].cancelled or self._pending[0].n <= free):
            req = self._pending.popleft()
            if not req.cancelled:
                out.append(req)
                free -= req.n
        return out

    def _admit(self, reqs: list[Request]) -> None:
        import torch

        rows = [_Row(q, i, self.gen.tok) for q in reqs for i in range(q.n)]
        room = max(r.room for r in self.rows + rows)
        if self.rows:
            self.joined_running += 1
        logits = self.batch.add([r.req.prompt for r in rows], room)
        first = self._pick(logits, rows)
        self.rows += rows
        self.next_tokens = first if self.next_tokens is None else torch.cat([self.next_tokens, first])
        self.peak_rows = max(self.peak_rows, len(self.rows))
        self._emit(first, rows, offset=len(self.rows) - len(rows))

    def _step(self) -> None:
        greedy = all(r.req.cfg.greedy for r in self.rows)
        out = self.batch.step(self.next_tokens, greedy)
        nxt = out if greedy else self._pick(out, self.rows)
        self.next_tokens = nxt
        self._emit(nxt, self.rows, offset=0)

    def _pick(self, logits: "torch.Tensor", rows: list[_Row]) -> "torch.Tensor":
        import torch

        if all(r.req.cfg.greedy for r in rows):
            return argmax(logits)
        # each choice draws its own noise from (seed, its index, its step), as TorchGenerator does
        # for a prompt of that index: the same seed gives the same sample in or out of a batch
        vocab = logits.shape[-1]
        return torch.cat([pick(logits[i: i + 1], r.req.cfg, gumbel([row_seed(r.req.cfg.seed, r.index, len(r.ids))], vocab, logits.device))
                          for i, r in enumerate(rows)])

    def _emit(self, tokens: "torch.Tensor", rows: list[_Row], offset: int) -> None:
        """Push each row's token (a tool's forced id replaces its pick, and is what the row is
        fed next); rows that finished leave the batch."""
        import torch

        picked = tokens.tolist()
        taken = [r.take(t) for r, t in zip(rows, picked)]
        if taken != picked:
            at = torch.tensor(taken, dtype=self.next_tokens.dtype, device=self.next_tokens.device)
            self.next_tokens = torch.cat([self.next_tokens[:offset], at, self.next_tokens[offset + len(rows):]])
        decode = self.gen.tok.decode
        done = [offset + i for i, (r, t) in enumerate(zip(rows, taken)) if r.push(t, self.stop_ids, decode)]
        self._remove(set(done))

    def _drop_cancelled(self) -> None:
        self._remove({i for i, r in enumerate(self.rows) if r.req.cancelled})

    def _remove(self, gone: set[int]) -> None:
        import torch

        if not gone:
            return
        keep = [i for i in range(len(self.rows)) if i not in gone]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.next_tokens = None
            self.batch.reset()
            return
        idx = torch.tensor(keep, device=self.next_tokens.device)
        self.next_tokens = self.next_tokens.index_select(0, idx)
        self.batch.select(idx)

    @staticmethod
    def _fail(reqs, message: str, retryable: bool = False) -> None:
        for req in reqs:
            try:
                req.sink(Event("error", error=message, retryable=retryable))
            except Exception:  # noqa: BLE001 - a sink that fails must not stop the others
                log.exception("request sink failed")
