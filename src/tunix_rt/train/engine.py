"""The contract between the driver (the order of things), a method (what one step does) and
an engine (how a step runs on a framework). Both engines implement `Engine`; the driver and
the methods know nothing else about them.

One primitive serves every method: a step over micro-batches whose loss is

    loss = sum over tokens t of  coef[t] * phi(logp[t]; aux[t])

where logp[t] is the log-probability of the target token at t (computed chunk by chunk
through the head: never [B, L, V] logits), coef[t] is a per-token coefficient normalised
over the whole optimizer step (so gradient accumulation 8x1 equals 1x8 exactly), and phi is
the objective's elementwise function:

    nll     phi = -logp                                           (SFT)
    policy  phi = -min(r A, clip(r, 1-eps_low, 1+eps_high) A) + beta k3,
            r = exp(logp - old_logp),  k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1
            (the GRPO family; A, old_logp, ref_logp are per-token aux arrays)

Because phi depends on logp alone, dloss/dlogits[t] = coef[t] * phi'(logp[t]) * (onehot - softmax)
is formed in the same chunk as the forward pass: no recomputation, no full logits.

A SequenceObjective (the preference losses) is nll whose coef the method computes from the
micro-batch's own log-probs inside its forward pass (the head runs twice, the trunk once), on
engines whose sequence_objective() says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

import numpy as np

if TYPE_CHECKING:
    from tunix_rt.eval.generate import Generator
    from tunix_rt.models.tokenizer import ChatTokenizer
    from tunix_rt.train.config import TrainConfig


@dataclass(frozen=True)
class Objective:
    """The elementwise objective phi of a step (see the module docstring)."""

    kind: str = "nll"
    """nll (SFT) or policy (GRPO family)."""
    eps_low: float = 0.2
    eps_high: float = 0.2
    beta: float = 0.0
    """KL coefficient to the reference (the adapter-off model, or full fine-tuning's frozen copy of
    the starting weights); 0 skips the reference."""
    on_policy: bool = False
    """old_logp is the current policy's own log-prob (one update per rollout batch, mu = 1):
    the ratio is exactly 1 in value (old_logp = logp, held constant), so no second forward
    pass computes it; the aux old_logp column is ignored."""

    def __post_init__(self) -> None:
        if self.kind not in ("nll", "policy"):
            raise ValueError(f"objective kind must be nll or policy, got {self.kind!r}")


NLL = Objective()


@dataclass(frozen=True, eq=False)
class SequenceObjective:
    """An objective whose per-token coefficients depend on the step's own log-probs (the
    preference losses: dL/dl_t is a function of the sums S of whole sequences). In each
    micro-batch's forward pass the engine computes log p(target) of its labelled positions
    (row-major order) with no gradient from the same hidden states, calls coef_of with them
    (float32 [T] numpy; once per micro-batch, in order), and trains the NLL surrogate with the
    coefficients it returns: one forward pass where a no-gradient pass and a gradient pass
    took two. Only where `Engine.sequence_objective()` says so."""

    coef_of: Callable[[np.ndarray], np.ndarray]
    kind: ClassVar[str] = "sequence"

#: aux arrays a policy step needs, float32 [B, L] like coef
POLICY_AUX = ("old_logp", "ref_logp", "adv")


@dataclass
class StepResult:
    """What one optimizer step reports: the window's loss (sum of coef * phi), the global
    gradient norm before clipping, and objective statistics summed over the window's
    weighted tokens (policy: clipped, kl, ratio sums and the token count)."""

    loss: float
    grad_norm: float
    stats: dict[str, float] = field(default_factory=dict)


class Engine(Protocol):
    """What the driver and the methods use of an engine.

    Lifecycle: `Engine(cfg)` → `devices()` (resolve and check the device; facts for the
    manifest) → `check_model(model_dir)` → `setup(model_dir, tok)` → [`restore(dir, state)`] → `train_step` ... →
    `save(dir)` at intervals → `export(final_dir)`.
    """

    name: ClassVar[str]

    def devices(self) -> dict[str, Any]:
        """Resolve cfg.device to this engine's devices and refuse what cannot run (bf16 on a
        CPU, a device that is absent): platform, count, names, memory_bytes."""

    def check_model(self, model_dir: Path) -> None:
        """Refuse, before a run directory exists, what this engine cannot train on this model
        under cfg (read from config.json; nothing is loaded)."""

    def setup(self, model_dir: Path, tok: "ChatTokenizer") -> dict[str, Any]:
        """Load the model (LoRA applied or every weight trainable) and the optimizer. Returns
        params / trainable_params counts."""

    def load_teacher(self, model_dir: Path) -> Any:
        """A frozen model beside the trained one (forward only, in cfg.dtype, on this engine's
        devices): the teacher a distillation objective carries (train.distill)."""

    def shares_prefix(self) -> bool:
        """Whether batches may hold rows with a shared prefix (data.collate_shared: a GRPO
        group's prompt written once for its G completions)."""

    def sequence_objective(self) -> bool:
        """Whether train_step takes a SequenceObjective (its log-probs and gradient from one
        forward pass of each micro-batch, whole on this process)."""

    def train_step(self, batches: list, objective: Objective, lr: float) -> StepResult:
        """One optimizer step over micro-batches (`data.Batch` with coef, and aux for a policy
        objective): gradients accumulated, clipped to cfg.grad_clip, applied at rate lr."""

    def loss_sum(self, batch) -> float:
        """sum of coef * (-logp) of one batch, no gradient (the held-out loss)."""

    def token_logprobs(self, batch, adapter: bool = True) -> np.ndarray:
        """log p(target) at every position of the batch, float32 [B, L] (0 where labels are
        IGNORE), no gradient. adapter=False: the reference policy, the model the run started
        from: the LoRA adapter disabled (no second copy of the model), or under finetune=full
        a frozen copy of the starting weights, loaded at the first such call."""

    def generator(self) -> "Generator":
        """An eval.generate.Generator on the current weights (RL rollouts)."""

    def save(self, directory: Path) -> dict[str, Any]:
        """Write weights (trainable ones), optimizer state and the engine's RNG into
        `directory` (a checkpoint's temp dir). Returns JSON facts for state.json (its RNG
        streams, file names)."""

    def restore(self, directory: Path, state: dict[str, Any]) -> None:
        """Load what `save` wrote, in place; restore the engine's RNG from state."""

    def export(self, final_dir: Path) -> dict[str, str]:
        """final/adapter (PEFT format, LoRA runs) and final/merged (HF layout: full runs, or
        cfg.merge) through train.export; returns {kind: path}."""

    def peak_memory_bytes(self) -> int:
        """Accelerators: peak bytes in use on a device; CPU: the process's peak RSS."""
