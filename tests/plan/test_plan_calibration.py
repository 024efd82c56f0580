"""Calibration: the plan's predicted peak against the peak RSS of real training runs on
this CPU (each in its own process, see rss_child.py), for the torch engine on the tiny
model (fast) and on Gemma 3 270M, LoRA and full (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("rss_child.py")


def write_traces(path: Path, n: int = 16, words: int = 1) -> str:
    with open(path, "w") as f:
        for i in range(n):
            steps = [f"{i} plus {j} is {i + j}. " * words for j in range(1 + i % 3)]
            f.write(json.dumps({"id": f"t{i:03d}", "question": f"Add {i} and {'one ' * (i % 4)}?",
                                "steps": steps, "answer": str(i)}) + "\n")
    return str(path)


def write_questions(path: Path, n: int = 16, filler: int = 0) -> str:
    """Arithmetic questions of about one prompt length (filler words after the sum), so that
    any P of them make a rollout batch as wide as the longest (rss_child's _seq_fits_prompts
    then sets max_seq_len to that + the rollout tokens: the plan's bound, reached)."""
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"q{i:03d}", "question": f"Add {i} and {i + 7}? " + "Think carefully. " * filler,
                                "steps": [f"{i} plus {i + 7} is {2 * i + 7}."], "answer": str(2 * i + 7)}) + "\n")
    return str(path)


#: the band of the tiny models' checks, whose total is mostly the process baseline: that
#: baseline's file-backed pages differ by up to ~25% of it between venvs of the same packages
FRESH_VENV = 0.35


def run_child(fields: dict, home: Path, timeout: int = 240) -> dict:
    env = {**os.environ, "TUNIX_RT_HOME": str(home)}
    proc = subprocess.run([sys.executable, str(CHILD), json.dumps(fields)], env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    print(f"\n{fields.get('model')} {fields.get('method')}: predicted {out['predicted'] / 1e9:.3f} GB, "
          f"measured peak RSS {out['measured_peak_rss'] / 1e9:.3f} GB "
          f"(ratio {out['measured_peak_rss'] / out['predicted']:.2f}), train {out['train_s']} s")
    for part, (predicted, measured, start) in out.get("compare", {}).items():
        print(f"  {part}: predicted {predicted / 1e9:.3f} GB, measured {measured / 1e9:.3f} GB "
              f"(ratio {measured / predicted:.2f}; from {start / 1e9:.3f} GB at the phase's start: "
              f"{phase_ratio(predicted, measured, start):.2f})")
    return out


def phase_ratio(predicted: int, measured: int, start: int) -> float:
    """A phase's measured peak RSS over what it should be: its planned peak, or the RSS the
    phase starts from where that is higher. The allocator keeps the pages an earlier, larger
    phase freed (the update and the held-out decode start where the rollouts left the RSS),
    and the plan counts each phase as if it started from its own resident bytes; so a later
    phase is held to not growing past what it starts from by more than the band, and to its
    plan where it starts below it (the first phase always does)."""
    return measured / max(predicted, start)


def test_tiny_full_finetune_rss_matches_the_plan(home, tmp_path):
    """On the tiny model the process dominates (Python, torch, transformers, tensorboard,
    matplotlib: ~0.46 GB of ~0.48); the plan models that baseline. Tolerance 20%: the
    baseline moves by tens of MB with what gets imported and with glibc's arenas, and the
    model's own bytes (~30 MB) are a few percent of the total (measured ratio 0.97).
    Fresh clone (2026-11-26, AVX512-VNNI EPYC): a just-installed venv maps more file-backed pages of
    the same shared libraries (`import torch`: 278 MB against 220 MB in an older venv of the same
    packages), which moved this run to 1.24; hence 35% (FRESH_VENV below)."""
    fields = dict(model="tiny-gemma3", dataset=write_traces(tmp_path / "t.jsonl"), split="all",
                  eval_split="all", eval_limit=4, batch_size=4, max_seq_len=128, max_steps=2,
                  method="full", _threads=1)
    out = run_child(fields, Path(os.environ["TUNIX_RT_HOME"]))
    assert abs(out["measured_peak_rss"] / out["predicted"] - 1) < FRESH_VENV


@pytest.mark.slow
@pytest.mark.parametrize("method", ["lora", "full"])
def test_gemma3_270m_rss_matches_the_plan(method, gemma3_270m, tmp_path):
    """Gemma 3 270M, batch 4 x 256 (packed, so every batch is full width), chunked loss
    (the default 256 MiB: 256-token chunks), two optimizer steps on the torch engine. Tolerance 25%: the model's bytes now dominate, but RSS also holds the
    safetensors file pages read at load (up to 1.07 GB until the kernel drops them) and
    glibc keeps freed blocks; the plan counts neither."""
    fields = dict(model=str(gemma3_270m), dataset=write_traces(tmp_path / "t.jsonl", n=40, words=6),
                  split="all", eval_split="all", eval_limit=2, batch_size=4, max_seq_len=256,
                  packing=True, max_steps=2, method=method, _threads=2)
    out = run_child(fields, tmp_path / "home", timeout=600)  # the model dir is used in place
    assert abs(out["measured_peak_rss"] / out["predicted"] - 1) < 0.25


@pytest.mark.slow
@pytest.mark.jax
def test_tiny_jax_engine_rss_matches_the_plan(home, tmp_path):
    """The JAX engine on the tiny model (CPU): the process (jax, torch for the data path,
    tunix, orbax, XLA's compiler: ~1.2 GB) dominates as with torch; same 20% tolerance.
    Measured 1.22 GB; the plan's JAX baseline (1.15 GB) was set from this run, so this test
    guards against drift (a heavier import, a leak), not the model of the weights. With the
    heap trimmed after each XLA compile it measured 0.855 GB (1.18 predicted then): the
    baseline is now 0.84 GB."""
    fields = dict(model="tiny-gemma3", dataset=write_traces(tmp_path / "t.jsonl"), split="all",
                  eval_split="all", eval_limit=4, batch_size=4, max_seq_len=128, max_steps=2,
                  method="lora", engine="jax")
    out = run_child(fields, Path(os.environ["TUNIX_RT_HOME"]), timeout=600)
    assert abs(out["measured_peak_rss"] / out["predicted"] - 1) < 0.20


def grpo_fields(model: str, dataset: str, new_tokens: int, **over) -> dict:
    """One GRPO step, 4 prompts x 4 samples, max_seq_len = the longest prompt + new_tokens
    (rss_child: the plan's bound reached), 8 held-out prompts (eval's decode batch)."""
    return dict(model=model, dataset=dataset, split="all", eval_split="all", eval_limit=8, method="grpo",
                rl_prompts=4, group_size=4, rollout_max_new_tokens=new_tokens, max_steps=1,
                _seq_fits_prompts=True, **over)


def test_tiny_grpo_step_rss_matches_the_plan_in_each_phase(home, tmp_path):
    """One GRPO step on the tiny model (16 rollouts of 32 tokens, the update in 4
    micro-batches of 4): the process baseline dominates, so this guards the RL path end to
    end (a grpo config planned as RL, each phase's own peak measured) rather than the KV
    cache formulas, which the slow Gemma 3 270M case calibrates. Measured: peak 0.522 GB
    for 0.484 predicted (1.08: the end of the run imports matplotlib for loss.png);
    rollouts 0.455 vs 0.474, update 0.492 vs 0.484. On an AVX512-VNNI EPYC (2026-11-26) the
    same code measured rollouts 0.580 / 0.653 GB for 0.554 predicted in two venvs of identical
    packages (`import torch` alone: 220 vs 252 MB there), after the int8 speed probe shrank
    from ~105 to ~26 MB (it had put the rollouts at 0.733 GB, 1.32): the baseline's spread
    between environments is ~15% of this small total.
    Fresh clone (2026-11-26, AVX512-VNNI EPYC): a just-installed venv maps more file-backed pages of
    the same shared libraries (`import torch`: 278 MB against 220 MB in an older venv of the same
    packages), which moved this run to 1.28; hence 35% (FRESH_VENV below)."""
    fields = grpo_fields("tiny-gemma3", write_questions(tmp_path / "q.jsonl"), 32, batch_size=4, _threads=1)
    out = run_child(fields, Path(os.environ["TUNIX_RT_HOME"]))
    assert abs(out["measured_peak_rss"] / out["predicted"] - 1) < FRESH_VENV
    for part, row in out["compare"].items():
        assert abs(phase_ratio(*row) - 1) < FRESH_VENV, part


@pytest.mark.slow
@pytest.mark.timeout(3600)  # minutes when idle; past the suite's 900 s on a loaded 2-core machine
def test_gemma3_270m_grpo_step_rss_matches_the_plan_in_each_phase(gemma3_270m, tmp_path):
    """One GRPO step of Gemma 3 270M, LoRA, fp32, torch: 16 rollouts of 64 new tokens after
    128-token prompts (max_seq_len 192), the update in micro-batches of 1 with remat, 8
    held-out prompts decoded greedily. 64 tokens (128 until 2026-11-26: the suite's longest
    test): a clean 2-core EPYC measured rollouts 2.751 GB for 2.652 (1.04), update 2.229 for
    2.176 (1.02), held-out decode 2.739 for 2.501 (1.10), 90 s. With 128 tokens: measured
    (one run, 54 min on the shared 2-core machine, 3 min of it CPU-bound work per phase): rollouts 2.304 GB for 2.434 predicted
    (0.95; the first step's rollouts have no AdamW state yet, 30 MB), update 2.038 for
    2.252 (0.90), the held-out decode 2.943 for 2.879 (1.02: the screen of the head is
    built from a full fp32 |head|, 671 MB), which is the run's peak: 2.943 for 2.879.
    A fresh clone (2026-11-26): rollouts 2.911 for 2.692 (1.08), update 2.484 for 2.332 (1.07),
    the held-out decode 2.905 for 2.520 (1.15: its phase starts at the RSS the rollouts left,
    plus the fresh venv's file-backed pages); hence 20%.
    The CI of a5484ea (2026-12-07, 572 s of training beside the suite's other process):
    rollouts 2.567 for 2.231 (1.15), update 2.287 for 1.962 (1.17), held-out decode 2.535 for
    2.079 (1.22, failed): the later phases measured the pages the rollouts left. Hence each
    phase is held to the larger of its plan and the RSS it starts from (phase_ratio), and the
    held-out decode's growth to its planned cache and workspace (one-sided). On a 2-core Xeon
    (AMX) with that rule: rollouts 2.324 for 2.231 (1.04), update 2.188 from 2.164 at its
    start (1.01), held-out decode 2.274 from 2.178 (1.04), its growth 96 MB for 366 planned."""
    fields = grpo_fields(str(gemma3_270m), write_questions(tmp_path / "q.jsonl", filler=28), 64,
                         batch_size=1, gradient_checkpointing=True, _threads=2)
    out = run_child(fields, tmp_path / "home", timeout=5400)
    assert out["details"]["peak_phase"] == "rollout" and out["details"]["rollout_decode"] == "rollouts"
    assert abs(out["measured_peak_rss"] / out["predicted"] - 1) < 0.20
    for part, row in out["compare"].items():
        assert abs(phase_ratio(*row) - 1) < 0.20, part
    predicted, measured = out["eval_growth"]  # the held-out decode adds no more than its plan
    print(f"  held-out eval growth: predicted {predicted / 1e6:.0f} MB, measured {measured / 1e6:.0f} MB")
    assert measured < 1.2 * predicted


@pytest.mark.parametrize("method", ["rft", "dpo-rollouts", "distill-on-policy"])
def test_tiny_sampling_methods_rss_matches_the_plan_in_each_phase(method, home, tmp_path):
    """One step of each method that samples besides GRPO, on the tiny model: rft (16 samples of
    32 tokens, then SFT on the kept ones), dpo with pairs=rollouts (GRPO's 16 rollouts, then
    DPO on the best/worst pairs) and on-policy distill (one 32-token completion of each of
    the step's 4 x 4 examples, the teacher beside the student, kd_alpha 0.1: a teacher with
    the student's own weights is refused without it). Each is planned with its rollout phase
    (plan.rl's rule, as GRPO's) and its own update; each phase's measured peak is within the
    band of the tiny GRPO check (FRESH_VENV: the process baseline dominates). Measured
    (2026-11-26, 2-core EPYC, this venv), peak / predicted: rft 0.614 / 0.564 GB (1.09),
    dpo-rollouts 0.615 / 0.564 (1.09), distill-on-policy 0.635 / 0.589 (1.08); rollouts
    1.10-1.11, updates 1.03-1.04 (tiny GRPO in the same run: 1.10)."""
    if method == "distill-on-policy":
        fields = dict(model="tiny-gemma3", dataset=write_traces(tmp_path / "t.jsonl"), split="all",
                      eval_split="all", eval_limit=4, method="distill", teacher="tiny-gemma3", kd_on_policy=True,
                      kd_alpha=0.1, batch_size=4, grad_accum=4, max_seq_len=128, rollout_max_new_tokens=32, max_steps=1,
                      _threads=1)
    else:
        over = {"method": "rft"} if method == "rft" else {"method": "dpo", "pairs": "rollouts"}
        fields = grpo_fields("tiny-gemma3", write_questions(tmp_path / "q.jsonl"), 32, batch_size=4, _threads=1)
        fields.update(over)
    out = run_child(fields, Path(os.environ["TUNIX_RT_HOME"]))
    d = out["details"]
    assert "rl_aux" not in out["items"] and out["items"]["rollout_cache"] > 0
    assert set(d["decodes"]) == ({"rollouts"} if method == "distill-on-policy" else {"rollouts", "held-out eval"})
    assert abs(out["measured_peak_rss"] / out["predicted"] - 1) < FRESH_VENV
    assert set(out["compare"]) >= {"update", "rollouts"}
    for part, row in out["compare"].items():
        assert abs(phase_ratio(*row) - 1) < FRESH_VENV, part


def test_tiny_on_policy_distill_of_long_prompts_grows_by_the_planned_rollouts(home, tmp_path):
    """On-policy distill where the rollouts are the peak: 2 x 32 examples a step, 64 distinct
    prompts of ~290 tokens (max_seq_len = the longest + 40, the plan's bound of max_seq_len - 1 nearly reached), 256
    new tokens each. What the rollout phase adds to the RSS it starts from (the KV cache, the
    prefill's one layer of intermediates, the merged view; no process baseline in it) is the
    plan's within 20%. Measured (2026-11-26, 2-core EPYC): +138 MB for +142 MB planned (0.97),
    the phase 0.706 GB for 0.686 (1.03); with the [L, L] attention scores counted in the
    torch prefill (sdpa holds none) the plan said +365 MB and 0.925 GB (0.38 and 0.76).
    The same rule on an H100 (2026-11-26, torch 2.11 cu130; growth = torch.cuda's peak
    allocation over the allocation when the phase starts, 256 rows of ~296-token prompts,
    256 new tokens): on-policy distill 552 MB for 541 planned (1.02); GRPO and rft, 32 x 8
    rows, 97 MB for 159 (0.61: each prompt prefilled once, the plan also stacks the
    prefill's intermediates on the whole cache, which never coexist there)."""
    fields = dict(model="tiny-gemma3", dataset=write_questions(tmp_path / "q.jsonl", n=64, filler=20), split="all",
                  eval_split="all", eval_limit=4, method="distill", teacher="tiny-gemma3", kd_on_policy=True,
                  kd_alpha=0.1, batch_size=2, grad_accum=32, rollout_max_new_tokens=256, max_steps=1,
                  _seq_is_prompt_plus=40, _threads=1)
    out = run_child(fields, Path(os.environ["TUNIX_RT_HOME"]))
    d = out["details"]
    assert d["peak_phase"] == "rollout" and d["decodes"]["rollouts"]["rows"] == 64
    predicted, measured = out["rollout_growth"]
    print(f"  rollout growth: predicted {predicted / 1e6:.0f} MB, measured {measured / 1e6:.0f} MB")
    assert abs(measured / predicted - 1) < 0.20
    assert abs(out["measured_peak_rss"] / out["predicted"] - 1) < FRESH_VENV
    for part, row in out["compare"].items():
        assert abs(phase_ratio(*row) - 1) < FRESH_VENV, part
