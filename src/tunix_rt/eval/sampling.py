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

The noise: g_i = -log(E_i) with E_i ~ Exp(1) (numpy's ziggurat, fp64; -log of an Exp(1)
variate is exactly Gumbel(0, 1)), one generator per row and decode step, seeded by a hash of
(seed, the row's key, step). The key is the prompt's index unless the caller gives its own
(RL seeds per train step, prompt and sample), so a row's noise does not depend on which
prompts share its batch or which rows already finished.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Sequence, Union

if TYPE_CHECKING:
    import torch

Key = Union[int, tuple[int, ...]]
"""A row's noise key: an int (the prompt index by default; k is the same key as (k,)) or a
tuple of ints."""

NUCLEUS_SLACK = 1e-9
"""Relative slack of the top-p pre-filter (the fp64 sums it compares are exact to ~1e-11)."""


def row_seed(seed: int, key: Key, step: int) -> int:
    """A 128-bit seed for one row's noise at one decode step: blake2b of the three, so any
    change of seed, key or step gives unrelated noise."""
    parts = (int(seed), int(step), *(key if isinstance(key, tuple) else (key,)))
    text = ",".join(str(int(p)) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=16).digest(), "little")


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


def gumbel(seeds: Sequence[int], vocab: int) -> "torch.Tensor":
    """[len(seeds), vocab] fp64 Gumbel(0, 1) noise, row r drawn from a generator seeded by
    seeds[r] (see row_seed)."""
    import numpy as np
    import torch

    e = np.empty((len(seeds), vocab))
    for r, s in enumerate(seeds):
        np.random.Generator(np.random.PCG64(s)).standard_exponential(vocab, out=e[r])
    # numpy's log, in place: ~5x faster than torch's fp64 log on these CPUs (a sampled decode
    # step of a 262K vocabulary paid ~20 ms of it per 8 rows)
    return torch.from_numpy(np.negative(np.log(e, out=e), out=e))


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
    keep = torch.zeros(z.shape[0], dtype=torch.bool)
    keep[cand[order[before < top_p * total]]] = True
    return keep


def allowed_ids(z: "torch.Tensor", cfg) -> list["torch.Tensor"]:
    """Per row of z [B, n], the allowed positions (ascending) after top-k, then top-p."""
    import torch

    n = z.shape[-1]
    mask = top_k_allowed(z, cfg.top_k) if 0 < cfg.top_k < n else None
    out = []
    for b in range(z.shape[0]):
        ids = mask[b].nonzero().squeeze(1) if mask is not None else torch.arange(n)
        if cfg.top_p < 1.0:
            ids = ids[nucleus(z[b, ids], cfg.temperature, cfg.top_p)]
        out.append(ids)
    return out


def sample_full(z: "torch.Tensor", g: "torch.Tensor", cfg) -> "torch.Tensor":
    """The draw of each row from full logits z [B, V] (fp32) and noise g [B, V] (fp64):
    argmax of z / T + g over the allowed tokens, the first maximum on ties."""
    import torch

    device, z = z.device, z.cpu()  # the noise lives on the CPU (numpy generators)
    if cfg.top_p >= 1.0 and not 0 < cfg.top_k < z.shape[-1]:
        return scores(z, g, cfg.temperature).argmax(dim=-1).to(device)
    picks = [ids[scores(z[b, ids], g[b, ids], cfg.temperature).argmax()]
             for b, ids in enumerate(allowed_ids(z, cfg))]
    return torch.stack(picks).to(device)
