"""What a plan is asked: the model and how it is trained (`PlanInputs`), and the model's
preset (`resolve_preset`: a catalog name or a model directory)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from tunix_rt.errors import BadInput
from tunix_rt.models.catalog import PRESETS, Preset, get_preset
from tunix_rt.models.jax_loader import FAMILIES
from tunix_rt.train.chunking import DEFAULT_CHUNK_BYTES

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: bytes per weight of a QLoRA-quantised projection: 4 or 8 bits plus an fp32 scale per 64
QBYTES = {"nf4": 0.5 + 4 / 64, "int8": 1.0 + 4 / 64}


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
    """A step that samples (grpo, rft, dpo with pairs=rollouts, distill with kd_on_policy):
    P prompts per generate call; 0 (with group_size and rollout_tokens): no sampling."""
    group_size: int = 0
    """Sampling: G completions per prompt."""
    rollout_tokens: int = 0
    """Sampling: most new tokens per completion (rollout_max_new_tokens); prompts take the rest
    of seq (or up to seq - 1 tokens with long_prompts)."""
    trains_on_rollouts: bool = True
    """Sampling: the update is an RL step over the P x G rollout sequences (GRPO, plan.rl's
    update_inputs); False: the method's own step (batch x grad_accum: rft, dpo's rollout
    pairs, on-policy distill), the sampling adding its rollout phase only."""
    held_out_decode: bool = True
    """Sampling: the held-out eval decodes greedily too (GRPO's eval, which rft and dpo's
    rollout pairs reuse; on-policy distill's eval is a loss)."""
    long_prompts: bool = False
    """Sampling: a prompt may take up to seq - 1 tokens (on-policy distill samples from each
    example's prompt and cuts the completion to seq afterwards); False: prompts leave the
    completion its room, seq - rollout_tokens (GRPO keeps only those)."""
    teacher: str | None = None
    """Distillation (a method with a teacher phase): the teacher, a catalog name or a model
    directory (plan.teacher adds its weights, forward and loss terms); None: no teacher."""
    reference: bool = False
    """Full fine-tuning with a loss that compares with the reference policy (train.methods.
    uses_reference: GRPO's beta > 0, dpo, ipo): a frozen copy of the starting weights is
    resident beside the trained ones (plan.teacher adds reference_weights). With LoRA the
    reference is the adapter-off model, nothing more."""

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
        if self.rl and not self.long_prompts and self.rollout_tokens >= self.seq:
            raise BadInput(f"plan: rollout_tokens ({self.rollout_tokens}) must leave room for the prompt "
                           f"in seq ({self.seq})")

    @property
    def rl(self) -> bool:
        """A step that samples (rollouts, then the update), not a plain training step."""
        return self.rl_prompts > 0

    @property
    def rollout_prompt(self) -> int:
        """The longest prompt a rollout decodes."""
        return self.seq - 1 if self.long_prompts else self.seq - self.rollout_tokens

    @property
    def fsdp(self) -> int:
        """Data-parallel ranks: each holds batch / fsdp sequences (ddp ranks too)."""
        return self.devices // self.tp


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
        family = FAMILIES.get(hf.get("model_type"))  # the loader's map: one source
        if family is None:
            raise BadInput(f"{config}: model_type {hf.get('model_type')!r} is not a Gemma the plan knows")
        return Preset(name=path.name, family=family, hf_config=hf, description=f"from {config}")
    get_preset(model)  # raises BadInput with the known names
    raise AssertionError("unreachable")
