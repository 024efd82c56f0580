"""The analytic estimate of a step that samples, and `analytic`, the estimate of any step.

A step that samples (`rl_prompts` P, `group_size` G, `rollout_tokens` T: grpo, rft, dpo with
pairs=rollouts, distill with kd_on_policy; train.methods.sampling says which and how) has
two phases that never overlap, and peaks in the larger (`details.phases`,
`details.peak_phase`):
- update: GRPO's (trains_on_rollouts) is the training step above over the P x G rollout
  sequences (prompt + completion, at most seq tokens) in micro-batches of `batch`, all
  accumulated into one optimizer step, plus rl_aux (the per-token coef, advantage, old and
  reference log-prob arrays; the reference is the adapter-off model, no second copy, or under
  full fine-tuning a frozen copy: plan.teacher's reference_weights); any
  other method's is its own step (batch x grad_accum, with a teacher's items: plan.teacher);
- rollout: the resident weights and optimizer state (and a distillation teacher's weights;
  LoRA adapters are applied live, no merged copy of any weight: eval.fast_gemma.LoraWeight),
  rollout_cache (the KV cache of every row: P x G rollouts of the longest prompt,
  seq - T, or seq - 1 with long_prompts, plus T new tokens, in the weights' dtype, with the
  generator's transient copies) and rollout_workspace (the prefill's one-layer
  intermediates or a decode step's logits and sampler buffers); the held-out greedy decode
  of a GRPO-style eval (eval's batch of prompts, the int8 screen of the head on a CPU) is
  planned the same way and counted when it is the larger.
This is the one rule for every method's sampling: a method only says its rows (P, G, T).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from tunix_rt.models.catalog import Preset
from tunix_rt.plan.devices import DeviceSpec
from tunix_rt.plan.inputs import PlanInputs
from tunix_rt.plan.step import SLACK, Facts, facts, proj_shapes, step_analytic, workspace_parts

#: fp32 [rows, vocab] buffers a sampled decode step holds at once: the step's logits and the
#: sampler's (eval.generate.filtered_probs, its worst path, top-k and top-p: the tempered
#: logits, the top-k mask, the sorted logits and their int64 order, the softmax and its
#: cumulative sum); the JAX sampler makes the same float64 copies on the host
SAMPLER_BUFFERS = 8
#: the same for a greedy step (the logits, the argmax's and the screen's int32 sums)
GREEDY_BUFFERS = 3


def update_inputs(inp: PlanInputs) -> PlanInputs:
    """The update of a sampling step as a training step. GRPO's (trains_on_rollouts): the
    P x G rollout sequences (prompt + completion, at most seq tokens) in micro-batches of
    `batch` (all of them when fewer), every micro-batch accumulated into one optimizer step
    (train.grpo: grad_accum plays no part there). Any other method's: its own step as asked."""
    off = dict(rl_prompts=0, group_size=0, rollout_tokens=0, trains_on_rollouts=True, held_out_decode=True,
               long_prompts=False)
    if not inp.trains_on_rollouts:
        return replace(inp, **off)
    rows = inp.rl_prompts * inp.group_size
    batch = min(inp.batch, rows)
    return replace(inp, batch=batch, grad_accum=math.ceil(rows / batch), **off)


def _rl_aux_bytes(inp: PlanInputs, upd: PlanInputs, f: Facts, device: DeviceSpec) -> float:
    """The update's per-token fp32 arrays: coef, adv, old and reference log-probs of every
    rollout sequence (host arrays: on a CPU, the device's memory), and one micro-batch's
    device copy of them with the loss's stacked [B, L, 3] aux. None without GRPO's update."""
    if not inp.trains_on_rollouts:
        return 0.0
    host = 4 * inp.rl_prompts * inp.group_size * inp.seq * 4 if device.kind == "cpu" else 0
    return host + 7 * math.ceil(upd.batch / f.ranks) * upd.seq * 4


def _decode_bytes(inp: PlanInputs, f: Facts, device: DeviceSpec, rows: int, greedy: bool,
                  distinct: int | None = None) -> dict[str, float]:
    """KV cache and workspace of one generate call of `rows` prompts (the longest prompt
    `inp.rollout_prompt` tokens, then rollout_tokens new ones), per device. Every device
    decodes every row: the JAX generator's cache and batch are not sharded, and each torch
    rank runs the method's rollouts itself.
    - torch (eval.generate + fast_gemma.LeanGemma): a cache of prompt + new slots per layer,
      preallocated in the model dtype, beside the prefill's own cache while it is copied in;
      later, when a row finishes, the new keys are built before the old are dropped (half a
      cache more). The larger of the two transients is counted.
    - JAX (eval.jax_generate): the prompt padded to a BUCKET multiple, and the jitted step's
      input and output caches both live (the step does not donate its cache).
    - workspace: the larger of the prefill (one layer's inference intermediates on every
      prompt token: residual and normed input, q/k/v, the MLP's gate/up/product, and the
      attention scores and probabilities where they exist: JAX, and torch's eager attention
      of Gemma 2's soft-capped logits, not torch's sdpa; and the last position's logits;
      torch prefills each distinct prompt once, `distinct` of them, the JAX generator every
      row; with torch LoRA, PEFT's forward of the widest adapted projection holds two more
      outputs' worth, `_lora_prefill`) and a decode step (the logits and the sampler's
      buffers); a decode of the torch engine on a
      CPU in fp32, greedy or sampled (Gumbel-max through the screen), also holds the int8
      copy of the head (eval.screened_head) and its permutation, built one group of rows
      at a time (once per head version: decoders share it)."""
    from tunix_rt.eval.jax_generate import BUCKET
    from tunix_rt.eval.screened_head import GROUPS as SCREEN_GROUPS
    from tunix_rt.eval.screened_head import PAD_COLS

    p, new = f.p, inp.rollout_tokens
    prompt = inp.rollout_prompt
    per_token = 2 * p.num_layers * p.num_kv_heads * p.head_dim * f.wb  # K and V, every layer
    if f.jax:
        slots = -(-prompt // BUCKET) * BUCKET + new
        cache = 2 * rows * slots * per_token
    else:
        slots = prompt + new
        cache = rows * slots * per_token + max(rows * prompt * per_token, (rows - 1) * slots * per_token / 2)
    h, i = p.hidden_size, p.intermediate_size
    q, kv = p.num_heads * p.head_dim, p.num_kv_heads * p.head_dim
    keys = slots if f.jax else prompt  # JAX attends over the whole cache in the prefill
    scores = 2 * p.num_heads * keys if f.jax or _eager_attention(p) else 0
    layer = 2 * h + q + 2 * kv + 3 * i + scores + _lora_prefill(inp, f)
    logits = rows * p.vocab_size * 4
    prefilled = rows if f.jax else min(rows, distinct or rows)
    prefill = prefilled * prompt * layer * f.wb + logits
    step = (GREEDY_BUFFERS if greedy else SAMPLER_BUFFERS) * logits
    screen = build = 0
    if not f.jax and device.kind == "cpu" and f.wb == 4 and p.vocab_size >= 4 * PAD_COLS:
        screen = p.vocab_size * (p.hidden_size + 8)  # int8 rows, int64 permutation
        per = -(-p.vocab_size // SCREEN_GROUPS)  # built one group of rows at a time:
        build = screen + per * p.hidden_size * 32  # fp32 rows and codes, fp64 rows, codes, error
    return {"rows": rows, "prefilled": prefilled, "slots": slots, "kv_bytes_per_token": per_token, "cache": cache,
            "workspace": max(max(prefill, step) + screen, build), "prefill": prefill, "step": step,
            "screen": screen, "screen_build": build}


def _lora_prefill(inp: PlanInputs, f: Facts) -> int:
    """Elements per prompt token the torch prefill adds with live LoRA adapters (the decode
    applies them, no merged copy: eval.fast_gemma): PEFT's forward of a projection holds its
    base output, the adapter's scaled output and their sum at once, two outputs more than a
    plain Linear; counted for the widest adapted projection. Measured on tiny-gemma3's
    on-policy distill (test_plan_calibration, 64 prompts of ~290 tokens): the rollout phase
    grew 35 MB more than with a merged copy, 2 x 256 fp32 a prompt token."""
    if f.jax or f.full:
        return 0
    shapes = proj_shapes(f.p)
    return 2 * max(shapes[t][1] for t in inp.lora_targets)


def _eager_attention(p: Preset) -> bool:
    """The torch engine's attention holds the [L, L] scores: eager, which it loads where the
    model soft-caps attention logits (Gemma 2: torch_engine.attention_of); sdpa elsewhere."""
    return bool((p.hf_config or {}).get("attn_logit_softcapping"))


def _rollout_phase(inp: PlanInputs, f: Facts, device: DeviceSpec, weights: float,
                   optimizer: float, frozen: float = 0.0) -> dict[str, Any]:
    """Bytes per device while the method decodes: the resident weights and optimizer state
    (no gradients, no activations: the last step freed them) and `frozen` (a distillation
    teacher's weights, or full fine-tuning's reference weights, loaded for the whole run), and the larger of the decodes the method
    makes: the rollouts (P x G rows, sampled) and, with held_out_decode, the held-out
    evaluation (greedy, eval's default batch of prompts)."""
    from tunix_rt.eval.generate import DecodeConfig

    rows = {"rollouts": (inp.rl_prompts * inp.group_size, False, inp.rl_prompts)}
    if inp.held_out_decode:
        rows["held-out eval"] = (DecodeConfig().batch_size, True, DecodeConfig().batch_size)
    resident = (weights if inp.donate else weights / 2) + frozen  # no step in flight: no undonated copy
    gather = workspace_parts(inp, f, device)  # the forward's FSDP gathers, as in training
    decodes = {}
    for name, (n, greedy, distinct) in rows.items():
        d = _decode_bytes(inp, f, device, n, greedy, distinct)
        core = resident + optimizer + d["cache"] + d["workspace"]
        parts = {"process_or_context": gather["process_or_context"], "fsdp_gather": gather["fsdp_gather"]}
        parts["allocator_slack"] = SLACK[device.kind] * (core + parts["fsdp_gather"])
        decodes[name] = {**d, "workspace_parts": parts, "peak": core + sum(parts.values())}
    which = max(decodes, key=lambda k: decodes[k]["peak"])
    d = decodes[which]
    return {"rollout_cache": d["cache"], "rollout_workspace": d["workspace"],
            "workspace": sum(d["workspace_parts"].values()), "workspace_parts": d["workspace_parts"],
            "decode": which, "peak": d["peak"],
            "decodes": {k: _ints({n: x for n, x in v.items() if n != "workspace_parts"}) for k, v in decodes.items()}}


def _ints(d: dict[str, float]) -> dict[str, int]:
    return {k: int(v) for k, v in d.items()}


def _rl_analytic(inp: PlanInputs, preset: Preset, device: DeviceSpec) -> tuple[dict[str, int], dict[str, Any], int]:
    """A sampling step peaks in one of its two phases: peak = max(update, rollout), where the
    update is the method's training step (GRPO's: over the rollout sequences, plus the RL
    per-token arrays), and the rollout holds the weights, optimizer state, a teacher's
    weights, KV cache and decode workspace (see `_rollout_phase`)."""
    from tunix_rt.plan.teacher import with_teacher

    upd = update_inputs(inp)
    items, details, update_peak = with_teacher(upd, preset, device, *step_analytic(upd, preset, device))
    f = facts(upd, preset)
    aux = _rl_aux_bytes(inp, upd, f, device)
    update_peak += aux * (1 + SLACK[device.kind])
    update_ws = items["workspace"] + aux * SLACK[device.kind]
    roll = _rollout_phase(inp, f, device, items["weights"], items["optimizer"],
                          items.get("teacher_weights", 0) + items.get("reference_weights", 0))
    phase = "rollout" if roll["peak"] > update_peak else "update"
    items = {**{k: v for k, v in items.items() if k != "workspace"}, **({"rl_aux": aux} if inp.trains_on_rollouts else {}),
             "rollout_cache": roll["rollout_cache"],
             "rollout_workspace": roll["rollout_workspace"],
             "workspace": roll["workspace"] if phase == "rollout" else update_ws}
    update = details["peak_formula"] + (" + rl_aux" if inp.trains_on_rollouts else "")
    frozen = "".join(f" + {k}" for k in ("teacher_weights", "reference_weights") if k in items)
    details.update({
        "peak_phase": phase, "phases": {"update": int(update_peak), "rollout": int(roll["peak"])},
        "update_batch": upd.batch, "update_micro_batches": upd.grad_accum, "rollout_decode": roll["decode"],
        "decodes": roll["decodes"], "rollout_workspace_parts": _ints(roll["workspace_parts"]),
        "update_workspace_parts": details.pop("workspace_parts"),
        "peak_formula": f"max(update: {update}, rollout: weights + optimizer{frozen} "
                        "+ rollout_cache + rollout_workspace + workspace)",
    })
    return {k: int(v) for k, v in items.items()}, details, int(max(update_peak, roll["peak"]))


def analytic(inp: PlanInputs, preset: Preset, device: DeviceSpec) -> tuple[dict[str, int], dict[str, Any], int]:
    """(items, details, peak) in bytes per device; see this module's and `plan.step`'s docstrings."""
    from tunix_rt.plan.teacher import with_teacher

    if inp.rl:
        return _rl_analytic(inp, preset, device)
    return with_teacher(inp, preset, device, *step_analytic(inp, preset, device))
