"""Gradient checkpointing of a decoder layer that XLA:CPU cannot undo.

Tunix remats a layer with `nnx.remat` (jax.checkpoint): the backward pass recomputes the
layer's activations from its input, and an optimization barrier is meant to keep that
recomputation where the backward needs it. XLA:CPU expands optimization barriers away, and
its memory scheduler then hoists every layer's recomputation to the forward pass, where it
has its inputs: the activations are all alive again at the peak (measured on Gemma 3 270M,
LoRA, 4 x 256, fp32: the train step's XLA temp buffer is 2.74 GiB with Tunix's remat and
2.74 GiB without it; it peaks inside the loss, with the recomputed MLP activations of all
18 layers alive).

Here the recomputation gets a data dependence on the layer's output cotangent, which exists
only once the backward pass reaches the layer: the layer input is replaced by
`x + 0 * g[0]` before the recomputation. XLA keeps that (for floats, 0 * g is not 0 when g is
inf or NaN, so it is not folded), and the schedule follows: the same train step's temp
buffer is 0.83 GiB, the process's peak RSS 3.3 GiB instead of 5.2, step time unchanged
within noise, losses and gradients the same as Tunix's remat.

The layer's weights get the same tie. XLA:CPU copies a weight into the layout its product
wants (q's [N, D, H] as [N·H, D], o's transposed for the input's gradient); untied, the
recomputation's copies are the forward pass's (the same computation of the same parameter),
made once at the start and alive until the layer's backward: every layer's copies at once.
Measured on the same step (2-core AMD EPYC, AVX2): XLA's temp buffer 617 -> 332 MB, the
step's peak RSS 2.44 -> 2.34 GiB (benchmarks/bench_jax_loss.py, one run each in the working
tree), its time unchanged within noise (8.57 against 8.97 s, medians of an alternating A/B in
one process); the cost is one layer's tied copy of its weights at a time.

Where: only where XLA drops the barriers, i.e. when the backend is the CPU (`wanted()`).
Accelerator compilers keep them, and there Tunix's own remat is left alone; the memory plan,
which compiles for a TPU or GPU target on fake CPU devices, says which behaviour it models
with `use("tunix")` / `use("tied")`. (On such an FSDP estimate the tie costs memory: Gemma 2B
full fine-tuning over 8 fake devices goes from 9.5 to 12.4 GiB, the recomputation re-gathering
the weights, so it must not leak into accelerator plans.)

How: the layer's computation is traced once in the forward pass (`jax.closure_convert`, so
qwix's LoRA interception, active only during the model call, is inside the traced function)
and wrapped in a `jax.custom_vjp` whose residuals are the layer's inputs only.
"""

from __future__ import annotations

import functools

import jax


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _checkpointed(fn, state, x, *rest):
    return fn(state, x, *rest)


def _fwd(fn, state, x, *rest):
    return fn(state, x, *rest), (state, x, rest)


def _bwd(fn, res, g):
    state, x, rest = res
    # The recomputation below must not start before g exists (see the module doc); the
    # layer's weights get the same tie, or the layout copies XLA makes of them for the
    # recomputation's products are shared with the forward pass's and live in between.
    zero = g.reshape(-1)[0] * 0
    x = x + zero.astype(x.dtype)
    state = jax.tree.map(lambda w: w + zero.astype(w.dtype) if jax.numpy.issubdtype(w.dtype, jax.numpy.floating)
                         else w, state)
    _, vjp = jax.vjp(fn, state, x, *rest)
    return vjp(g)


_checkpointed.defvjp(_fwd, _bwd)

_MODE = ["auto"]


def use(mode: str) -> None:
    """auto: the tie on the CPU backend only; tied: always; tunix: never (Tunix's remat)."""
    if mode not in ("auto", "tied", "tunix"):
        raise ValueError(f"remat mode must be auto, tied or tunix, got {mode!r}")
    _MODE[0] = mode


def wanted() -> bool:
    """Whether gradient-checkpointed layers go through `checkpointed_layer`."""
    mode = _MODE[0]
    return mode == "tied" or (mode == "auto" and jax.default_backend() == "cpu")


def has_rng_state(layer) -> bool:
    """A layer that draws random numbers (LoRA dropout) keeps Tunix's own remat: its RNG
    counters advance inside the call, which a traced-once function would not carry out."""
    from flax import nnx

    return bool(jax.tree.leaves(nnx.state(layer, nnx.RngState)))


def checkpointed_layer(layer, x, positions, attention_mask):
    """`layer.block(x, positions, None, attention_mask)`'s output (no KV cache: training),
    with its activations recomputed in the backward pass."""
    from flax import nnx

    graphdef, state = nnx.split(layer)

    def run(state, x, positions, attention_mask):
        _, y = nnx.merge(graphdef, state).block(x, positions, None, attention_mask)
        return y

    fn, consts = jax.closure_convert(run, state, x, positions, attention_mask)
    return _checkpointed(fn, state, x, positions, attention_mask, *consts)
