"""What to change when a plan does not fit: single changes, then pairs, each re-planned."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from tunix_rt.errors import BadInput
from tunix_rt.models.catalog import Preset
from tunix_rt.plan.devices import DeviceSpec
from tunix_rt.plan.inputs import PlanInputs
from tunix_rt.plan.rl import analytic, update_inputs

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
    grpo = inp.rl and inp.trains_on_rollouts
    start = update_inputs(inp).batch if grpo else inp.batch
    b = start
    while b > 1:
        b //= 2
        if start % b == 0 and (b % inp.fsdp == 0 or b >= inp.fsdp):
            if grpo:
                out.append((2, f"batch={b}", replace(inp, batch=b)))
                continue
            acc = inp.grad_accum * inp.batch // b
            out.append((2, f"batch={b} grad_accum={acc}", replace(inp, batch=b, grad_accum=acc)))
    return out


def _rl_candidates(inp: PlanInputs) -> list[tuple[int, str, PlanInputs]]:
    """Fewer prompts per step (the same estimator on fewer prompts), a smaller group (noisier
    advantages), shorter rollouts keeping the prompts' room (answers may be cut): each
    halved until it fits, the least change first. Sampling from whole prompts (long_prompts:
    on-policy distill, one completion of each example of the step) has only the last."""
    out = []
    t = inp.rollout_tokens
    if inp.long_prompts:
        while t > 16:
            t //= 2
            out.append((3, f"rollout_max_new_tokens={t}", replace(inp, rollout_tokens=t)))
        return out
    n = inp.rl_prompts
    while n > 1:
        n //= 2
        out.append((2, f"rl_prompts={n}", replace(inp, rl_prompts=n)))
    g = inp.group_size
    while g > 2:
        g //= 2
        out.append((3, f"group_size={g}", replace(inp, group_size=g)))
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
