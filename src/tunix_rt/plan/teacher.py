"""The teacher of a distillation step (a method with the table's teacher phase: train.distill).

A distillation run holds a frozen teacher beside the student (the torch engine loads it
whole, in the run's dtype, on each rank; the JAX engine shards it over the mesh like the
student's weights, and runs its forward as a jitted call of its own). Beyond the
student's step (`plan.step`, `plan.rl`) it adds, at the update's peak:
- teacher_weights: every teacher parameter in the param dtype (fp32 4 B, bf16 2 B);
- teacher_forward: its forward without gradient runs while the student's activations are
  alive: its final hidden states [tokens, D_t] in fp32 (kept for the loss) and one layer's
  transient work (the residual, norms, q/k/v/context and the MLP's gate, up and product);
- teacher_loss_head: the distillation kernel (train.kd_loss) holds, per chunk, the teacher's
  logits and log-probabilities and the divergence's terms beside the student's: 6 more
  [chunk, V] fp32 buffers than the plain token loss's 2, and the teacher's hidden rows.

    peak = the student's peak + (teacher_weights + teacher_forward + teacher_loss_head) * (1 + slack)

Full fine-tuning with a reference policy (PlanInputs.reference) holds the other frozen model
beside the trained one: a copy of the starting weights, loaded at the first reference pass and
kept (the torch engine whole on each rank, the JAX engine sharded like the trained weights);
its no-gradient passes run before the update's, so only its weights add to the peak:
- reference_weights: every parameter of the model in the param dtype.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunix_rt.models.catalog import PRESETS, Preset
from tunix_rt.plan.devices import DeviceSpec
from tunix_rt.plan.inputs import PlanInputs, resolve_preset
from tunix_rt.plan.step import SLACK, facts
from tunix_rt.train.chunking import chunk_tokens

#: [chunk, V] fp32 buffers the distillation kernel holds beyond the token loss's
KD_EXTRA_CHUNK_BUFFERS = 6


def teacher_model(ref: str | None, fallback: str | None = None) -> str | None:
    """What the plan reads of a config's teacher: a catalog name or a model directory as
    given; a run: its final/merged directory, else the base it trained (an adapter merged
    into its base has the base's shape). A run this process's home does not hold (a worker
    given another home) is planned as `fallback` (the student's model) when one is given;
    the method resolves the teacher itself before anything is loaded."""
    from tunix_rt import rundir

    if not ref or ref in PRESETS or (Path(ref) / rundir.MODEL_CONFIG).is_file():
        return ref
    from tunix_rt.errors import BadInput
    from tunix_rt.home import Home
    from tunix_rt.train.run import RunDir, resolve_run

    try:
        run = RunDir.open(resolve_run(ref, Home.resolve()))
    except BadInput:
        return fallback or ref  # without a fallback, resolve_preset names what is wrong
    merged = rundir.merged_dir(run.path)
    return str(merged) if (merged / rundir.MODEL_CONFIG).is_file() else run.config().model


def teacher_bytes(inp: PlanInputs, student: Preset) -> dict[str, float]:
    """The teacher's items (the module docstring), bytes per device."""
    t = resolve_preset(inp.teacher)
    wb = 2 if inp.dtype == "bf16" else 4
    f = facts(inp, student)
    tokens = f.tokens
    shard = f.shard if f.jax else 1
    q = t.num_heads * t.head_dim + 2 * t.num_kv_heads * t.head_dim + t.num_heads * t.head_dim
    layer = tokens * (4 * t.hidden_size + q + 3 * t.intermediate_size) * wb
    chunk = min(chunk_tokens(inp.loss_chunk_bytes, student.vocab_size), max(tokens, 1))
    return {"teacher_weights": t.param_count() * wb / shard,
            "teacher_forward": tokens * t.hidden_size * 4 + layer,
            "teacher_loss_head": chunk * student.vocab_size * 4 * KD_EXTRA_CHUNK_BUFFERS + tokens * t.hidden_size * 4}


def with_teacher(inp: PlanInputs, student: Preset, device: DeviceSpec, items: dict[str, int],
                 details: dict[str, Any], peak: int) -> tuple[dict[str, int], dict[str, Any], int]:
    """A step's (items, details, peak) with the frozen models' items added: a teacher's, and
    full fine-tuning's reference weights (none without either)."""
    if inp.reference and inp.method == "full":
        f = facts(inp, student)
        ref = int(student.param_count() * f.wb / (f.shard if f.jax else 1))
        items = {**items, "reference_weights": ref}
        details = {**details, "peak_formula": f"{details['peak_formula']} + reference_weights"}
        peak = int(peak + ref * (1 + SLACK[device.kind]))
    if not inp.teacher:
        return items, details, peak
    extra = {k: int(v) for k, v in teacher_bytes(inp, student).items()}
    t = resolve_preset(inp.teacher)
    if t.vocab_size != student.vocab_size:
        from tunix_rt.errors import BadInput

        raise BadInput(f"plan: teacher {inp.teacher!r} has a vocabulary of {t.vocab_size}, the student "
                       f"{student.vocab_size}: distillation needs the same tokenizer")
    added = sum(extra.values()) * (1 + SLACK[device.kind])
    details = {**details, "teacher": {"model": inp.teacher, "params": t.param_count(), **extra},
               "peak_formula": f"{details['peak_formula']} + (teacher_weights + teacher_forward + teacher_loss_head)"}
    return {**items, **extra}, details, int(peak + added)
