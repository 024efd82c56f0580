"""How many tokens one chunk of the chunked loss holds: one rule for both engines and the plan.

The fused losses (`loss.chunked_linear_ce`, `jax_loss.make_loss_fn`) never build the
[tokens, vocab] logits of a whole batch; they build them one chunk of tokens at a time. What
a chunk costs in memory is its logits, [chunk, vocab] in fp32 (both losses compute logits in
fp32 whatever the weights' dtype), so the budget is given in bytes (`loss_chunk_bytes`) and
turned into tokens here, from the vocabulary of the head at hand. A token count would mean
1 MiB a token at Gemma's 262K vocabulary and 4 KiB on the tiny test models.

The default, 256 MiB, is 256 tokens of Gemma 3's 262,144-entry vocabulary: a quarter of the
[1024, V] block of a 4 x 256 batch (1 GiB), 262 tokens of Gemma 1/2's 256,000. Why not
smaller: every chunk multiplies its rows by the whole [V, D] head twice, and on a CPU each
pass is memory traffic (671 MB for Gemma 3 270M). Measured on this 2-core CPU
(`benchmarks/bench_loss_chunk.py`, the torch fused loss alone, 512 supervised rows, CPU
seconds against one chunk of all rows, medians of 5): 256 MiB +8% (about +0.45 CPU-s, an
extra read of the head), 128 MiB +29%, 64 MiB +61%: 256 MiB is the cheapest budget that
keeps to a quarter block. On an accelerator, and for the JAX loss, which skips chunks
without supervised tokens, smaller chunks cost less.

No torch or JAX import: the memory plan reads this without loading a framework.
"""

from __future__ import annotations

MiB = 1024**2
#: bytes of one logit: both fused losses compute the logits in fp32
LOGITS_BYTES = 4
#: the default budget for one chunk's logits (TrainConfig.loss_chunk_bytes, the plan's input)
DEFAULT_CHUNK_BYTES = 256 * MiB
#: slices of the vocabulary a chunk's logits are formed in where the head does not train
#: (LoRA; torch engine: loss.frozen_head_rows), and a trained head's softmax is summed in
VOCAB_PARTS = 16
#: the same on a CPU: blocks of [c, V / 64] stay in its last-level cache between the products
#: and the softmax's passes. Measured on Gemma 3 270M's SFT step (torch engine, LoRA r16, the
#: products through oneDNN: train.cpu_matmul; benchmarks/bench_torch_vs_trl.py's batches, 6
#: steps a run, 7 runs each alternating, 2-core AMD EPYC with AVX-512): 13.10 s against 13.61
#: (-3.8%); frozen_head_rows alone over 338 rows 0.64-0.71 s against 0.80-0.90 (MKL: 1.33
#: against 1.45)
CPU_VOCAB_PARTS = 64
#: a frozen head's chunk holds FROZEN_ROWS times chunk_tokens' rows: the logits held at once,
#: one slice of one chunk, are FROZEN_ROWS / VOCAB_PARTS of the budget (half of it). Fewer,
#: taller chunks read the [V, D] head fewer times, and a CPU's matmul is faster with more rows:
#: measured on Gemma 3 270M's head (fp32, 2-core AMD EPYC with AVX-512, CPU seconds of
#: frozen_head_rows over all rows, medians of 3), 338 rows 4.07 s in 2 chunks of 169 x V/2
#: against 3.44 s in one of 338 x V/16, 676 rows 7.16 s (3 x 226 x V/2) against 6.50 s
#: (676 x V/16), for less memory held.
FROZEN_ROWS = 8
#: the JAX engine's frozen head goes over the vocabulary this many head rows at a time (an
#: online softmax: jax_loss._online_head), where the vocabulary is larger. Measured on Gemma 3
#: 270M's head (fp32, 2-core Xeon, 256 rows, loss and dloss/dh of a chunk, XLA temp): whole
#: vocabulary 1061 ms, 268 MB; slices of 32768 rows 863 ms, 118 MB; 16384: 688 ms, 59 MB;
#: 8192: 627-647 ms, 30 MB; 4096: 669 ms, 15 MB
JAX_SLICE_ROWS = 8192


def chunk_tokens(chunk_bytes: int, vocab_size: int, logits_bytes: int = LOGITS_BYTES) -> int:
    """Tokens per loss chunk: the most whose [tokens, vocab_size] logits of `logits_bytes`
    each fit in `chunk_bytes`, and at least one (a budget below one row still makes progress).
    The losses clamp it to the tokens they have."""
    if chunk_bytes < 1 or vocab_size < 1 or logits_bytes < 1:
        raise ValueError(f"chunk_tokens: positive sizes needed, got {chunk_bytes}, {vocab_size}, {logits_bytes}")
    return max(1, chunk_bytes // (vocab_size * logits_bytes))


def balanced(rows: int, chunk: int) -> int:
    """Rows per chunk for `rows` rows in chunks of at most `chunk`: as many chunks as `chunk`
    needs, of near-equal size, since one buffer holds the largest chunk's logits (671 rows at
    256 a chunk: 3 chunks of 224, where 256, 256 and 159 held a 256-row buffer; 32 MiB of
    Gemma 3's logits less, for the same matmuls)."""
    if rows < 1:
        return max(1, chunk)
    n = -(-rows // chunk)
    return -(-rows // n)


def vocab_parts(device_type: str) -> int:
    """The vocabulary slices of a frozen head's logits (and of a trained head's softmax sums) on
    a device of this type ("cpu", "cuda", ...)."""
    return CPU_VOCAB_PARTS if device_type == "cpu" else VOCAB_PARTS


def rows_per_chunk(rows: int, chunk_bytes: int, vocab_size: int, frozen: bool = False) -> int:
    """The torch fused losses' chunk: chunk_tokens' budget (FROZEN_ROWS times it where the head
    does not train and its logits go a VOCAB_PARTS-th at a time), balanced over `rows` rows."""
    return balanced(rows, chunk_tokens(chunk_bytes, vocab_size) * (FROZEN_ROWS if frozen else 1))
