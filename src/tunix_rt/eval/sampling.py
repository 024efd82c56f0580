"""Sampling as Gumbel-max: the one definition of a sampled token that every decode path of
the PyTorch generator shares (full logits through transformers or the lean step, and the
int8-screened head, `tunix_rt.eval.screened_head`).

    token = argmax over the allowed tokens i of  z_i / T + g_i,   g_i i.i.d. Gumbel(0, 1)

is a draw from softmax(z / T) restricted to the allowed tokens (the Gumbel-max trick), and
it is a pure function of the logits and the noise. So a path that proves which tokens cannot
win (the screen) gives bit-identical ids to one that scores every token, when both use the
same noise.

The allowed tokens, decided on the fp32 logits z of one row (never on z / T, whose rounding
could merge distinct logits):
- top-k (0 < k < V): z_i >= the k-th largest z (ties with it stay in);
- top-p (p < 1), within the top-k tokens if any: order the tokens by z descending, ties by
  token id; token i stays iff the probability mass strictly before it is below p, i.e.
  sum_{j before i} e_j < p * sum_j e_j with e_j = exp((z_j - max z) / T) in fp64. The most
  likely token always stays.

The noise: g_i = -log(E_i) with E_i = -log(U_i) ~ Exp(1) (-log of an Exp(1) variate is
exactly Gumbel(0, 1)), in fp64, where U_i is counter-based: a pure function of the row's seed
and the token id i, splitmix64's finaliser of (seed + (i + 1) * 0x9E3779B97F4A7C15) in int64
arithmetic, whose top 52 bits m give U = (2m + 1) / 2**53, strictly inside (0, 1) and exact in
fp64 (so g lies in [-3.61, 36.74]). It is computed on the logits' device (torch tensors, no
host round trip, no generator state), any subset of token ids can be drawn alone with the same
bits as in the full draw, and U has the same bits on every device (the two fp64 logs are the
device's own, numpy's on the CPU, torch's on an accelerator: they may differ in g's last bit). The row's seed is a hash of (seed, the
row's key, step). The key is the prompt's index unless the caller gives its own (RL seeds per
train step, prompt and sample), so a row's noise does not depend on which prompts share its
batch or which rows already finished.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from typing import TYPE_CHECKING, Sequence, Union

if TYPE_CHECKING:
    import torch

Key = Union[int, tuple[int, ...]]
"""A row's noise key: an int (the prompt index by default; k is the same key as (k,)) or a
tuple of ints."""

NUCLEUS_SLACK = 1e-9
"""Relative slack of the top-p pre-filter (the fp64 sums it compares are exact to ~1e-11)."""
BOUND_FIRST_SHARE = 0.25
"""Sampling without top-k/top-p from lazy CPU noise, drawn bound first (`_draw_bound_first`
and the screened head's `_reach_bound_first`): past this share of the entries needing their
noise's logs, every entry's are taken."""


def row_seed(seed: int, key: Key, step: int) -> int:
    """A 64-bit seed (unsigned) for one row's noise at one decode step: blake2b of the three,
    so any change of seed, key or step gives unrelated noise."""
    parts = (int(seed), int(step), *(key if isinstance(key, tuple) else (key,)))
    text = ",".join(str(int(p)) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def _int64(u: int) -> int:
    """The int64 with the bits of the unsigned 64-bit u."""
    u &= (1 << 64) - 1
    return u - (1 << 64) if u >= 1 << 63 else u


GOLDEN = _int64(0x9E3779B97F4A7C15)
"""The counter's increment per token id (splitmix64's Weyl constant)."""
MIX = (_int64(0xBF58476D1CE4E5B9), _int64(0x94D049BB133111EB))
"""splitmix64's two finaliser multipliers."""
CHUNK_ELEMENTS = 1 << 24
"""The noise's hash runs a few rows at a time, about this many entries at once (bounded scratch)."""
CPU_CHUNK_ELEMENTS = 1 << 15
"""The same on the CPU, a tile of rows and columns (256 KB of scratch per buffer: it stays in
cache through the hash's passes)."""


def check_keys(keys: Sequence, n: int) -> list[Key]:
    """The caller's per-prompt keys, validated: one per prompt, ints or tuples of ints."""
    from tunix_rt.errors import BadInput

    keys = list(keys)
    if len(keys) != n:
        raise BadInput(f"keys: got {len(keys)} for {n} prompts (one noise key per prompt)")
    for k in keys:
        parts = k if isinstance(k, tuple) else (k,)
        if not parts or not all(isinstance(p, int) and not isinstance(p, bool) for p in parts):
            raise BadInput(f"keys: {k!r} is not an int or a non-empty tuple of ints")
    return keys


def _mix_(x: "torch.Tensor", t: "torch.Tensor") -> None:
    """splitmix64's finaliser of x (int64 bits), in place (t: scratch of x's shape)."""
    import torch

    for shift, mult in ((30, MIX[0]), (27, MIX[1]), (31, None)):
        torch.bitwise_right_shift(x, shift, out=t)
        t.bitwise_and_((1 << (64 - shift)) - 1)  # a logical shift: no sign bits shifted in
        x.bitwise_xor_(t)
        if mult is not None:
            x.mul_(mult)


def _bits_torch(seed, off, bits, x, t) -> None:
    """bits [r, n] (int64) := the double 1 + m / 2**52 for each (seed [r], offset [n] or [r, n]),
    m the top 52 bits of splitmix64's finaliser of seed + offset: in torch, on any device
    (x, t: int64 scratch [r, n])."""
    import torch

    torch.add(seed[:, None], off, out=x)
    _mix_(x, t)
    torch.bitwise_right_shift(x, 12, out=bits)
    bits.bitwise_and_((1 << 52) - 1).bitwise_or_(0x3FF << 52)


def _bits_numpy(seed, off, bits, x, t) -> None:
    """The same bits as _bits_torch, on the CPU through numpy's uint64 (logical shifts without
    masks: about 1.5x faster than torch's int64 on these CPUs). The tensors share memory."""
    import numpy as np

    s, o = seed.numpy().view(np.uint64), off.numpy().view(np.uint64)
    x, t = x.numpy().view(np.uint64), t.numpy().view(np.uint64)
    np.add(s[:, None], o, out=x)  # uint64 arrays wrap silently
    for shift, mult in ((30, MIX[0]), (27, MIX[1]), (31, None)):
        np.right_shift(x, np.uint64(shift), out=t)
        np.bitwise_xor(x, t, out=x)
        if mult is not None:
            np.multiply(x, np.uint64(mult & ((1 << 64) - 1)), out=x)
    out = bits.numpy().view(np.uint64)
    np.right_shift(x, np.uint64(12), out=out)
    np.bitwise_or(out, np.uint64(0x3FF << 52), out=out)


@functools.lru_cache(maxsize=8)
def _vocab_offsets(vocab: int, device) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Every token id [vocab] and its counter offset (id + 1) * GOLDEN, once per vocabulary and
    device (read only: a decode step draws them every step)."""
    import torch

    ids = torch.arange(vocab, dtype=torch.int64, device=device)
    return ids, (ids + 1).mul_(GOLDEN)  # wraps as uint64 would


def gumbel(seeds: Sequence[int], vocab: int, device=None, ids: "torch.Tensor | None" = None) -> "torch.Tensor":
    """fp64 Gumbel(0, 1) noise on `device` (default CPU): [len(seeds), vocab], row r from
    seeds[r] (see row_seed); with `ids` (token ids, [n] for every row or [len(seeds), n]) only
    those entries, [len(seeds), n], the same bits as the full draw's columns `ids`."""
    import torch

    seed = torch.tensor([_int64(int(s)) for s in seeds], dtype=torch.int64, device=device)
    if ids is None:
        ids, off = _vocab_offsets(vocab, seed.device)
    else:
        ids = ids.to(device=seed.device, dtype=torch.int64)
        off = (ids + 1).mul_(GOLDEN)  # wraps as uint64 would
    out = torch.empty((len(seeds), ids.shape[-1]), dtype=torch.float64, device=seed.device)
    if seed.device.type == "cpu":
        _gumbel_cpu(seed, off, out)
        return out
    bits = out.view(torch.int64)  # U is built in place, as the bits of a double
    step = max(1, CHUNK_ELEMENTS // max(ids.shape[-1], 1))  # a few rows at a time: bounded scratch
    x = torch.empty((min(step, len(seeds)), ids.shape[-1]), dtype=torch.int64, device=seed.device)
    t = torch.empty_like(x)
    for a in range(0, len(seeds), step):
        b = min(len(seeds), a + step)
        _bits_torch(seed[a:b], off if ids.dim() == 1 else off[a:b], bits[a:b], x[: b - a], t[: b - a])
    # 1 + m / 2**52 minus 1 - 2**-53 is U = (2m + 1) / 2**53, exact, strictly inside (0, 1)
    return out.sub_(1 - 2.0 ** -53).log_().neg_().log_().neg_()  # -log(-log U)


_POOL: "tuple[int, int, object] | None" = None


def _pool(workers: int):
    """A pool of `workers` threads for the CPU noise (numpy's ufuncs release the GIL), made
    once per process (a forked child gets its own: its parent's threads are not in it)."""
    import os

    global _POOL
    if _POOL is None or _POOL[:2] != (workers, os.getpid()):
        from concurrent.futures import ThreadPoolExecutor

        _POOL = (workers, os.getpid(), ThreadPoolExecutor(workers, thread_name_prefix="tunix-rt-noise"))
    return _POOL[2]


def _gumbel_cpu(seed: "torch.Tensor", off: "torch.Tensor", out: "torch.Tensor") -> None:
    """gumbel's draw on the CPU into out [r, n] (fp64): numpy's hash then numpy's logs, a tile
    of at most CPU_CHUNK_ELEMENTS at a time, each tile's scratch and output small enough to stay
    in cache between the dozen passes (whole 262K rows ran 2.5x slower), the tiles spread over
    torch's thread count. Every entry is computed alone, so any tiling gives the same bits."""
    import torch

    rows, n = out.shape
    cols = min(n, CPU_CHUNK_ELEMENTS)
    per = max(1, CPU_CHUNK_ELEMENTS // cols) if cols == n else 1  # rows a tile
    tiles = [(r, min(rows, r + per), c, min(n, c + cols)) for r in range(0, rows, per) for c in range(0, n, cols)]
    bits = out.view(torch.int64)

    from tunix_rt.eval.int8_kernel import noise_bits

    def work(part: list[tuple[int, int, int, int]]) -> None:
        x = t = None
        for r0, r1, c0, c1 in part:
            o = off[c0:c1] if off.dim() == 1 else off[r0:r1, c0:c1]
            if not noise_bits(seed[r0:r1], o, bits[r0:r1, c0:c1]):  # our C kernel, else numpy
                if x is None:
                    x = torch.empty((per, cols), dtype=torch.int64)
                    t = torch.empty_like(x)
                _bits_numpy(seed[r0:r1], o, bits[r0:r1, c0:c1], x[: r1 - r0, : c1 - c0], t[: r1 - r0, : c1 - c0])
            # numpy's fp64 log: 5x torch's on 262K entries, ~100x on a tiny model's 1K
            _neg_log_neg_log(out[r0:r1, c0:c1].numpy())

    workers = min(len(tiles), torch.get_num_threads())
    if workers <= 1:
        return work(tiles)
    for f in [_pool(workers).submit(work, tiles[w::workers]) for w in range(workers)]:
        f.result()


class Noise:
    """One decode step's noise for a batch of rows, drawn only where a path looks: the
    [B, vocab] draw `gumbel(seeds, vocab)` defines, as full rows (full logits need them all),
    in another order (the screened head's, `at(perm)`: no gather of a [B, vocab] fp64 tensor)
    or at a few ids (the rescored tokens of a top-k or top-p draw: no full draw at all). Every
    entry has the bits of the full draw's (the counter-based noise: any subset alone is the same
    numbers). Built from the rows' seeds, or around a ready tensor (`of`)."""

    def __init__(self, seeds: Sequence[int], vocab: int, device=None):
        self.seeds = [int(s) for s in seeds]
        self.vocab = vocab
        self.device = device
        self._full: "torch.Tensor | None" = None

    @classmethod
    def of(cls, g: "Noise | torch.Tensor") -> "Noise":
        """`g` as a Noise: a Noise stays itself; a [B, vocab] tensor is its full draw."""
        if isinstance(g, Noise):
            return g
        noise = cls([], g.shape[-1], g.device)
        noise._full = g
        return noise

    def drawn_on_cpu(self) -> bool:
        """Not drawn yet, and to be drawn on the CPU (where a path may draw its bits first)."""
        return self._full is None and (self.device is None or str(self.device) == "cpu")

    @property
    def rows(self) -> int:
        return len(self.seeds) if self._full is None else self._full.shape[0]

    def full(self) -> "torch.Tensor":
        """[B, vocab] fp64, drawn once."""
        if self._full is None:
            self._full = gumbel(self.seeds, self.vocab, self.device)
        return self._full

    def at(self, ids: "torch.Tensor") -> "torch.Tensor":
        """[B, n] at token ids ([n] for every row, or [B, n]): the full draw's entries there."""
        if self._full is not None:
            ids = ids.to(self._full.device)
            return self._full.index_select(1, ids) if ids.dim() == 1 else self._full.gather(1, ids)
        return gumbel(self.seeds, self.vocab, self.device, ids=ids)

    def row(self, r: int, ids: "torch.Tensor") -> "torch.Tensor":
        """[n]: row r's noise at token ids [n]."""
        if self._full is not None:
            return self._full[r, ids.to(self._full.device)]
        return gumbel(self.seeds[r: r + 1], self.vocab, self.device, ids=ids)[0]


def offsets(ids: "torch.Tensor") -> "torch.Tensor":
    """The counter offsets (id + 1) * GOLDEN of token ids (int64, wrapping as uint64 would)."""
    import torch

    return (ids.to(torch.int64) + 1).mul_(GOLDEN)


def seed_tensor(seeds: Sequence[int]) -> "torch.Tensor":
    """The rows' seeds as the counter adds them: int64 [len(seeds)] (CPU)."""
    import torch

    return torch.tensor([_int64(int(s)) for s in seeds], dtype=torch.int64)


def noise_bits_of(seeds: Sequence[int], off: "torch.Tensor") -> "torch.Tensor":
    """gumbel's first stage on the CPU: [len(seeds), n] int64, each entry's U as the bits of the
    double 1 + m / 2**52, for counter offsets `off` [n] (`offsets`). A few ms for 8 rows of
    262K ids where the logs of `gumbel_of_bits` on all of them take about 10."""
    import torch

    from tunix_rt.eval.int8_kernel import noise_bits

    seed = seed_tensor(seeds)
    bits = torch.empty((len(seeds), off.shape[-1]), dtype=torch.int64)
    if not noise_bits(seed, off, bits):  # our C kernel, else numpy (the same bits)
        _bits_numpy(seed, off, bits, torch.empty_like(bits), torch.empty_like(bits))
    return bits


def gumbel_of_bits(bits: "torch.Tensor") -> "torch.Tensor":
    """The fp64 noise of entries given by their `noise_bits_of` bits (any subset, any shape): a
    new tensor with the bits of the full draw's entries (each entry alone, numpy's logs)."""
    import torch

    out = bits.to(torch.int64, copy=True).contiguous().view(torch.float64)
    if out.numel():
        _neg_log_neg_log(out.numpy())
    return out


def _neg_log_neg_log(u) -> None:
    """-log(-log U) in place on a numpy fp64 array holding 1 + m / 2**52 (see gumbel)."""
    import numpy as np

    np.subtract(u, 1 - 2.0 ** -53, out=u)
    np.log(u, out=u)
    np.negative(u, out=u)
    np.log(u, out=u)
    np.negative(u, out=u)


def scores(z: "torch.Tensor", g: "torch.Tensor", temperature: float) -> "torch.Tensor":
    """z / T + g in fp64: the quantity whose argmax is the draw (elementwise, so a token's
    score has the same bits whichever other tokens are scored with it)."""
    return (z.double() / temperature).add_(g)


def top_k_allowed(z: "torch.Tensor", k: int) -> "torch.Tensor":
    """[B, n] bool: z >= the k-th largest z of the row (needs n >= k)."""
    import torch

    return z >= torch.topk(z, k, dim=-1).values[..., -1:]


def nucleus(z: "torch.Tensor", temperature: float, top_p: float) -> "torch.Tensor":
    """[n] bool: the top-p rule on one row's allowed logits z [n] (in token-id order)."""
    import torch

    z64 = z.double()
    e = torch.exp((z64 - z64.max()) / temperature)
    total = e.sum()
    # A token with n * e_i <= (1 - p) * total is out: every token at or after it in the order
    # has e_j <= e_i, so the mass before it is at least total - n * e_i >= p * total. Only the
    # rest is sorted (a full sort of 262K logits per row costs more than the decode step).
    cand = (e * e.numel() > (1 - top_p) * total * (1 - NUCLEUS_SLACK)).nonzero().squeeze(1)
    order = torch.sort(z[cand], descending=True, stable=True).indices
    ce = e[cand[order]]
    before = torch.cat([ce.new_zeros(1), torch.cumsum(ce, 0)[:-1]])  # mass strictly before
    keep = torch.zeros(z.shape[0], dtype=torch.bool, device=z.device)
    keep[cand[order[before < top_p * total]]] = True
    return keep


def allowed_ids(z: "torch.Tensor", cfg) -> list["torch.Tensor"]:
    """Per row of z [B, n], the allowed positions (ascending) after top-k, then top-p."""
    import torch

    n = z.shape[-1]
    mask = top_k_allowed(z, cfg.top_k) if 0 < cfg.top_k < n else None
    out = []
    for b in range(z.shape[0]):
        ids = mask[b].nonzero().squeeze(1) if mask is not None else torch.arange(n, device=z.device)
        if cfg.top_p < 1.0:
            ids = ids[nucleus(z[b, ids], cfg.temperature, cfg.top_p)]
        out.append(ids)
    return out


_SCRATCH = threading.local()


def _scratch(shape: tuple[int, int]) -> tuple["torch.Tensor", "torch.Tensor"]:
    """This thread's fp64 and int64 buffers of `shape` for `_draw_bound_first`, kept from one
    decode step to the next: 16 MB each for 8 rows of Gemma's 262K ids, whose fresh pages
    (jemalloc hands such blocks back to the kernel at once) cost more than the passes over them."""
    import torch

    held = getattr(_SCRATCH, "bufs", None)
    if held is None or held[0].shape != shape:
        held = (torch.empty(shape, dtype=torch.float64), torch.empty(shape, dtype=torch.int64))
        _SCRATCH.bufs = held
    return held


def _draw_bound_first(z: "torch.Tensor", g: "Noise", temperature: float) -> "torch.Tensor | None":
    """sample_full's draw without top-k/top-p from full CPU logits z [B, V] and noise not yet
    drawn, with the noise's two logs (most of a full draw's time) only where they can matter:
    the same ids. Each row's best score is at least its top logit's, s* = z*/T + g*; a token
    whose z/T plus an upper bound on its noise read off the counter's bits
    (int8_kernel.noise_screen: no log) stays below s* (less a margin far above fp64 rounding)
    cannot reach it. The others are scored as `scores` scores them, and the first maximum of
    each row taken: every token scoring the row's maximum is among them, so it is the full
    draw's argmax. None (the caller draws every entry) where the kernel library is not loaded,
    a score is not finite, or past BOUND_FIRST_SHARE of the entries."""
    import torch

    from tunix_rt.eval.int8_kernel import noise_screen

    b, v = z.shape
    sc, bits = _scratch((b, v))
    sc.copy_(z).div_(temperature)  # scores' first op, z.double() / T: the same bits
    top = sc.argmax(dim=1, keepdim=True)
    best_lb = sc.gather(1, top)[:, 0].add_(g.at(top)[:, 0])  # s*, as scores adds it
    if not bool(torch.isfinite(best_lb).all()):
        return None
    at = noise_screen(seed_tensor(g.seeds), _vocab_offsets(v, sc.device)[1], sc,
                      best_lb - 1e-6 * (1 + best_lb.abs()), bits, int(BOUND_FIRST_SHARE * b * v))
    if at is None:
        return None
    r, p = at.div(v, rounding_mode="floor"), at.remainder(v)
    s = sc.view(-1)[at].add_(gumbel_of_bits(bits.view(-1)[at]))  # their scores, as scores makes them
    best = torch.full((b,), float("-inf"), dtype=torch.float64).scatter_reduce_(0, r, s, reduce="amax")
    win = s == best[r]
    return torch.full((b,), v, dtype=torch.int64).scatter_reduce_(0, r[win], p[win], reduce="amin")


def sample_full(z: "torch.Tensor", g: "Noise | torch.Tensor", cfg) -> "torch.Tensor":
    """The draw of each row from full logits z [B, V] (fp32) and noise g [B, V] (fp64, or a
    Noise): argmax of z / T + g over the allowed tokens, the first maximum on ties. Computed on
    z's device (g is moved there if it is elsewhere)."""
    import torch

    top_k = 0 < cfg.top_k < z.shape[-1]
    if cfg.top_p >= 1.0 and not top_k and isinstance(g, Noise) and g.drawn_on_cpu() and z.device.type == "cpu":
        picks = _draw_bound_first(z, g, cfg.temperature)
        if picks is not None:
            return picks
    g = Noise.of(g).full().to(z.device)
    if cfg.top_p >= 1.0:
        s = scores(z, g, cfg.temperature)
        if top_k:  # the whole batch at once: a token outside the top-k cannot be the argmax
            s.masked_fill_(~top_k_allowed(z, cfg.top_k), float("-inf"))
        return s.argmax(dim=-1)
    picks = [ids[scores(z[b, ids], g[b, ids], cfg.temperature).argmax()]
             for b, ids in enumerate(allowed_ids(z, cfg))]
    return torch.stack(picks)
