"""method=dpo (train.preference): DPO, IPO, SimPO and ORPO on tiny-gemma3 (real tokenizer).

- exactness against TRL 1.16 on the same pairs and the same LoRA weights, loss and every
  LoRA gradient to 1e-5: DPOTrainer (loss_type sigmoid, ipo; the reference a plain copy of
  the base model, what our adapter-off pass computes), CPOTrainer (loss_type simpo,
  cpo_alpha 0), ORPOTrainer (prompts of one token: TRL's ORPO NLL also counts the prompt's
  tokens, ours the model turn only, and a one-token prompt has no predicted prompt token);
  label smoothing (conservative DPO; TRL 1.16's DPOTrainer applies it to robust/exo/aot only)
  against CPOTrainer.cpo_loss's sigmoid smoothing;
- torch and JAX: the same loss of every pref_loss on the same pairs (1e-4);
- gradient accumulation 8 x 1 = 1 x 8 (dpo, and orpo whose NLL is normalised per window);
- SIGKILL inside an accumulation window and inside a checkpoint write, resume: bit-exact;
- `tunix-rt train --config smoke method=dpo` on both engines, and on-policy pairs from
  rollouts, leave complete runs; the pair reader names every bad line.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tunix_rt.errors import BadInput
from tunix_rt.train import checkpoint
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.driver import train
from tunix_rt.train.engine import NLL, SequenceObjective
from tunix_rt.train.metrics import read_jsonl
from train_testlib import one_torch_thread, write_pairs, write_traces  # noqa: E402,F401 (autouse fixture)
from train_testlib import jax_engine_with_drawn_adapter  # noqa: E402
from train_testlib import run_train_cli as _run  # noqa: E402

HERE = Path(__file__).resolve().parent


def dpo_cfg(tmp_path, **over) -> TrainConfig:
    base = dict(model="tiny-gemma3", dataset=write_pairs(tmp_path / "pairs.jsonl"), split="all", eval_split="all",
                eval_limit=4, method="dpo", batch_size=4, max_seq_len=128, max_steps=4, lr=1e-2, warmup_steps=0,
                save_interval=2, log_interval=1, lora_dropout=0.0, device="cpu", engine="torch",
                system_prompt="Be brief.")
    base.update(over)
    return TrainConfig(**base)


def torch_setup(cfg, home, perturb: bool = True):
    """The torch engine on cfg with LoRA B drawn at random (so the policy differs from the
    adapter-off reference), and the method."""
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.train.preference import Preference
    from tunix_rt.train.torch_engine import TorchEngine

    tok = load_tokenizer(cfg.model, home)
    engine = TorchEngine(cfg)
    engine.devices()
    engine.setup(ensure_model(cfg.model, home), tok)
    if perturb:
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, p in engine.trainable.items():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return engine, Preference(cfg, home, tok), tok


def our_loss_and_grads(engine, method, pairs, fused: bool = True):
    """The window's PairLoss and gradients as a step forms them: fused (the torch engine's
    path: S from each micro-batch's own gradient pass, engine.SequenceObjective) or two-pass
    (no-gradient passes for S, then the NLL surrogate: the JAX engine's path)."""
    if fused:
        assert engine.sequence_objective()
        batches, window = method.window_objective(engine, pairs)
        objective = SequenceObjective(window)
    else:
        batches, loss = method.weighted_batches(engine, pairs)
        objective = NLL
    for b in batches:
        part, _ = engine.objective_sum(b, objective)
        part.backward()
    grads = {n: p.grad.clone() for n, p in engine.trainable.items()}
    for p in engine.trainable.values():
        p.grad = None
    return (window.loss() if fused else loss), grads


def trl_grads(engine, loss):
    loss.backward()
    grads = {n: p.grad.clone() for n, p in engine.trainable.items()}
    for p in engine.trainable.values():
        p.grad = None
    return grads


def assert_same_grads(ours, theirs):
    assert max(g.abs().max().item() for g in ours.values()) > 1e-3  # a gradient that can disagree
    for name, g in ours.items():
        torch.testing.assert_close(g, theirs[name], atol=1e-5, rtol=0, msg=name)


def hf_tokenizer(engine):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(engine.model_dir)


def dummy_dataset():
    from datasets import Dataset

    return Dataset.from_list([{"prompt": "a", "chosen": " b", "rejected": " c"}])


def old_style_batch(pairs, pad_id: int, orpo: bool = False):
    """CPOTrainer's / ORPOTrainer's tokenized batch of these token pairs (what their
    tokenize_row and collator give: prompt labels -100, right padding)."""
    def side(key):
        seqs = [p.prompt + getattr(p, key) for p in pairs]
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), pad_id)
        att = torch.zeros((len(seqs), width), dtype=torch.long)
        lab = torch.full((len(seqs), width), -100)
        for i, (p, s) in enumerate(zip(pairs, seqs)):
            ids[i, :len(s)], att[i, :len(s)] = torch.tensor(s), 1
            lab[i, len(p.prompt):len(s)] = torch.tensor(getattr(p, key))
        return {f"{key}_input_ids": ids, f"{key}_attention_mask": att, f"{key}_labels": lab}

    return {**side("chosen"), **side("rejected")}


def trl_dpo_loss(engine, pairs, loss_type: str, beta: float, tmp_path):
    """TRL's DPOTrainer loss of these token pairs, the engine's model as the policy and the
    model it started from (read again from its directory) as ref_model."""
    from trl import DPOConfig, DPOTrainer

    from tunix_rt.models.hf import load_causal_lm
    from tunix_rt.train.torch_engine import attention_of

    ref = load_causal_lm(engine.model_dir, dtype="fp32", device="cpu", attn=attention_of(engine.model_dir)).eval()
    args = DPOConfig(output_dir=tempfile.mkdtemp(dir=tmp_path), beta=beta, loss_type=loss_type, report_to=[],
                     use_cpu=True, bf16=False, per_device_train_batch_size=4)
    trainer = DPOTrainer(model=engine.model, ref_model=ref, args=args, train_dataset=dummy_dataset(),
                         processing_class=hf_tokenizer(engine))
    batch = trainer.data_collator([{"prompt_ids": p.prompt, "chosen_ids": p.chosen, "rejected_ids": p.rejected}
                                   for p in pairs])
    return trainer.compute_loss(trainer.model, batch)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_and_ipo_equal_trl_dpotrainer(home, tmp_path, loss_type):
    cfg = dpo_cfg(tmp_path, pref_loss="dpo" if loss_type == "sigmoid" else "ipo", pref_beta=0.5)
    engine, method, _ = torch_setup(cfg, home)
    pairs = method.train_pairs[:4]
    ours, grads = our_loss_and_grads(engine, method, pairs)
    theirs = trl_dpo_loss(engine, pairs, loss_type, 0.5, tmp_path)
    assert ours.loss == pytest.approx(float(theirs.detach()), abs=1e-5)
    assert 0.05 < ours.loss and abs(ours.loss - np.log(2)) > 1e-3  # the reference differs from the policy
    assert_same_grads(grads, trl_grads(engine, theirs))


def test_full_fine_tuning_dpo_equals_trl_dpotrainer_with_its_reference_copy(home, tmp_path):
    """finetune=full: the reference is a frozen copy of the starting weights, which the engine
    loads at its first reference pass. The policy is moved off them (noise on every weight),
    so the loss and the gradient of every weight equal TRL's DPOTrainer given the unmoved
    model as its ref_model."""
    cfg = dpo_cfg(tmp_path, pref_loss="dpo", pref_beta=0.5, finetune="full")
    engine, method, _ = torch_setup(cfg, home, perturb=False)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in engine.trainable.values():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    pairs = method.train_pairs[:4]
    assert engine._reference is None  # loaded at the first reference pass, not at setup
    ours, grads = our_loss_and_grads(engine, method, pairs)
    assert engine._reference is not None and not any(p.requires_grad for p in engine._reference.parameters())
    theirs = trl_dpo_loss(engine, pairs, "sigmoid", 0.5, tmp_path)
    assert ours.loss == pytest.approx(float(theirs.detach()), abs=1e-5)
    assert abs(ours.loss - np.log(2)) > 1e-3  # the reference differs from the policy
    assert len(grads) == len(list(engine.model.parameters()))  # every weight trains
    assert_same_grads(grads, trl_grads(engine, theirs))


def test_simpo_equals_trl_cpotrainer(home, tmp_path):
    from trl.experimental.cpo import CPOConfig, CPOTrainer

    cfg = dpo_cfg(tmp_path, pref_loss="simpo", pref_beta=2.0, simpo_gamma=0.7, label_smoothing=0.1)
    engine, method, tok = torch_setup(cfg, home)
    pairs = method.train_pairs[:4]
    ours, grads = our_loss_and_grads(engine, method, pairs)
    args = CPOConfig(output_dir=tempfile.mkdtemp(dir=tmp_path), loss_type="simpo", cpo_alpha=0.0, beta=2.0,
                     simpo_gamma=0.7, label_smoothing=0.1, report_to=[], use_cpu=True, bf16=False,
                     per_device_train_batch_size=4, max_length=128)
    trainer = CPOTrainer(model=engine.model, args=args, train_dataset=dummy_dataset(),
                         processing_class=hf_tokenizer(engine))
    theirs, metrics = trainer.get_batch_loss_metrics(engine.model, old_style_batch(pairs, tok.pad_id))
    assert ours.loss == pytest.approx(float(theirs.detach()), abs=1e-5)
    assert float(ours.chosen_rewards.mean()) == pytest.approx(metrics["rewards/chosen"], abs=1e-5)
    assert_same_grads(grads, trl_grads(engine, theirs))


def test_orpo_equals_trl_orpotrainer(home, tmp_path):
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    from tunix_rt.train.preference import TokenPair

    cfg = dpo_cfg(tmp_path, pref_loss="orpo", orpo_lambda=0.3)
    engine, method, tok = torch_setup(cfg, home)
    pairs = [TokenPair(p.id, [tok.bos_id], p.chosen, p.rejected) for p in method.train_pairs[:4]]
    ours, grads = our_loss_and_grads(engine, method, pairs)
    args = ORPOConfig(output_dir=tempfile.mkdtemp(dir=tmp_path), beta=0.3, report_to=[], use_cpu=True, bf16=False,
                      per_device_train_batch_size=4, max_length=128)
    trainer = ORPOTrainer(model=engine.model, args=args, train_dataset=dummy_dataset(),
                          processing_class=hf_tokenizer(engine))
    theirs, metrics = trainer.get_batch_loss_metrics(engine.model, old_style_batch(pairs, tok.pad_id, orpo=True))
    assert ours.loss == pytest.approx(float(theirs.detach()), abs=1e-5)
    assert float(ours.rejected_rewards.mean()) == pytest.approx(metrics["rewards/rejected"], abs=1e-5)
    assert_same_grads(grads, trl_grads(engine, theirs))


def test_label_smoothing_is_trl_conservative_dpo():
    """cDPO: our dpo loss with label_smoothing against CPOTrainer.cpo_loss (sigmoid), fed the
    log-ratios, value and d/dS to 1e-6 (float64)."""
    from trl.experimental.cpo import CPOTrainer

    from tunix_rt.train.preference import pair_loss

    rng = np.random.default_rng(1)
    s_c, s_r, r_c, r_r = (rng.normal(-30, 5, 6) for _ in range(4))
    ours = pair_loss("dpo", s_c, s_r, np.ones(6), np.ones(6), r_c, r_r, beta=0.3, label_smoothing=0.2)
    lc = torch.tensor(s_c - r_c, requires_grad=True)
    lr = torch.tensor(s_r - r_r, requires_grad=True)
    trainer = type("T", (), {"beta": 0.3, "label_smoothing": 0.2, "loss_type": "sigmoid", "alpha": 0.0,
                             "accelerator": type("A", (), {"device": "cpu"})()})()
    losses, _c, _r = CPOTrainer.cpo_loss(trainer, lc, lr)
    losses.mean().backward()
    assert ours.loss == pytest.approx(float(losses.mean().detach()), abs=1e-12)
    np.testing.assert_allclose(ours.d_chosen, lc.grad.numpy(), atol=1e-12)
    np.testing.assert_allclose(ours.d_rejected, lr.grad.numpy(), atol=1e-12)


@pytest.mark.parametrize("kind", ["dpo", "ipo", "simpo", "orpo"])
def test_one_forward_pass_equals_two(home, tmp_path, kind):
    """The torch engine's fused step (S from the gradient pass itself) has the two-pass step's
    loss, implicit rewards and gradient, with accumulation and shared-prompt rows."""
    cfg = dpo_cfg(tmp_path, pref_loss=kind, batch_size=4, grad_accum=2, orpo_lambda=0.3)
    engine, method, _ = torch_setup(cfg, home)
    pairs = method.train_pairs[:4]
    (fl, fg), (tl, tg) = (our_loss_and_grads(engine, method, pairs, fused=f) for f in (True, False))
    assert fl.loss == pytest.approx(tl.loss, abs=1e-7) and abs(fl.loss) > 1e-3
    np.testing.assert_allclose(fl.chosen_rewards, tl.chosen_rewards, atol=1e-6)
    np.testing.assert_allclose(fl.d_rejected, tl.d_rejected, atol=1e-9)
    assert_same_grads(fg, tg)


@pytest.mark.parametrize("kind", ["dpo", "orpo"])
def test_accumulation_8x1_equals_1x8(home, tmp_path, kind):
    out = []
    for batch_size, accum in ((2, 8), (16, 1)):
        cfg = dpo_cfg(tmp_path, pref_loss=kind, batch_size=batch_size, grad_accum=accum)
        engine, method, _ = torch_setup(cfg, home)
        pairs = method.train_pairs[:8]
        batches, _ = method.weighted_batches(engine, pairs)
        assert len(batches) == accum
        out.append(our_loss_and_grads(engine, method, pairs))
    (a, ga), (b, gb) = out
    # the two windows pad their rows differently: the fp32 trunk's hidden states differ by ~1e-6,
    # each token's log-prob by ~5e-7 (measured), so the losses agree to 1e-7, not to float64
    assert a.loss == pytest.approx(b.loss, abs=1e-7)
    assert max(g.abs().max().item() for g in ga.values()) > 1e-3
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], atol=1e-6, rtol=0, msg=name)


@pytest.mark.parametrize("kind", ["dpo", "orpo"])
def test_shared_prompt_rows_equal_a_row_per_sequence(home, tmp_path, kind):
    """The torch engine writes a pair's prompt once (two branches): same loss and gradient as
    a row per sequence, with fewer tokens."""
    engine, method, _ = torch_setup(dpo_cfg(tmp_path, pref_loss=kind), home)
    assert engine.shares_prefix()
    pairs = method.train_pairs[:4]
    shared_batches, _ = method.weighted_batches(engine, pairs)
    shared = our_loss_and_grads(engine, method, pairs)
    engine.shares_prefix = lambda: False
    plain_batches, _ = method.weighted_batches(engine, pairs)
    plain = our_loss_and_grads(engine, method, pairs)
    assert sum(b.n_tokens for b in shared_batches) < sum(b.n_tokens for b in plain_batches)
    assert shared[0].loss == pytest.approx(plain[0].loss, abs=1e-6)
    assert_same_grads(shared[1], plain[1])


@pytest.mark.jax
def test_torch_and_jax_give_the_same_pair_losses(home, tmp_path):
    """The same non-zero adapter on both engines (drawn on the JAX one, exported in PEFT's
    layout, loaded into the torch one's LoRA weights), so the policy is not the adapter-off
    reference: the same loss of every pref_loss, the same per-sequence coefficients, and the
    same implicit rewards, far from the values a fresh adapter gives (dpo: log 2)."""
    import math

    from requires import require_module

    require_module("jax")
    from tunix_rt.train.export import export_adapter
    from tunix_rt.train.preference import pair_batch

    cfg = dpo_cfg(tmp_path, engine="jax")
    j, _ = jax_engine_with_drawn_adapter(cfg, home, seed=1, scale=0.1)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    export_adapter(j.model(), j.model_dir, adapter, cfg.lora_rank, cfg.lora_alpha, 0.0, cfg.lora_targets)
    drawn = load_file(str(adapter / "adapter_model.safetensors"))
    for kind in ("dpo", "ipo", "simpo", "orpo"):
        t, method, tok = torch_setup(dpo_cfg(tmp_path, pref_loss=kind), home, perturb=False)
        with torch.no_grad():
            assert len(drawn) == len(t.trainable)
            for name, p in t.trainable.items():
                p.copy_(drawn[name.replace(".default.weight", ".weight")])
        method.cfg = dataclasses.replace(cfg, pref_loss=kind)
        parts = [pair_batch(method.train_pairs[i:i + 2], tok.pad_id) for i in (0, 2, 4)]
        lt, lj = method.window_loss(t, parts), method.window_loss(j, parts)
        assert lt.loss == pytest.approx(lj.loss, abs=1e-4, rel=1e-4), kind
        np.testing.assert_allclose(lj.d_chosen, lt.d_chosen, atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(lj.d_rejected, lt.d_rejected, atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(lj.chosen_rewards, lt.chosen_rewards, atol=1e-4, rtol=1e-4)
        if kind == "dpo":
            assert abs(lt.loss - math.log(2)) > 1e-2 and np.abs(lt.chosen_rewards).max() > 1e-2


@pytest.mark.jax
def test_jax_accumulation_8x1_equals_1x8(home, tmp_path):
    """On the JAX engine (a drawn adapter: the policy is not the reference), 8 pairs as 8
    micro-batches of one pair give the gradient of one micro-batch of 8, for every pref_loss."""
    from requires import require_module

    require_module("jax")
    from tunix_rt.train.jax_engine import flat
    from tunix_rt.train.preference import Preference

    j, tok = jax_engine_with_drawn_adapter(dpo_cfg(tmp_path, engine="jax"), home, seed=2, scale=0.1)
    for kind in ("dpo", "ipo", "simpo", "orpo"):
        out = []
        for batch_size, accum in ((2, 8), (16, 1)):
            method = Preference(dpo_cfg(tmp_path, engine="jax", pref_loss=kind, batch_size=batch_size,
                                        grad_accum=accum), home, tok)
            batches, loss = method.weighted_batches(j, method.train_pairs[:8])
            assert len(batches) == accum
            total, _stats, grads = j.gradients(batches, NLL)
            out.append((loss.loss, flat(grads)))
        (a, ga), (b, gb) = out
        assert a == pytest.approx(b, abs=1e-6), kind
        assert max(float(np.abs(g).max()) for g in ga.values()) > 1e-3, kind
        for name in ga:
            np.testing.assert_allclose(gb[name], ga[name], atol=1e-5, rtol=0, err_msg=f"{kind} {name}")


def test_dpo_sigkill_in_accumulation_and_checkpoint_then_resume_is_bit_exact(home, tmp_path):
    cfg = dpo_cfg(tmp_path, batch_size=2, grad_accum=2, save_interval=1, max_steps=4, eval_interval=2)
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(cfg.to_yaml())
    r = _run(home, ["--config", str(cfg_file)], fault="accum@2")  # inside step 2's window
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    run = next(p for p in home.runs.iterdir() if not p.name.startswith("."))
    assert checkpoint.latest(run).name == "step-000001"
    r = _run(home, ["--resume", run.name], fault="ckpt-write@2")  # writing step 3's checkpoint
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert checkpoint.latest(run).name == "step-000002"
    r = _run(home, ["--resume", run.name])
    assert r.returncode == 0, r.stderr[-2000:]
    ref = train(cfg, home)
    got = load_file(str(run / "final/adapter/adapter_model.safetensors"))
    want = load_file(str(ref / "final/adapter/adapter_model.safetensors"))
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    rows = lambda d: [(r["step"], r["loss"], r["rewards_margin"]) for r in read_jsonl(d / "metrics.jsonl")
                      if "rewards_margin" in r]
    assert rows(run) == rows(ref) and [s for s, *_ in rows(run)] == [1, 2, 3, 4]


@pytest.mark.parametrize("engine", ["torch", pytest.param("jax", marks=pytest.mark.jax)])
def test_smoke_dpo_run_is_complete(home, tmp_path, engine):
    if engine == "jax":
        from requires import require_module

        require_module("jax")
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    r = _run(home, ["--config", "smoke", "method=dpo", f"dataset={pairs}", "split=all", "eval_split=all",
                    "max_steps=4", "save_interval=2", "eval_interval=2", "warmup_steps=0", f"engine={engine}"])
    assert r.returncode == 0, r.stderr[-2000:]
    run = next(p for p in home.runs.iterdir() if not p.name.startswith("."))
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "succeeded" and manifest["summary"]["method"] == "dpo"
    assert [p.name for p in checkpoint.committed(run)] == ["step-000002", "step-000004"]
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "rewards_margin" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["loss"] == pytest.approx(np.log(2), abs=1e-6)  # a fresh adapter is the reference
    assert rows[-1]["rewards_margin"] > rows[1]["rewards_margin"] > 0 and rows[-1]["rewards_accuracy"] == 1.0
    assert any("eval_rewards_accuracy" in r for r in read_jsonl(run / "metrics.jsonl"))
    assert (run / "final/adapter/adapter_model.safetensors").is_file()


def test_simpo_on_rollout_pairs_trains(home, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    cfg = TrainConfig(model="tiny-gemma3", dataset=write_traces(tmp_path / "traces.jsonl", 12), split="all",
                      eval_split="all", eval_limit=2, system_prompt="Be brief.", method="dpo", pairs="rollouts",
                      pref_loss="simpo", pref_beta=2.0, batch_size=4, max_seq_len=96, max_steps=3, lr=1e-2,
                      warmup_steps=0, save_interval=3, group_size=4, rl_prompts=2, rollout_max_new_tokens=12,
                      rewards={"rl_rewards:length_share": 1.0}, device="cpu", engine="torch")
    run = train(cfg, home)
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "paired_share" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["pairs"] == 2 and r["paired_share"] == 1.0 and r["grad_norm"] > 0 for r in rows)
    assert all(r["rewards_accuracy"] >= 0 and "rollout_s" in r for r in rows)


def test_the_pair_reader_names_every_bad_line_and_reads_nothing(tmp_path):
    from tunix_rt.traces.dataset import load_dataset

    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([
        json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"}),
        json.dumps({"prompt": "q", "chosen": "a"}),
        json.dumps({"prompt": "q", "chosen": [{"role": "assistant", "content": "a"}], "rejected": "b"}),
        json.dumps({"prompt": " ", "chosen": "a", "rejected": "a", "score": 1}),
        json.dumps({"prompt": "q", "chosen": "x", "rejected": "x"}),
    ]) + "\n")
    with pytest.raises(BadInput) as e:
        load_dataset(str(path))
    msg = str(e.value)
    for line in (f"{path}:2: rejected: missing", f"{path}:3: chosen: expected a string, got a list",
                 f"{path}:4: prompt: empty string", f"{path}:4: score: unknown field",
                 f"{path}:5: rejected: the same text as chosen"):
        assert line in msg, msg
    assert ":1:" not in msg
    good = load_dataset(write_pairs(tmp_path / "good.jsonl", 3))
    assert [r.prompt for r in good.records] == ["Add 0 and 0?", "Add 1 and 1?", "Add 2 and 2?"]
    assert good.manifest["importer"] == "pairs" and good.sha256


def test_dpo_refuses_what_it_cannot_run(home, tmp_path):
    from tunix_rt.models.store import load_tokenizer
    from tunix_rt.train.preference import Preference

    # the config refuses these itself (the CLI and the job API build it before anything runs)
    for over, words in (({"batch_size": 3}, "even batch_size"),
                        ({"batch_size": 1}, "even batch_size"), ({"tools": ["calculator"]}, "takes no tools"),
                        ({"packing": True}, "does not pack"), ({"pairs": "rollouts", "group_size": 1}, "group_size")):
        with pytest.raises(BadInput, match=words):
            dpo_cfg(tmp_path, **over)
    dpo_cfg(tmp_path, batch_size=3, method="sft")  # the rules are method=dpo's only
    tok = load_tokenizer("tiny-gemma3", home)
    with pytest.raises(BadInput, match="pairs=rollouts"):  # a traces dataset is known once it is read
        Preference(dpo_cfg(tmp_path, dataset=write_traces(tmp_path / "t.jsonl", 4)), home, tok)
    Preference(dpo_cfg(tmp_path, finetune="full", pref_loss="simpo"), home, tok)  # no reference: fine
    Preference(dpo_cfg(tmp_path, finetune="full", pref_loss="dpo"), home, tok)  # a frozen copy: fine


def test_data_validate_reads_pairs(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(HERE.parent))
    from cli_testlib import cli_main

    good = write_pairs(tmp_path / "good.jsonl", 4)
    code, out, _ = cli_main(monkeypatch, capsys, "data", "validate", good)
    assert code == 0 and "OK: 4 records (format pairs" in out
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"}) + "\n" + json.dumps({"prompt": "q"}) + "\n")
    code, out, err = cli_main(monkeypatch, capsys, "data", "validate", str(bad))
    assert code == 2 and f"{bad}:2: chosen: missing" in out and f"{bad}:2: rejected: missing" in out


def test_rollout_pairs_sigkill_in_checkpoint_then_resume_is_bit_exact(home, tmp_path, monkeypatch):
    cfg = TrainConfig(model="tiny-gemma3", dataset=write_traces(tmp_path / "traces.jsonl", 12), split="all",
                      eval_split="all", eval_limit=2, system_prompt="Be brief.", method="dpo", pairs="rollouts",
                      pref_loss="dpo", batch_size=2, max_seq_len=96, max_steps=3, lr=1e-2, warmup_steps=0,
                      save_interval=1, group_size=4, rl_prompts=2, rollout_max_new_tokens=12,
                      rewards={"rl_rewards:length_share": 1.0}, device="cpu", engine="torch")
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(cfg.to_yaml())
    r = _run(home, ["--config", str(cfg_file)], fault="ckpt-write@2")  # writing step 2's checkpoint
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    run = next(p for p in home.runs.iterdir() if not p.name.startswith("."))
    assert checkpoint.latest(run).name == "step-000001"
    r = _run(home, ["--resume", run.name])
    assert r.returncode == 0, r.stderr[-2000:]
    monkeypatch.syspath_prepend(str(HERE))  # the reward module, for the uninterrupted run in this process
    ref = train(cfg, home)
    got = load_file(str(run / "final/adapter/adapter_model.safetensors"))
    want = load_file(str(ref / "final/adapter/adapter_model.safetensors"))
    for name in want:
        assert torch.equal(got[name], want[name]), name
    rows = lambda d: [(r["step"], r["loss"], r["reward"]) for r in read_jsonl(d / "metrics.jsonl") if "paired_share" in r]
    assert rows(run) == rows(ref) and [s for s, *_ in rows(run)] == [1, 2, 3]
