"""One training configuration for both engines.

Defaults are resolved here, in `__post_init__`, and nowhere else. A config comes from a YAML
file (a path, or the name of a shipped preset in configs/) plus `key=value` overrides.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from tunix_rt import devices
from tunix_rt.errors import BadInput
from tunix_rt.eval.generate import DecodeConfig
from tunix_rt.ranges import ABOVE_0, AT_LEAST_0, AT_LEAST_1, Range, is_int, is_number, number_problem
from tunix_rt.render import DEFAULT_SYSTEM_PROMPT
from tunix_rt.train import engines
from tunix_rt.train.chunking import DEFAULT_CHUNK_BYTES
from tunix_rt.train.methods import METHODS, check_config, draws_groups, groups_methods, rolls_out

PRESET_DIR = Path(__file__).resolve().parents[1] / "configs"
ALL_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: qwix weight types QLoRA (lora_weight_qtype) accepts: 4-bit NormalFloat or int8, each with a
#: float scale per tile of the contracting axis (the memory plan's QBYTES knows these two)
LORA_QTYPES = ("nf4", "int8")
PREF_LOSSES = ("dpo", "ipo", "simpo", "orpo")


@dataclass
class TrainConfig:
    """Everything a run needs; written to runs/<id>/config.yaml as resolved."""

    model: str = "tiny-gemma3"
    """Catalog preset name (imported into the home) or a path to an HF-layout model dir."""
    dataset: str = ""
    """Dataset as NAME or NAME@VERSION (latest version when omitted), or a trace JSONL path."""
    split: str = "train"
    """Split to train on: train, dev or all."""
    eval_split: str = "dev"
    """Split for the held-out loss at eval_interval."""
    eval_limit: int | None = 256
    """Held-out examples for that loss (the first N of the split; None: the whole split)."""
    limit: int | None = None
    """Use only the first N examples of the split (None: all)."""
    method: str = "sft"
    """What one step does: sft (next-token loss on the traces) or grpo (RL with verifiable
    rewards, the GRPO family). The older spellings method=lora|full mean sft with that finetune."""
    finetune: str = "lora"
    """Which weights train: lora (an adapter only) or full (every weight)."""
    lora_rank: int = 16
    """LoRA rank r."""
    lora_alpha: float = 32.0
    """LoRA alpha; the update is scaled by alpha / rank."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA input (0 keeps runs exactly reproducible)."""
    lora_targets: list[str] = field(default_factory=lambda: list(ALL_LORA_TARGETS))
    """Projections that get an adapter."""
    lora_weight_qtype: str | None = None
    """JAX engine only: quantise the frozen targeted projections for QLoRA (nf4 or int8); None: off."""
    optimizer: str = "adamw"
    """adamw or adafactor (factored second moments: far less optimizer memory)."""
    lr: float = 2e-4
    """Peak learning rate."""
    warmup_steps: int = 0
    """Linear warm-up from 0 to lr over this many optimizer steps."""
    schedule: str = "cosine"
    """After warm-up: cosine (to min_lr_ratio * lr), linear (to 0) or constant."""
    min_lr_ratio: float = 0.1
    """Floor of the cosine schedule, as a fraction of lr."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0: no clipping)."""
    batch_size: int = 4
    """Sequences per micro-batch."""
    grad_accum: int = 1
    """Micro-batches per optimizer step; the loss is normalised per supervised token."""
    max_seq_len: int = 512
    """Longest sequence; longer examples are dropped and counted (or fail, see drop_overlong)."""
    drop_overlong: bool = True
    """True: drop and count examples longer than max_seq_len; False: fail the run."""
    packing: bool = False
    """Pack several examples into one sequence, attention kept inside each example."""
    max_steps: int | None = None
    """Optimizer steps to run; exactly one of max_steps and epochs is set."""
    epochs: float | None = None
    """Passes over the training split (converted to max_steps at setup)."""
    dtype: str = "fp32"
    """fp32 or bf16 (bf16 is refused on CPU unless force_bf16_cpu: ~300x slower there)."""
    force_bf16_cpu: bool = False
    """Allow bf16 on a CPU anyway."""
    seed: int = 0
    """Seed for initialisation, shuffling and dropout."""
    log_interval: int = 1
    """Write a metrics line every N steps."""
    eval_interval: int = 0
    """Held-out loss every N steps (0: only at the end)."""
    save_interval: int = 0
    """Checkpoint every N steps (0: only the final one)."""
    keep_checkpoints: int = 2
    """Keep the newest N checkpoints."""
    loss_impl: str = "chunked"
    """chunked (fused linear cross-entropy, no [B, L, V] logits) or plain (reference)."""
    loss_chunk_bytes: int = DEFAULT_CHUNK_BYTES
    """Bytes of one chunk's fp32 logits in the chunked loss (256 MiB: 256 tokens of Gemma 3's
    262K vocabulary); turned into tokens from the model's vocabulary (train/chunking.py)."""
    gradient_checkpointing: bool = False
    """Recompute layer activations in backward (remat) to save memory."""
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    """System prompt rendered into every example; eval reads it from the run's config."""
    tools: list[str] = field(default_factory=list)
    """Tools the model calls inside its reasoning (tunix_rt.tools): calculator, python. What a
    tool writes is forced into decoding and never trained on; eval and serving use the run's."""
    engine: str = "auto"
    """auto, torch or jax."""
    device: str = "auto"
    """auto, cpu, cuda (torch), gpu or tpu (jax): tunix_rt.devices."""
    mesh: dict[str, int] | str = "auto"
    """JAX engine: {fsdp: N, tp: M} or auto (all devices on fsdp)."""
    merge: bool = False
    """Also write final/merged/ (HF layout) at the end of a LoRA run."""
    force: bool = False
    """Run even when the memory plan predicts it will not fit."""
    run_name: str | None = None
    """Prefix of the run id (default: the model name)."""

    # ----- reinforcement learning (method: grpo) -----------------------------------------
    init: str | None = None
    """grpo: start from a run (its LoRA adapter merged into its base, or its final/merged
    model): the usual SFT → RL chain. The merged model becomes this run's model (and its
    reference policy). None: the model as given."""
    rl_loss: str = "grpo"
    """grpo (group-normalised advantages, sequence-mean-token-mean loss), dr_grpo (no std
    division, token-sum / max_new_tokens), dapo (clip-higher, token-mean, zero-variance
    groups dropped and refilled), gspo (one importance ratio per completion, the geometric
    mean of its tokens' ratios, clipped per sequence: GSPO) or rloo (leave-one-out baseline,
    the sequence's summed log-ratio, beta x KL taken from the reward: TRL's RLOOTrainer);
    train.sequence_ratio."""
    group_size: int = 4
    """G: completions sampled per prompt."""
    rl_prompts: int = 4
    """P: prompts per optimizer step (P x G completions, updated in micro-batches of batch_size)."""
    rollout_max_new_tokens: int = 128
    """Most tokens a rollout completion may have (the stop token counts)."""
    rollout_temperature: float = 1.0
    """Sampling temperature of the rollouts (> 0)."""
    rollout_top_p: float = 1.0
    """Nucleus mass of the rollouts."""
    rollout_top_k: int = 0
    """Keep the k most likely tokens in the rollouts (0: all)."""
    epsilon: float = 0.2
    """Ratio clip: 1 - epsilon below."""
    epsilon_high: float | None = None
    """Ratio clip above (1 + epsilon_high); None: epsilon (dapo's clip-higher uses 0.28)."""
    beta: float = 0.04
    """KL coefficient to the reference policy (the adapter-off model; under finetune=full a
    frozen copy of the starting weights; 0: no reference)."""
    mu: int = 1
    """Update iterations per rollout batch (each one an optimizer step on the same rollouts)."""
    mask_truncated: bool = False
    """Give no loss to completions cut at rollout_max_new_tokens (no stop token)."""
    rewards: dict[str, Any] = field(default_factory=lambda: {"format": 0.5, "answer": 1.0})
    """Reward name (or module:function) -> weight, or -> {weight: w, <param>: value}."""
    dapo_max_draws: int = 4
    """dapo and filter_pass_rate: draw at most this many times rl_prompts groups to find
    rl_prompts the filters keep (a step that runs out trains on what it kept)."""
    filter_pass_rate: list[float] | None = None
    """grpo, rft, dpo with pairs=rollouts: [low, high]: train only on prompts whose pass rate, estimated from their own G
    rollouts (the share answered correctly), is within [low, high]; the others are skipped and
    more drawn within dapo_max_draws (train.curriculum). None: no filter. Any dataset."""
    curriculum: dict[str, Any] | None = None
    """grpo, rft, dpo with pairs=rollouts, on a reasoning-gym dataset: each task's difficulty level moves with its rolling
    rollout accuracy, prompts generated online at the current levels (train.curriculum):
    {window: 32, raise_at: 0.75, lower_below: 0.25, start_level: 0, ranges: upper_bound, mix: 0}
    (true: those defaults; resolved here); start_level may be {task: level} or nearest (each
    task at the level nearest the dataset's config); mix: the share of prompts kept from the
    dataset at its own config. None: the dataset's prompts as they are."""
    reward_timeout_s: float = 10.0
    """Most seconds one reward call may take (per completion and reward); a reward that runs
    longer fails the run naming the reward and the record. A judge reward's requests count:
    set this above its timeout_s x (max_retries + 1)."""

    # ----- preference optimisation (method: dpo; train.preference) ------------------------
    pref_loss: str = "dpo"
    """dpo (sigmoid DPO with label_smoothing), ipo, simpo (length-normalised, margin
    simpo_gamma, no reference) or orpo (NLL on chosen + orpo_lambda x odds-ratio term, no
    reference). dpo and ipo compare with the reference: the adapter-off model, or under finetune=full a
    frozen copy of the starting weights."""
    pref_beta: float = 0.1
    """beta of dpo, ipo (its tau) and simpo (SimPO's paper uses 2.0-2.5); the implicit reward
    is pref_beta x (logp - ref_logp) (simpo: x the mean logp)."""
    label_smoothing: float = 0.0
    """dpo and simpo: the assumed share of flipped labels (conservative DPO), in [0, 0.5)."""
    simpo_gamma: float = 0.5
    """simpo: the target reward margin gamma (the logits are mean-logp margin - gamma / beta)."""
    orpo_lambda: float = 0.1
    """orpo: weight of the odds-ratio term (TRL's ORPOConfig calls it beta)."""
    pairs: str = "dataset"
    """Where the pairs come from: dataset (a prompt/chosen/rejected JSONL given as `dataset`,
    traces.pairs) or rollouts (group_size completions per prompt of the trace dataset from
    the current model, ranked by `rewards`: the best against the worst where they differ)."""

    # ----- distillation (method: distill; train.distill, train.kd_loss) ------------------
    teacher: str | None = None
    """distill: the teacher, a catalog model, a model directory or a run (its final/merged, or
    its LoRA adapter merged into its base, as `init` resolves a run); its tokenizer must be the
    student's (vocabulary and special ids, checked). Only a method with a teacher takes one."""
    kd_loss: str = "forward_kl"
    """distill: forward_kl (KL(teacher || student), mode-covering), reverse_kl (KL(student ||
    teacher), mode-seeking) or jsd (TRL GKD's generalised Jensen-Shannon with kd_beta)."""
    kd_beta: float = 0.5
    """jsd: the mixture weight of the teacher (0 is forward_kl, 1 reverse_kl; TRL's GKD beta)."""
    kd_temperature: float = 1.0
    """distill: both distributions are softmax(logits / kd_temperature) (no T^2 factor, as TRL)."""
    kd_alpha: float = 0.0
    """distill: weight of the student's NLL of the target tokens; the loss per token is
    (1 - kd_alpha) x divergence + kd_alpha x NLL (0: pure distillation)."""
    kd_on_policy: bool = False
    """distill: false trains on the dataset's traces (off-policy); true on the student's own
    completions of the dataset's prompts, sampled with the rollout_* settings (GKD, lambda 1)."""

    # ----- rejection-sampling fine-tuning (method: rft; train.rft) -------------------------
    rft_accept: dict[str, float] = field(default_factory=lambda: {"answer": 1.0, "format": 1.0})
    """rft: the acceptance rule, reward name -> threshold: a sampled completion is kept when
    each named reward (a name in `rewards`) gives it at least its threshold (the unweighted
    value), e.g. {answer: 1, format: 1, arith: 1}."""
    rft_round_steps: int = 4
    """rft: optimizer steps of SFT on one round's kept completions before the next round
    samples (group_size completions for each of rl_prompts prompts, rollout_* decoding)."""

    def __post_init__(self) -> None:
        if self.method in ("lora", "full"):  # configs written before method meant sft|grpo
            self.method, self.finetune = "sft", self.method
        self._check_choice("method", tuple(METHODS))
        self._check_choice("finetune", ("lora", "full"))
        self._check_choice("optimizer", ("adamw", "adafactor"))
        self._check_choice("schedule", ("cosine", "linear", "constant"))
        self._check_choice("dtype", ("fp32", "bf16"))
        self._check_choice("loss_impl", ("chunked", "plain"))
        self._check_choice("engine", engines.CHOICES)
        self._check_choice("device", devices.NAMES)
        self._check_choice("split", ("train", "dev", "all"))
        self._check_choice("eval_split", ("train", "dev", "all"))
        self._check_choice("pref_loss", PREF_LOSSES)
        self._check_choice("pairs", ("dataset", "rollouts"))
        self._check_distill()
        self._check_rft()
        if not self.dataset:
            raise BadInput("config: dataset is required (a dataset name or a trace JSONL path)")
        if (self.max_steps is None) == (self.epochs is None):
            if self.max_steps is None:
                self.max_steps = 100  # neither given: a short run, said in the resolved config
            else:
                raise BadInput("config: set max_steps or epochs, not both")
        self._check_ranges()
        unknown = set(self.lora_targets) - set(ALL_LORA_TARGETS)
        if unknown or not self.lora_targets:
            raise BadInput(f"config: lora_targets {sorted(unknown) or '[]'} not in {list(ALL_LORA_TARGETS)}")
        self._check_qlora()
        self._check_tools()
        self._check_rl()
        check_config(self)  # the method's own refusals, from its own file (train.methods)
        if isinstance(self.mesh, str) and self.mesh != "auto":
            raise BadInput(f"config: mesh must be 'auto' or a mapping like {{fsdp: 8, tp: 1}}, got {self.mesh!r}")
        if isinstance(self.mesh, dict):
            bad = {k: v for k, v in self.mesh.items() if k not in ("fsdp", "tp") or not is_int(v) or v < 1}
            if bad:
                raise BadInput(f"config: mesh axes must be fsdp/tp with sizes >= 1, got {bad}")

    def _check_ranges(self) -> None:
        """Every numeric field: a real number of its type (no NaN, no infinity) in its RANGES."""
        for name, rng in RANGES.items():
            value = getattr(self, name)
            if value is None and name in OPTIONAL:
                continue
            integer = str(self.__dataclass_fields__[name].type).startswith("int")
            problem = number_problem(name, value, rng, integer, OPTIONAL.get(name, ""))
            if problem:
                raise BadInput(f"config: {problem}")
        self._check_rollout()
        if self.max_steps is not None:
            self.check_total_steps(self.max_steps)

    def _check_rollout(self) -> None:
        """The rollout_* settings are a DecodeConfig's and checked by it (named as this config
        spells them); rollouts also sample, so greedy (temperature 0) is refused: every
        completion of a group would be the same and no advantage could be learnt."""
        t = self.rollout_temperature
        if is_number(t) and not ABOVE_0.holds(t):
            raise BadInput(f"config: rollout_temperature must be {ABOVE_0}, got {t!r}")
        problem = DecodeConfig.problem({d: getattr(self, t) for t, d in ROLLOUT.items()}, prefix="rollout_")
        if problem:
            raise BadInput(f"config: {problem}")

    def rollout_decode(self, seed: int = 0, batch_size: int = 1) -> DecodeConfig:
        """The rollouts' decoding: the rollout_* settings, with one generate call's seed and
        batch size."""
        return DecodeConfig(seed=seed, batch_size=batch_size, **{d: getattr(self, t) for t, d in ROLLOUT.items()})

    def check_total_steps(self, total_steps: int) -> None:
        """warmup_steps fits in the run: with epochs, the driver calls this once the step count
        is known (before the run directory exists)."""
        if self.warmup_steps > total_steps:
            raise BadInput(f"config: warmup_steps ({self.warmup_steps}) exceeds the run's {total_steps} optimizer "
                           "steps: the learning rate would never reach lr; lower warmup_steps")

    def _check_rl(self) -> None:
        self._check_choice("rl_loss", ("grpo", "dr_grpo", "dapo", "gspo", "rloo"))
        self._check_prompt_selection()
        if not draws_groups(self):
            for name in ("filter_pass_rate", "curriculum"):
                if getattr(self, name) is not None:
                    raise BadInput(f"config: {name} chooses the prompts of the rollouts ({groups_methods()}); "
                                   f"method={self.method} as configured has none (or set {name}: null)")
        if not rolls_out(self.method):
            return
        if self.group_size < 2:
            raise BadInput(f"config: group_size must be >= 2 (advantages compare completions of one prompt), "
                           f"got {self.group_size}")
        if self.rollout_max_new_tokens >= self.max_seq_len:
            raise BadInput(f"config: rollout_max_new_tokens ({self.rollout_max_new_tokens}) must leave room for the "
                           f"prompt in max_seq_len ({self.max_seq_len})")
        if not isinstance(self.rewards, dict) or not self.rewards:
            raise BadInput(f"config: rewards must be a non-empty mapping name -> weight, got {self.rewards!r}")
        from tunix_rt.train.rewards import RewardSpec  # here, not at the top: numpy stays out of `--help`

        RewardSpec.from_mapping(self.rewards, "config: rewards")  # names, weights, parameters; nothing imported

    def _check_rft(self) -> None:
        """rft_accept: a non-empty mapping of names to numbers (train.rft checks the names
        against the rewards of an rft run)."""
        a = self.rft_accept
        if (not isinstance(a, dict) or not a or any(not isinstance(k, str) for k in a)
                or any(not is_number(v) or isinstance(v, bool) for v in a.values())):
            raise BadInput(f"config: rft_accept must be a non-empty mapping reward name -> threshold, got {a!r}")
        self.rft_accept = {k: float(v) for k, v in a.items()}

    def _check_distill(self) -> None:
        """kd_loss, and a teacher exactly where the method has one (the table's teacher phase)."""
        from tunix_rt.train.methods import uses_teacher

        self._check_choice("kd_loss", ("forward_kl", "reverse_kl", "jsd"))
        if uses_teacher(self.method) and not self.teacher:
            raise BadInput(f"config: method={self.method} needs a teacher (a catalog model, a model directory or a run)")
        if self.teacher and not uses_teacher(self.method):
            raise BadInput(f"config: teacher is for a method with a teacher (distill); method={self.method} has none "
                           "(use method=distill, or teacher: null)")

    def _check_prompt_selection(self) -> None:
        """filter_pass_rate and curriculum (train.curriculum checks their values); null
        curriculum and filter are off, true means the curriculum's defaults."""
        from tunix_rt.train.curriculum import CurriculumSpec, pass_band

        if self.filter_pass_rate is not None:
            self.filter_pass_rate = list(pass_band(self.filter_pass_rate))
        if self.curriculum is True:
            self.curriculum = {}
        if self.curriculum is False:
            self.curriculum = None
        if self.curriculum is not None:
            self.curriculum = CurriculumSpec.from_mapping(self.curriculum).to_dict()

    def _check_tools(self) -> None:
        from tunix_rt.tools import NAMES

        unknown = [t for t in self.tools if t not in NAMES]
        if unknown or len(set(self.tools)) != len(self.tools):
            raise BadInput(f"config: tools must be distinct names from {list(NAMES)}, got {self.tools!r}")

    @property
    def clip_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    def _check_qlora(self) -> None:
        """lora_weight_qtype: a qwix type we support, and a run that would honour it (only the
        JAX engine's LoRA quantises; anything else would silently train without it)."""
        q = self.lora_weight_qtype
        if q is None:
            return
        if q not in LORA_QTYPES:
            raise BadInput(f"config: lora_weight_qtype must be one of {'|'.join(LORA_QTYPES)} "
                           f"(or null for plain LoRA), got {q!r}")
        if self.finetune != "lora":
            raise BadInput(f"config: lora_weight_qtype={q} (QLoRA) needs finetune=lora, got finetune={self.finetune}")
        if engines.pick(self.engine, self.device) != "jax":
            raise BadInput(f"config: lora_weight_qtype={q} (QLoRA) runs on the JAX engine only; set engine=jax "
                           f"(engine={self.engine}, device={self.device} would train with PyTorch, unquantised)")

    def _check_choice(self, name: str, choices: tuple[str, ...]) -> None:
        if getattr(self, name) not in choices:
            raise BadInput(f"config: {name} must be one of {'|'.join(choices)}, got {getattr(self, name)!r}")

    @property
    def tokens_per_step(self) -> int:
        """Upper bound of tokens in one optimizer step."""
        return self.batch_size * self.grad_accum * self.max_seq_len

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise BadInput(f"{source}: unknown field(s) {unknown}; known: {sorted(known)}")
        hints = get_type_hints(cls)
        typed = {k: _coerce(k, v, hints[k], source) for k, v in data.items()}
        return cls(**typed)

    @classmethod
    def load(cls, config: str | Path | None = None, overrides: list[str] | None = None) -> "TrainConfig":
        """A YAML file or preset name, then key=value overrides (values parsed as YAML)."""
        data: dict[str, Any] = {}
        source = "overrides"
        if config:
            path = resolve_preset(config)
            source = str(path)
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            if not isinstance(loaded, dict):
                raise BadInput(f"{path}: a config file must hold a mapping")
            data.update(loaded)
        for item in overrides or []:
            if "=" not in item:
                raise BadInput(f"override {item!r}: expected key=value")
            key, raw = item.split("=", 1)
            data[key.strip()] = yaml.safe_load(raw) if raw != "" else None
        return cls.from_dict(data, source=source)


#: every numeric field of TrainConfig and its range, checked in __post_init__ (one place);
#: the rollout_* decoding settings are DecodeConfig's (ROLLOUT) and checked by it
RANGES: dict[str, Range] = {
    "eval_limit": AT_LEAST_1, "limit": AT_LEAST_1, "lora_rank": AT_LEAST_1, "lora_alpha": ABOVE_0,
    "lora_dropout": Range(0, 1, high_open=True), "lr": ABOVE_0, "warmup_steps": AT_LEAST_0,
    "min_lr_ratio": Range(0, 1), "weight_decay": AT_LEAST_0, "grad_clip": AT_LEAST_0,
    "batch_size": AT_LEAST_1, "grad_accum": AT_LEAST_1, "max_seq_len": AT_LEAST_1, "max_steps": AT_LEAST_1,
    "epochs": ABOVE_0, "seed": Range(0, 2 ** 32 - 1),  # every engine's and numpy's seeds take a uint32
    "log_interval": AT_LEAST_1, "eval_interval": AT_LEAST_0, "save_interval": AT_LEAST_0,
    "keep_checkpoints": AT_LEAST_1, "loss_chunk_bytes": AT_LEAST_1,
    "group_size": AT_LEAST_1, "rl_prompts": AT_LEAST_1,
    "epsilon": Range(0, 1, low_open=True, high_open=True), "epsilon_high": ABOVE_0, "beta": AT_LEAST_0,
    "mu": AT_LEAST_1, "dapo_max_draws": AT_LEAST_1, "reward_timeout_s": ABOVE_0,
    "pref_beta": ABOVE_0, "label_smoothing": Range(0, 0.5, high_open=True), "simpo_gamma": AT_LEAST_0,
    "orpo_lambda": AT_LEAST_0,
    "kd_beta": Range(0, 1), "kd_temperature": ABOVE_0, "kd_alpha": Range(0, 1),  # distill
    "rft_round_steps": AT_LEAST_1,  # rft
}
#: the rollout decoding settings: TrainConfig field -> the DecodeConfig field it sets
ROLLOUT = {"rollout_max_new_tokens": "max_new_tokens", "rollout_temperature": "temperature",
           "rollout_top_p": "top_p", "rollout_top_k": "top_k"}
#: the fields that may be null, and what null means
OPTIONAL = {"eval_limit": " (or null for the whole split)", "limit": " (or null for the whole split)",
            "max_steps": "", "epochs": "", "epsilon_high": " (or null: epsilon)"}


def resolve_preset(config: str | Path) -> Path:
    """A path to a YAML file, or the name of a shipped preset (smoke, cpu-demo, gpu)."""
    p = Path(config)
    if p.is_file():
        return p
    shipped = PRESET_DIR / f"{config}.yaml"
    if shipped.is_file():
        return shipped
    names = sorted(x.stem for x in PRESET_DIR.glob("*.yaml"))
    raise BadInput(f"config {str(config)!r}: no such file and no shipped preset; presets: {names}")


def _coerce(key: str, value: Any, hint: Any, source: str) -> Any:
    """Check a YAML value against the field type; ints are accepted where floats are."""
    text = str(hint)
    if value is None:
        if "None" in text:
            return None
        raise BadInput(f"{source}: {key} may not be null")
    if hint is bool or text == "bool":
        if not isinstance(value, bool):
            raise BadInput(f"{source}: {key} must be true or false, got {value!r}")
        return value
    if hint is int or text.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadInput(f"{source}: {key} must be an integer, got {value!r}")
        return value
    if hint is float or text.startswith("float"):
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadInput(f"{source}: {key} must be a number, got {value!r}")
        return float(value)
    if text.startswith("list[float]"):
        if isinstance(value, str):
            value = [v.strip() for v in value.strip("[]").split(",") if v.strip()]
        try:
            if not isinstance(value, list) or any(isinstance(v, bool) for v in value):
                raise TypeError
            return [float(v) for v in value]
        except (TypeError, ValueError):
            raise BadInput(f"{source}: {key} must be a list of numbers, got {value!r}") from None
    if key == "curriculum" and isinstance(value, bool):
        return value  # true: the defaults, false: off (resolved in __post_init__)
    if text.startswith("list"):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise BadInput(f"{source}: {key} must be a list, got {value!r}")
        return [str(v) for v in value]
    if key == "mesh":
        return value
    if text.startswith("dict"):
        if not isinstance(value, dict):
            raise BadInput(f"{source}: {key} must be a mapping, got {value!r}")
        return value
    if not isinstance(value, str) and "str" in text:
        return str(value)
    return value
