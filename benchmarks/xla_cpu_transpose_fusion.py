"""XLA:CPU's slow case that cost the JAX engine most (a reproducer for an upstream report).

A LoRA-adapted gated MLP (Gemma 3 270M's sizes: D 640, F 2048, rank 16) and its gradient
with respect to the six LoRA factors, written twice with the same math:
- "3d": the projections as einsums on [B, T, D] activations, as Tunix's modules compute them;
- "2d": the same on [B·T, D] (one reshape before, one after), as jax_loader.flatten_projections
  makes them.
The factors' gradients contract two axes (B and T) in the 3-D form. XLA:CPU then transposes
the [B, T, F] operand (to [F, B·T]) inside the loop fusion that produces it, and that fusion
writes across rows: the program's optimized HLO shows `f32[2048,768]` kLoop fusions feeding
`dot(..., lhs_contracting_dims={0}, rhs_contracting_dims={1})`. The script times both, counts
those transposing fusions in each compiled program, and times one such fusion alone (an
elementwise op with a transposed output) against the same op untransposed.

    .venv/bin/python benchmarks/xla_cpu_transpose_fusion.py [--batch 4] [--seq 192] [--reps 20]

Last line: RESULT flat_speedup=<3d time / 2d time> transposing_fusions_3d=<n> transposing_fusions_2d=<n>
"""

from __future__ import annotations

import argparse
import re
import time

import jax
import jax.numpy as jnp

D, F, R = 640, 2048, 16


def best_ms(fn, *args, reps: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def lora_3d(x, w, a, b):
    return (jnp.einsum("btd,df->btf", x, w)
            + jnp.einsum("btr,rf->btf", jnp.einsum("btd,dr->btr", x, a), b) * 2.0)


def lora_2d(x, w, a, b):
    x2 = x.reshape(-1, x.shape[-1])
    y = x2 @ w + (x2 @ a) @ b * 2.0
    return y.reshape(*x.shape[:-1], y.shape[-1])


def mlp_loss(lin, frozen, factors, x):
    wg, wu, wd = frozen
    ag, bg, au, bu, ad, bd = factors
    h = jax.nn.gelu(lin(x, wg, ag, bg), approximate=True) * lin(x, wu, au, bu)
    return jnp.sum(lin(h, wd, ad, bd) ** 2)


def transposing_fusions(hlo: str) -> int:
    """kLoop fusions whose [F, B·T]-shaped output some dot contracts on its last axis."""
    out = 0
    for m in re.finditer(r"%(\S+) = f32\[(\d+),\d+\]\{1,0\} fusion\([^\n]*kind=kLoop", hlo):
        name, rows = m.group(1), int(m.group(2))
        if rows == F and re.search(rf"dot\([^)]*%{re.escape(name)}\)[^\n]*rhs_contracting_dims={{1}}", hlo):
            out += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=192)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()

    ks = jax.random.split(jax.random.PRNGKey(0), 8)
    x = jax.random.normal(ks[0], (args.batch, args.seq, D))
    frozen = (jax.random.normal(ks[1], (D, F)) * 0.03, jax.random.normal(ks[2], (D, F)) * 0.03,
              jax.random.normal(ks[3], (F, D)) * 0.03)
    a_in, a_out = jax.random.normal(ks[4], (D, R)) * 0.1, jax.random.normal(ks[5], (F, R)) * 0.1
    factors = (a_in, jnp.full((R, F), 0.01), a_in * 0.9, jnp.full((R, F), 0.011), a_out, jnp.full((R, D), 0.01))

    rows = []
    grads = {}
    for name, lin in (("3d", lora_3d), ("2d", lora_2d)):
        fn = jax.jit(jax.grad(lambda f, x, lin=lin: mlp_loss(lin, frozen, f, x)))
        hlo = fn.lower(factors, x).compile().as_text()
        grads[name] = fn(factors, x)
        rows.append((name, best_ms(fn, factors, x, reps=args.reps), transposing_fusions(hlo)))
    worst = max(float(jnp.max(jnp.abs(p - q)) / jnp.max(jnp.abs(q))) for p, q in zip(grads["3d"], grads["2d"]))

    g = jax.random.normal(ks[6], (args.batch * args.seq, F))
    u, d = g * 0.5, g * 0.3
    plain = best_ms(jax.jit(lambda g, u, d: d * u * (1 + jnp.tanh(g)) - g), g, u, d, reps=args.reps)
    transposed = best_ms(jax.jit(lambda g, u, d: (d * u * (1 + jnp.tanh(g)) - g).T), g, u, d, reps=args.reps)

    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; LoRA MLP gradient, x [{args.batch}, {args.seq}, {D}], "
          f"F {F}, rank {R}; best of {args.reps}")
    print(f"{'form':<6}{'ms':>10}{'transposing fusions':>22}")
    for name, ms, n in rows:
        print(f"{name:<6}{ms:>10.1f}{n:>22}")
    print(f"largest gradient difference 3d vs 2d: {worst:.1e} of the largest entry")
    print(f"one elementwise op on [{args.batch * args.seq}, {F}]: {plain:.2f} ms; the same writing its transpose: "
          f"{transposed:.2f} ms (x{transposed / plain:.1f})")
    (_, t3, n3), (_, t2, n2) = rows
    print(f"RESULT flat_speedup={t3 / t2:.2f} transposing_fusions_3d={n3} transposing_fusions_2d={n2}")


if __name__ == "__main__":
    main()
