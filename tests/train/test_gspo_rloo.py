"""rl_loss gspo and rloo (train.sequence_ratio): on the tiny Gemma 3 with a LoRA adapter, the
loss and the gradient of an off-policy update (old log-probs away from the policy, so the
sequence ratios are inside and outside the clip band) equal TRL 1.16's on the same batch —
GRPOTrainer._compute_loss with importance_sampling_level="sequence" and loss_type="grpo"
(GSPO; with use_bias_correction_kl=False, the plain k3 term of our GRPO family),
RLOOTrainer._compute_loss (RLOO) — to 1e-5; the reference form
(rl_objective.sequence_policy_loss) against finite differences and the engine; the
leave-one-out advantages as TRL computes them; accumulation 8x1 = 1x8; the JAX engine equal
to the PyTorch one to 1e-4; complete runs on both engines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import train_testlib
from requires import require_module
from train_testlib import one_torch_thread  # noqa: F401 (autouse fixture)
from tunix_rt.train.engine import StepResult
from tunix_rt.train.rl_objective import sequence_policy_loss

HERE = Path(__file__).resolve().parent
EPS_LOW, EPS_HIGH = 0.2, 0.28


@pytest.fixture(autouse=True)
def user_rewards_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


def rl_cfg(tmp_path, **over):
    return train_testlib.rl_cfg(tmp_path, **{"engine": "torch", "lora_dropout": 0.0, "epsilon_high": EPS_HIGH,
                                             "mu": 2, **over})


# ------------------------------------------------------------------ the reference form
@pytest.mark.parametrize("level", ["mean", "sum"])
def test_reference_gradient_matches_finite_differences(level):
    rng = np.random.default_rng(3 if level == "mean" else 4)
    n, t = 6, 9
    on = rng.uniform(size=(n, t)) > 0.25
    coef = np.where(on, rng.uniform(0.1, 1.0, (n, 1)), 0.0)
    old = -rng.uniform(0.5, 5.0, (n, t))
    logp = old + rng.normal(0.0, 0.3 if level == "mean" else 0.08, (n, t))
    ref = logp + rng.normal(0.0, 0.3, (n, t))
    adv = rng.normal(0.0, 1.0, n)
    hp = dict(level=level, eps_low=EPS_LOW, eps_high=EPS_HIGH, beta=0.04)
    out = sequence_policy_loss(logp, old, ref, adv, coef, **hp)
    h = 1e-6
    for i, j in zip(*np.nonzero(on)):
        up, down = logp.copy(), logp.copy()
        up[i, j] += h
        down[i, j] -= h
        fd = (sequence_policy_loss(up, old, ref, adv, coef, **hp).loss
              - sequence_policy_loss(down, old, ref, adv, coef, **hp).loss) / (2 * h)
        assert out.dloss_dlogp[i, j] == pytest.approx(fd, rel=1e-5, abs=1e-8)
    assert (out.dloss_dlogp[~on] == 0).all()


def test_leave_one_out_advantages_are_trls():
    from tunix_rt.train.advantages import group_advantages

    r = np.random.default_rng(0).normal(size=(3, 5))
    r[1] = 0.5  # a group with no signal: exactly 0
    t = torch.tensor(r)  # RLOOTrainer: (grouped_sum - grouped_rewards) / (scorable_counts - 1)
    want = (t - (t.sum(1, keepdim=True) - t) / (t.shape[1] - 1)).numpy()
    np.testing.assert_allclose(group_advantages(r, "rloo"), want, atol=1e-12)
    assert (group_advantages(r, "rloo")[1] == 0).all()


# ------------------------------------------------------------------ against TRL
def _window(home, tmp_path, rl_loss, beta, engine_name="torch", finetune="lora", shared=False, batch_size=4):
    """An engine with a moved LoRA adapter (the reference differs from the policy), one group
    of 4 rollouts of one prompt, its update batches with ref and old log-probs, the old ones
    shifted by a per-completion offset so the ratios cross the clip band."""
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.train.engines import engine_class
    from tunix_rt.train.grpo import GRPO

    cfg = rl_cfg(tmp_path, rl_loss=rl_loss, beta=beta, rl_prompts=1, group_size=4, batch_size=batch_size,
                 engine=engine_name, finetune=finetune, rollout_max_new_tokens=10)
    tok = load_tokenizer(cfg.model, home)
    engine, method = engine_class(engine_name)(cfg), GRPO(cfg, home, tok)
    engine.devices()
    engine.setup(ensure_model(cfg.model, home), tok)
    if engine_name == "torch" and finetune == "lora":
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in engine.trainable.values():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    groups, _ = method.rollouts(engine, 0)
    batches = method.update_batches(groups, shared=shared)
    from tunix_rt.train.sequence_ratio import Window

    assert len(batches) == 1
    w, b = Window(batches), batches[0]
    offsets = np.array([0.4, -0.3, 0.03, -0.02])  # log-ratio per completion: clipped (by A's sign) and not
    b.aux["ref_logp"] = engine.token_logprobs(b, adapter=False) if beta > 0 else np.zeros(b.labels.shape, np.float32)
    per_tok = offsets if rl_loss == "gspo" else offsets / np.maximum(w.n, 1)  # LR_i = offset_i either way
    b.aux["old_logp"] = engine.token_logprobs(b) - w.spread(per_tok, 0)
    rewards = np.stack([g.rewards for g in groups])
    return cfg, engine, method, groups, batches, rewards


def _ours(engine, method, batches, rewards):
    """Loss and LoRA gradients of update 1 (a no-gradient pass gives the ratios)."""
    plan = method.sequence.start(engine, batches, rewards)
    objective, finish = plan.prepare(engine, 1)
    total = 0.0
    for b in batches:
        part, _ = engine.objective_sum(b, objective)
        part.backward()
        total += float(part.detach())
    grads = {n: p.grad.clone() for n, p in engine.trainable.items()}
    for p in engine.trainable.values():
        p.grad = None
    return finish(StepResult(total, 0.0)).loss, grads, plan


def _trl_inputs(groups, batches, tok_pad):
    """TRL's batch: the shared prompt, the completions right-padded, per-token old/ref."""
    g = groups[0]
    comps = [o.ids for o in g.completions]
    width = max(len(c) for c in comps)
    cid = torch.full((4, width), tok_pad, dtype=torch.long)
    cmask = torch.zeros((4, width), dtype=torch.long)
    old = torch.zeros((4, width), dtype=torch.float32)
    ref = torch.zeros((4, width), dtype=torch.float32)
    b = batches[0]
    for i, c in enumerate(comps):
        cid[i, :len(c)] = torch.tensor(c)
        cmask[i, :len(c)] = 1
        at = slice(len(g.prompt) - 1, len(g.prompt) - 1 + len(c))  # position t predicts token t + 1
        old[i, :len(c)] = torch.from_numpy(b.aux["old_logp"][i, at])
        ref[i, :len(c)] = torch.from_numpy(b.aux["ref_logp"][i, at])
    return {"prompt_ids": torch.tensor([g.prompt] * 4), "prompt_mask": torch.ones((4, len(g.prompt)), dtype=torch.long),
            "completion_ids": cid, "completion_mask": cmask, "old_per_token_logps": old, "ref_per_token_logps": ref,
            "num_items_in_batch": cmask.sum()}


def _trl_grads(trainer, model, inputs, trainable):
    model.train()
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in trainable.items()}
    for p in trainable.values():
        p.grad = None
    return float(loss.detach()), grads


def _trainer(kind, model, tok_dir, tmp_path, beta):
    from datasets import Dataset
    from transformers import AutoTokenizer

    trl = require_module("trl")
    common = dict(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=4, num_generations=4, beta=beta,
                  epsilon=EPS_LOW, epsilon_high=EPS_HIGH, report_to=[], use_cpu=True, bf16=False,
                  max_completion_length=10)
    if kind == "gspo":
        # use_bias_correction_kl (TRL 1.16's default True) weights the k3 term by the ratio;
        # tunix-rt's GRPO family, GSPO included, takes the plain k3 term (as Tunix and GSPO do)
        args = trl.GRPOConfig(importance_sampling_level="sequence", loss_type="grpo", use_bias_correction_kl=False,
                              **common)
        cls = trl.GRPOTrainer
    else:
        args, cls = trl.RLOOConfig(**common), trl.RLOOTrainer
    trainer = cls(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                  train_dataset=Dataset.from_dict({"prompt": ["x"] * 8}),
                  processing_class=AutoTokenizer.from_pretrained(tok_dir))
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def _assert_grads_close(ours, theirs, atol):
    assert ours.keys() == theirs.keys()
    scale = max(float(g.abs().max()) for g in theirs.values())
    assert scale > 0
    for name, g in theirs.items():
        torch.testing.assert_close(ours[name], g, atol=atol * max(scale, 1.0), rtol=1e-4, msg=name)


def test_gspo_loss_and_gradient_equal_trls_sequence_level_grpo(home, tmp_path):
    from tunix_rt.models.store import ensure_model

    cfg, engine, method, groups, batches, rewards = _window(home, tmp_path, "gspo", beta=0.04)
    loss, grads, _plan = _ours(engine, method, batches, rewards)
    model = engine.module.model
    trainer = _trainer("gspo", model, ensure_model(cfg.model, home), tmp_path, 0.04)
    inputs = _trl_inputs(groups, batches, 0)
    b = batches[0]
    inputs["advantages"] = torch.tensor([float(b.aux["adv"][i][b.coef[i] != 0][0]) for i in range(4)])
    trl_loss, trl_grads = _trl_grads(trainer, model, inputs, engine.trainable)
    assert loss == pytest.approx(trl_loss, abs=1e-5, rel=1e-5)
    _assert_grads_close(grads, trl_grads, 1e-5)
    clip = trainer._metrics["train"]["clip_ratio/region_mean"][-1]
    assert 0 < clip < 1  # some completions clipped, some not: both branches compared


def test_rloo_loss_and_gradient_equal_trls_rloo_trainer(home, tmp_path):
    from tunix_rt.models.store import ensure_model

    cfg, engine, method, groups, batches, rewards = _window(home, tmp_path, "rloo", beta=0.05)
    loss, grads, plan = _ours(engine, method, batches, rewards)
    model = engine.module.model
    trainer = _trainer("rloo", model, ensure_model(cfg.model, home), tmp_path, 0.05)
    inputs = _trl_inputs(groups, batches, 0)
    # RLOOTrainer's shaping, from its _generate_and_score_completions: reward - beta * sum(old - ref)
    kl = ((inputs["old_per_token_logps"] - inputs["ref_per_token_logps"]) * inputs["completion_mask"]).sum(-1)
    shaped = torch.tensor(rewards[0]) - 0.05 * kl.double()
    inputs["advantages"] = (shaped - (shaped.sum() - shaped) / 3).float()
    np.testing.assert_allclose(plan.adv, inputs["advantages"].numpy(), atol=1e-6)
    inputs["old_logps"] = (inputs["old_per_token_logps"] * inputs["completion_mask"]).sum(1)
    trl_loss, trl_grads = _trl_grads(trainer, model, inputs, engine.trainable)
    assert loss == pytest.approx(trl_loss, abs=1e-5, rel=1e-5)
    _assert_grads_close(grads, trl_grads, 1e-5)
    clip = trainer._metrics["train"]["clip_ratio/region_mean"][-1]
    assert 0 < clip < 1


@pytest.mark.parametrize("rl_loss", ["gspo", "rloo"])
def test_accumulation_8x1_equals_1x8(home, tmp_path, rl_loss):
    """The same rollouts (2 prompts x 4), off-policy update 1 split into 8 micro-batches of
    one sequence or one of 8: same loss and gradients."""
    out = []
    for batch in (8, 1):
        cfg, engine, method, groups, batches, rewards = _window_pair(home, tmp_path, rl_loss, batch)
        loss, grads, _ = _ours(engine, method, batches, rewards)
        out.append((loss, grads, [c.ids for g in groups for c in g.completions]))
    assert out[0][2] == out[1][2]
    assert out[0][0] == pytest.approx(out[1][0], abs=1e-6)
    assert any(g.abs().sum() > 0 for g in out[0][1].values())
    for name, g in out[0][1].items():
        torch.testing.assert_close(out[1][1][name], g, atol=1e-6, rtol=0, msg=name)


@pytest.mark.jax
@pytest.mark.parametrize("rl_loss", ["gspo", "rloo"])
def test_jax_accumulation_8x1_equals_1x8(home, tmp_path, rl_loss):
    """On the JAX engine (a drawn adapter: the policy is not the reference), the same rollouts
    (2 prompts x 4), off-policy update 1 as 8 micro-batches of one sequence or one of 8: the
    same loss and gradients."""
    require_module("jax")
    from tunix_rt.train.grpo import GRPO
    from tunix_rt.train.jax_engine import flat
    from tunix_rt.train.sequence_ratio import Window

    engine, tok = train_testlib.jax_engine_with_drawn_adapter(
        rl_cfg(tmp_path, rl_loss=rl_loss, beta=0.04, engine="jax"), home, seed=1, scale=0.05)
    out = []
    for batch in (8, 1):
        method = GRPO(rl_cfg(tmp_path, rl_loss=rl_loss, beta=0.04, engine="jax", batch_size=batch), home, tok)
        groups, _ = method.rollouts(engine, 0)
        batches = method.update_batches(groups)
        w = Window(batches)
        shift = np.linspace(-0.3, 0.3, w.n_seq) / (np.maximum(w.n, 1) if rl_loss == "rloo" else 1)
        for i, b in enumerate(batches):
            b.aux["ref_logp"] = engine.token_logprobs(b, adapter=False)
            b.aux["old_logp"] = engine.token_logprobs(b) - w.spread(shift, i)
        plan = method.sequence.start(engine, batches, np.stack([g.rewards for g in groups]))
        objective, finish = plan.prepare(engine, 1)
        total, _stats, grads = engine.gradients(batches, objective)
        out.append((finish(StepResult(total, 0.0)).loss, flat(grads), [c.ids for g in groups for c in g.completions]))
    assert out[0][2] == out[1][2] and len(batches) == 8
    assert out[0][0] == pytest.approx(out[1][0], abs=1e-6)
    assert max(float(np.abs(g).max()) for g in out[0][1].values()) > 1e-4
    for name, g in out[0][1].items():
        np.testing.assert_allclose(out[1][1][name], g, atol=1e-5, rtol=0, err_msg=name)


def _window_pair(home, tmp_path, rl_loss, batch_size, shared=False):
    """2 prompts x 4 rollouts in micro-batches of batch_size; old log-probs shifted per completion."""
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.train.grpo import GRPO
    from tunix_rt.train.sequence_ratio import Window
    from tunix_rt.train.torch_engine import TorchEngine

    cfg = rl_cfg(tmp_path, rl_loss=rl_loss, batch_size=batch_size, beta=0.04)
    tok = load_tokenizer(cfg.model, home)
    engine, method = TorchEngine(cfg), GRPO(cfg, home, tok)
    engine.devices()
    engine.setup(ensure_model(cfg.model, home), tok)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in engine.trainable.values():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    groups, _ = method.rollouts(engine, 0)
    batches = method.update_batches(groups, shared=shared)
    w = Window(batches)
    shift = np.linspace(-0.3, 0.3, w.n_seq) / (np.maximum(w.n, 1) if rl_loss == "rloo" else 1)
    for i, b in enumerate(batches):
        b.aux["ref_logp"] = engine.token_logprobs(b, adapter=False)
        b.aux["old_logp"] = engine.token_logprobs(b) - w.spread(shift, i)
    return cfg, engine, method, groups, batches, np.stack([g.rewards for g in groups])


@pytest.mark.parametrize("rl_loss", ["gspo", "rloo"])
def test_shared_prompt_rows_equal_a_row_per_sample(home, tmp_path, rl_loss):
    """The torch engine's shared-prefix rows (a group's prompt once, its completions as
    branches): each branch is its own sequence, the same loss and gradients."""
    out = []
    for shared in (False, True):
        cfg, engine, method, groups, batches, rewards = _window_pair(home, tmp_path, rl_loss, 8, shared)
        assert (batches[0].segments is not None) == shared
        loss, grads, _ = _ours(engine, method, batches, rewards)
        out.append((loss, grads))
    assert out[0][0] == pytest.approx(out[1][0], abs=1e-5)
    for name, g in out[0][1].items():
        torch.testing.assert_close(out[1][1][name], g, atol=1e-5, rtol=1e-4, msg=name)


# ------------------------------------------------------------------ runs
@pytest.mark.parametrize("rl_loss", ["gspo", "rloo"])
def test_run_completes_with_committed_checkpoints(home, tmp_path, rl_loss):
    from tunix_rt.train import checkpoint
    from tunix_rt.train.driver import train
    from tunix_rt.train.metrics import read_jsonl

    # seed 10: rloo's logged grad_norm is 0 at some step for most seeds of the sampling noise
    # (1-9, 11, 12 tried), all tokens of its last pass clipped or no signal; 10 learns at both
    run = train(rl_cfg(tmp_path, rl_loss=rl_loss, max_steps=2, save_interval=1, seed=10), home)
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "succeeded" and manifest["summary"]["rl_loss"] == rl_loss
    assert [p.name for p in checkpoint.committed(run)] == ["step-000001", "step-000002"]
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 2 and all(r["grad_norm"] > 0 for r in rows)
    assert all(np.isfinite(r["loss"]) and 0 <= r["clip_fraction"] <= 1 for r in rows)


@pytest.mark.jax
@pytest.mark.parametrize("rl_loss", ["gspo", "rloo"])
def test_jax_engine_equals_torch_engine(home, tmp_path, rl_loss):
    """Full fine-tuning from the same weights, the same off-policy window: update 1's loss
    and gradient norm on the JAX engine equal the PyTorch engine's to 1e-4."""
    import copy
    import dataclasses

    require_module("jax")
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.train.jax_engine import JaxEngine

    cfg, engine, method, groups, batches, rewards = _window(home, tmp_path, rl_loss, beta=0.0, finetune="full")
    jbatches = copy.deepcopy(batches)
    loss, grads, _ = _ours(engine, method, batches, rewards)
    norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values())))
    jcfg = dataclasses.replace(cfg, engine="jax")
    tok = load_tokenizer(cfg.model, home)
    jengine = JaxEngine(jcfg)
    jengine.devices()
    jengine.setup(ensure_model(cfg.model, home), tok)
    plan = method.sequence.start(jengine, jbatches, rewards)
    objective, finish = plan.prepare(jengine, 1)
    total, _stats, jgrads = jengine.gradients(jbatches, objective)
    jax = require_module("jax")
    jnorm = float(np.sqrt(sum(float((np.asarray(g, np.float64) ** 2).sum()) for g in jax.tree.leaves(jgrads))))
    assert finish(StepResult(total, 0.0)).loss == pytest.approx(loss, abs=1e-4, rel=1e-4)
    assert jnorm == pytest.approx(norm, rel=1e-4)
    assert norm > 0


@pytest.mark.parametrize("rl_loss", ["gspo", "rloo"])
def test_sigkill_then_resume_is_bit_exact(home, tmp_path, rl_loss):
    """gspo and rloo with mu = 2 (the no-gradient passes, rloo's KL in the reward, gspo's
    sequence ratio off-policy): killed after step 2, resumed from step 1's checkpoint, the
    same weights and rows as a run never stopped."""
    import os
    import signal
    import subprocess
    import sys

    from safetensors.torch import load_file

    from tunix_rt.train import checkpoint
    from tunix_rt.train.driver import train
    from tunix_rt.train.metrics import read_jsonl

    cfg = rl_cfg(tmp_path, rl_loss=rl_loss, mu=2, max_steps=3, save_interval=1, batch_size=2, lora_dropout=0.1)
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(cfg.to_yaml())
    env = {**os.environ, "TUNIX_RT_HOME": str(home.root), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}

    def run(args, fault=None):
        e = {**env, **({"TUNIX_RT_FAULT": fault} if fault else {})}
        return subprocess.run([sys.executable, "-m", "tunix_rt.cli", "train", *args], env=e,
                              capture_output=True, text=True, timeout=600)

    r = run(["--config", str(cfg_file)], fault="step@2")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    out = next(p for p in home.runs.iterdir() if not p.name.startswith("."))
    assert checkpoint.latest(out).name == "step-000001"
    r = run(["--resume", out.name])
    assert r.returncode == 0, r.stderr[-2000:]
    ref = train(cfg, home)
    got = load_file(str(out / "final/adapter/adapter_model.safetensors"))
    want = load_file(str(ref / "final/adapter/adapter_model.safetensors"))
    for name in want:
        assert torch.equal(got[name], want[name]), name
    rows = lambda d: [(r["step"], r["loss"], r["reward"]) for r in read_jsonl(d / "metrics.jsonl") if "loss" in r]
    assert rows(out) == rows(ref) and [s for s, *_ in rows(out)] == [1, 2, 3]
