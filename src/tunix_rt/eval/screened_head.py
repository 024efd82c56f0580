"""Greedy argmax over a large vocabulary without the fp32 head matmul: an int8 screen with a
proven error bound, then exact fp32 logits for the few tokens that can still win.

Why: at batch 8 the tied head of Gemma 3 (262,144 x 640, 671 MB in fp32) is more than half of
a decode step's memory traffic on this CPU. Greedy decoding only needs the argmax, and the
argmax is decided by a handful of tokens.

How (all per decode step, rows b of the batch, vocabulary rows v):

1. Weights, once: vocabulary rows sorted by their largest |w| and cut into G equal groups; each
   group g has one int8 scale s_g = max|w| / 127 and rows wq_v = round(w_v / s_g). Kept per
   group: nw_g = max ||w_v||₂ and nd_g = max ||w_v − s_g·wq_v||₂ (the exact quantisation error).
2. Activations, two int8 levels: q1 = round(x / s), q2 = round((x − s·q1)·127 / s) with
   s = max|x| / 127, so x̂ = (s/127)(127·q1 + q2) and |x − x̂| ≤ s/254 per element.
3. One int8 matmul `torch._int_mm([q1; q2], wq.T)` (exact int32: probed for saturation on the
   machine before the screen is built, `int8_matmul_is_exact`) gives comb = 127·acc1 + acc2 (int64 when D > 1040 could overflow int32) and the approximation a = (s/127)·s_g·comb = x̂·ŵ.
4. The bound: x·w − x̂·ŵ = (x − x̂)·w + x̂·(w − ŵ), so by Cauchy–Schwarz
   |x·w − a| ≤ ||x − x̂||·nw_g + ||x̂||·nd_g, plus the fp32 rounding of the reference matmul
   itself (at most D·2⁻²⁴·||x||·||w|| for any summation order), plus a safety margin.
   Call it E_bg. L_b = max over groups of (max_v a − E_bg) is a lower bound on the best logit;
   a token whose a + E_bg < L_b (minus a margin of 1e-3 + 1e-5·|L_b|) provably cannot be the
   argmax. The test is one integer compare per logit: comb ≥ T_bg. (With a softcap the
   margin is taken after the cap, where the argmax is taken.)
5. The survivors (a median of about 1 token per row on GSM8K, at most a few thousand) get their
   exact fp32 logits, as the reference computes them, and the first maximum wins, as
   `torch.argmax` picks it. Gemma 2's final softcap is applied to those exact logits.

Bit-exactness of step 5: MKL's sgemm gives the same bits for a logit when the number of
vocabulary columns is a multiple of 256 (at the same number of rows), so the survivors are
padded to a multiple of 256 columns.
The bench (`benchmarks/bench_generate.py`) and the tests check the ids against full logits.

CPU only (`torch._int_mm` on CUDA wants other shapes, and there the fp32 head is not the
bottleneck); `ScreenedArgmax.build` returns None elsewhere and the caller keeps full logits.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

GROUPS = 64
"""Scale groups (equal-sized after sorting rows by their largest |w|)."""
PAD_COLS = 256
"""The exact rescoring uses a multiple of this many vocabulary columns (see module doc)."""
REL_SAFETY = 1e-4
"""Relative slack on every computed norm (they are computed in fp64; this is generous)."""
ABS_MARGIN = 1e-3
REL_MARGIN = 1e-5


@functools.lru_cache(maxsize=None)
def int8_matmul_is_exact(dim: int) -> bool:
    """Probe `torch._int_mm` on this machine at contraction length `dim` with the values that
    would overflow an int16 pair sum (AVX2's vpmaddubsw saturates there; a VNNI or AMX kernel
    does not) and with random ones, at the row counts a decode uses: the bound assumes exact
    int32 sums, so a kernel that is not exact here turns the screen off."""
    import torch

    cols = 512
    g = torch.Generator().manual_seed(0)
    for rows in (2, 16):
        for xv, wv in ((127, 127), (-127, 127), (-127, -127)):
            xq = torch.full((rows, dim), xv, dtype=torch.int8)
            wq = torch.full((cols, dim), wv, dtype=torch.int8)
            if not torch.equal(torch._int_mm(xq, wq.t()), torch.full((rows, cols), xv * wv * dim, dtype=torch.int32)):
                return False
        xq = torch.randint(-127, 128, (rows, dim), dtype=torch.int8, generator=g)
        wq = torch.randint(-127, 128, (cols, dim), dtype=torch.int8, generator=g)
        if not torch.equal(torch._int_mm(xq, wq.t()).long(), xq.long() @ wq.long().t()):
            return False
    return True


class ScreenedArgmax:
    """argmax_v (x @ head.T)[b, v] (after an optional softcap), with int8 screening."""

    def __init__(self, head: "torch.Tensor", softcap: float | None = None, groups: int = GROUPS,
                 pad_cols: int = PAD_COLS):
        import torch

        if head.dim() != 2 or head.dtype != torch.float32:
            raise ValueError("the head must be a 2-D fp32 matrix")
        vocab, dim = head.shape
        self.head = head
        self.softcap = softcap
        self.vocab, self.dim = vocab, dim
        self.groups = max(1, min(groups, vocab))
        per = -(-vocab // self.groups)
        padded = per * self.groups
        with torch.no_grad():
            rowmax = head.abs().amax(1)
            order = torch.argsort(rowmax, stable=True)
            if padded > vocab:  # pad with copies of real rows: their logits are real logits
                order = torch.cat([order, order[: padded - vocab]])
            self.perm = order  # position in the screen -> token id
            self.wq = torch.empty((padded, dim), dtype=torch.int8)
            scale = torch.empty(self.groups, dtype=torch.float64)
            nw = torch.empty(self.groups, dtype=torch.float64)
            nd = torch.empty(self.groups, dtype=torch.float64)
            tiny = torch.finfo(torch.float32).tiny
            for g in range(self.groups):  # one group at a time: no full-size fp64 copies
                rows = head.index_select(0, order[g * per: (g + 1) * per])
                sg = (rows.abs().amax() / 127).clamp_min(tiny)
                q = torch.round(rows / sg).clamp_(-127, 127)
                self.wq[g * per: (g + 1) * per] = q.to(torch.int8)
                rows64 = rows.double()
                scale[g] = sg.double()
                nw[g] = rows64.norm(dim=1).amax()
                nd[g] = (rows64 - q.double() * scale[g]).norm(dim=1).amax()  # exact error, fp64
            self.scale = scale
            self.nw = nw * (1 + REL_SAFETY)
            self.nd = nd * (1 + REL_SAFETY)
        self.wide = 128 * 127 * 127 * dim >= 2**31
        """comb = 127*acc1 + acc2 can pass int32 above D = 1040 (Gemma 3 1B, Gemma 2 2B):
        it is then formed in int64."""
        self.per = per
        self.pad_cols = max(1, pad_cols)
        self.gamma = dim * 2.0**-24 / (1 - dim * 2.0**-24)
        self.steps = 0
        self.candidates = 0
        """Running totals: screened rows and tokens rescored exactly (for benchmarks)."""

    @classmethod
    def build(cls, head: "torch.Tensor", softcap: float | None = None) -> "ScreenedArgmax | None":
        """The screen for a CPU fp32 head, or None where it does not apply."""
        import torch

        if head.device.type != "cpu" or head.dtype != torch.float32 or not hasattr(torch, "_int_mm"):
            return None
        if head.shape[0] < 4 * PAD_COLS:
            return None  # a small vocabulary: the plain matmul is already cheap
        if not int8_matmul_is_exact(head.shape[1]):
            return None  # this CPU's int8 kernel saturates: no bound would hold
        return cls(head, softcap)

    def argmax(self, x: "torch.Tensor") -> "torch.Tensor":
        """The greedy next token of each row of x [B, D] (fp32)."""
        import torch

        b = x.shape[0]
        if not bool(torch.isfinite(x).all()):  # no bound holds: full logits, as the reference
            tokens, cand = torch.arange(self.vocab), torch.arange(self.vocab)
        else:
            cand = self.candidates_of(x)
            tokens = self._padded(cand)
        exact = torch.mm(x, self.head.index_select(0, tokens).t())
        if self.softcap is not None:
            exact = torch.tanh(exact / self.softcap) * self.softcap
        self.steps += b
        self.candidates += int(cand.numel()) * b
        return tokens[exact.argmax(dim=1)]

    def candidates_of(self, x: "torch.Tensor") -> "torch.Tensor":
        """Sorted token ids that may hold some row's maximum (the union over the rows)."""
        import torch

        b, g = x.shape[0], self.groups
        sx = (x.abs().amax(1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
        q1 = torch.round(x / sx[:, None]).clamp_(-127, 127)
        q2 = torch.round((x - q1 * sx[:, None]) * 127 / sx[:, None]).clamp_(-127, 127)
        acc = torch._int_mm(torch.cat([q1, q2]).to(torch.int8), self.wq.t())  # [2B, V] int32
        if self.wide:
            comb = acc[b:].long().add_(acc[:b].long(), alpha=127).view(b, g, self.per)
        else:
            comb = acc[b:].add_(acc[:b], alpha=127).view(b, g, self.per)  # 127*q1 + q2, exact
        top = comb.amax(2).double()  # [B, G]

        x64 = x.double()
        c = sx.double() / 127  # x̂ = c * (127 q1 + q2)
        xh = (q1.double() * 127 + q2.double()) * c[:, None]
        dx = (x64 - xh).norm(dim=1) * (1 + REL_SAFETY)
        nxh = xh.norm(dim=1) * (1 + REL_SAFETY)
        nx = x64.norm(dim=1) * (1 + REL_SAFETY)
        err = dx[:, None] * self.nw + nxh[:, None] * self.nd + self.gamma * nx[:, None] * self.nw
        step = c[:, None] * self.scale[None, :]  # logit per unit of comb, [B, G]
        low = self._margin((step * top - err).amax(1))  # under each row's best logit
        thr = torch.floor((low[:, None] - err) / step).clamp_(-(2.0**31), 2.0**31 - 1)
        keep = comb >= thr.to(comb.dtype)[:, :, None]
        pos = keep.view(b, -1).any(0).nonzero().squeeze(1)
        return torch.unique(self.perm.index_select(0, pos))

    def _margin(self, low: "torch.Tensor") -> "torch.Tensor":
        """The threshold below a lower bound on the best logit under which no token can win,
        with the margin taken where the argmax is taken: after the softcap, whose rounding
        could otherwise tie a raw logit just under the bound with the best one (at large
        logits tanh flattens many raw values onto one float)."""
        import torch

        if self.softcap is None:
            return low - (ABS_MARGIN + REL_MARGIN * low.abs())
        c = float(self.softcap)
        capped = torch.tanh(low / c) * c
        capped = capped - (ABS_MARGIN + REL_MARGIN * capped.abs())
        ratio = capped / c
        raw = torch.atanh(ratio.clamp(-1 + 1e-12, 1 - 1e-12)) * c
        return torch.where(ratio > -1 + 1e-12, raw, torch.full_like(raw, float("-inf")))

    def _padded(self, tokens: "torch.Tensor") -> "torch.Tensor":
        """tokens (sorted, unique) plus filler ids up to a multiple of PAD_COLS, sorted."""
        import torch

        want = -(-max(1, tokens.numel()) // self.pad_cols) * self.pad_cols
        if want >= self.vocab:
            return torch.arange(self.vocab)
        if tokens.numel() == want:
            return tokens
        taken = torch.zeros(self.vocab, dtype=torch.bool)
        taken[tokens] = True
        filler = (~taken[: want + tokens.numel()]).nonzero().squeeze(1)[: want - tokens.numel()]
        return torch.cat([tokens, filler]).sort().values
