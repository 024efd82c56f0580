"""The analytic estimate of one training step (SFT's, or the update of an RL step).

What the analytic model counts (bytes per device). Several devices: the JAX engine shards
weights, gradients and optimizer state over its (fsdp, tp) mesh; the torch engine runs as
`torchrun` ranks, each a DDP replica (all of it, per rank) or an FSDP2 shard (1/N of it);
either way each data-parallel rank holds batch / ranks sequences.
- weights: every parameter in the param dtype (fp32 4 B, bf16 2 B); for LoRA the frozen
  base (its targeted projections at 4.5 or 8.5 bits for QLoRA: nf4/int8 plus one fp32
  scale per 64 weights) plus the fp32 adapter. Twice that when the JAX step does not
  donate its model (`donate=False`: Tunix's own PeftTrainer, whose jitted step returns the
  new model state in fresh buffers while the old is still an argument; that second fp32
  copy turns 19.2 into 28.9 GiB on the failed run above, which died at 28.59).
- gradients: of the trainable parameters, in their dtype. The torch engine keeps `.grad`
  of every trainable tensor. In the JAX engine they all exist at once only when something
  needs them together: global-norm clipping (`grad_clip > 0`) or accumulation (an extra
  accumulator); without either XLA feeds each gradient into its update as it is produced,
  and only the largest one (the embedding) is counted.
- optimizer: AdamW two moments in the trainable dtype (torch `zeros_like`, optax's default);
  Adafactor factored second moments (rows + columns per matrix, full size for vectors and
  for LoRA's rank-r matrices) in fp32.
- activations: saved for backward, per token per layer, derived from the Gemma block
  (`_layer_act_elems`): norm inputs/outputs, q/k/v after RoPE, the attention context, the
  MLP's gate, GELU, up and product (3 projections; the torch engine keeps no GELU output:
  train.fused_mlp, and without remat remakes the pre-norms' outputs, the product and Gemma
  3's q and k after RoPE in backward: train.recompute), post-norms on Gemma 2/3, q/k norms on
  Gemma 3, and the attention score matrix [heads, L] per token (scores and probabilities,
  as eager and XLA attention materialise them). With rematerialisation only each layer's
  input stays, and one layer is recomputed at a time. One more layer's worth is counted
  for the gradients flowing backward.
- loss_head: the chunked loss (no [B, L, V] logits): one chunk of fp32 logits (its tokens
  from `loss_chunk_bytes`, `train.chunking`, the engines' rule), with its softmax and
  gradient (up to 3 chunk-sized buffers in the JAX scan, 2 in the torch fused loss, a
  half of that where the head does not train, as calibrated: loss.frozen_head_rows holds a
  vocabulary slice of taller chunks), plus,
  for full fine-tuning, the gradient of the tied embedding [V, D] the head produces. The
  JAX loss sorts the global batch's tokens and runs every chunk on every device (XLA's
  buffer assignment holds a whole chunk per device under fsdp), so its chunk is not split
  by the device count. The plain loss (loss_impl=plain) holds the full logits, log-softmax
  and their gradient.
- workspace: the process baseline on a CPU (Python + torch/jax RSS; torch: 0.40-0.48 GB when
  first measured, 0.52-0.60 GB now), the CUDA context on a GPU, FSDP's gathered weights (XLA keeps each layer's
  all-gathered weights from its forward to its backward: the whole model unsharded at the
  peak, as XLA's own analysis shows; torch FSDP2: the root with the embedding and two
  layers, `workspace_parts`), DDP's gradient buckets, torch's optimizer temporaries, and
  allocator slack.

The peak is not the plain sum: gradients are produced while activations are freed, so
    peak = weights + optimizer + max(activations + loss_head, gradients) + workspace
(`items` lists every item; `details.peak_formula` says how they were combined).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tunix_rt.errors import BadInput
from tunix_rt.models.catalog import Preset
from tunix_rt.plan.devices import MiB, DeviceSpec
from tunix_rt.plan.inputs import QBYTES, PlanInputs
from tunix_rt.train.chunking import chunk_tokens

#: RSS of a training process beyond the model's own bytes, measured here: a whole tiny
#: torch-engine run peaked at 0.48 GB when first measured, 0.55-0.62 GB on 2026-11-25 (whole
#: tiny runs in tests/plan/test_plan_calibration.py; torch+transformers+peft alone: 0.40 GB); a tiny
#: JAX-engine run at 1.22 GB (jax+flax+optax+tunix alone: 0.48 GB; the engine also imports
#: torch for its data path, orbax, and XLA's compiler holds the compiled step), 0.855 GB once
#: the heap was trimmed after each compile (jax_devices.trim_after_compiles, 2026-12-07).
CPU_BASELINE = {"torch": 540 * 10**6, "jax": 840 * 10**6}
CUDA_CONTEXT = 512 * MiB
#: allocator slack on top of everything else (caching allocator / XLA fragmentation; glibc
#: malloc on a CPU)
SLACK = {"cpu": 0.05, "gpu": 0.05, "tpu": 0.03}


def _layer_act_elems(p: Preset, seq: int, lora_elems: int, engine: str, remat: bool = False) -> tuple[int, int]:
    """Elements saved for backward per token in one layer: (dense part, score part). Without
    remat the torch engine remakes in backward what is cheap to remake (train.recompute): the
    pre-norms' outputs, the MLP's product and, on Gemma 3, q and k after RoPE."""
    h, i = p.hidden_size, p.intermediate_size
    q, kv = p.num_heads * p.head_dim, p.num_kv_heads * p.head_dim
    torch_ = engine == "torch" and not remat
    norms = 4 * h if p.family == "gemma" else 6 * h  # pre-norm in+out x2, post-norm inputs
    if torch_:
        norms -= 2 * h  # the pre-norms' outputs
    attn = 2 * q + 2 * kv  # scaled q and k after RoPE, v, the context
    if p.family == "gemma3":
        attn += q + kv  # q/k norm inputs
        if torch_:
            attn -= q + kv  # q and k after RoPE
    # gate, gelu(gate), up, the product: the torch engine keeps no gelu(gate) (fused_mlp) and,
    # without remat, remakes the product
    mlp = (4 if engine != "torch" else 3 if remat else 2) * i
    scores = 2 * p.num_heads * seq  # logits and probabilities over the keys
    return norms + attn + mlp + lora_elems, scores


def _matrix_shapes(p: Preset) -> list[tuple[int, int]]:
    """The 2-D weights of the architecture (for Adafactor's factored state and FSDP)."""
    h, i = p.hidden_size, p.intermediate_size
    q, kv = p.num_heads * p.head_dim, p.num_kv_heads * p.head_dim
    layer = [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]
    return [(p.vocab_size, h)] + layer * p.num_layers


def _lora_shapes(p: Preset, rank: int, targets: tuple[str, ...]) -> list[tuple[int, int]]:
    h, i = p.hidden_size, p.intermediate_size
    q, kv = p.num_heads * p.head_dim, p.num_kv_heads * p.head_dim
    dims = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    out = []
    for t in targets:
        a, b = dims[t]
        out += [(a, rank), (rank, b)]
    return out * p.num_layers


def _adafactor_elems(shapes: list[tuple[int, int]], vectors: int) -> int:
    """optax/torch Adafactor: a row and a column accumulator per matrix whose two dims are
    >= 128, the full second moment otherwise (and for vectors)."""
    return sum(a + b if min(a, b) >= 128 else a * b for a, b in shapes) + vectors


def proj_shapes(p: Preset) -> dict[str, tuple[int, int]]:
    """(in, out) features of each of a decoder layer's seven projections."""
    h, i = p.hidden_size, p.intermediate_size
    q, kv = p.num_heads * p.head_dim, p.num_kv_heads * p.head_dim
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def proj_elems(p: Preset, targets: tuple[str, ...]) -> int:
    shapes = proj_shapes(p)
    return p.num_layers * sum(shapes[t][0] * shapes[t][1] for t in targets)


@dataclass(frozen=True)
class Facts:
    """What every item needs, resolved once per plan."""

    p: Preset
    jax: bool
    wb: int  # bytes per weight in the param dtype
    tb: int  # bytes per trainable weight (LoRA adapters are fp32)
    shard: int  # devices that split weights, gradients and optimizer state (1: replicas)
    ranks: int  # data-parallel ranks: each holds batch / ranks sequences
    torch_fsdp: bool  # torch engine, FSDP2 over several ranks
    ddp: bool  # torch engine, DDP over several ranks
    full: bool
    trainable: int
    largest: int  # elements of the largest trainable tensor
    tokens: int  # tokens per device in one micro-batch


def facts(inp: PlanInputs, p: Preset) -> Facts:
    jax_engine = inp.engine == "jax"
    full = inp.method == "full"
    wb = 4 if inp.dtype == "fp32" else 2
    ranks = inp.fsdp
    if jax_engine:
        shard = inp.devices
    else:
        shard = inp.devices if inp.strategy == "fsdp" else 1
    lora = _lora_shapes(p, inp.lora_rank, inp.lora_targets)
    return Facts(
        p=p, jax=jax_engine, wb=wb, tb=wb if full else 4, shard=shard, ranks=ranks,
        torch_fsdp=not jax_engine and inp.strategy == "fsdp" and inp.devices > 1,
        ddp=not jax_engine and inp.strategy == "ddp" and inp.devices > 1, full=full,
        trainable=p.param_count() if full else p.lora_param_count(inp.lora_rank, inp.lora_targets),
        largest=p.vocab_size * p.hidden_size if full else max(a * b for a, b in lora),
        tokens=math.ceil(inp.batch / ranks) * inp.seq,
    )


def _state_bytes(inp: PlanInputs, f: Facts) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer, frozen weights) per device. The JAX engine keeps LoRA
    adapters whole (they are small); torch's fully_shard shards every parameter."""
    p, n_params = f.p, f.p.param_count()
    per_shard = f.shard if f.full or not f.jax else 1
    if f.full:
        frozen = 0.0
        weights = n_params * f.wb / f.shard
    else:
        proj = proj_elems(p, inp.lora_targets)
        qb = QBYTES[inp.weight_qtype] if inp.weight_qtype else f.wb
        frozen = ((n_params - proj) * f.wb + proj * qb) / f.shard
        weights = frozen + f.trainable * 4 / per_shard
    if not inp.donate:  # the step writes the new model state beside the old (see PlanInputs)
        weights *= 2
    materialised = not f.jax or inp.grad_clip > 0 or inp.grad_accum > 1
    if materialised:
        grads = f.trainable * f.tb / per_shard
    else:  # streamed into the update; full FT's largest (the embedding) is in loss_head
        grads = 0 if f.full else f.largest * f.tb
    if f.jax and inp.grad_accum > 1:
        grads += f.trainable * f.tb / per_shard  # optax.MultiSteps' accumulator
    if inp.optimizer == "adamw":
        opt = 2 * f.trainable * f.tb
    else:
        shapes = _matrix_shapes(p) if f.full else _lora_shapes(p, inp.lora_rank, inp.lora_targets)
        vectors = (2 * p.num_layers + 1) * p.hidden_size if f.full else 0
        opt = _adafactor_elems(shapes, vectors) * 4
    return weights, grads, opt / per_shard, frozen


def _activation_bytes(inp: PlanInputs, f: Facts) -> tuple[float, float]:
    """(without remat, with remat) per device; one more layer for the gradients flowing back."""
    p, wb = f.p, f.wb
    lora_elems = 0 if f.full else inp.lora_rank * len(inp.lora_targets)
    score_b = wb + 4 if wb == 2 else 8  # softmax in fp32, probabilities in the compute dtype

    def per_layer(remat: bool) -> float:
        dense, scores = _layer_act_elems(p, inp.seq, lora_elems, inp.engine, remat)
        return f.tokens * (dense * wb + scores * score_b / 2)

    edges = f.tokens * 3 * p.hidden_size * wb  # embedding output, final norm in/out
    no_remat = (p.num_layers + 1) * per_layer(False) + edges
    remat = p.num_layers * f.tokens * p.hidden_size * wb + edges + 2 * per_layer(True)
    return no_remat, remat


def _loss_head_bytes(inp: PlanInputs, f: Facts) -> float:
    """One chunk of fp32 logits with its softmax/gradient (or the full logits for the plain
    loss), the hidden-state gradient, and for full FT the tied embedding's gradient: it
    starts in the head at the start of backward and lives until the embedding lookup adds
    to it, unsharded (before FSDP's reduce-scatter)."""
    p = f.p
    rows = _loss_rows(inp, f)
    if inp.loss_impl == "plain":
        head = f.tokens * p.vocab_size * (12 + (f.wb if f.wb == 2 else 0))
    else:
        # The JAX engine's frozen head now forms a chunk's logits a slice of the vocabulary at a
        # time (train.jax_loss._online_head, ~30 MB for the 270M at 256 rows), but the three
        # whole-vocabulary buffers stay counted: XLA's estimate of the 270M's LoRA step (4 x 256,
        # plan.xla) fell 3.48 -> 3.02 GiB with it, against 3.20 analytic; counted as sliced, the
        # analytic falls to 2.45 (0.81 of XLA's): something else XLA holds is not counted
        head = _chunk_tokens(inp, f) * p.vocab_size * 4 * (3 if f.jax else 2)
        if not f.jax and not f.full:
            # a frozen head's logits go a vocabulary slice at a time, in FROZEN_ROWS times taller
            # chunks (at most half the budget held); the measured RSS of the 270M's GRPO update did
            # not fall with them (tests/plan/test_plan_calibration.py: 2.23 GB before and after),
            # so the figure calibrated before stays: half of a whole-vocabulary chunk
            head //= 2
    head_grad = p.vocab_size * p.hidden_size * f.tb if f.full else 0
    return head + head_grad + rows * p.hidden_size * 4


def _layer_params(p: Preset) -> int:
    return (p.param_count() - p.vocab_size * p.hidden_size - p.hidden_size) // p.num_layers


def workspace_parts(inp: PlanInputs, f: Facts, device: DeviceSpec) -> dict[str, float]:
    """Per device, beyond the model's own state:
    - JAX FSDP all-gathers each weight where it is used. XLA merges the forward's gather with
      the backward's (same sharded input), so each layer's gathered weights live from its
      forward to its backward, remat or not: measured with XLA's CPU compiler (plan.xla),
      the whole model unsharded at the peak. A TPU's scheduler may do better; we plan for it.
    - torch FSDP2 (`fully_shard` on each decoder layer and on the root, which holds the tied
      embedding): the root's weights stay gathered from forward to backward (FSDP2 does not
      reshard the root after forward), each layer's are gathered for its forward and again
      for its backward with the next layer's prefetched (two layers), and one layer's
      unsharded gradients wait for their reduce-scatter.
    - torch DDP: its gradient buckets, a second copy of every trainable gradient (the
      default, gradient_as_bucket_view=False).
    - optimizer temporaries: XLA fuses each update into one elementwise loop; torch's
      single-tensor AdamW (CPU) allocates one tensor-sized temporary, foreach (CUDA) one per
      trainable tensor (of this rank's shard) at once."""
    p = f.p
    gather = 0.0
    if f.jax and f.shard > 1:
        gather = p.param_count() * f.wb
    elif f.torch_fsdp:
        layer = _layer_params(p)
        gather = (p.vocab_size * p.hidden_size + 2 * layer) * f.wb + (layer * f.tb if f.full else 0)
    buckets = f.trainable * f.tb if f.ddp else 0
    per_shard = 1 if f.jax or not f.torch_fsdp else f.shard
    opt_tmp = 0 if f.jax else (f.trainable / per_shard if device.kind == "gpu" else f.largest) * f.tb
    base = 0
    if device.kind == "cpu":
        base = CPU_BASELINE[inp.engine]
    elif device.kind == "gpu" and not f.jax:
        base = CUDA_CONTEXT
    return {"process_or_context": base, "fsdp_gather": gather, "ddp_buckets": buckets,
            "optimizer_temporaries": opt_tmp}


def step_analytic(inp: PlanInputs, preset: Preset, device: DeviceSpec) -> tuple[dict[str, int], dict[str, Any], int]:
    """A training step (SFT's, or the update of an RL step)."""
    f = facts(inp, preset)
    weights, grads, opt, frozen = _state_bytes(inp, f)
    act_full, act_remat = _activation_bytes(inp, f)
    activations = act_remat if inp.remat else act_full
    loss_head = _loss_head_bytes(inp, f)
    parts = workspace_parts(inp, f, device)
    core = weights + opt + max(activations + loss_head, grads)
    parts["allocator_slack"] = SLACK[device.kind] * (core + sum(v for k, v in parts.items() if k != "process_or_context"))
    workspace = sum(parts.values())
    items = {"weights": weights, "gradients": grads, "optimizer": opt, "activations": activations,
             "loss_head": loss_head, "workspace": workspace}
    details = {
        "params": preset.param_count(), "trainable_params": f.trainable,
        "trainable_weights": int(f.trainable * f.tb / (f.shard if f.full or not f.jax else 1)),
        "frozen_weights": int(frozen), "undonated_copy": int(0 if inp.donate else weights / 2),
        "activations_no_remat": int(act_full), "activations_remat": int(act_remat),
        "tokens_per_device": f.tokens, "loss_chunk_tokens": _chunk_tokens(inp, f),
        "strategy": inp.strategy, "ranks": f.ranks, "shards": f.shard, "fsdp": inp.fsdp,
        "tp": inp.tp,
        "gradients_materialised": not f.jax or inp.grad_clip > 0 or inp.grad_accum > 1,
        "workspace_parts": {k: int(v) for k, v in parts.items()},
        "peak_formula": "weights + optimizer + max(activations + loss_head, gradients) + workspace",
        "param_bytes": f.wb,
    }
    return {k: int(v) for k, v in items.items()}, details, int(core + workspace)


def _loss_rows(inp: PlanInputs, f: Facts) -> int:
    """Token rows the loss works on per device. The JAX loss sorts the flattened global batch
    (supervised tokens first) and indexes it by that permutation: XLA's sharding propagation
    leaves the result replicated, so every device runs every chunk of the global batch
    (XLA's buffer assignment holds a whole [chunk, V] block per device under fsdp). The torch
    engine's ranks each see their own micro-batch."""
    return inp.batch * inp.seq if f.jax else f.tokens


def _chunk_tokens(inp: PlanInputs, f: Facts) -> int:
    """Tokens of one loss chunk on one device: the one rule (`train.chunking`), no more than
    the rows there are."""
    return min(chunk_tokens(inp.loss_chunk_bytes, f.p.vocab_size), _loss_rows(inp, f))


def check_lora_rank(inp: PlanInputs, preset: Preset) -> None:
    """Refuse a LoRA rank above the width of a targeted projection (the smaller of its input
    and output size): past it the adapter adds parameters and memory but no rank (a rank
    of 100000 on a tiny model once planned 397M trainable weights)."""
    if inp.method != "lora":
        return
    shapes = {}
    for t in inp.lora_targets:
        (fan_in, _), (_, fan_out) = _lora_shapes(preset, 1, (t,))[:2]  # A is in x rank, B rank x out
        shapes[t] = (fan_in, fan_out)
    narrowest = min(shapes, key=lambda t: min(shapes[t]))
    width = min(shapes[narrowest])
    if inp.lora_rank > width:
        raise BadInput(f"plan: lora_rank {inp.lora_rank} is above the width of {narrowest} on {preset.name} "
                       f"({shapes[narrowest][0]} x {shapes[narrowest][1]}: a rank of at most {width}); lower "
                       f"lora_rank or leave {narrowest} out of lora_targets")
