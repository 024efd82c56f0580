"""The memory plan: bytes per device before anything is allocated; fits, or says what to change.

The system we replace lost weeks to "Used 28.59G of 15.75G hbm" (Gemma 2B, full fine-tune,
one 16 GB v5e chip). A plan answers that before compiling: an analytic estimate of every
item that lives on a device at the peak of a training step, itemised, and, for the JAX
engine, XLA's own figure for the real train step lowered with abstract shapes
(`tunix_rt.plan.xla`, run in a subprocess because it fakes devices).

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
  MLP's gate, GELU, up and product (3 projections), post-norms on Gemma 2/3, q/k norms on
  Gemma 3, and the attention score matrix [heads, L] per token (scores and probabilities,
  as eager and XLA attention materialise them). With rematerialisation only each layer's
  input stays, and one layer is recomputed at a time. One more layer's worth is counted
  for the gradients flowing backward.
- loss_head: the chunked loss (no [B, L, V] logits): one chunk of fp32 logits (its tokens
  from `loss_chunk_bytes`, `train.chunking`, the engines' rule), with its softmax and
  gradient (up to 3 chunk-sized buffers in the JAX scan, 2 in the torch fused loss), plus,
  for full fine-tuning, the gradient of the tied embedding [V, D] the head produces. The
  JAX loss sorts the global batch's tokens and runs every chunk on every device (XLA's
  buffer assignment holds a whole chunk per device under fsdp), so its chunk is not split
  by the device count. The plain loss (loss_impl=plain) holds the full logits, log-softmax
  and their gradient.
- workspace: the process baseline on a CPU (Python + torch/jax RSS; torch: 0.40-0.48 GB when
  first measured, 0.52-0.60 GB now), the CUDA context on a GPU, FSDP's gathered weights (XLA keeps each layer's
  all-gathered weights from its forward to its backward: the whole model unsharded at the
  peak, as XLA's own analysis shows; torch FSDP2: the root with the embedding and two
  layers, `_workspace_parts`), DDP's gradient buckets, torch's optimizer temporaries, and
  allocator slack.

The peak is not the plain sum: gradients are produced while activations are freed, so
    peak = weights + optimizer + max(activations + loss_head, gradients) + workspace
(`items` lists every item; `details.peak_formula` says how they were combined).

An RL step (method grpo: `rl_prompts` P, `group_size` G, `rollout_tokens` T) has two phases
that never overlap, and peaks in the larger (`details.phases`, `details.peak_phase`):
- update: the training step above over the P x G rollout sequences (prompt + completion, at
  most seq tokens) in micro-batches of `batch`, all accumulated into one optimizer step,
  plus rl_aux (the per-token coef, advantage, old and reference log-prob arrays; the
  reference is the adapter-off model, no second copy);
- rollout: the resident weights and optimizer state, merged_view (torch LoRA: W + scale B@A
  of every adapted projection, held for the whole rollout), rollout_cache (the KV cache of
  every row: P x G rollouts of the longest prompt, seq - T, plus T new tokens, in the
  weights' dtype, with the generator's transient copies) and rollout_workspace (the
  prefill's one-layer intermediates or a decode step's logits and sampler buffers); the
  held-out greedy decode of a GRPO run (eval's batch of prompts, the int8 screen of the head
  on a CPU) is planned the same way and counted when it is the larger.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.models.catalog import PRESETS, Preset, get_preset
from tunix_rt.train.chunking import DEFAULT_CHUNK_BYTES, chunk_tokens
from tunix_rt.train.methods import rolls_out

GiB = 1024**3
MiB = 1024**2
ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: bytes per weight of a QLoRA-quantised projection: 4 or 8 bits plus an fp32 scale per 64
QBYTES = {"nf4": 0.5 + 4 / 64, "int8": 1.0 + 4 / 64}
#: RSS of a training process beyond the model's own bytes, measured here: a whole tiny
#: torch-engine run peaked at 0.48 GB when first measured, 0.55-0.62 GB on 2026-11-25 (whole
#: tiny runs in tests/plan/test_plan_calibration.py; torch+transformers+peft alone: 0.40 GB); a tiny
#: JAX-engine run at 1.22 GB (jax+flax+optax+tunix alone: 0.48 GB; the engine also imports
#: torch for its data path, orbax, and XLA's compiler holds the compiled step).
CPU_BASELINE = {"torch": 540 * 10**6, "jax": 1150 * 10**6}
CUDA_CONTEXT = 512 * MiB
#: allocator slack on top of everything else (caching allocator / XLA fragmentation; glibc
#: malloc on a CPU)
SLACK = {"cpu": 0.05, "gpu": 0.05, "tpu": 0.03}


# --------------------------------------------------------------------------- devices

@dataclass(frozen=True)
class DeviceSpec:
    """One device kind: usable bytes per device (what the runtime lets a program use)."""

    name: str
    kind: str  # cpu | gpu | tpu
    capacity_bytes: int
    note: str
    bf16: bool = True


def _tpu(name: str, hbm_gib: float, note: str) -> DeviceSpec:
    # XLA reports 15.75G usable of a v5e chip's 16 GiB; the other chips keep the same share.
    usable = 15.75 if name == "tpu-v5e" else hbm_gib * 15.75 / 16
    return DeviceSpec(name, "tpu", int(usable * GiB), note)


DEVICES: dict[str, DeviceSpec] = {
    d.name: d
    for d in [
        # GPUs: the memory nvidia-smi reports; the CUDA context is counted in workspace.
        DeviceSpec("t4-16gb", "gpu", 15360 * MiB, "NVIDIA T4 16 GB (no bf16 tensor cores)", bf16=False),
        DeviceSpec("l4-24gb", "gpu", 23034 * MiB, "NVIDIA L4 24 GB"),
        DeviceSpec("a100-40gb", "gpu", 40960 * MiB, "NVIDIA A100 40 GB"),
        DeviceSpec("a100-80gb", "gpu", 81920 * MiB, "NVIDIA A100 80 GB"),
        DeviceSpec("h100-80gb", "gpu", 81559 * MiB, "NVIDIA H100 80 GB"),
        DeviceSpec("h200-141gb", "gpu", 143771 * MiB, "NVIDIA H200 141 GB"),
        _tpu("tpu-v3", 16, "TPU v3, per core (Kaggle's v3-8: 8 devices x 16 GiB)"),
        _tpu("tpu-v4", 32, "TPU v4, per chip (32 GiB HBM)"),
        _tpu("tpu-v5e", 16, "TPU v5e (v5 lite), per chip (16 GiB HBM, 15.75G usable)"),
        _tpu("tpu-v5p", 95, "TPU v5p, per chip (95 GiB HBM)"),
        _tpu("tpu-v6e", 32, "TPU v6e (Trillium), per chip (32 GiB HBM)"),
    ]
}
#: JAX device_kind -> our name, for plans made inside a running JAX engine
JAX_KINDS = {"TPU v3": "tpu-v3", "TPU v4": "tpu-v4", "TPU v5 lite": "tpu-v5e", "TPU v5e": "tpu-v5e",
             "TPU v5p": "tpu-v5p", "TPU v5": "tpu-v5p", "TPU v6 lite": "tpu-v6e", "TPU v6e": "tpu-v6e"}


def resolve_device(name: str) -> DeviceSpec:
    """A named device, `cpu` (this host's RAM), `cuda`/`gpu` (the GPU present) or `tpu`
    (the TPU a running JAX process sees)."""
    if name in DEVICES:
        return DEVICES[name]
    if name == "cpu":
        import psutil

        return DeviceSpec("cpu", "cpu", int(psutil.virtual_memory().total), "this host's RAM", bf16=False)
    if name in ("cuda", "gpu", "tpu"):
        live = _live_jax_device(name) if name != "cuda" else None
        return live or _live_cuda_device(name)
    known = ", ".join(["cpu", "cuda", *DEVICES])
    raise BadInput(f"unknown device {name!r}; known: {known}")


def _live_jax_device(name: str) -> DeviceSpec | None:
    """The device of a JAX process that already imported jax (the JAX engine); never
    imports jax itself, so a plan stays cheap."""
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        dev = jax.devices(name)[0]
    except RuntimeError:
        return None
    kind = str(getattr(dev, "device_kind", ""))
    stats = {}
    try:
        stats = dev.memory_stats() or {}
    except Exception:  # some backends have none
        pass
    if stats.get("bytes_limit"):
        return DeviceSpec(name, "tpu" if name == "tpu" else "gpu", int(stats["bytes_limit"]), kind)
    if kind in JAX_KINDS:
        return DEVICES[JAX_KINDS[kind]]
    return None


def _live_cuda_device(name: str) -> DeviceSpec:
    if name == "tpu":
        raise BadInput("device tpu: name the chip (tpu-v3, tpu-v4, tpu-v5e, tpu-v5p, tpu-v6e)")
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        raise BadInput(f"device {name}: no CUDA device here; name one instead ({', '.join(n for n, d in DEVICES.items() if d.kind == 'gpu')})")
    props = torch.cuda.get_device_properties(0)
    major, _ = torch.cuda.get_device_capability(0)
    return DeviceSpec("cuda", "gpu", int(props.total_memory), props.name, bf16=major >= 8)


# --------------------------------------------------------------------------- inputs

@dataclass(frozen=True)
class PlanInputs:
    """What a plan needs to know; `plan_train` derives it from a TrainConfig."""

    model: str
    method: str = "lora"
    seq: int = 512
    batch: int = 4
    """Sequences per micro-batch, over all devices (the JAX engine splits it over fsdp)."""
    device: str = "cpu"
    devices: int = 1
    optimizer: str = "adamw"
    dtype: str = "fp32"
    engine: str = "torch"
    remat: bool = False
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = ALL_TARGETS
    weight_qtype: str | None = None
    grad_accum: int = 1
    grad_clip: float = 1.0
    loss_impl: str = "chunked"
    loss_chunk_bytes: int = DEFAULT_CHUNK_BYTES
    tp: int = 1
    donate: bool = True
    """The JAX step donates the model (our engine does): new weights overwrite the old.
    False: Tunix's own PeftTrainer (it donates only the optimizer); the step writes the new
    model state beside the old one, both live at the peak."""
    strategy: str = "auto"
    """How several devices split the work: fsdp (weights, gradients and optimizer state
    sharded; the JAX engine's only way) or ddp (torch engine: every rank a replica). auto:
    fsdp for the JAX engine and for full fine-tuning, ddp for LoRA on torch."""
    rl_prompts: int = 0
    """RL (method grpo): P prompts per step; 0 (with group_size and rollout_tokens): an SFT step."""
    group_size: int = 0
    """RL: G completions sampled per prompt."""
    rollout_tokens: int = 0
    """RL: most new tokens per completion (rollout_max_new_tokens); prompts take the rest of seq."""

    def __post_init__(self) -> None:
        for name, choices in (("method", ("lora", "full")), ("optimizer", ("adamw", "adafactor")),
                              ("dtype", ("fp32", "bf16")), ("engine", ("torch", "jax")),
                              ("loss_impl", ("chunked", "plain")), ("strategy", ("auto", "ddp", "fsdp"))):
            if getattr(self, name) not in choices:
                raise BadInput(f"plan: {name} must be one of {'|'.join(choices)}, got {getattr(self, name)!r}")
        for name in ("seq", "batch", "devices", "lora_rank", "grad_accum", "loss_chunk_bytes", "tp"):
            if getattr(self, name) < 1:
                raise BadInput(f"plan: {name} must be >= 1, got {getattr(self, name)}")
        if self.weight_qtype is not None:
            if self.weight_qtype not in QBYTES:
                raise BadInput(f"plan: weight_qtype must be one of {'|'.join(QBYTES)}, got {self.weight_qtype!r}")
            if self.method != "lora" or self.engine != "jax":
                raise BadInput("plan: weight_qtype (QLoRA) needs --method lora and the JAX engine")
        if self.strategy == "auto":  # frozen: the one place the default is resolved
            auto = "fsdp" if self.engine == "jax" or self.method == "full" else "ddp"
            object.__setattr__(self, "strategy", auto)
        if self.engine == "jax" and self.strategy != "fsdp":
            raise BadInput("plan: the JAX engine shards over its (fsdp, tp) mesh; --strategy ddp is for --engine torch")
        if self.engine == "torch" and self.tp > 1:
            raise BadInput("plan: tensor parallelism (tp) is the JAX engine's; the torch engine runs ddp or fsdp")
        if self.engine == "torch" and not self.donate:
            raise BadInput("plan: --no-donate is the JAX step's; the torch engine updates weights in place")
        if self.devices % self.tp:
            raise BadInput(f"plan: devices ({self.devices}) must be a multiple of tp ({self.tp})")
        self._check_rl()

    def _check_rl(self) -> None:
        rl = (self.rl_prompts, self.group_size, self.rollout_tokens)
        if any(v < 0 for v in rl) or (any(rl) and not all(rl)):
            raise BadInput("plan: an RL step needs rl_prompts, group_size and rollout_tokens, each >= 1 "
                           "(--rl-prompts, --group-size, --rollout-tokens together)")
        if self.rl and self.rollout_tokens >= self.seq:
            raise BadInput(f"plan: rollout_tokens ({self.rollout_tokens}) must leave room for the prompt "
                           f"in seq ({self.seq})")

    @property
    def rl(self) -> bool:
        """An RL step (rollouts, then the update), not an SFT step."""
        return self.rl_prompts > 0

    @property
    def fsdp(self) -> int:
        """Data-parallel ranks: each holds batch / fsdp sequences (ddp ranks too)."""
        return self.devices // self.tp


# --------------------------------------------------------------------------- the plan

@dataclass
class Plan:
    """A plan's verdict and its evidence; `to_json()` is the `tunix-rt plan --json` object."""

    inputs: PlanInputs
    device: DeviceSpec
    items: dict[str, int]
    details: dict[str, Any]
    peak_bytes_per_device: int
    estimators: dict[str, int]
    suggestions: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def capacity_bytes(self) -> int:
        return self.device.capacity_bytes

    @property
    def fits(self) -> bool:
        return self.peak_bytes_per_device <= self.capacity_bytes

    def to_json(self) -> dict[str, Any]:
        out = {
            "fits": self.fits,
            "peak_bytes_per_device": int(self.peak_bytes_per_device),
            "capacity_bytes": int(self.capacity_bytes),
            "items": {k: int(v) for k, v in self.items.items()},
            "estimators": {k: int(v) for k, v in self.estimators.items()},
            "suggestions": self.suggestions,
            "inputs": {**asdict(self.inputs), "lora_targets": list(self.inputs.lora_targets)},
            "device": {"name": self.device.name, "kind": self.device.kind, "note": self.device.note},
            "details": self.details,
            "notes": self.notes,
        }
        if self.inputs.rl:
            out["peak_phase"] = self.details["peak_phase"]
        return out

    def renderable(self):
        """A rich table, a verdict line and, when it does not fit, the changes that do."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        i = self.inputs
        how = f"{i.engine}, {i.strategy}" if i.engine == "torch" and i.devices > 1 else i.engine
        title = (f"{i.model} {i.method} on {i.devices} x {self.device.name} ({how}): "
                 f"batch {i.batch} x seq {i.seq}, {i.dtype}, {i.optimizer}"
                 + (", remat" if i.remat else "") + (f", {i.weight_qtype}" if i.weight_qtype else "")
                 + (f"; RL step: {i.rl_prompts} prompts x {i.group_size} samples, up to {i.rollout_tokens} "
                    f"new tokens" if i.rl else ""))
        table = Table()
        table.add_column("item")
        table.add_column("per device", justify="right")
        if i.rl:
            table.add_column("phase")
        for k, v in self.items.items():
            table.add_row(k, fmt_bytes(v), *([RL_ITEM_PHASE.get(k, "both")] if i.rl else []))
        for name, v in self.details.get("phases", {}).items():
            peak = " (the peak)" if name == self.details["peak_phase"] else ""
            table.add_row(f"[bold]{name} phase{peak}[/bold]", f"[bold]{fmt_bytes(v)}[/bold]", name)
        for k, v in self.estimators.items():
            table.add_row(f"[bold]estimate: {k}[/bold]", f"[bold]{fmt_bytes(v)}[/bold]", *([""] if i.rl else []))
        table.add_row("capacity", fmt_bytes(self.capacity_bytes), *([""] if i.rl else []))
        formula = Text("peak = " + self.details["peak_formula"], style="dim")
        verdict = Text(
            f"{'FITS' if self.fits else 'DOES NOT FIT'}: predicted peak {fmt_bytes(self.peak_bytes_per_device)} "
            f"of {fmt_bytes(self.capacity_bytes)} per device ({self.peak_bytes_per_device / self.capacity_bytes:.0%})",
            style="bold green" if self.fits else "bold red",
        )
        parts: list[Any] = [Text(title, style="bold"), table, formula, verdict]
        parts += [Text(f"note: {n}", style="dim") for n in self.notes]
        if not self.fits:
            if self.suggestions:
                sug = Table(title="changes that make it fit (cheapest first)", title_justify="left")
                sug.add_column("change")
                sug.add_column("predicted peak", justify="right")
                for s in self.suggestions:
                    sug.add_row(s["change"], fmt_bytes(s["peak_bytes_per_device"]))
                parts.append(sug)
            else:
                parts.append(Text("no single or paired change we know makes it fit", style="red"))
        return Group(*parts)

    def render(self) -> str:
        """The same as plain text (for logs and error messages)."""
        from io import StringIO

        from rich.console import Console

        buf = StringIO()
        Console(file=buf, width=100, color_system=None, force_terminal=False).print(self.renderable())
        return buf.getvalue()


#: which phase of an RL step holds an item (the rest, weights and optimizer state, both)
RL_ITEM_PHASE = {"gradients": "update", "activations": "update", "loss_head": "update", "rl_aux": "update",
                 "merged_view": "rollout", "rollout_cache": "rollout", "rollout_workspace": "rollout",
                 "workspace": "the peak's"}


def fmt_bytes(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= 0.1 * GiB else f"{n / MiB:.1f} MiB"


# --------------------------------------------------------------------------- the analytic model

def _layer_act_elems(p: Preset, seq: int, lora_elems: int) -> tuple[int, int]:
    """Elements saved for backward per token in one layer: (dense part, score part)."""
    h, i = p.hidden_size, p.intermediate_size
    q, kv = p.num_heads * p.head_dim, p.num_kv_heads * p.head_dim
    norms = 4 * h if p.family == "gemma" else 6 * h  # pre-norm in+out x2, post-norm inputs
    attn = 2 * q + 2 * kv  # scaled q and k after RoPE, v, the context
    if p.family == "gemma3":
        attn += q + kv  # q/k norm inputs
    mlp = 4 * i  # gate, gelu(gate), up, gelu * up
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


def _proj_elems(p: Preset, targets: tuple[str, ...]) -> int:
    h, i = p.hidden_size, p.intermediate_size
    q, kv = p.num_heads * p.head_dim, p.num_kv_heads * p.head_dim
    size = {"q_proj": h * q, "k_proj": h * kv, "v_proj": h * kv, "o_proj": q * h,
            "gate_proj": h * i, "up_proj": h * i, "down_proj": i * h}
    return p.num_layers * sum(size[t] for t in targets)


@dataclass(frozen=True)
class _Facts:
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


def _facts(inp: PlanInputs, p: Preset) -> _Facts:
    jax_engine = inp.engine == "jax"
    full = inp.method == "full"
    wb = 4 if inp.dtype == "fp32" else 2
    ranks = inp.fsdp
    if jax_engine:
        shard = inp.devices
    else:
        shard = inp.devices if inp.strategy == "fsdp" else 1
    lora = _lora_shapes(p, inp.lora_rank, inp.lora_targets)
    return _Facts(
        p=p, jax=jax_engine, wb=wb, tb=wb if full else 4, shard=shard, ranks=ranks,
        torch_fsdp=not jax_engine and inp.strategy == "fsdp" and inp.devices > 1,
        ddp=not jax_engine and inp.strategy == "ddp" and inp.devices > 1, full=full,
        trainable=p.param_count() if full else p.lora_param_count(inp.lora_rank, inp.lora_targets),
        largest=p.vocab_size * p.hidden_size if full else max(a * b for a, b in lora),
        tokens=math.ceil(inp.batch / ranks) * inp.seq,
    )


def _state_bytes(inp: PlanInputs, f: _Facts) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer, frozen weights) per device. The JAX engine keeps LoRA
    adapters whole (they are small); torch's fully_shard shards every parameter."""
    p, n_params = f.p, f.p.param_count()
    per_shard = f.shard if f.full or not f.jax else 1
    if f.full:
        frozen = 0.0
        weights = n_params * f.wb / f.shard
    else:
        proj = _proj_elems(p, inp.lora_targets)
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


def _activation_bytes(inp: PlanInputs, f: _Facts) -> tuple[float, float]:
    """(without remat, with remat) per device; one more layer for the gradients flowing back."""
    p, wb = f.p, f.wb
    lora_elems = 0 if f.full else inp.lora_rank * len(inp.lora_targets)
    dense, scores = _layer_act_elems(p, inp.seq, lora_elems)
    score_b = wb + 4 if wb == 2 else 8  # softmax in fp32, probabilities in the compute dtype
    per_layer = f.tokens * (dense * wb + scores * score_b / 2)
    edges = f.tokens * 3 * p.hidden_size * wb  # embedding output, final norm in/out
    no_remat = p.num_layers * per_layer + edges + per_layer
    remat = p.num_layers * f.tokens * p.hidden_size * wb + edges + 2 * per_layer
    return no_remat, remat


def _loss_head_bytes(inp: PlanInputs, f: _Facts) -> float:
    """One chunk of fp32 logits with its softmax/gradient (or the full logits for the plain
    loss), the hidden-state gradient, and for full FT the tied embedding's gradient: it
    starts in the head at the start of backward and lives until the embedding lookup adds
    to it, unsharded (before FSDP's reduce-scatter)."""
    p = f.p
    rows = _loss_rows(inp, f)
    if inp.loss_impl == "plain":
        head = f.tokens * p.vocab_size * (12 + (f.wb if f.wb == 2 else 0))
    else:
        head = _chunk_tokens(inp, f) * p.vocab_size * 4 * (3 if f.jax else 2)
    head_grad = p.vocab_size * p.hidden_size * f.tb if f.full else 0
    return head + head_grad + rows * p.hidden_size * 4


def _layer_params(p: Preset) -> int:
    return (p.param_count() - p.vocab_size * p.hidden_size - p.hidden_size) // p.num_layers


def _workspace_parts(inp: PlanInputs, f: _Facts, device: DeviceSpec) -> dict[str, float]:
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


def analytic(inp: PlanInputs, preset: Preset, device: DeviceSpec) -> tuple[dict[str, int], dict[str, Any], int]:
    """(items, details, peak) in bytes per device; see the module docstring."""
    if inp.rl:
        return _rl_analytic(inp, preset, device)
    return _step_analytic(inp, preset, device)


def _step_analytic(inp: PlanInputs, preset: Preset, device: DeviceSpec) -> tuple[dict[str, int], dict[str, Any], int]:
    """A training step (SFT's, or the update of an RL step)."""
    f = _facts(inp, preset)
    weights, grads, opt, frozen = _state_bytes(inp, f)
    act_full, act_remat = _activation_bytes(inp, f)
    activations = act_remat if inp.remat else act_full
    loss_head = _loss_head_bytes(inp, f)
    parts = _workspace_parts(inp, f, device)
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


def _loss_rows(inp: PlanInputs, f: _Facts) -> int:
    """Token rows the loss works on per device. The JAX loss sorts the flattened global batch
    (supervised tokens first) and indexes it by that permutation: XLA's sharding propagation
    leaves the result replicated, so every device runs every chunk of the global batch
    (XLA's buffer assignment holds a whole [chunk, V] block per device under fsdp). The torch
    engine's ranks each see their own micro-batch."""
    return inp.batch * inp.seq if f.jax else f.tokens


def _chunk_tokens(inp: PlanInputs, f: _Facts) -> int:
    """Tokens of one loss chunk on one device: the one rule (`train.chunking`), no more than
    the rows there are."""
    return min(chunk_tokens(inp.loss_chunk_bytes, f.p.vocab_size), _loss_rows(inp, f))


# --------------------------------------------------------------------------- the RL step

#: fp32 [rows, vocab] buffers a sampled decode step holds at once: the step's logits and the
#: sampler's (eval.generate.filtered_probs, its worst path, top-k and top-p: the tempered
#: logits, the top-k mask, the sorted logits and their int64 order, the softmax and its
#: cumulative sum); the JAX sampler makes the same float64 copies on the host
SAMPLER_BUFFERS = 8
#: the same for a greedy step (the logits, the argmax's and the screen's int32 sums)
GREEDY_BUFFERS = 3


def update_inputs(inp: PlanInputs) -> PlanInputs:
    """The update of an RL step as a training step: the P x G rollout sequences (prompt +
    completion, at most seq tokens) in micro-batches of `batch` (all of them when fewer),
    every micro-batch accumulated into one optimizer step (train.grpo: grad_accum plays no
    part there)."""
    rows = inp.rl_prompts * inp.group_size
    batch = min(inp.batch, rows)
    return replace(inp, batch=batch, grad_accum=math.ceil(rows / batch), rl_prompts=0, group_size=0,
                   rollout_tokens=0)


def _rl_aux_bytes(inp: PlanInputs, upd: PlanInputs, f: _Facts, device: DeviceSpec) -> float:
    """The update's per-token fp32 arrays: coef, adv, old and reference log-probs of every
    rollout sequence (host arrays: on a CPU, the device's memory), and one micro-batch's
    device copy of them with the loss's stacked [B, L, 3] aux."""
    host = 4 * inp.rl_prompts * inp.group_size * inp.seq * 4 if device.kind == "cpu" else 0
    return host + 7 * math.ceil(upd.batch / f.ranks) * upd.seq * 4


def _decode_bytes(inp: PlanInputs, f: _Facts, device: DeviceSpec, rows: int, greedy: bool) -> dict[str, float]:
    """KV cache and workspace of one generate call of `rows` prompts (the longest prompt
    `seq - rollout_tokens` tokens, then rollout_tokens new ones), per device. Every device
    decodes every row: the JAX generator's cache and batch are not sharded, and each torch
    rank runs the method's rollouts itself.
    - torch (eval.generate + fast_gemma.LeanGemma): a cache of prompt + new slots per layer,
      preallocated in the model dtype, beside the prefill's own cache while it is copied in;
      later, when a row finishes, the new keys are built before the old are dropped (half a
      cache more). The larger of the two transients is counted.
    - JAX (eval.jax_generate): the prompt padded to a BUCKET multiple, and the jitted step's
      input and output caches both live (the step does not donate its cache).
    - workspace: the larger of the prefill (one layer's inference intermediates on every
      prompt token: residual and normed input, q/k/v, the attention scores and
      probabilities, the MLP's gate/up/product; and the last position's logits) and a
      decode step (the logits and the sampler's buffers); a decode of the torch engine on a
      CPU in fp32, greedy or sampled (Gumbel-max through the screen), also holds the int8
      copy of the head (eval.screened_head) and its permutation, built one group of rows
      at a time (once per head version: decoders share it)."""
    from tunix_rt.eval.jax_generate import BUCKET
    from tunix_rt.eval.screened_head import GROUPS as SCREEN_GROUPS
    from tunix_rt.eval.screened_head import PAD_COLS

    p, new = f.p, inp.rollout_tokens
    prompt = inp.seq - new
    per_token = 2 * p.num_layers * p.num_kv_heads * p.head_dim * f.wb  # K and V, every layer
    if f.jax:
        slots = -(-prompt // BUCKET) * BUCKET + new
        cache = 2 * rows * slots * per_token
    else:
        slots = inp.seq
        cache = rows * slots * per_token + max(rows * prompt * per_token, (rows - 1) * slots * per_token / 2)
    h, i = p.hidden_size, p.intermediate_size
    q, kv = p.num_heads * p.head_dim, p.num_kv_heads * p.head_dim
    keys = slots if f.jax else prompt  # JAX attends over the whole cache in the prefill
    layer = 2 * h + q + 2 * kv + 3 * i + 2 * p.num_heads * keys
    logits = rows * p.vocab_size * 4
    prefill = rows * prompt * layer * f.wb + logits
    step = (GREEDY_BUFFERS if greedy else SAMPLER_BUFFERS) * logits
    screen = build = 0
    if not f.jax and device.kind == "cpu" and f.wb == 4 and p.vocab_size >= 4 * PAD_COLS:
        screen = p.vocab_size * (p.hidden_size + 8)  # int8 rows, int64 permutation
        per = -(-p.vocab_size // SCREEN_GROUPS)  # built one group of rows at a time:
        build = screen + per * p.hidden_size * 32  # fp32 rows and codes, fp64 rows, codes, error
    return {"rows": rows, "slots": slots, "kv_bytes_per_token": per_token, "cache": cache,
            "workspace": max(max(prefill, step) + screen, build), "prefill": prefill, "step": step,
            "screen": screen, "screen_build": build}


def _rollout_phase(inp: PlanInputs, f: _Facts, device: DeviceSpec, weights: float,
                   optimizer: float) -> dict[str, Any]:
    """Bytes per device while the method decodes: the resident weights and optimizer state
    (no gradients, no activations: the last step freed them), on the torch engine with LoRA
    the merged view (W + scale B@A of every adapted projection, a second copy of those
    weights for the whole rollout: torch_engine.merged_lora_view), and the larger of the two
    decodes a GRPO run makes: the rollouts (P x G rows, sampled) and the held-out
    evaluation (greedy, eval's default batch of prompts)."""
    from tunix_rt.eval.generate import DecodeConfig

    merged = 0.0
    if not f.jax and not f.full:
        merged = _proj_elems(f.p, inp.lora_targets) * f.wb / f.shard
    rows = {"rollouts": (inp.rl_prompts * inp.group_size, False), "held-out eval": (DecodeConfig().batch_size, True)}
    resident = weights if inp.donate else weights / 2  # no step in flight: no undonated copy
    gather = _workspace_parts(inp, f, device)  # the forward's FSDP gathers, as in training
    decodes = {}
    for name, (n, greedy) in rows.items():
        d = _decode_bytes(inp, f, device, n, greedy)
        core = resident + optimizer + merged + d["cache"] + d["workspace"]
        parts = {"process_or_context": gather["process_or_context"], "fsdp_gather": gather["fsdp_gather"]}
        parts["allocator_slack"] = SLACK[device.kind] * (core + parts["fsdp_gather"])
        decodes[name] = {**d, "workspace_parts": parts, "peak": core + sum(parts.values())}
    which = max(decodes, key=lambda k: decodes[k]["peak"])
    d = decodes[which]
    return {"merged_view": merged, "rollout_cache": d["cache"], "rollout_workspace": d["workspace"],
            "workspace": sum(d["workspace_parts"].values()), "workspace_parts": d["workspace_parts"],
            "decode": which, "peak": d["peak"],
            "decodes": {k: _ints({n: x for n, x in v.items() if n != "workspace_parts"}) for k, v in decodes.items()}}


def _ints(d: dict[str, float]) -> dict[str, int]:
    return {k: int(v) for k, v in d.items()}


def _rl_analytic(inp: PlanInputs, preset: Preset, device: DeviceSpec) -> tuple[dict[str, int], dict[str, Any], int]:
    """An RL step peaks in one of its two phases: peak = max(update, rollout), where the
    update is a training step over the rollout sequences plus the RL per-token arrays, and
    the rollout holds the weights, optimizer state, merged view, KV cache and decode
    workspace (see `_rollout_phase`)."""
    upd = update_inputs(inp)
    items, details, update_peak = _step_analytic(upd, preset, device)
    f = _facts(upd, preset)
    aux = _rl_aux_bytes(inp, upd, f, device)
    update_peak += aux * (1 + SLACK[device.kind])
    update_ws = items["workspace"] + aux * SLACK[device.kind]
    roll = _rollout_phase(inp, f, device, items["weights"], items["optimizer"])
    phase = "rollout" if roll["peak"] > update_peak else "update"
    items = {**{k: v for k, v in items.items() if k != "workspace"}, "rl_aux": aux,
             "merged_view": roll["merged_view"], "rollout_cache": roll["rollout_cache"],
             "rollout_workspace": roll["rollout_workspace"],
             "workspace": roll["workspace"] if phase == "rollout" else update_ws}
    details.update({
        "peak_phase": phase, "phases": {"update": int(update_peak), "rollout": int(roll["peak"])},
        "update_batch": upd.batch, "update_micro_batches": upd.grad_accum, "rollout_decode": roll["decode"],
        "decodes": roll["decodes"], "rollout_workspace_parts": _ints(roll["workspace_parts"]),
        "update_workspace_parts": details.pop("workspace_parts"),
        "peak_formula": "max(update: weights + optimizer + max(activations + loss_head, gradients) + rl_aux "
                        "+ workspace, rollout: weights + optimizer + merged_view + rollout_cache "
                        "+ rollout_workspace + workspace)",
    })
    return {k: int(v) for k, v in items.items()}, details, int(max(update_peak, roll["peak"]))


# --------------------------------------------------------------------------- suggestions

#: cheapest first: same maths (remat, split batch), for RL fewer prompts per step, then a
#: smaller group or shorter rollouts, a different optimizer, LoRA, sharding, more chips
#: (JAX) or ranks (torch on GPUs), QLoRA (quantised base weights change the numbers a little)
def _candidates(inp: PlanInputs, device: DeviceSpec) -> list[tuple[int, str, PlanInputs]]:
    out: list[tuple[int, str, PlanInputs]] = []
    if not inp.remat:
        out.append((1, "remat (gradient_checkpointing=true)", replace(inp, remat=True)))
    out += _batch_splits(inp)
    if inp.rl:
        out += _rl_candidates(inp)
    if inp.dtype == "fp32" and inp.device not in ("cpu", "t4-16gb"):
        out.append((3, "dtype=bf16", replace(inp, dtype="bf16")))
    if inp.optimizer == "adamw":
        out.append((3, "optimizer=adafactor", replace(inp, optimizer="adafactor")))
    if inp.method == "full":
        out.append((4, f"method=lora (rank {inp.lora_rank})", replace(inp, method="lora")))
    if inp.strategy == "ddp" and inp.devices > 1:
        out.append((4, "strategy=fsdp", replace(inp, strategy="fsdp")))
    if device.kind != "cpu" and (inp.engine == "jax" or device.kind == "gpu"):
        n = inp.devices * 2
        while n <= 512:
            out.append((5, f"devices={n} (fsdp)", replace(inp, devices=n, strategy="fsdp")))
            n *= 2
    if inp.engine == "jax" and not inp.weight_qtype:
        out.append((6, "method=lora weight_qtype=nf4 (QLoRA)", replace(inp, method="lora", weight_qtype="nf4")))
    return out


def _batch_splits(inp: PlanInputs) -> list[tuple[int, str, PlanInputs]]:
    """Smaller micro-batches, same maths: more accumulation (an RL update accumulates every
    micro-batch of its rollouts anyway)."""
    out = []
    start = update_inputs(inp).batch if inp.rl else inp.batch
    b = start
    while b > 1:
        b //= 2
        if start % b == 0 and (b % inp.fsdp == 0 or b >= inp.fsdp):
            if inp.rl:
                out.append((2, f"batch={b}", replace(inp, batch=b)))
                continue
            acc = inp.grad_accum * inp.batch // b
            out.append((2, f"batch={b} grad_accum={acc}", replace(inp, batch=b, grad_accum=acc)))
    return out


def _rl_candidates(inp: PlanInputs) -> list[tuple[int, str, PlanInputs]]:
    """Fewer prompts per step (the same estimator on fewer prompts), a smaller group (noisier
    advantages), shorter rollouts keeping the prompts' room (answers may be cut): each
    halved until it fits, the least change first."""
    out = []
    n = inp.rl_prompts
    while n > 1:
        n //= 2
        out.append((2, f"rl_prompts={n}", replace(inp, rl_prompts=n)))
    g = inp.group_size
    while g > 2:
        g //= 2
        out.append((3, f"group_size={g}", replace(inp, group_size=g)))
    t = inp.rollout_tokens
    while t > 16:
        t //= 2
        seq = inp.seq - (inp.rollout_tokens - t)
        out.append((3, f"rollout_max_new_tokens={t} max_seq_len={seq}", replace(inp, rollout_tokens=t, seq=seq)))
    return out


def suggestions(inp: PlanInputs, preset: Preset, device: DeviceSpec, limit: int = 6) -> list[dict[str, Any]]:
    """Changes that make a plan fit, cheapest first, each with its predicted peak: single
    changes, and pairs when no single change fits. Only the smallest batch split and the
    fewest extra chips that fit are listed."""
    cands = _candidates(inp, device)
    found = _fitting([(c, [d], x) for c, d, x in cands], preset, device)
    if not found:
        cands = cands[:8] + [c for c in cands[8:] if c[0] != 5]  # pairs: fewer chip counts
    if not found:
        pairs = []
        for k, (c1, d1, x1) in enumerate(cands):
            for c2, d2, x2 in cands[k + 1:]:
                if c1 == c2:
                    continue
                try:
                    merged = _merge(inp, x1, x2)
                except BadInput:
                    continue
                pairs.append((c1 + c2, [d1, d2], merged))
        found = _fitting(pairs, preset, device)
    found.sort(key=lambda s: s["_cost"])  # stable: the least batch split / fewest chips first
    seen_kind: set[str] = set()
    out = []
    for s in found:
        kind = " + ".join(part.split("=")[0] for part in s["change"].split(" + "))
        if kind in seen_kind:
            continue  # e.g. only the least batch split / fewest chips that fits
        seen_kind.add(kind)
        s.pop("_cost")
        out.append(s)
    return out[:limit]


def _merge(base: PlanInputs, a: PlanInputs, b: PlanInputs) -> PlanInputs:
    changed = {k: v for k, v in asdict(b).items() if v != getattr(base, k)}
    changed["lora_targets"] = tuple(changed.get("lora_targets", a.lora_targets))
    return replace(a, **changed)


def _fitting(cands, preset: Preset, device: DeviceSpec) -> list[dict[str, Any]]:
    out = []
    for cost, desc, x in cands:
        _, _, peak = analytic(x, preset, device)
        if peak <= device.capacity_bytes:
            out.append({"change": " + ".join(desc), "peak_bytes_per_device": int(peak), "fits": True,
                        "_cost": cost})
    return out


# --------------------------------------------------------------------------- entry points

def resolve_preset(model: str) -> Preset:
    """A catalog name, or a model directory whose manifest or config.json names a preset."""
    if model in PRESETS:
        return PRESETS[model]
    from pathlib import Path

    from tunix_rt.files import MODEL_MANIFEST

    path = Path(model)
    manifest = path / MODEL_MANIFEST
    if manifest.is_file():
        name = json.loads(manifest.read_text(encoding="utf-8")).get("preset")
        if name in PRESETS:
            return PRESETS[name]
    config = path / "config.json"
    if config.is_file():
        hf = json.loads(config.read_text(encoding="utf-8"))
        family = {"gemma3_text": "gemma3", "gemma3": "gemma3", "gemma2": "gemma2", "gemma": "gemma"}.get(hf.get("model_type"))
        if family is None:
            raise BadInput(f"{config}: model_type {hf.get('model_type')!r} is not a Gemma the plan knows")
        return Preset(name=path.name, family=family, hf_config=hf, description=f"from {config}")
    get_preset(model)  # raises BadInput with the known names
    raise AssertionError("unreachable")


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


def make_plan(inp: PlanInputs, xla: bool = False, xla_timeout: float = 300.0,
              capacity_bytes: int | None = None) -> Plan:
    """The analytic plan (and XLA's figure when asked, JAX engine only) with suggestions."""
    preset = resolve_preset(inp.model)
    check_lora_rank(inp, preset)
    device = resolve_device(inp.device)
    notes = []
    if capacity_bytes:
        device = replace(device, capacity_bytes=int(capacity_bytes))
    elif device.kind == "cpu" and inp.devices > 1:  # fake CPU devices share the host's RAM
        device = replace(device, capacity_bytes=device.capacity_bytes // inp.devices)
        notes.append(f"{inp.devices} CPU devices share this host's RAM: capacity is a 1/{inp.devices} share")
    elif device.kind == "gpu" and inp.engine == "jax" and device.name in DEVICES:
        fraction = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75"))
        device = replace(device, capacity_bytes=int(device.capacity_bytes * fraction))
        notes.append(f"JAX preallocates {fraction:.0%} of a GPU (XLA_PYTHON_CLIENT_MEM_FRACTION)")
    items, details, peak = analytic(inp, preset, device)
    plan = Plan(inp, device, items, details, peak, {"analytic": peak}, notes=notes)
    if inp.engine == "jax" and inp.batch % inp.fsdp:
        plan.notes.append(f"batch {inp.batch} is not a multiple of fsdp={inp.fsdp}: the JAX engine needs it to be")
    if inp.dtype == "bf16" and not device.bf16:
        plan.notes.append(f"{device.name} has no fast bf16")
    if xla and inp.engine == "jax":
        try:
            res = xla_estimate(update_inputs(inp) if inp.rl else inp, timeout=xla_timeout)
        except TunixRtError as e:  # the analytic verdict stands; say why XLA has none
            plan.notes.append(f"no XLA estimate: {str(e).splitlines()[-1]}")
            res = None
    if xla and inp.engine == "jax" and res is not None:
        plan.estimators["xla"] = int(res["peak_bytes_per_device"])
        if inp.rl:  # XLA compiles the update; the rollout phase has the analytic figure only
            plan.estimators["xla"] = max(plan.estimators["xla"] + items["rl_aux"], details["phases"]["rollout"])
            plan.notes.append("xla: the update step compiled by XLA (plus rl_aux), or the analytic rollout phase "
                              "when that is larger")
        plan.details["xla"] = res
        plan.details["xla_over_analytic"] = round(plan.estimators["xla"] / peak, 3)
    if not plan.fits:
        plan.suggestions = suggestions(inp, preset, device)
    return plan


def resolve_engine(engine: str, device: str) -> str:
    """torch or jax: what engine=auto means on a device (`train.engines.pick`, the rule
    `train` and `eval` use), given a plan's device name or kind."""
    if engine != "auto":
        return engine
    from tunix_rt.train import engines

    if device not in ("cpu", "cuda", "gpu", "tpu"):  # a named kind: the engine's device word
        device = {"tpu": "tpu", "gpu": "cuda", "cpu": "cpu"}[resolve_device(device).kind]
    return engines.pick("auto", device)


def plan_train(cfg, device: str, devices: int, capacity_bytes: int | None = None, xla: bool = False,
               engine: str | None = None, strategy: str = "auto") -> Plan:
    """The plan of a TrainConfig on `devices` devices of a kind (a DEVICES name, cpu, cuda,
    or gpu/tpu inside a JAX process, where the live device's memory limit is read). Fast and
    jax-free unless xla=True. `engine` overrides cfg.engine (an engine planning itself should
    pass its name); torch on several devices is `torchrun` ranks (`strategy` ddp or fsdp)."""
    engine = resolve_engine(engine or cfg.engine, cfg.device if cfg.device != "auto" else device)
    tp = int(cfg.mesh.get("tp", 1)) if isinstance(cfg.mesh, dict) and engine == "jax" else 1
    n = devices
    if isinstance(cfg.mesh, dict) and engine == "jax":
        n = int(cfg.mesh.get("fsdp", 1)) * tp
    inp = PlanInputs(
        model=cfg.model, method=cfg.finetune, seq=cfg.max_seq_len, batch=cfg.batch_size,
        device=device, devices=n, optimizer=cfg.optimizer, dtype=cfg.dtype,
        engine=engine, remat=cfg.gradient_checkpointing, lora_rank=cfg.lora_rank,
        lora_targets=tuple(cfg.lora_targets),
        weight_qtype=cfg.lora_weight_qtype if engine == "jax" and cfg.finetune == "lora" else None,
        grad_accum=cfg.grad_accum, grad_clip=cfg.grad_clip, loss_impl=cfg.loss_impl,
        loss_chunk_bytes=cfg.loss_chunk_bytes, tp=tp, strategy=strategy,
        **({"rl_prompts": cfg.rl_prompts, "group_size": cfg.group_size,
            "rollout_tokens": cfg.rollout_max_new_tokens} if rolls_out(cfg.method) else {}),
    )
    return make_plan(inp, xla=xla, capacity_bytes=capacity_bytes)


def xla_estimate(inp: PlanInputs, timeout: float = 300.0) -> dict[str, Any]:
    """XLA's compiled memory analysis of the JAX train step on `inp.devices` fake CPU
    devices, in a subprocess (the device count must be set before jax is imported)."""
    env = dict(os.environ)
    flags = f"--xla_force_host_platform_device_count={inp.devices}"
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flags).strip()
    env["JAX_PLATFORMS"] = "cpu"
    payload = json.dumps({**asdict(inp), "lora_targets": list(inp.lora_targets)})
    try:
        proc = subprocess.run([sys.executable, "-m", "tunix_rt.plan.xla", payload], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TunixRtError(f"the XLA estimate took longer than {timeout:.0f} s") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise TunixRtError("the XLA estimate failed:\n" + "\n".join(tail))
    return json.loads(lines[-1])
