"""Distillation: the student learns the teacher's token distribution (method: distill).

    teacher         a catalog model, a model directory or a run (its final/merged, or its
                    LoRA adapter merged into its base: driver.run_model_dir, as `init`)
    kd_loss         forward_kl | reverse_kl | jsd (kd_beta: TRL GKD's generalised JSD)
    kd_temperature  both distributions at softmax(logits / T)
    kd_alpha        weight of the student's NLL of the targets: (1 - a) KD + a NLL
    kd_on_policy    false: the dataset's traces; true: the student's own completions of
                    the dataset's prompts (GKD with lambda = 1), sampled with rollout_*

One step takes `grad_accum` micro-batches from the same seeded, resumable stream SFT uses;
on-policy, each example keeps its prompt and gets the student's completion in place of its
trace (one generate call per step, seeded by (seed, step) as GRPO's rollouts are, so a
resumed run samples the same). Every labelled position is weighted 1 / (labelled positions
of the window), so accumulation 8x1 equals 1x8, and the engine runs one optimizer step of
the distillation objective: the fused kernel of train.kd_loss computes, per chunk of tokens,
both models' logits from their hidden states (the teacher's computed once per micro-batch,
without gradient) and the divergence's gradient; neither model's [B, L, V] logits exist.

The teacher must share the student's tokenizer (the same vocabulary piece by piece and the
same special ids) and head size; it is loaded frozen, in the run's dtype, on the student's
device, and the memory plan counts its weights (the table's teacher phase). Metrics per
step: kd (the divergence per token), kl_teacher (KL(teacher || student) per token at the
temperature, whatever kd_loss), nll (the student's per token); held out: eval_loss (the
student's NLL, as SFT) and eval_kl_teacher.

Both engines run it: each loads the teacher (Engine.load_teacher) and has its kernel
(train.kd_loss for torch, train.jax_kd_loss for JAX), equal to each other and to a
full-logits reference.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tunix_rt import rundir
from tunix_rt.errors import BadInput
from tunix_rt.home import Home
from tunix_rt.render import Rendered
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.data import BatchStream, collate, position_of, position_state, weighted
from tunix_rt.train.engine import Engine, Objective

#: the statistics the kernel sums per micro-batch, in its order (train.kd_loss)
KD_STATS = ("kd", "kl", "nll", "tokens")


@dataclass(frozen=True)
class Distillation(Objective):
    """The distillation objective the engine trains (train.kd_loss reads its fields)."""

    kind: str = "distill"
    kd_loss: str = "forward_kl"
    kd_beta: float = 0.5
    temperature: float = 1.0
    alpha: float = 0.0
    teacher: Any = field(default=None, compare=False, repr=False)
    """kd_loss.Teacher on the student's device (set once the engine has one)."""
    stat_names: tuple[str, ...] = KD_STATS

    def __post_init__(self) -> None:
        if self.kind != "distill":
            raise ValueError(f"a Distillation objective has kind distill, got {self.kind!r}")


def resolve_teacher(ref: str, home: Home) -> Path:
    """The teacher's model directory: a model directory, a catalog name (imported when that
    needs no network), or a run (driver.run_model_dir)."""
    from tunix_rt.models.catalog import PRESETS
    from tunix_rt.models.store import ensure_model

    if Path(ref).is_dir() and not (Path(ref) / rundir.MANIFEST).is_file():
        return ensure_model(ref, home)
    if ref in PRESETS:
        return ensure_model(ref, home)
    from tunix_rt.train.driver import run_model_dir
    from tunix_rt.train.run import RunDir, resolve_run

    try:
        path = resolve_run(ref, home)
    except BadInput:
        raise BadInput(f"teacher {ref!r}: not a model directory, a catalog model ({', '.join(sorted(PRESETS))}) "
                       "or a run") from None
    return run_model_dir(RunDir.open(path), home, "teacher")


def check_same_tokenizer(student, teacher, student_dir: Path, teacher_dir: Path, ref: str) -> None:
    """The teacher's tokens are the student's: the same special ids, the same vocabulary piece
    by piece, and heads of the same size (their distributions are compared entry by entry)."""
    for name in ("pad_id", "eos_id", "bos_id", "sot_id", "eot_id"):
        if getattr(student, name) != getattr(teacher, name):
            raise BadInput(f"teacher {ref!r}: its tokenizer's {name} is {getattr(teacher, name)}, the student's "
                           f"{getattr(student, name)}: distillation needs the same tokenizer")
    if student.vocab_size != teacher.vocab_size:
        raise BadInput(f"teacher {ref!r}: vocabulary of {teacher.vocab_size} tokens, the student's has "
                       f"{student.vocab_size}: distillation needs the same tokenizer")
    for i in range(student.vocab_size):
        if student.token_text(i) != teacher.token_text(i):
            raise BadInput(f"teacher {ref!r}: token {i} is {teacher.token_text(i)!r}, the student's is "
                           f"{student.token_text(i)!r}: distillation needs the same tokenizer")
    heads = [head_rows(d) for d in (student_dir, teacher_dir)]
    if heads[0] != heads[1]:
        raise BadInput(f"teacher {ref!r}: its head has {heads[1]} rows, the student's {heads[0]}: distillation "
                       "needs the same vocabulary")


def head_rows(model_dir: Path) -> int:
    """vocab_size of a model directory's config.json (the text config of a multimodal one)."""
    hf = json.loads((Path(model_dir) / rundir.MODEL_CONFIG).read_text(encoding="utf-8"))
    return int(hf.get("vocab_size") or hf.get("text_config", {}).get("vocab_size"))


def held_out_stats(engine: Engine, batch, objective: Distillation) -> np.ndarray:
    """The kernel's statistics (KD_STATS) of one batch, nothing applied: the torch engine's
    objective without gradient, the JAX engine's gradient function (its gradients dropped)."""
    if hasattr(engine, "objective_sum"):
        import torch

        with torch.no_grad():
            return engine.objective_sum(batch, objective)[1].cpu().numpy()
    return np.asarray(engine.gradients([batch], objective)[1])


class Distill:
    def __init__(self, cfg: TrainConfig, home: Home, tok):
        from tunix_rt.files import weights_sha256
        from tunix_rt.models.store import ensure_model
        from tunix_rt.models.tokenizer import ChatTokenizer
        from tunix_rt.train import dist
        from tunix_rt.train.common import load_data, steps_for

        if cfg.kd_on_policy and (cfg.packing or cfg.tools):
            raise BadInput("kd_on_policy: the student's completions replace the traces one example a row, "
                           "without tools: set packing=false and tools=[]")
        self.cfg, self.tok = cfg, tok
        self.teacher_dir = dist.main_first("teacher model", resolve_teacher, cfg.teacher, home)
        student_dir = ensure_model(cfg.model, home)
        check_same_tokenizer(tok, ChatTokenizer.from_file(self.teacher_dir), student_dir, self.teacher_dir,
                             cfg.teacher)
        self.teacher_sha256 = weights_sha256(self.teacher_dir)
        if self.teacher_sha256 == weights_sha256(student_dir) and cfg.kd_alpha == 0:
            raise BadInput(f"teacher {cfg.teacher!r} has the student's own weights: the student starts equal to it, "
                           "so the divergence and its gradient are 0 and nothing is learnt; name another teacher "
                           "(a larger model, or a trained run), or set kd_alpha > 0")
        train, self.eval_examples, self.dataset = load_data(cfg, home, tok)
        self.dataset = {**self.dataset, "teacher": cfg.teacher, "teacher_dir": str(self.teacher_dir),
                        "teacher_sha256": self.teacher_sha256}
        self.pad_id = tok.pad_id
        self.stream = BatchStream(train, cfg.batch_size, cfg.max_seq_len, cfg.packing, cfg.seed, tok.pad_id)
        self.total_steps = steps_for(cfg, train, tok.pad_id)
        self.objective = Distillation(kd_loss=cfg.kd_loss, kd_beta=cfg.kd_beta, temperature=cfg.kd_temperature,
                                      alpha=cfg.kd_alpha)

    def teacher_objective(self, engine: Engine) -> Distillation:
        """The objective with its teacher, loaded by the engine (frozen, on its devices) the
        first time."""
        if self.objective.teacher is None:
            self.objective = dataclasses.replace(self.objective, teacher=engine.load_teacher(self.teacher_dir))
        return self.objective

    # ------------------------------------------------------------------ the step
    def step(self, engine: Engine, step: int, lr: float) -> tuple[dict[str, Any], list[str]]:
        rows = [self.stream.next_rows() for _ in range(self.cfg.grad_accum)]
        if self.cfg.kd_on_policy:
            rows = self.sampled(engine, rows, step)
        batches = weighted([collate(r, self.pad_id) for r in rows])
        res = engine.train_step(batches, self.teacher_objective(engine), lr)
        n = max(res.stats.get("tokens", 0.0), 1.0)
        row = {"loss": res.loss, "grad_norm": res.grad_norm, "tokens": sum(b.n_tokens for b in batches),
               "kd": res.stats["kd"] / n, "kl_teacher": res.stats["kl"] / n, "nll": res.stats["nll"] / n}
        return row, [i for b in batches for i in b.example_ids]

    def sampled(self, engine: Engine, rows: list, step: int) -> list:
        """The same rows with each example's trace replaced by the student's completion of its
        prompt (cut to max_seq_len), sampled in one seeded generate call."""
        from tunix_rt.train.grpo import rollout_seed

        examples = [ex for micro in rows for row in micro for ex in row]
        prompts = [ex.ids[:ex.prompt_len] for ex in examples]
        decode = self.cfg.rollout_decode(seed=rollout_seed(self.cfg.seed, step, 0), batch_size=len(prompts))
        outs = iter(engine.generator().generate(prompts, decode))

        def replace(ex: Rendered) -> Rendered:
            out = next(outs)
            ids = out.ids[:max(0, self.cfg.max_seq_len - ex.prompt_len)] or [self.tok.eot_id]
            return dataclasses.replace(ex, ids=ex.ids[:ex.prompt_len] + list(ids),
                                       loss_mask=[0] * ex.prompt_len + [1] * len(ids), target_text=out.text,
                                       model_text=None)

        return [[[replace(ex) for ex in row] for row in micro] for micro in rows]

    def evaluate(self, engine: Engine) -> dict[str, float]:
        """{"eval_loss": the student's held-out NLL per supervised token, "eval_kl_teacher":
        KL(teacher || student) per supervised token} ({} without eval examples)."""
        if not self.eval_examples:
            return {}
        groups = [[[ex] for ex in self.eval_examples[i:i + self.cfg.batch_size]]
                  for i in range(0, len(self.eval_examples), self.cfg.batch_size)]
        batches = weighted([collate(rows, self.pad_id) for rows in groups])
        loss = sum(engine.loss_sum(b) for b in batches)
        stats = np.sum([held_out_stats(engine, b, self.teacher_objective(engine)) for b in batches], axis=0)
        out = {"eval_loss": loss} if math.isfinite(loss) else {}
        return {**out, "eval_kl_teacher": float(stats[1] / max(stats[3], 1.0))}

    def state(self) -> dict[str, Any]:
        return {**position_state(self.stream.position), "teacher_sha256": self.teacher_sha256}

    def load_state(self, state: dict[str, Any]) -> None:
        """The data position, once the teacher is checked to be the checkpoint's."""
        if state.get("teacher_sha256", self.teacher_sha256) != self.teacher_sha256:
            raise BadInput(f"teacher {self.cfg.teacher!r} has other weights than when the checkpoint was written "
                           f"(sha256 {self.teacher_sha256[:12]}, was {state['teacher_sha256'][:12]}): resuming would "
                           "distil from another teacher; restore it, or start a new run")
        self.stream.position = position_of(state)

    def summary(self) -> dict[str, Any]:
        """The pre-run facts: first batch shape, examples, what was dropped, the teacher."""
        first = BatchStream(self.stream.examples, self.cfg.batch_size, self.cfg.max_seq_len, self.cfg.packing,
                            self.cfg.seed, self.pad_id, self.stream.position).next_batch()
        return {"first_batch_shape": list(first.input_ids.shape),
                "first_batch_supervised_tokens": first.n_supervised,
                "max_tokens_per_step": self.cfg.tokens_per_step,
                "train_examples": len(self.stream.examples),
                "dropped_overlong": self.dataset["dropped_overlong"],
                "teacher": self.cfg.teacher, "kd_loss": self.cfg.kd_loss,
                "kd_on_policy": self.cfg.kd_on_policy}

    @staticmethod
    def report_line(cfg: dict[str, Any]) -> str | None:
        """REPORT.md's line on what this method did, with which settings (train.report adds the
        run it started from); `cfg` is the run's resolved config as its manifest holds it."""
        kd = cfg["kd_loss"] + (f" (beta {cfg['kd_beta']})" if cfg["kd_loss"] == "jsd" else "")
        data = ("on-policy (the student's own samples, GKD)" if cfg["kd_on_policy"]
                else "off-policy (the dataset's traces)")
        return (f"- distillation: teacher `{cfg['teacher']}`, {kd}, temperature {cfg['kd_temperature']}, "
                f"NLL weight alpha {cfg['kd_alpha']}, {data}")
