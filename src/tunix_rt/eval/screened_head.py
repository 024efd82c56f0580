"""The next token over a large vocabulary without the fp32 head matmul: an int8 screen with a
proven error bound, then exact fp32 logits for the few tokens that can still be chosen.
Greedy (argmax) and sampling (Gumbel-max, `tunix_rt.eval.sampling`) give bit-identical ids
to full logits.

Why: at batch 8 the tied head of Gemma 3 (262,144 x 640, 671 MB in fp32) is more than half of
a decode step's memory traffic on this CPU. A token is decided by a handful of logits.

How (all per decode step, rows b of the batch, vocabulary rows v):

1. Weights, once: vocabulary rows sorted by their largest |w| and cut into G equal groups; each
   group g has one int8 scale s_g = max|w| / 127 and rows wq_v = round(w_v / s_g). Kept per
   group: nw_g = max ||w_v||₂ and nd_g = max ||w_v − s_g·wq_v||₂ (the exact quantisation error).
2. Activations, two int8 levels: q1 = round(x / s), q2 = round((x − s·q1)·127 / s) with
   s = max|x| / 127, so x̂ = (s/127)(127·q1 + q2) and |x − x̂| ≤ s/254 per element.
3. One int8 matmul `[q1; q2] @ wq.T` (tunix_rt.eval.int8_kernel.int_mm: our AVX-512 VNNI
   kernel where the CPU has one, else torch._int_mm) gives comb = 127·acc1 + acc2 (int64 when
   D > 1040 could overflow int32) and the approximation a = (s/127)·s_g·comb = x̂·ŵ.
4. The bound: x·w − x̂·ŵ = (x − x̂)·w + x̂·(w − ŵ), so by Cauchy–Schwarz
   |x·w − a| ≤ ||x − x̂||·nw_g + ||x̂||·nd_g, plus the fp32 rounding of the reference matmul
   itself (at most γ·||x||·||w||, γ = D·2⁻²⁴/(1 − D·2⁻²⁴), for any summation order), plus a
   margin of 1e-3 + 1e-5·|logit| taken where the decision is made (after Gemma 2's softcap).
   Call it E_bg: the fp32 logit of token v lies in [a_v − E_bg, a_v + E_bg].
5. Greedy: L_b = max over groups of (max_v a − E_bg) is a lower bound on the best logit; a
   token with a + E_bg < L_b provably cannot be the argmax: one integer compare per logit,
   comb ≥ T_bg.
   Sampling (token = argmax of z/T + g over the allowed tokens, `tunix_rt.eval.sampling`),
   per token with the row's noise g: without top-k/top-p, a token whose upper bound / T + g_v
   is below the best lower bound / T + g_j cannot be drawn (with noise not yet drawn, its two
   logs are taken only for the tokens whose upper bound / T plus a bound on g_v read off the
   counter's bits reaches a threshold below every row's best: `_reach_bound_first`, the same
   tokens kept); with top-k, a token whose upper
   bound is below the k-th largest lower bound cannot be in the top-k; with top-p alone, the
   tokens below a cut hold a bounded mass, so the normaliser lies between two bounds and each
   nucleus decision is taken only where it is the same at both (else full logits). Top-p
   weighs the whole tail, so it adds a fine level: the weights' quantisation residual as a
   second int8 matrix, which cuts E about 40x on Gemma 3 270M (median 1.7 -> 0.033 logits).
   That path is exact but slower than the fp32 head on this CPU, so it is off by default
   (`certify_top_p`): top-p alone takes full logits, top-k (with or without top-p) screens.
6. The survivors (a median of about 1 token per row on GSM8K when greedy) get their exact fp32
   logits, as the reference computes them, and the same rule as on full logits picks the
   token (the first maximum on ties, as `torch.argmax`). Past a quarter of the vocabulary the
   full matmul is cheaper than copying the rows, and is taken (the same bits).

When no bound holds the step takes full logits (`full_rows` counts the rows), as the
reference: a hidden state that is not finite; |x|·|w| near fp32 overflow, where the reference
matmul's partial sums could round to inf and the rounding bound of 4. no longer holds (every
product and partial sum is at most (1 + γ)·||x||·||w|| in magnitude, so below FLT_MAX the
bound holds); a bound that is NaN or infinite; an int8 kernel that is not exact at this shape.
Underflow costs at most D·2⁻¹⁴⁹ per logit, inside the margin. A head with a non-finite weight
gets no screen at all (`build` returns None).

The int8 kernel: the bound assumes exact int32 sums. oneDNN's AVX2 and AVX-512 (non-VNNI)
kernels saturate int16 pair sums (vpmaddubsw; measured here with ONEDNN_MAX_CPU_ISA=AVX2);
VNNI and AMX do not. oneDNN picks its implementation by ISA and shape, so
`int8_matmul_is_exact` probes each shape the screen serves ([2B, D] x [D, V'] for B rows
alive), once per process, before the screen uses it. Where our own kernel serves it
(tunix_rt.eval.int8_kernel: vpdpbusd, which does not saturate) the sums are exact by
construction and nothing is probed (0.95 s saved on Gemma 3 270M for batches of 1 to 8).

Bit-exactness of 6.: MKL's sgemm gives the same bits for a logit when the number of
vocabulary columns is a multiple of 256 (at the same number of rows), so the survivors are
padded to a multiple of 256 columns. The bench (`benchmarks/bench_generate.py`) and the tests
check the ids against full logits.

CPU only (`torch._int_mm` on CUDA wants other shapes, and there the fp32 head is not the
bottleneck); `ScreenedArgmax.build` returns None elsewhere and the caller keeps full logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tunix_rt.eval.int8_kernel import int_mm, pack_vnni_, row_sums, serves, unpack_vnni
from tunix_rt.eval.sampling import (BOUND_FIRST_SHARE, Noise, allowed_ids, gumbel_of_bits, noise_bits_of,
                                    offsets, sample_full, scores, seed_tensor)

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
FLT_MAX = 3.4028234663852886e38
SCORE_SLACK = 1e-9
"""Relative slack on fp64 scores and sums of masses (a sum of 2^20 positive terms is exact to
1.2e-10 in any order)."""
TAIL_SHARES = (0.2, 0.02)
"""top-p: the tokens left unscored may hold at most this share of (1 − p) of the normaliser
(upper bounds): first a generous cut, which decides most rows, then a tight one for the rows
whose nucleus decision it could not settle; the rest take full logits."""
BINS = 240
"""top-p: the cut is searched in bins of 1/4 of (logit − best lower bound) / T, down to −60."""
RESCORE_BLOCK = 4096
"""Candidates rescored this many head rows at a time (a multiple of PAD_COLS)."""
FULL_SHARE = 0.6
"""Beyond this share of the vocabulary, gathering the candidates' rows costs more than the full
matmul: the step takes full logits (the same bits). Measured on a GRPO rollout's sampling steps
(Gemma 3 270M, 8 rows, T = 1, 2-core Xeon; in flat rows the coarse screen leaves tens of
thousands of tokens): 18.6 s with 0.25 and the candidates copied at once, 15.2 s with 0.6 and
the rows gathered a block at a time."""
WIDE_ROW = 16384
"""A row the screen leaves more candidates than this takes full logits on its own (with at most
`MAX_WIDE` such rows in the batch), the others are rescored as usual. Such rows come from a
hidden state of outsized norm, whose bound spans tens of logits: in a GRPO rollout of Gemma 3
270M (8 rows, T = 1) one row at ||x|| 400-800 against ~100 left 35-120k candidates (error
bounds 20-47) at 72 of 127 steps, and every row paid for its union. On the 2-core Xeon a 2-row
matmul over the whole vocabulary takes 26 ms; gathering 87k head rows for 8 rows, 94 ms."""
MAX_WIDE = 2
G_MIN = -3.61
"""Below the smallest Gumbel noise the counter can give: -log(-log(2**-53)) = -3.6037."""
INT32_MIN = -(2**31)


def _score_slack(size: "torch.Tensor", ap: Approx, t: float) -> "torch.Tensor":
    """[B] the rounding slack on fp64 scores z / T + g of a row whose best score is `size` in
    magnitude: |z / T + g| <= (||x||·nw + err) / T + 1e3 (-log of a positive double is below 745)."""
    return SCORE_SLACK * (size + (ap.bound_x.amax(1) + ap.err.amax(1)) / t + 1e3)


PROBED: dict[tuple[int, int, int], bool] = {}
"""(rows, dim, cols) -> whether the int8 matmul (`int_mm`) is exact at that shape, filled as the screen
first serves each shape (this process)."""


def int8_matmul_is_exact(rows: int, dim: int, cols: int) -> bool:
    """Whether the int8 matmul (`int_mm`, whichever kernel serves it here) at exactly this shape
    ([rows, dim] x [dim, cols]) sums exactly,
    probed once per shape. The matrix holds all-127 and all-(-127) rows against all-127 and
    all-(-127) activations (the values that overflow an int16 pair sum, where AVX2's
    vpmaddubsw saturates) and random ones, tiled from one 256-row block so the expected result
    costs a small fp64 matmul (exact: every sum is below 2^53)."""
    import torch

    shape = (rows, dim, cols)
    if shape not in PROBED and serves(dim):
        PROBED[shape] = True  # our VNNI kernel: exact by construction (int8_kernel's doc)
    if shape not in PROBED:
        g = torch.Generator().manual_seed(0)
        block = torch.randint(-127, 128, (256, dim), dtype=torch.int8, generator=g)
        block[0], block[1] = 127, -127
        xq = torch.randint(-127, 128, (rows, dim), dtype=torch.int8, generator=g)
        xq[0] = 127
        xq[rows - 1] = -127
        reps = -(-cols // 256)
        want = (xq.double() @ block.double().t()).to(torch.int32).repeat(1, reps)[:, :cols]
        PROBED[shape] = torch.equal(int_mm(xq, block.repeat(reps, 1)[:cols]), want)
    return PROBED[shape]


PAIRED: dict[tuple[int, int, int], bool] = {}
"""(rows, vocab, dim) -> whether a 2-row fp32 matmul against the head gives each row the bits
of a `rows`-row one (this process)."""


def pair_rows_match(head: "torch.Tensor", rows: int) -> bool:
    """Whether `torch.mm` of two rows against this head (its whole vocabulary) gives each row
    the bits it gets among `rows` rows, probed once per shape on the head itself with random
    rows (the summation order is the kernel's, chosen by shape, not by the values). MKL's one-row
    product (a matrix-vector kernel) sums in another order; two rows and more sum as a batch
    does on the CPUs seen here, but that is the library's choice, so it is checked."""
    import torch

    key = (rows, head.shape[0], head.shape[1])
    if rows <= 2:
        return True  # two rows are the batch itself (a pair of one row is [r, r] only then)
    if key not in PAIRED:
        g = torch.Generator().manual_seed(0)
        x = torch.randn((rows, head.shape[1]), generator=g)
        full = torch.mm(x, head.t())
        pick = [1, rows - 1]
        PAIRED[key] = (torch.equal(torch.mm(x[pick], head.t()), full[pick])
                       and torch.equal(torch.mm(x[[0, 0]], head.t())[0], full[0]))
    return PAIRED[key]


FAST: list[bool] = []
"""Whether this process's int8 kernel beats the fp32 head matmul (measured once)."""


def int8_matmul_is_fast(dim: int = 640, cols: int = 8192, reps: int = 3) -> bool:
    """Whether the int8 matmul (`int_mm`) at head-sized shapes takes less time than the fp32
    matmul it replaces, decided once per process. Where our kernel serves `dim` (`serves`) it is,
    without a probe: it reads a quarter of fp32's bytes. Elsewhere it is measured (best of
    `reps` after a warm-up call each) at [2, dim] x [dim, cols] (a one-row step's screen) and at
    [16, dim] (a batch of eight's), and must win at both. Where oneDNN has no fast int8 kernel for
    the CPU it may run a reference one: exact, but ~12x slower than fp32 (seen on a 2-core AMD
    EPYC: 2.0 s against 0.16 s for Gemma 3's [16, 640] x [640, 262144] head), and the screen
    would then slow every decode step down instead of speeding it up. torch's CPU `_int_mm`
    grows with the rows where the fp32 matmul hardly does: a probe at 2 rows alone once let it
    through on a 2-core AMD EPYC (Zen 3, AVX2), and a GRPO step's rollouts took 193.5 s, 90% of
    it in that product (`bench_grpo.py --sides ours`; 24.8 s on our AVX2 kernel)."""
    import time

    import torch

    if not FAST:
        if serves(dim):
            FAST.append(True)
            return True
        g = torch.Generator().manual_seed(0)
        wq = torch.randint(-127, 128, (cols, dim), dtype=torch.int8, generator=g)
        w = wq.float()
        sums = row_sums(wq)

        def best(fn) -> float:
            fn()
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            return min(times)

        fast = True
        for rows in (2, 16):
            xq = torch.randint(-127, 128, (rows, dim), dtype=torch.int8, generator=g)
            x = xq.float()
            fast = fast and best(lambda: int_mm(xq, wq, sums)) < best(lambda: x @ w.t())
        FAST.append(fast)
    return FAST[0]


def int_thresholds(low: "torch.Tensor", err: "torch.Tensor", step: "torch.Tensor", dtype) -> "torch.Tensor":
    """floor((low_b − err_bg) / step_bg) as integers of `dtype`: comb below it cannot reach
    low_b. A bound that is NaN or infinite keeps every token of that row and group (INT32_MIN):
    no NaN is ever cast to an integer (that cast is undefined)."""
    import torch

    thr = torch.floor((low[:, None] - err) / step)
    thr = torch.where(torch.isfinite(thr), thr, torch.full_like(thr, INT32_MIN))
    return thr.clamp_(INT32_MIN, 2**31 - 1).to(dtype)


@dataclass
class Approx:
    """One step's screen: comb [B, G, per] (integers) and per row and group the logit per unit
    of comb (`step`) and the error bound (`err`), both [B, G] fp64."""

    comb: "torch.Tensor"
    step: "torch.Tensor"
    err: "torch.Tensor"
    bound_x: "torch.Tensor"  # [B, G]: ||x||·nw_g, a bound on |logit| (Cauchy–Schwarz)
    residual: "torch.Tensor | None" = None
    """[B, G, per] fp64, the fine level: x̂·r̂ (the int8 quantised weight residual), already
    added into the approximation that `err` bounds."""
    lhs: "torch.Tensor | None" = None  # [2B, D] int8: the activations' two levels, q1 then q2
    c: "torch.Tensor | None" = None  # [B]: x̂ = c·(127·q1 + q2)
    dx: "torch.Tensor | None" = None  # [B]: a bound on ||x − x̂||
    nxh: "torch.Tensor | None" = None  # [B]: a bound on ||x̂||


class _TopPTail:
    """For top-p through the screen, per row: the mass w = exp((upper − m) / T) of every token
    at its upper bound (m: a lower bound on the row's best logit, so the normaliser is at least
    1 in these units; at its lower bound a token's mass is at least w·exp(−span_g / T)), and
    the upper-bound mass per bin of 1/4 in (upper − m) / T, down to −BINS/4. A cut between
    bins leaves out the tokens below it, whose mass lies between those two sums."""

    def __init__(self, up: "torch.Tensor", span: "torch.Tensor", t: float, vocab: int):
        import torch

        b = up.shape[0]
        self.t = t
        self.m = (up.amax(2) - span).amax(1)
        u = up.sub_(self.m[:, None, None]).div_(t)  # in place: `up` is not needed after this
        u.view(b, -1)[:, vocab:] = float("-inf")  # the padding copies: no mass, never inside
        self.u = u.view(b, -1)
        self.w = torch.exp(u)
        self.decay = torch.exp(-span / t)  # [B, G]
        self.total_lo = (self.w.sum(2) * self.decay).sum(1)  # a lower bound on the normaliser
        self.bins = (u * 4).clamp_(min=-BINS).floor_().long().add_(BINS).view(b, -1)
        width = int(self.bins.max()) + 1
        flat = (self.bins + torch.arange(b)[:, None] * width).view(-1)
        mass = torch.bincount(flat, weights=self.w.view(-1), minlength=b * width).view(b, width)
        self.below = torch.cumsum(mass, 1)  # upper-bound mass of the bins up to each one

    def cut(self, share: float):
        """Leave out the lowest bins whose upper-bound mass stays within `share` of the
        normaliser's lower bound: (inside [B, V'], the left-out mass's lower and upper bound
        [B], the largest left-out upper bound on a logit [B])."""
        b, g = self.w.shape[:2]
        n_out = (self.below <= share * self.total_lo[:, None]).sum(1)  # bins left out
        inside = self.bins >= n_out[:, None]
        out = (self.w * ~inside.view(b, g, -1)).sum(2)  # [B, G]
        top_out = self.u.masked_fill(inside, float("-inf")).amax(1)
        return inside, (out * self.decay).sum(1), out.sum(1), self.m + self.t * top_out


#: rows of the head per block while the screen is built (no whole [V, D] temporary: for Gemma
#: 3 270M, |head| in fp32 was 671 MB, the peak of an RL step's decode)
BUILD_ROWS = 8192
#: rows of a group quantised together (their fp64 copies stay in cache)
BUILD_BLOCK = 1024


def _rows_over(keep: "torch.Tensor", n: int) -> list[int]:
    """The rows of keep [B, V] (bool, contiguous) with more than n True entries. A row's
    nonzero 8-byte words, times 8, bound its count from above, so only the rows whose bound
    passes n are counted byte by byte (a decode step's [8, 262144] mask: ~0.2 ms against
    ~2 ms for torch.count_nonzero on the bools)."""
    import torch

    b, v = keep.shape
    if v % 8 == 0 and keep.is_contiguous() and keep.data_ptr() % 8 == 0:
        maybe = (torch.count_nonzero(keep.view(torch.int64), 1) * 8 > n).nonzero().squeeze(1)
        if maybe.numel() == 0:
            return []
    else:
        maybe = torch.arange(b)
    counts = keep.index_select(0, maybe).view(torch.uint8).sum(1, dtype=torch.int64)
    return maybe[counts > n].tolist()


class ScreenedArgmax:
    """The next token of x @ head.T (after an optional softcap), greedy or sampled, with int8
    screening; build with `ScreenedArgmax.build`."""

    def __init__(self, head: "torch.Tensor", softcap: float | None = None, groups: int = GROUPS,
                 pad_cols: int = PAD_COLS, certify_top_p: bool = False):
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
            rowmax = torch.cat([head[i:i + BUILD_ROWS].abs().amax(1) for i in range(0, vocab, BUILD_ROWS)])
            if not bool(torch.isfinite(rowmax).all()):  # abs and amax carry a NaN or an inf through
                raise ValueError("the head has a non-finite weight: no bound holds")
            order = torch.argsort(rowmax, stable=True)
            if padded > vocab:  # pad with copies of real rows: their logits are real logits
                order = torch.cat([order, order[: padded - vocab]])
            self.perm = order  # position in the screen -> token id (positions >= vocab: copies)
            self.inv = torch.empty(vocab, dtype=torch.long)
            self.inv[order[:vocab]] = torch.arange(vocab)  # token id -> its position in the screen
            self.wq = torch.empty((padded, dim), dtype=torch.int8)
            scale = torch.empty(self.groups, dtype=torch.float64)
            nw = torch.empty(self.groups, dtype=torch.float64)
            nd = torch.empty(self.groups, dtype=torch.float64)
            tiny = torch.finfo(torch.float32).tiny
            for g in range(self.groups):  # one group at a time, in blocks: no large fp64 copies
                part = order[g * per: (g + 1) * per]
                sg = (rowmax.index_select(0, part).amax() / 127).clamp_min(tiny)  # max |w| of the group
                scale[g] = sg.double()
                top_w = top_d = 0.0
                for a in range(0, per, BUILD_BLOCK):
                    rows = head.index_select(0, part[a: a + BUILD_BLOCK])
                    q = torch.round(rows / sg).clamp_(-127, 127)
                    self.wq[g * per + a: g * per + a + rows.shape[0]] = q.to(torch.int8)
                    rows64 = rows.double()
                    top_w = max(top_w, float(torch.linalg.vector_norm(rows64, dim=1).amax()))
                    err = q.double().mul_(scale[g]).neg_().add_(rows64)  # the exact error, fp64
                    top_d = max(top_d, float(torch.linalg.vector_norm(err, dim=1).amax()))
                nw[g], nd[g] = top_w, top_d
            self.scale = scale
            self.sums = row_sums(self.wq)  # for the int8 kernel (tunix_rt.eval.int8_kernel)
            self.vnni = serves(dim)
            """wq in the kernel's broadcast layout (int8_kernel.pack_vnni: the screen's product about
            twice as fast as on row-major rows at 1 to 16 rows), where the kernel serves it."""
            if self.vnni:
                pack_vnni_(self.wq)  # in place: no second copy
            self.nw = nw * (1 + REL_SAFETY)
            self.nd = nd * (1 + REL_SAFETY)
        self.wide = 128 * 127 * 127 * dim >= 2**31
        """comb = 127*acc1 + acc2 can pass int32 above D = 1040 (Gemma 3 1B, Gemma 2 2B):
        it is then formed in int64."""
        self.per = per
        self.pad_cols = max(1, pad_cols)
        self.gamma = dim * 2.0**-24 / (1 - dim * 2.0**-24)
        self.certify_top_p = certify_top_p
        """Top-p without top-k through the screen (certified nucleus, `_sample_top_p`); off by
        default, where such a step takes full logits: on the AVX-512 VNNI CPU here (no AMX)
        the fine level's second int8 matmul plus the per-token tail cost more than the fp32
        head (bench_generate.py --mode sample). Top-k, with or without top-p, always screens."""
        self._fine = None  # the residual level (see _residual_level), built on first use
        self._fine_sums = None
        self.refine_at: int | None = None
        """Sampling without top-k/top-p: past this many tokens left by the coarse screen (a
        flat row), add the fine level (one more int8 matmul) before rescoring; None: never.
        Off by default: the fine level is a second int8 copy of the head (+168 MB resident on
        Gemma 3 270M, which an RL step's peak memory pays). With 8192 a GRPO rollout's
        sampling steps took 12.2 s against 15.2 (2-core Xeon, the same ids)."""
        self.kernel = False
        """Exact logits through the kernel library's fp32 product (`kernel_view`), not torch's."""
        self._kernel_view: "ScreenedArgmax | None" = None
        self.steps = 0
        self.candidates = 0
        self.full_rows = 0
        self.refined = 0
        self.wide_rows = 0
        """Running totals: rows decided through the screen, tokens rescored exactly for them
        (summed over those rows), rows decided on full logits (see the module doc), rows of
        the sampling steps that took the fine level (`refine_at`), rows the screen left too
        many candidates that took full logits on their own (`WIDE_ROW`; counted in `steps`
        and `candidates` too)."""

    @classmethod
    def build(cls, head: "torch.Tensor", softcap: float | None = None) -> "ScreenedArgmax | None":
        """The screen for a CPU fp32 head, or None where it does not apply: not CPU fp32, a
        small vocabulary (the plain matmul is already cheap), a non-finite weight, or an int8
        kernel that saturates (no bound would hold) or that is slower than the fp32 matmul
        (`int8_matmul_is_fast`)."""
        import torch

        if head.device.type != "cpu" or head.dtype != torch.float32 or not hasattr(torch, "_int_mm"):
            return None
        if head.dim() != 2 or head.shape[0] < 4 * PAD_COLS:
            return None
        try:
            screen = cls(head, softcap)
        except ValueError:  # a non-finite weight (checked there, once): no bound holds
            return None
        return screen if screen.kernel_exact(1) and int8_matmul_is_fast() else None

    def kernel_view(self) -> "ScreenedArgmax":
        """This screen (the same int8 copy and bounds) deciding on the kernel library's fp32
        logits (int8_kernel.f32_linear / f32_rows) for batches of up to 8 rows: the decode
        step of an RL run's rollouts (fast_gemma.LeanGemma.f32_kernel), whose reference is then
        the kernel's full logits. Each of the kernel's logits is one sum in a fixed order, so
        any subset of the vocabulary read in place has the bits of the whole product's columns:
        the candidates are rescored without a gathered copy of their head rows (a GRPO
        rollout's first step gathered up to 78k rows a decode step), and a wide row needs no
        pairing. Its own running totals. Itself where the kernel is not loaded."""
        from tunix_rt.eval.int8_kernel import f32_applies

        if self.kernel or not f32_applies(self.head[:1], self.head):
            return self
        if self._kernel_view is None:
            import copy

            view = copy.copy(self)
            view.kernel, view._kernel_view = True, None
            view.steps = view.candidates = view.full_rows = view.refined = view.wide_rows = 0
            self._kernel_view = view
        return self._kernel_view

    def _on_kernel(self, rows: int) -> bool:
        from tunix_rt.eval.int8_kernel import F32_MAX_ROWS

        return self.kernel and 1 <= rows <= F32_MAX_ROWS

    def kernel_exact(self, batch: int) -> bool:
        """The int8 kernel is exact at the shape a step with `batch` rows uses (probed once)."""
        return int8_matmul_is_exact(2 * batch, self.dim, self.wq.shape[0])

    # -----------------------------------------------------------------------------------
    # Greedy

    def argmax(self, x: "torch.Tensor") -> "torch.Tensor":
        """The greedy next token of each row of x [B, D] (fp32)."""
        ap = self.approx(x)
        if ap is None:
            return self._full(x).argmax(dim=1)
        return self._decide(x, self._greedy_keep(ap), lambda z, rows, tokens: z.argmax(dim=1))

    def candidates_of(self, x: "torch.Tensor") -> "torch.Tensor":
        """Sorted token ids that may hold some row's maximum (the union over the rows); every
        token where no bound holds."""
        import torch

        ap = self.approx(x)
        return torch.arange(self.vocab) if ap is None else self._greedy_candidates(ap)

    def _greedy_candidates(self, ap: Approx) -> "torch.Tensor":
        import torch

        pos = self._greedy_keep(ap).any(0).nonzero().squeeze(1)
        return torch.unique(self.perm.index_select(0, pos))

    def _greedy_keep(self, ap: Approx) -> "torch.Tensor":
        """[B, V'] bool (screen order): the tokens that may hold each row's maximum."""
        b = ap.comb.shape[0]
        top = ap.comb.amax(2).double()  # [B, G]
        low = self._margin((ap.step * top - ap.err).amax(1))  # under each row's best logit
        thr = int_thresholds(low, ap.err, ap.step, ap.comb.dtype)
        return (ap.comb >= thr[:, :, None]).view(b, -1)

    def _decide(self, x: "torch.Tensor", keep: "torch.Tensor", pick) -> "torch.Tensor":
        """Each row's token from the exact logits of its candidates (keep [B, V'], screen
        order): `pick(z [n, T], rows, tokens)` -> [n] positions in z's columns: the rule applied
        to full logits, for the rows `rows`, z their exact logits of `tokens` (sorted ids; None:
        the whole vocabulary, in id order). The
        candidates of all rows but the wide ones (`WIDE_ROW`) are rescored as one union at
        all B rows; a wide row takes full logits of the whole vocabulary, in pairs (the bits
        of the batch's matmul: `pair_rows_match`)."""
        import torch

        b = x.shape[0]
        wide = self._wide(keep)
        out = torch.empty(b, dtype=torch.long)
        if wide:
            keep = keep.clone()
            keep[wide] = False
            out[wide] = pick(self._pair_logits(x, wide), wide, None)
            self.wide_rows += len(wide)
            self._count(len(wide), self.vocab)
        narrow = [r for r in range(b) if r not in wide]
        if narrow:
            tokens, n = self._union(keep)  # the wide rows' candidates are cleared
            z = self.exact_logits(x, tokens)
            out[narrow] = tokens[pick(z if not wide else z[narrow], narrow, tokens)]
            self._count(len(narrow), n)
        return out

    def _wide(self, keep: "torch.Tensor") -> list[int]:
        """The rows that take full logits on their own: more than `WIDE_ROW` candidates, at
        most `MAX_WIDE` of them, and a pair of rows gives the batch's bits here."""
        import torch

        b = keep.shape[0]
        wide = _rows_over(keep, WIDE_ROW)
        if not wide or len(wide) > MAX_WIDE or not (self._on_kernel(b) or pair_rows_match(self.head, b)):
            return []
        return wide

    def _pair_logits(self, x: "torch.Tensor", rows: list[int]) -> "torch.Tensor":
        """[len(rows), vocab] full logits of those rows of x, two rows to a matmul (an odd one
        out paired with itself; a batch of one row alone, its own shape), softcap included."""
        import torch

        if self._on_kernel(x.shape[0]):
            from tunix_rt.eval.int8_kernel import f32_linear

            z = f32_linear(x[rows].contiguous(), self.head)  # a row's bits whatever the batch
        elif x.shape[0] == 1:
            z = torch.mm(x, self.head.t())
        else:
            z = torch.cat([torch.mm(x[(rows[i: i + 2] * 2)[:2]], self.head.t())[: len(rows[i: i + 2])]
                           for i in range(0, len(rows), 2)])
        if self.softcap is not None:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z

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

    # -----------------------------------------------------------------------------------
    # Sampling

    def sample(self, x: "torch.Tensor", g: "Noise | torch.Tensor", cfg) -> "torch.Tensor":
        """The sampled next token of each row of x [B, D] with Gumbel noise g [B, vocab]
        (fp64, or a `sampling.Noise`, which draws only what is looked at: in the screen's order
        without top-k/top-p, at the rescored ids with them): the same ids as
        `sampling.sample_full(full logits, g, cfg)`.

        - top-k: only a token whose upper bound reaches the k-th largest lower bound can be in
          the top-k; those are rescored and the top-k (and top-p within it) decided on their
          exact logits, as on full logits.
        - top-p alone (when `certify_top_p`, else full logits): the tokens are rescored whose
          upper bounds are not in a tail of negligible mass; the normaliser lies between the
          rescored mass plus the tail's lower and upper bounds, and each nucleus decision is
          taken only where it is the same at both ends (else that row takes full logits).
        - neither: a token whose upper bound / T + g cannot reach the best lower bound / T + g
          cannot be drawn; the rest are rescored."""
        g = Noise.of(g)
        top_k = 0 < cfg.top_k < self.vocab
        top_p_alone = cfg.top_p < 1.0 and not top_k
        ap = self.approx(x, fine=top_p_alone) if self.certify_top_p or not top_p_alone else None
        if ap is None:  # no bound holds, or top-p alone while certify_top_p is off
            return sample_full(self._full(x), g, cfg)
        if not top_p_alone and not top_k and g.drawn_on_cpu():
            return self._sample_bound_first(x, g, cfg, ap)
        up, span = self._upper(ap)  # [B, G, per] in screen order, [B, G]
        if top_p_alone:
            return self._sample_top_p(x, g, cfg, up, span)
        if top_k:
            return self._sample_top_k(x, g, cfg, up, span)
        return self._sample_gumbel(x, g, cfg, up, span, ap)

    def _sample_gumbel(self, x, g: Noise, cfg, up, span, ap: Approx) -> "torch.Tensor":
        b, t = x.shape[0], cfg.temperature
        gp = g.at(self.perm).view_as(up)  # the noise in screen order, drawn once
        keep = self._reachable(up, span, ap, gp, t)
        if self.refine_at is not None and ap.residual is None and int(keep.any(0).sum()) > self.refine_at:
            fine = self.refine(ap)  # a flat distribution: the fine level's bounds, not full logits
            if fine is not None:
                up, span = self._upper(fine)
                keep = self._reachable(up, span, fine, gp, t)
                self.refined += b
        flat = gp.view(b, -1)

        def pick(z, rows, tokens):  # the noise of those rows at those tokens (None: every id)
            if tokens is None:  # a wide row or two: their noise in id order
                noise = flat[rows].index_select(1, self.inv)
            else:  # the candidates' columns first (few), then the rows
                noise = flat.index_select(1, self.inv.index_select(0, tokens))[rows]
            return scores(z, noise, t).argmax(dim=1)

        return self._decide(x, keep, pick)

    def _sample_bound_first(self, x, g: Noise, cfg, ap: Approx) -> "torch.Tensor":
        """_sample_gumbel with noise not yet drawn (CPU): the same keep mask and ids, but the
        two logs of the noise (about 10 ms for 8 rows of Gemma's 262K tokens, against 1 ms for
        the counter's bits) only where they can matter (`_reach_bound_first`)."""
        b, t = x.shape[0], cfg.temperature
        seeds = seed_tensor(g.seeds)
        keep, bits = self._reach_bound_first(ap, seeds, t)
        if self.refine_at is not None and ap.residual is None and int(keep.any(0).sum()) > self.refine_at:
            fine = self.refine(ap)
            if fine is not None:
                keep, bits = self._reach_bound_first(fine, seeds, t)
                self.refined += b

        def pick(z, rows, tokens):  # the noise of those rows at those tokens (None: every id)
            if tokens is None:  # a wide row or two: their noise in id order
                noise = gumbel_of_bits(bits[rows].index_select(1, self.inv))
            else:
                noise = gumbel_of_bits(bits.index_select(1, self.inv.index_select(0, tokens))[rows])
            return scores(z, noise, t).argmax(dim=1)

        return self._decide(x, keep, pick)

    def _perm_offsets(self) -> "torch.Tensor":
        """The noise counter's offsets of the screen's positions (its token ids), made once."""
        if getattr(self, "_perm_off", None) is None:
            self._perm_off = offsets(self.perm)
        return self._perm_off

    def _reach_bound_first(self, ap: Approx, seeds, t: float) -> tuple["torch.Tensor", "torch.Tensor"]:
        """(`_reachable`'s mask on `_upper(ap)`, the same bits; the noise's bits [B, V'] in screen
        order) for the rows' seeds (`sampling.seed_tensor`), with the noise's logs only where
        they can matter. thr = (the largest (up - span) / T) + G_MIN, minus margins, is below
        every row's best lower bound whatever the noise; a token whose up / T plus an upper
        bound on its noise read off its counter bits (int8_kernel.noise_screen: no log) stays
        below thr cannot be kept. The others get their noise, their scores give the best lower
        bound (every token that could hold it is among them, so it is the full draw's), and the
        keep test is `_reachable`'s. Without a softcap or a fine level the kernel makes up / T
        from the screen's integers itself (`noise_screen_comb`: no [B, V'] fp64 copy; the
        candidates' up / T as `_upper` rounds them). Where the kernel does not apply, or past
        BOUND_FIRST_SHARE of the entries, every entry's noise is drawn."""
        import torch

        from tunix_rt.eval.int8_kernel import noise_screen, noise_screen_comb

        b = ap.comb.shape[0]
        n = self.groups * self.per
        cap = int(BOUND_FIRST_SHARE * b * n)
        bits = torch.empty((b, n), dtype=torch.int64)
        if self.softcap is None and ap.residual is None and ap.comb.dtype == torch.int32:
            width = self._width(ap)  # _upper's, without the [B, V'] copy
            span_t = 2 * width / t
            top = ap.comb.amax(2).double().mul_(ap.step).add_(width).div_(t)  # each group's largest up / T
            thr = self._bound_first_threshold(top, span_t, ap, t)
            at = noise_screen_comb(seeds, self._perm_offsets(), ap.comb, ap.step, width, t, thr, bits, cap)
            if at is not None:
                r, p = at.div(n, rounding_mode="floor"), at.remainder(n)
                gi = p // self.per
                sc = ap.comb.view(b, -1)[r, p].double().mul_(ap.step[r, gi]).add_(width[r, gi]).div_(t)
                return self._keep_of(sc, r, p, span_t, ap, bits, t), bits
        up, span = self._upper(ap)
        sc = up.div_(t)  # up / T, as _reachable's first op
        span_t = span / t
        thr = self._bound_first_threshold(sc.amax(2), span_t, ap, t)
        flat = sc.view(b, -1)
        at = noise_screen(seeds, self._perm_offsets(), flat, thr, bits, cap)
        if at is None:  # every entry's noise (the kernel may not have written the bits)
            bits = noise_bits_of(seeds.tolist(), self._perm_offsets())
            return self._reachable_scaled(sc, span, ap, gumbel_of_bits(bits).view_as(sc), t), bits
        r, p = at.div(n, rounding_mode="floor"), at.remainder(n)
        return self._keep_of(flat[r, p], r, p, span_t, ap, bits, t), bits

    @staticmethod
    def _bound_first_threshold(top: "torch.Tensor", span_t: "torch.Tensor", ap: Approx, t: float) -> "torch.Tensor":
        """[B]: below every row's best lower bound on a score whatever the noise, from each
        group's largest up / T [B, G] (thr of `_reach_bound_first`)."""
        top_lb = (top - span_t).amax(1)  # a lower bound on some token's z / T
        slack_hi = _score_slack(top_lb.abs() + 40, ap, t)  # above _reachable's (|best| <= |top_lb| + 40: |g| < 37)
        return top_lb + G_MIN - slack_hi - 1e-6 * (1 + top_lb.abs())

    def _keep_of(self, sc, r, p, span_t, ap: Approx, bits, t: float) -> "torch.Tensor":
        """_reachable's mask [B, V'] from the candidates (r, p) only: their up / T `sc`, their
        noise from `bits`."""
        import torch

        b = span_t.shape[0]
        s = sc.add_(gumbel_of_bits(bits[r, p]))  # up/T + g: _reachable's score bits
        best = torch.full((b,), float("-inf"), dtype=torch.float64)
        best.scatter_reduce_(0, r, s - span_t[r, p // self.per], reduce="amax")
        keep = torch.zeros(bits.shape, dtype=torch.bool)
        keep[r, p] = s >= (best - _score_slack(best.abs(), ap, t))[r]
        return keep

    @staticmethod
    def _reachable(up, span, ap: Approx, gp, t: float) -> "torch.Tensor":
        """[B, V'] bool (screen order): the tokens whose upper bound on z/T + g reaches a lower
        bound on the row's best score (the others cannot be drawn). `up` is consumed."""
        return ScreenedArgmax._reachable_scaled(up.div_(t), span, ap, gp, t)

    @staticmethod
    def _reachable_scaled(sc, span, ap: Approx, gp, t: float) -> "torch.Tensor":
        """_reachable from sc = up / T (consumed)."""
        b = sc.shape[0]
        score = sc.add_(gp)  # upper bounds on z/T + g
        best = (score.amax(2) - span / t).amax(1)  # a lower bound on each row's best score
        return (score >= (best - _score_slack(best.abs(), ap, t))[:, None, None]).view(b, -1)

    def _sample_top_k(self, x, g: Noise, cfg, up, span) -> "torch.Tensor":
        import torch

        b = x.shape[0]
        lo = (up - span[:, :, None]).view(b, -1)[:, : self.vocab]  # copies must not count twice
        kth = torch.topk(lo, cfg.top_k, dim=1).values[:, -1]
        tokens, n = self._union(up.view(b, -1) >= kth[:, None])
        z = self.exact_logits(x, tokens)
        picks = [tokens[ids[scores(z[r, ids], g.row(r, tokens[ids]), cfg.temperature).argmax()]]
                 for r, ids in enumerate(allowed_ids(z, cfg))]
        self._count(b, n)
        return torch.stack(picks)

    def _sample_top_p(self, x, g: Noise, cfg, up, span) -> "torch.Tensor":
        import torch

        b, t = x.shape[0], cfg.temperature
        tail = _TopPTail(up, span, t, self.vocab)
        picks: list[torch.Tensor | None] = [None] * b
        pending, n = list(range(b)), 0
        for share in TAIL_SHARES:  # a generous cut first, a tight one for the rows it left
            inside, out_lo, out_hi, cut = tail.cut(share * (1 - cfg.top_p))
            keep = torch.zeros_like(inside)
            keep[pending] = inside[pending]
            tokens, n = self._union(keep)
            if tokens.numel() == self.vocab:
                break  # as costly as full logits: take them
            z = self.exact_logits(x, tokens)
            for r in pending:
                ids = torch.unique(self.perm[inside[r]])
                zr = z[r, torch.searchsorted(tokens, ids)]
                nucleus = self._certify(zr, (tail.m[r], out_lo[r], out_hi[r], cut[r]), cfg)
                if nucleus is not None:
                    ids = ids[nucleus]
                    picks[r] = ids[scores(zr[nucleus], g.row(r, ids), t).argmax()]
            pending = [r for r in pending if picks[r] is None]
            if not pending:
                break
        if pending:  # full logits for the whole batch: the same rows as the reference's matmul
            full = sample_full(self._full(x, count=False), g, cfg)
            for r in pending:
                picks[r] = full[r]
            self.full_rows += len(pending)
        self._count(b - len(pending), n)
        return torch.stack(picks)  # type: ignore[arg-type]

    def _certify(self, z: "torch.Tensor", tail, cfg) -> "torch.Tensor | None":
        """The nucleus among the rescored tokens of a row (z exact, in ascending token id) as a
        mask, when the top-p decision of every token is the same at both ends of the
        normaliser's bound; None otherwise (the row then takes full logits)."""
        import torch

        m, out_lo, out_hi, cut = tail
        t, p = cfg.temperature, cfg.top_p
        z64 = z.double()
        zmax = z64.max()
        e = torch.exp((z64 - zmax) / t)  # as sampling.nucleus computes them
        unit = torch.exp((m - zmax) / t)  # the tail's unit, in units of exp(zmax / T)
        total_lo = (e.sum() + out_lo * unit) * (1 - SCORE_SLACK)
        total_hi = (e.sum() + out_hi * unit) * (1 + SCORE_SLACK)
        head = z64 > cut  # each of these comes before every other token, rescored or not
        if not bool(e[head].sum() * (1 - SCORE_SLACK) >= p * total_hi):
            return None  # the tokens after them might still be in the nucleus
        pos = head.nonzero().squeeze(1)
        order = pos[torch.sort(z[pos], descending=True, stable=True).indices]  # ties: lower id first
        before = torch.cat([e.new_zeros(1), torch.cumsum(e[order], 0)[:-1]])
        inside = before * (1 + SCORE_SLACK) < p * total_lo
        outside = before * (1 - SCORE_SLACK) >= p * total_hi
        if not bool((inside | outside).all()):
            return None
        mask = torch.zeros(z.shape[0], dtype=torch.bool)
        mask[order[inside]] = True
        return mask

    # -----------------------------------------------------------------------------------
    # The screen and the exact logits

    def approx(self, x: "torch.Tensor", fine: bool = False) -> Approx | None:
        """The int8 screen of x [B, D], or None where no bound holds this step (see the module
        doc): the caller takes full logits. `fine` adds the weights' quantisation residual as
        a second int8 level (one more int8 matmul), which shrinks the error bound about 40x
        on Gemma 3 (the residual's Cauchy–Schwarz term dominates it)."""
        import torch

        b = x.shape[0]
        x64 = x.double()
        nx = x64.norm(dim=1) * (1 + REL_SAFETY)
        bound_x = nx[:, None] * self.nw  # >= |x·w| for every row of the group
        # NaN or inf x gives a NaN or inf norm: the comparison is False there too.
        if not bool((bound_x * (1 + self.gamma) < FLT_MAX).all()) or not self.kernel_exact(b):
            return None
        sx = (x.abs().amax(1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
        q1 = torch.round(x / sx[:, None]).clamp_(-127, 127)
        q2 = torch.round((x - q1 * sx[:, None]) * 127 / sx[:, None]).clamp_(-127, 127)
        lhs = torch.cat([q1, q2]).to(torch.int8)
        comb = self._combine(int_mm(lhs, self.wq, self.sums, vnni=self.vnni), b)  # [B, G, per], exact
        c = sx.double() / 127  # x̂ = c * (127 q1 + q2)
        xh = (q1.double() * 127 + q2.double()) * c[:, None]
        dx = (x64 - xh).norm(dim=1) * (1 + REL_SAFETY)
        nxh = xh.norm(dim=1) * (1 + REL_SAFETY)
        ap = self._bounded(Approx(comb, c[:, None] * self.scale[None, :], None, bound_x, None, lhs, c, dx, nxh), self.nd)
        return self.refine(ap) if fine and ap is not None else ap

    def refine(self, ap: Approx) -> Approx | None:
        """`ap` with the fine level added (the weights' quantisation residual, one more int8
        matmul on the same activations): the same bound, about 40x tighter on Gemma 3. None
        where it does not hold."""
        import torch

        if ap.residual is not None:
            return ap
        rq, rscale, nd = self._residual_level()
        b = ap.comb.shape[0]
        residual = self._combine(int_mm(ap.lhs, rq, self._fine_sums), b).double()
        residual.mul_((ap.c[:, None] * rscale[None, :])[:, :, None])
        return self._bounded(Approx(ap.comb, ap.step, None, ap.bound_x, residual, ap.lhs, ap.c, ap.dx, ap.nxh), nd)

    def _bounded(self, ap: Approx, nd: "torch.Tensor") -> Approx | None:
        """`ap` with its error bound (`nd`: the weights' per-group quantisation error at its
        level), or None where the bound is not finite or a step is not positive."""
        import torch

        ap.err = ap.dx[:, None] * self.nw + ap.nxh[:, None] * nd + self.gamma * ap.bound_x
        if not bool(torch.isfinite(ap.err).all() and (ap.step > 0).all()):
            return None
        return ap

    def _combine(self, acc: "torch.Tensor", b: int) -> "torch.Tensor":
        """127·acc(q1) + acc(q2) [B, G, per], in int64 where int32 could overflow."""
        if self.wide:
            return acc[b:].long().add_(acc[:b].long(), alpha=127).view(b, self.groups, self.per)
        return acc[b:].add_(acc[:b], alpha=127).view(b, self.groups, self.per)

    def _residual_level(self) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
        """The weights' quantisation residual r = w − s_g·wq, itself int8-quantised per group
        (scale max|r| / 127), and per group the exact error left, max ||r − r̂||; built on first
        use (top-p sampling): one more int8 copy of the head."""
        import torch

        if self._fine is None:
            wq = unpack_vnni(self.wq) if self.vnni else self.wq
            rq = torch.empty_like(wq)
            rscale = torch.empty(self.groups, dtype=torch.float64)
            nd = torch.empty(self.groups, dtype=torch.float64)
            for g in range(self.groups):
                part = slice(g * self.per, (g + 1) * self.per)
                r = self.head.index_select(0, self.perm[part]).double() - wq[part].double() * self.scale[g]
                rscale[g] = (r.abs().amax() / 127).clamp_min(torch.finfo(torch.float64).tiny)
                q = torch.round(r / rscale[g]).clamp_(-127, 127)
                rq[part] = q.to(torch.int8)
                nd[g] = (r - q * rscale[g]).norm(dim=1).amax()
            self._fine_sums = row_sums(rq)
            self._fine = (rq, rscale, nd * (1 + REL_SAFETY))
        return self._fine

    def _upper(self, ap: Approx) -> tuple["torch.Tensor", "torch.Tensor"]:
        """Every token's logit (after the softcap, where the sampling rule reads it) lies in
        [up − span_g, up], margins included: (up [B, G, per] fp64 in screen order, span
        [B, G]). With a softcap the span is 2·(err + margin): c·tanh(·/c) is 1-Lipschitz."""
        import torch

        a = ap.comb.double().mul_(ap.step[:, :, None])
        if ap.residual is not None:
            a.add_(ap.residual)
        if self.softcap is None:
            width = self._width(ap)
            return a.add_(width[:, :, None]), 2 * width
        c = float(self.softcap)
        margin = ABS_MARGIN + REL_MARGIN * c  # |capped logit| <= c
        up = torch.tanh(a.add_(ap.err[:, :, None]).div_(c)).mul_(c).add_(margin)
        return up, 2 * (ap.err + margin)

    @staticmethod
    def _width(ap: Approx) -> "torch.Tensor":
        """[B, G] half-width of each token's logit interval without a softcap: the error bound
        plus the margin (1e-3 + 1e-5·|logit|, with |logit| <= ||x||·nw_g + err)."""
        return ap.err + ABS_MARGIN + REL_MARGIN * (ap.bound_x + ap.err)

    def _union(self, keep: "torch.Tensor") -> tuple["torch.Tensor", int]:
        """keep [B, V'] (screen order) -> (the kept token ids of all rows, sorted and padded
        for the exact rescoring; how many were kept)."""
        import torch

        pos = keep.any(0).nonzero().squeeze(1)
        cand = torch.unique(self.perm.index_select(0, pos))
        return self._padded(cand), int(cand.numel())

    def exact_logits(self, x: "torch.Tensor", tokens: "torch.Tensor") -> "torch.Tensor":
        """[B, len(tokens)] fp32 logits of those tokens (sorted ids), as the reference computes
        them (softcap included)."""
        import torch

        if self._on_kernel(x.shape[0]):
            from tunix_rt.eval.int8_kernel import f32_linear, f32_rows

            x = x.contiguous()
            z = f32_linear(x, self.head) if tokens.numel() == self.vocab else f32_rows(x, self.head, tokens)
        elif tokens.numel() == self.vocab:
            z = torch.mm(x, self.head.t())
        else:  # the rows a block at a time: no copy of them all (each block a multiple of 256)
            z = torch.empty((x.shape[0], tokens.numel()), dtype=x.dtype)
            for a in range(0, tokens.numel(), RESCORE_BLOCK):
                blk = tokens[a: a + RESCORE_BLOCK]
                torch.mm(x, self.head.index_select(0, blk).t(), out=z[:, a: a + blk.numel()])
        if self.softcap is not None:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z

    def _full(self, x: "torch.Tensor", count: bool = True) -> "torch.Tensor":
        """Full logits [B, vocab] (where no bound holds)."""
        import torch

        if count:
            self.full_rows += x.shape[0]
        return self.exact_logits(x, torch.arange(self.vocab))

    def _count(self, rows: int, rescored: int) -> None:
        self.steps += rows
        self.candidates += rescored * rows

    def _padded(self, tokens: "torch.Tensor") -> "torch.Tensor":
        """tokens (sorted, unique) plus filler ids up to a multiple of PAD_COLS, sorted."""
        import torch

        want = -(-max(1, tokens.numel()) // self.pad_cols) * self.pad_cols
        if want >= self.vocab * FULL_SHARE:
            return torch.arange(self.vocab)
        if tokens.numel() == want:
            return tokens
        taken = torch.zeros(self.vocab, dtype=torch.bool)
        taken[tokens] = True
        filler = (~taken[: want + tokens.numel()]).nonzero().squeeze(1)[: want - tokens.numel()]
        return torch.cat([tokens, filler]).sort().values
