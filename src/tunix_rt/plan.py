"""The memory plan: bytes per device before anything is allocated; fits, or says what to change.

The system we replace lost weeks to "Used 28.59G of 15.75G hbm" (Gemma 2B, full fine-tune,
one 16 GB v5e chip). A plan answers that before compiling: an analytic estimate of every
item that lives on a device at the peak of a training step, itemised, and, for the JAX
engine, XLA's own figure for the real train step lowered with abstract shapes
(`tunix_rt.plan_xla`, run in a subprocess because it fakes devices).

What the analytic model counts (bytes per device; `fsdp` shards weights, gradients and
optimizer state in the JAX engine; the torch engine runs on one device):
- weights: every parameter in the param dtype (fp32 4 B, bf16 2 B); for LoRA the frozen
  base (its targeted projections at 4.5 or 8.5 bits for QLoRA: nf4/int8 plus one fp32
  scale per 64 weights) plus the fp32 adapter.
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
- loss_head: the chunked loss (no [B, L, V] logits): one chunk of fp32 logits, with its
  softmax and gradient (the JAX scan keeps 3 chunk-sized buffers, the torch fused loss 2),
  plus, for full fine-tuning, the gradient of the tied embedding [V, D] the head produces.
  The plain loss (loss_impl=plain) holds the full logits, log-softmax and their gradient.
- workspace: the process baseline on a CPU (Python + torch/jax RSS, measured 0.40-0.48 GB
  here), the CUDA context on a GPU, FSDP's gathered weights (XLA keeps each layer's
  all-gathered weights from its forward to its backward: the whole model unsharded at the
  peak, as XLA's own analysis shows), torch's optimizer temporaries, and allocator slack.

The peak is not the plain sum: gradients are produced while activations are freed, so
    peak = weights + optimizer + max(activations + loss_head, gradients) + workspace
(`items` lists every item; `details.peak_formula` says how they were combined).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace
from typing import Annotated, Any, Optional

import typer

from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.models.catalog import PRESETS, Preset, get_preset

GiB = 1024**3
MiB = 1024**2
ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: bytes per weight of a QLoRA-quantised projection: 4 or 8 bits plus an fp32 scale per 64
QBYTES = {"nf4": 0.5 + 4 / 64, "int8": 1.0 + 4 / 64}
#: RSS of a training process beyond the model's own bytes, measured here: a whole tiny
#: torch-engine run peaks at 0.48 GB (torch+transformers+peft alone: 0.40 GB); a tiny
#: JAX-engine run at 1.22 GB (jax+flax+optax+tunix alone: 0.48 GB; the engine also imports
#: torch for its data path, orbax, and XLA's compiler holds the compiled step).
CPU_BASELINE = {"torch": 460 * 10**6, "jax": 1150 * 10**6}
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
    loss_chunk_tokens: int = 1024
    tp: int = 1

    def __post_init__(self) -> None:
        for name, choices in (("method", ("lora", "full")), ("optimizer", ("adamw", "adafactor")),
                              ("dtype", ("fp32", "bf16")), ("engine", ("torch", "jax")),
                              ("loss_impl", ("chunked", "plain"))):
            if getattr(self, name) not in choices:
                raise BadInput(f"plan: {name} must be one of {'|'.join(choices)}, got {getattr(self, name)!r}")
        for name in ("seq", "batch", "devices", "lora_rank", "grad_accum", "loss_chunk_tokens", "tp"):
            if getattr(self, name) < 1:
                raise BadInput(f"plan: {name} must be >= 1, got {getattr(self, name)}")
        if self.weight_qtype is not None:
            if self.weight_qtype not in QBYTES:
                raise BadInput(f"plan: weight_qtype must be one of {'|'.join(QBYTES)}, got {self.weight_qtype!r}")
            if self.method != "lora" or self.engine != "jax":
                raise BadInput("plan: weight_qtype (QLoRA) needs --method lora and the JAX engine")
        if self.engine == "torch" and self.devices * self.tp > 1:
            raise BadInput("plan: the torch engine runs on one device; use --engine jax to shard over several")
        if self.devices % self.tp:
            raise BadInput(f"plan: devices ({self.devices}) must be a multiple of tp ({self.tp})")

    @property
    def fsdp(self) -> int:
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
        return out

    def renderable(self):
        """A rich table, a verdict line and, when it does not fit, the changes that do."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        i = self.inputs
        title = (f"{i.model} {i.method} on {i.devices} x {self.device.name} ({i.engine}): "
                 f"batch {i.batch} x seq {i.seq}, {i.dtype}, {i.optimizer}"
                 + (", remat" if i.remat else "") + (f", {i.weight_qtype}" if i.weight_qtype else ""))
        table = Table()
        table.add_column("item")
        table.add_column("per device", justify="right")
        for k, v in self.items.items():
            table.add_row(k, fmt_bytes(v))
        for k, v in self.estimators.items():
            table.add_row(f"[bold]estimate: {k}[/bold]", f"[bold]{fmt_bytes(v)}[/bold]")
        table.add_row("capacity", fmt_bytes(self.capacity_bytes))
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
    shard: int  # devices that split weights, gradients and optimizer state (JAX engine)
    fsdp: int
    full: bool
    trainable: int
    largest: int  # elements of the largest trainable tensor
    tokens: int  # tokens per device in one micro-batch


def _facts(inp: PlanInputs, p: Preset) -> _Facts:
    jax_engine = inp.engine == "jax"
    full = inp.method == "full"
    wb = 4 if inp.dtype == "fp32" else 2
    fsdp = inp.fsdp if jax_engine else 1
    lora = _lora_shapes(p, inp.lora_rank, inp.lora_targets)
    return _Facts(
        p=p, jax=jax_engine, wb=wb, tb=wb if full else 4, shard=inp.devices if jax_engine else 1,
        fsdp=fsdp, full=full,
        trainable=p.param_count() if full else p.lora_param_count(inp.lora_rank, inp.lora_targets),
        largest=p.vocab_size * p.hidden_size if full else max(a * b for a, b in lora),
        tokens=math.ceil(inp.batch / fsdp) * inp.seq,
    )


def _state_bytes(inp: PlanInputs, f: _Facts) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer, frozen weights) per device."""
    p, n_params = f.p, f.p.param_count()
    per_shard = f.shard if f.full else 1  # adapters are small and kept whole
    if f.full:
        frozen = 0.0
        weights = n_params * f.wb / f.shard
    else:
        proj = _proj_elems(p, inp.lora_targets)
        qb = QBYTES[inp.weight_qtype] if inp.weight_qtype else f.wb
        frozen = ((n_params - proj) * f.wb + proj * qb) / f.shard
        weights = frozen + f.trainable * 4
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
    if inp.loss_impl == "plain":
        head = f.tokens * p.vocab_size * (12 + (f.wb if f.wb == 2 else 0))
    else:
        head = _chunk_tokens(inp, f.tokens // inp.seq) * p.vocab_size * 4 * (3 if f.jax else 2)
    head_grad = p.vocab_size * p.hidden_size * f.tb if f.full else 0
    return head + head_grad + f.tokens * p.hidden_size * 4


def _workspace_parts(inp: PlanInputs, f: _Facts, device: DeviceSpec) -> dict[str, float]:
    """FSDP all-gathers each weight where it is used. XLA merges the forward's gather with
    the backward's (same sharded input), so each layer's gathered weights live from its
    forward to its backward, remat or not: measured with XLA's CPU compiler (plan_xla), the
    whole model unsharded at the peak. A TPU's scheduler may do better; we plan for this.
    Optimizer temporaries: XLA fuses each update into one elementwise loop; torch's
    single-tensor AdamW (CPU) allocates one tensor-sized temporary, foreach (CUDA) one per
    trainable tensor at once."""
    gather = f.p.param_count() * f.wb if f.jax and f.shard > 1 else 0
    opt_tmp = 0 if f.jax else (f.trainable if device.kind == "gpu" else f.largest) * f.tb
    base = 0
    if device.kind == "cpu":
        base = CPU_BASELINE[inp.engine]
    elif device.kind == "gpu" and not f.jax:
        base = CUDA_CONTEXT
    return {"process_or_context": base, "fsdp_gather": gather, "optimizer_temporaries": opt_tmp}


def analytic(inp: PlanInputs, preset: Preset, device: DeviceSpec) -> tuple[dict[str, int], dict[str, Any], int]:
    """(items, details, peak) in bytes per device; see the module docstring."""
    f = _facts(inp, preset)
    weights, grads, opt, frozen = _state_bytes(inp, f)
    act_full, act_remat = _activation_bytes(inp, f)
    activations = act_remat if inp.remat else act_full
    loss_head = _loss_head_bytes(inp, f)
    parts = _workspace_parts(inp, f, device)
    core = weights + opt + max(activations + loss_head, grads)
    parts["allocator_slack"] = SLACK[device.kind] * (core + parts["fsdp_gather"] + parts["optimizer_temporaries"])
    workspace = sum(parts.values())
    items = {"weights": weights, "gradients": grads, "optimizer": opt, "activations": activations,
             "loss_head": loss_head, "workspace": workspace}
    details = {
        "params": preset.param_count(), "trainable_params": f.trainable,
        "trainable_weights": int(f.trainable * f.tb / (f.shard if f.full else 1)),
        "frozen_weights": int(frozen),
        "activations_no_remat": int(act_full), "activations_remat": int(act_remat),
        "tokens_per_device": f.tokens, "loss_chunk_tokens_per_device": _chunk_tokens(inp, f.tokens // inp.seq),
        "fsdp": f.fsdp, "tp": inp.tp if f.jax else 1,
        "gradients_materialised": not f.jax or inp.grad_clip > 0 or inp.grad_accum > 1,
        "workspace_parts": {k: int(v) for k, v in parts.items()},
        "peak_formula": "weights + optimizer + max(activations + loss_head, gradients) + workspace",
        "param_bytes": f.wb,
    }
    return {k: int(v) for k, v in items.items()}, details, int(core + workspace)


def _chunk_tokens(inp: PlanInputs, b_dev: int) -> int:
    """Tokens of one loss chunk on one device. jax_loss reshapes the flattened global batch
    into [chunks, chunk]; with fsdp sharding the flat axis, each device holds chunk / (fsdp /
    chunks) tokens of a chunk when there are fewer chunks than devices, a whole one otherwise."""
    if inp.engine == "jax":
        total = inp.batch * inp.seq
        chunk = min(inp.loss_chunk_tokens, total)
        chunks = math.ceil(total / chunk)
        return max(1, chunk // max(1, inp.fsdp // chunks)) if inp.fsdp > chunks else chunk
    return min(b_dev * inp.seq, inp.loss_chunk_tokens)


# --------------------------------------------------------------------------- suggestions

#: cheapest first: same maths (remat, split batch), a different optimizer, LoRA, more chips,
#: QLoRA (quantised base weights change the numbers a little)
def _candidates(inp: PlanInputs) -> list[tuple[int, str, PlanInputs]]:
    out: list[tuple[int, str, PlanInputs]] = []
    if not inp.remat:
        out.append((1, "remat (gradient_checkpointing=true)", replace(inp, remat=True)))
    b = inp.batch
    while b > 1:
        b //= 2
        if inp.batch % b == 0 and (inp.engine == "torch" or b % inp.fsdp == 0 or b >= inp.fsdp):
            acc = inp.grad_accum * inp.batch // b
            out.append((2, f"batch={b} grad_accum={acc}", replace(inp, batch=b, grad_accum=acc)))
    if inp.dtype == "fp32" and inp.device not in ("cpu", "t4-16gb"):
        out.append((3, "dtype=bf16", replace(inp, dtype="bf16")))
    if inp.optimizer == "adamw":
        out.append((3, "optimizer=adafactor", replace(inp, optimizer="adafactor")))
    if inp.method == "full":
        out.append((4, f"method=lora (rank {inp.lora_rank})", replace(inp, method="lora")))
    if inp.engine == "jax" and inp.device != "cpu":
        n = inp.devices * 2
        while n <= 512:
            out.append((5, f"devices={n} (fsdp)", replace(inp, devices=n)))
            n *= 2
    if inp.engine == "jax" and not inp.weight_qtype:
        out.append((6, "method=lora weight_qtype=nf4 (QLoRA)", replace(inp, method="lora", weight_qtype="nf4")))
    return out


def suggestions(inp: PlanInputs, preset: Preset, device: DeviceSpec, limit: int = 6) -> list[dict[str, Any]]:
    """Changes that make a plan fit, cheapest first, each with its predicted peak: single
    changes, and pairs when no single change fits. Only the smallest batch split and the
    fewest extra chips that fit are listed."""
    cands = _candidates(inp)
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

    path = Path(model)
    manifest = path / "tunix_rt_model.json"
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


def make_plan(inp: PlanInputs, xla: bool = False, xla_timeout: float = 300.0,
              capacity_bytes: int | None = None) -> Plan:
    """The analytic plan (and XLA's figure when asked, JAX engine only) with suggestions."""
    preset = resolve_preset(inp.model)
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
            res = xla_estimate(inp, timeout=xla_timeout)
        except TunixRtError as e:  # the analytic verdict stands; say why XLA has none
            plan.notes.append(f"no XLA estimate: {str(e).splitlines()[-1]}")
            res = None
    if xla and inp.engine == "jax" and res is not None:
        plan.estimators["xla"] = int(res["peak_bytes_per_device"])
        plan.details["xla"] = res
        plan.details["xla_over_analytic"] = round(plan.estimators["xla"] / peak, 3)
    if not plan.fits:
        plan.suggestions = suggestions(inp, preset, device)
    return plan


def plan_train(cfg, device: str, devices: int, capacity_bytes: int | None = None, xla: bool = False,
               engine: str | None = None) -> Plan:
    """The plan of a TrainConfig on `devices` devices of a kind (a DEVICES name, cpu, cuda,
    or gpu/tpu inside a JAX process, where the live device's memory limit is read). Fast and
    torch/jax-free unless xla=True. `engine` overrides cfg.engine (an engine planning itself
    should pass its name; cfg.engine "auto" means JAX on TPUs or several devices)."""
    engine = engine or cfg.engine
    if engine == "auto":
        engine = "jax" if device.startswith("tpu") or devices > 1 else "torch"
    tp = int(cfg.mesh.get("tp", 1)) if isinstance(cfg.mesh, dict) else 1
    n = devices
    if isinstance(cfg.mesh, dict) and engine == "jax":
        n = int(cfg.mesh.get("fsdp", 1)) * tp
    inp = PlanInputs(
        model=cfg.model, method=cfg.method, seq=cfg.max_seq_len, batch=cfg.batch_size,
        device=device, devices=n if engine == "jax" else 1, optimizer=cfg.optimizer, dtype=cfg.dtype,
        engine=engine, remat=cfg.gradient_checkpointing, lora_rank=cfg.lora_rank,
        lora_targets=tuple(cfg.lora_targets),
        weight_qtype=cfg.lora_weight_qtype if engine == "jax" and cfg.method == "lora" else None,
        grad_accum=cfg.grad_accum, grad_clip=cfg.grad_clip, loss_impl=cfg.loss_impl,
        loss_chunk_tokens=cfg.loss_chunk_tokens, tp=tp if engine == "jax" else 1,
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
        proc = subprocess.run([sys.executable, "-m", "tunix_rt.plan_xla", payload], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TunixRtError(f"the XLA estimate took longer than {timeout:.0f} s") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise TunixRtError("the XLA estimate failed:\n" + "\n".join(tail))
    return json.loads(lines[-1])


# --------------------------------------------------------------------------- CLI

def plan_command(
    model: str, method: str, seq: int, batch: int, device: str, devices: int, optimizer: str,
    dtype: str, engine: str, remat: bool, lora_rank: int, weight_qtype: str | None, grad_accum: int,
    grad_clip: float, loss_chunk_tokens: int, xla: bool | None, as_json: bool,
) -> None:
    """`tunix-rt plan`: print the plan (rich table, verdict, suggestions) or its JSON."""
    if engine == "auto":
        engine = "jax" if device.startswith("tpu") or devices > 1 else "torch"
    if dtype == "auto":  # what a run on that device would use: bf16 where it is native
        spec = resolve_device(device)
        dtype = "bf16" if spec.bf16 and spec.kind != "cpu" else "fp32"
    inp = PlanInputs(model=model, method=method, seq=seq, batch=batch, device=device, devices=devices,
                     optimizer=optimizer, dtype=dtype, engine=engine, remat=remat, lora_rank=lora_rank,
                     weight_qtype=weight_qtype, grad_accum=grad_accum, grad_clip=grad_clip,
                     loss_chunk_tokens=loss_chunk_tokens)
    run_xla = engine == "jax" if xla is None else xla
    if run_xla and engine != "jax":
        raise BadInput("--xla needs --engine jax (it compiles the JAX train step)")
    if as_json:
        plan = make_plan(inp, xla=run_xla)
        print(json.dumps(plan.to_json()))
        return
    from rich.console import Console

    console = Console()
    if run_xla:
        with console.status(f"compiling the JAX train step on {devices} fake CPU device(s) for XLA's estimate…"):
            plan = make_plan(inp, xla=True)
    else:
        plan = make_plan(inp)
    console.print(plan.renderable())


def plan_cmd(
    model: Annotated[str, typer.Option("--model", help="Catalog preset or model directory.")],
    method: Annotated[str, typer.Option("--method", help="lora or full.")] = "lora",
    seq: Annotated[int, typer.Option("--seq", help="Sequence length (tokens).")] = 512,
    batch: Annotated[int, typer.Option("--batch", help="Sequences per micro-batch, over all devices.")] = 4,
    device: Annotated[str, typer.Option("--device", help="cpu, cuda, or a named kind: " + ", ".join(DEVICES))] = "cpu",
    devices: Annotated[int, typer.Option("--devices", help="Devices to shard over (FSDP, JAX engine).")] = 1,
    optimizer: Annotated[str, typer.Option("--optimizer", help="adamw or adafactor.")] = "adamw",
    dtype: Annotated[str, typer.Option("--dtype", help="Parameter dtype: fp32, bf16 or auto (bf16 on TPUs and bf16 GPUs).")] = "auto",
    engine: Annotated[str, typer.Option("--engine", help="torch, jax or auto (jax on TPUs or several devices).")] = "auto",
    remat: Annotated[bool, typer.Option("--remat/--no-remat", help="Rematerialise layer activations in backward.")] = False,
    lora_rank: Annotated[int, typer.Option("--lora-rank", help="LoRA rank.")] = 16,
    weight_qtype: Annotated[Optional[str], typer.Option("--weight-qtype", help="QLoRA base weights: nf4 or int8 (JAX).")] = None,
    grad_accum: Annotated[int, typer.Option("--grad-accum", help="Micro-batches per optimizer step.")] = 1,
    grad_clip: Annotated[float, typer.Option("--grad-clip", help="Global-norm clip (0: none; JAX then streams gradients into the update).")] = 1.0,
    loss_chunk_tokens: Annotated[int, typer.Option("--loss-chunk-tokens", help="Tokens per chunk of the chunked loss.")] = 1024,
    xla: Annotated[Optional[bool], typer.Option("--xla/--no-xla", help="Also ask XLA (JAX engine only; on by default there).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Predict peak bytes per device of a training run, say whether it fits and what would."""
    plan_command(model, method, seq, batch, device, devices, optimizer, dtype, engine, remat,
                 lora_rank, weight_qtype, grad_accum, grad_clip, loss_chunk_tokens, xla, as_json)


def register(app) -> None:
    """Mount `plan` on the root Typer app (one line in cli._mount)."""
    app.command("plan")(plan_cmd)
