"""Distillation (method: distill) on the torch engine: the fused chunked kernel against a
full-logits reference and against TRL's GKDTrainer.generalized_jsd_loss, accumulation
8x1 = 1x8, SIGKILL then resume bit-exact (on-policy: the student's own samples), the smoke
preset through the CLI, the teacher as a run, the plan's teacher term, and the refusals
(another tokenizer, the student's own weights as teacher, no teacher, a teacher for another
method, a resume after the teacher changed)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tunix_rt.errors import BadInput
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.distill import KD_STATS, Distillation
from tunix_rt.train.kd_loss import kd_objective, plain_kd
from tunix_rt.train.metrics import read_jsonl
from train_testlib import one_torch_thread, write_traces  # noqa: F401
from train_testlib import run_train_cli as _run  # noqa: E402

CASES = [("forward_kl", 0.5, 1.0, 0.0, None), ("reverse_kl", 0.5, 1.0, 0.0, None), ("jsd", 0.5, 1.0, 0.0, None),
         ("forward_kl", 0.5, 2.0, 0.3, 30.0), ("reverse_kl", 0.5, 0.7, 0.5, 30.0), ("jsd", 0.2, 2.0, 0.25, 30.0)]


def _rows(seed=0, n=37, h=16, ht=24, v=300):
    g = torch.Generator().manual_seed(seed)
    hs = torch.randn(n, h, generator=g, requires_grad=True)
    w = (torch.randn(v, h, generator=g) * 0.5).requires_grad_(True)
    t = torch.randn(n, ht, generator=g)
    wt = torch.randn(v, ht, generator=g) * 0.5
    y = torch.randint(0, v, (n,), generator=g)
    return hs, w, t, wt, y, torch.full((n,), 1.0 / n)


def _cap(z, cap):
    return z if cap is None else cap * torch.tanh(z / cap)


@pytest.mark.parametrize("kind,beta,temp,alpha,cap", CASES)
def test_chunked_kd_and_its_gradient_equal_the_full_logits_reference(kind, beta, temp, alpha, cap):
    """Chunks of 7 rows (37 rows: 6 chunks, the last short) against autograd through both
    models' full logits, for the loss and the gradient w.r.t. the hidden rows and the head."""
    obj = Distillation(kd_loss=kind, kd_beta=beta, temperature=temp, alpha=alpha)
    hs, w, t, wt, y, c = _rows()
    loss, stats = kd_objective(hs, w, t, wt, y, c, obj, chunk_bytes=7 * w.shape[0] * 4, softcaps=(cap, cap))
    gh, gw = torch.autograd.grad(loss, (hs, w))
    ref = plain_kd(_cap(hs @ w.t(), cap)[None], _cap(t @ wt.t(), cap)[None], y[None], c[None], obj)
    rh, rw = torch.autograd.grad(ref, (hs, w))
    assert float(loss.detach()) > 1e-3  # not trivially 0: the teacher differs
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gh, rh, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gw, rw, atol=1e-5, rtol=1e-5)
    assert stats[3] == 37 and len(KD_STATS) == len(stats)
    with torch.no_grad():  # evaluation: the same value, no gradient formed
        torch.testing.assert_close(kd_objective(hs, w, t, wt, y, c, obj, chunk_bytes=7 * w.shape[0] * 4,
                                                softcaps=(cap, cap))[0], loss.detach())


@pytest.mark.parametrize("kind,beta", [("forward_kl", 0.0), ("reverse_kl", 1.0), ("jsd", 0.5), ("jsd", 0.1),
                                       ("jsd", 0.9)])
@pytest.mark.parametrize("temp", [1.0, 2.0])
def test_the_divergences_equal_trl_gkd_generalized_jsd_loss(kind, beta, temp):
    """TRL 1.16's GKDTrainer.generalized_jsd_loss (beta 0: forward KL, 1: reverse KL) on the
    same logits, its batchmean over the labelled tokens: loss and gradient."""
    from trl.experimental.gkd import GKDTrainer

    hs, w, t, wt, y, _ = _rows(seed=1, n=24)
    labels = y.clone()
    labels[::5] = -100  # ignored positions, as TRL masks them
    keep = labels != -100
    obj = Distillation(kd_loss=kind, kd_beta=beta, temperature=temp)
    c = torch.full((int(keep.sum()),), 1.0 / int(keep.sum()))
    ours, _ = kd_objective(hs[keep], w, t[keep], wt, y[keep], c, obj, chunk_bytes=5 * w.shape[0] * 4)
    g_ours = torch.autograd.grad(ours, (hs, w))
    theirs = GKDTrainer.generalized_jsd_loss((hs @ w.t())[None], (t @ wt.t())[None], labels[None], beta=beta,
                                             temperature=temp, reduction="batchmean")
    g_theirs = torch.autograd.grad(theirs, (hs, w))
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    for a, b in zip(g_ours, g_theirs):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.fixture
def teacher_dir(tmp_path):
    """A tiny Gemma 3 of the catalog's shape with other random weights (seed 1): the student
    (tiny-gemma3, seed 0) differs from it, so the loss is not 0."""
    from tunix_rt.models.catalog import get_preset
    from tunix_rt.models.tiny import build_tiny

    return build_tiny(get_preset("tiny-gemma3"), tmp_path / "teacher", seed=1)


def _cfg(tmp_path, teacher, **over):
    base = dict(model="tiny-gemma3", dataset=write_traces(tmp_path / "traces.jsonl", 12), split="all",
                eval_split="all", eval_limit=2, system_prompt="Be brief.", method="distill", teacher=str(teacher) if teacher else None,
                kd_loss="jsd", kd_temperature=2.0, kd_alpha=0.1, batch_size=2, max_seq_len=96, max_steps=4,
                lr=1e-2, warmup_steps=0, save_interval=2, log_interval=1, device="cpu", rollout_max_new_tokens=8)
    base.update(over)
    return TrainConfig(**base)


@pytest.mark.parametrize("on_policy", [False, True], ids=["traces", "on-policy"])
def test_distill_accumulation_8x1_equals_1x8(home, tmp_path, teacher_dir, on_policy):
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.train.data import collate, weighted
    from tunix_rt.train.distill import Distill
    from tunix_rt.train.torch_engine import TorchEngine

    out = []
    for batch, accum in ((8, 1), (1, 8)):
        cfg = _cfg(tmp_path, teacher_dir, batch_size=batch, grad_accum=accum, kd_on_policy=on_policy)
        tok = load_tokenizer(cfg.model, home)
        engine, method = TorchEngine(cfg), Distill(cfg, home, tok)
        engine.devices()
        engine.setup(ensure_model(cfg.model, home), tok)
        rows = [method.stream.next_rows() for _ in range(accum)]
        if on_policy:
            rows = method.sampled(engine, rows, 0)
        batches = weighted([collate(r, tok.pad_id) for r in rows])
        loss = 0.0
        for b in batches:
            part, _ = engine.objective_sum(b, method.teacher_objective(engine))
            part.backward()
            loss += float(part.detach())
        ids = [ex.ids for r in rows for row in r for ex in row]
        out.append((loss, ids, {n: p.grad.clone() for n, p in engine.trainable.items()}))
    assert out[0][1] == out[1][1]  # the same examples (and, on-policy, the same samples)
    assert out[0][0] == pytest.approx(out[1][0], abs=1e-6) and out[0][0] > 1e-4
    assert any(g.abs().sum() > 0 for g in out[0][2].values())
    for name, g in out[0][2].items():
        torch.testing.assert_close(out[1][2][name], g, atol=1e-6, rtol=0, msg=name)




def test_distill_sigkill_then_resume_is_bit_exact(home, tmp_path, teacher_dir):
    """On-policy (the samples must be drawn again exactly) with accumulation: killed inside
    step 3's window, resumed from step 2, equal to an uninterrupted run bit for bit."""
    from tunix_rt.train import checkpoint
    from tunix_rt.train.driver import train

    cfg = _cfg(tmp_path, teacher_dir, grad_accum=2, kd_on_policy=True, kd_loss="reverse_kl")
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(cfg.to_yaml())
    r = _run(home, ["--config", str(cfg_file)], fault="accum@3")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    run = next(p for p in home.runs.iterdir() if not p.name.startswith("."))
    assert checkpoint.latest(run).name == "step-000002"
    r = _run(home, ["--resume", run.name])
    assert r.returncode == 0, r.stderr[-2000:]
    ref = train(cfg, home)
    got = load_file(str(run / "final/adapter/adapter_model.safetensors"))
    want = load_file(str(ref / "final/adapter/adapter_model.safetensors"))
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    rows = lambda d: [(r["step"], r["loss"], r["kl_teacher"]) for r in read_jsonl(d / "metrics.jsonl") if "loss" in r]
    assert rows(run) == rows(ref) and [s for s, *_ in rows(run)] == [1, 2, 3, 4]


def test_smoke_preset_distills_through_the_cli(home, teacher_dir):
    """`tunix-rt train --config smoke method=distill teacher=DIR`: a complete run with
    committed checkpoints, the KL to the teacher logged every step and falling, the plan's
    teacher term in the manifest's predicted peak."""
    from typer.testing import CliRunner

    from tunix_rt.cli import app

    args = ["train", "--config", "smoke", "--device", "cpu", "method=distill", f"teacher={teacher_dir}",
            "max_steps=6", "save_interval=3", "eval_interval=0", "lr=0.01"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    run = next(home.runs.iterdir())
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "succeeded"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000003", "step-000006"]
    assert all((p / "COMMIT").is_file() for p in (run / "checkpoints").iterdir())
    assert (run / "final/adapter/adapter_model.safetensors").is_file()
    assert manifest["summary"]["teacher"] == str(teacher_dir) and manifest["dataset"]["teacher_dir"]
    steps = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 7))
    assert all(r["kl_teacher"] > 0 and r["kd"] > 0 and r["nll"] > 0 for r in steps)
    assert steps[-1]["kl_teacher"] < steps[0]["kl_teacher"]
    final = [r for r in read_jsonl(run / "metrics.jsonl") if "eval_kl_teacher" in r]
    assert final and final[-1]["eval_kl_teacher"] > 0


def test_plan_counts_the_teacher():
    from tunix_rt.plan import plan_train

    base = dict(model="gemma3-270m", dataset="x", max_seq_len=256)
    sft = plan_train(TrainConfig(**base), "cpu", 1)
    kd = plan_train(TrainConfig(**base, method="distill", teacher="gemma3-1b"), "cpu", 1)
    assert kd.items["teacher_weights"] > 3.5 * 2 ** 30  # ~1B fp32 parameters
    assert kd.peak_bytes_per_device > sft.peak_bytes_per_device + kd.items["teacher_weights"]
    assert "teacher" not in " ".join(sft.items)


def test_a_run_can_be_the_teacher(home, tmp_path):
    """teacher=<run id>: its adapter merged into its base (as init resolves a run)."""
    from tunix_rt.train.distill import resolve_teacher
    from tunix_rt.train.driver import train

    sft = train(_cfg(tmp_path, None, method="sft", max_steps=1, save_interval=0), home)
    path = resolve_teacher(sft.name, home)
    assert path == home.models / f"init-{sft.name}" and (path / "model.safetensors").is_file()
    run = train(_cfg(tmp_path, sft.name, max_steps=1, save_interval=0), home)
    assert [r["kl_teacher"] > 0 for r in read_jsonl(run / "metrics.jsonl") if "loss" in r] == [True]


def test_refusals(home, tmp_path, teacher_dir):
    from tunix_rt.models.store import load_tokenizer
    from tunix_rt.train.distill import Distill

    with pytest.raises(BadInput, match="needs a teacher"):
        _cfg(tmp_path, None)
    with pytest.raises(BadInput, match="teacher is for a method with a teacher"):
        _cfg(tmp_path, teacher_dir, method="sft")
    with pytest.raises(BadInput, match="kd_loss must be one of"):
        _cfg(tmp_path, teacher_dir, kd_loss="kl")
    with pytest.raises(BadInput, match="kd_beta"):
        _cfg(tmp_path, teacher_dir, kd_beta=1.5)
    with pytest.raises(BadInput, match="has the student's own weights"):
        Distill(_cfg(tmp_path, "tiny-gemma3", kd_alpha=0.0), home, load_tokenizer("tiny-gemma3"))
    Distill(_cfg(tmp_path, "tiny-gemma3", kd_alpha=0.5), home, load_tokenizer("tiny-gemma3"))  # NLL moves it
    with pytest.raises(BadInput, match="not a model directory, a catalog model"):
        Distill(_cfg(tmp_path, tmp_path / "nowhere"), home, load_tokenizer("tiny-gemma3"))
    method = Distill(_cfg(tmp_path, teacher_dir), home, load_tokenizer("tiny-gemma3"))
    with pytest.raises(BadInput, match="other weights than when the checkpoint was written"):
        method.load_state({**method.state(), "teacher_sha256": "0" * 64})  # a resume after the teacher changed
    tj = Path(teacher_dir) / "tokenizer.json"
    spec = json.loads(tj.read_text())
    vocab = spec["model"]["vocab"]  # two pieces swap ids: same size, same specials, other tokens
    a, b = (next(k for k, v in vocab.items() if v == i) for i in (300, 301))
    vocab[a], vocab[b] = 301, 300
    tj.write_text(json.dumps(spec))
    with pytest.raises(BadInput, match="token 300 is .* distillation needs the same tokenizer"):
        Distill(_cfg(tmp_path, teacher_dir), home, load_tokenizer("tiny-gemma3"))
