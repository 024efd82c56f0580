"""The PyTorch engine end to end on tiny models: the smoke preset through the CLI, LoRA with
merge, full fine-tuning, gradient-accumulation equivalence, device errors, failure records."""

from __future__ import annotations

import json

import pytest
import torch

from tunix_rt.errors import BadInput
from tunix_rt.evidence import find_placeholders
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.data import BatchStream
from tunix_rt.train import torch_engine as te
from tunix_rt.train.driver import train
from tunix_rt.train.metrics import read_jsonl
from train_testlib import one_torch_thread, write_traces  # noqa: E402,F401 (autouse fixture)


def small_cfg(tmp_path, **over):
    base = dict(model="tiny-gemma3", dataset=write_traces(tmp_path / "traces.jsonl"), split="all",
                eval_split="all", eval_limit=4, system_prompt="Be brief.", batch_size=2, max_seq_len=128,
                max_steps=3, lr=1e-2, warmup_steps=1, log_interval=1, save_interval=2)
    base.update(over)
    return TrainConfig(**base)


def test_smoke_preset_through_the_cli_writes_every_file_and_loss_falls(home):
    from typer.testing import CliRunner

    from tunix_rt.cli import app

    result = CliRunner().invoke(app, ["train", "--config", "smoke", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    run = next(home.runs.iterdir())
    for name in ("config.yaml", "run_manifest.json", "metrics.jsonl", "loss.png", "data_order.jsonl",
                 "final/adapter/adapter_config.json", "final/adapter/adapter_model.safetensors"):
        assert (run / name).is_file(), name
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000006", "step-000012"]
    assert all((p / "COMMIT").is_file() for p in (run / "checkpoints").iterdir())
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "succeeded" and "error" not in manifest
    assert find_placeholders(manifest) == []
    assert manifest["device"]["platform"] == "cpu" and manifest["device"]["names"][0]
    from tunix_rt.train.cpu_matmul import backend
    assert manifest["device"]["matmul"] == backend()  # the library the step's products went through
    from tunix_rt.train.cpu_kernels import choice
    assert manifest["device"]["elementwise"] == choice()  # norms, RoPE, gelu*up: train.cpu_kernels (cc is here)
    assert manifest["device"]["shared_attention"] == "tree"  # train.tree_attention, the default
    assert manifest["dataset"]["sha256"] and manifest["model"]["sha256"]
    assert manifest["dataset"]["dropped_overlong"] >= 0
    steps = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 13))
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "step_s", "peak_mem_bytes"):
        assert all(r[key] > 0 for r in steps), key
    first, last = steps[0]["loss"], sum(r["loss"] for r in steps[-3:]) / 3
    assert last < first - 0.1, (first, last)  # loss falls
    assert any("eval_loss" in r for r in read_jsonl(run / "metrics.jsonl"))
    # `train` records the run: the registry points at the directory, with its metrics.
    import sqlite3

    with sqlite3.connect(home.registry_db) as db:
        assert db.execute("select status from runs where id = ?", (run.name,)).fetchall() == [("succeeded",)]
        assert db.execute("select count(*) from metrics where run_id = ?", (run.name,)).fetchone()[0] >= 12


def test_lora_packing_accum_merge_outputs_load(home, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg = small_cfg(tmp_path, packing=True, grad_accum=2, merge=True, keep_checkpoints=1)
    run = train(cfg, home)
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-000003"]  # keep-N
    base_dir = json.loads((run / "run_manifest.json").read_text())["model"]["dir"]
    ids = torch.tensor([[2, 4, 10, 11, 12, 13, 5]])
    base = AutoModelForCausalLM.from_pretrained(base_dir, use_safetensors=True)
    with torch.no_grad():
        plain = base(ids).logits
        peft = PeftModel.from_pretrained(base, str(run / "final/adapter"))(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(run / "final/merged", use_safetensors=True)(ids).logits
    assert (run / "final/merged/tokenizer.json").is_file()
    assert not torch.allclose(peft, plain, atol=1e-4)  # the adapter learned something
    torch.testing.assert_close(merged, peft, atol=1e-4, rtol=1e-4)
    order = read_jsonl(run / "data_order.jsonl")
    assert [r["step"] for r in order] == [1, 2, 3] and all(len(r["ids"]) >= 4 for r in order)


def test_full_finetune_writes_a_loadable_model(home, tmp_path):
    from safetensors.torch import load_file

    cfg = small_cfg(tmp_path, method="full", max_steps=2, optimizer="adafactor", lr=1e-3)
    run = train(cfg, home)
    manifest = json.loads((run / "run_manifest.json").read_text())
    after = load_file(str(run / "final/merged/model.safetensors"))
    before = load_file(str(next(iter(__import__("pathlib").Path(manifest["model"]["dir"]).glob("*.safetensors")))))
    key = "model.layers.0.mlp.down_proj.weight"
    assert not torch.equal(after[key], before[key])
    assert manifest["summary"]["trainable_params"] == manifest["summary"]["params"]


def test_grad_accumulation_8x1_equals_1x8(home, tmp_path):
    """Per-token normalisation over the window: the same gradient however it is split."""
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.train.data import weighted
    from tunix_rt.train.engine import NLL
    from tunix_rt.train.sft import SFT

    grads = []
    for batch, accum in ((8, 1), (1, 8)):
        cfg = small_cfg(tmp_path, method="full", batch_size=batch, grad_accum=accum)
        tok = load_tokenizer(cfg.model, home)
        engine, sft = te.TorchEngine(cfg), SFT(cfg, home, tok)
        engine.devices()
        engine.setup(ensure_model(cfg.model, home), tok)
        loss = 0.0
        for b in weighted([sft.stream.next_batch() for _ in range(accum)]):
            part, _ = engine.objective_sum(b, NLL)
            part.backward()
            loss += float(part.detach())
        grads.append((loss, {n: p.grad.clone() for n, p in engine.trainable.items()}))
    assert len({len(e.ids) for e in sft.stream.examples}) > 3  # variable-length examples
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-6, abs=0)  # a loss near 7: a few fp32 ulps
    for name, g in grads[0][1].items():
        torch.testing.assert_close(grads[1][1][name], g, atol=1e-6, rtol=0, msg=name)


def test_device_errors_name_what_was_asked_and_what_exists(tmp_path):
    if not torch.cuda.is_available():
        with pytest.raises(BadInput, match=r"device 'cuda' was asked.*available here: cpu"):
            te.TorchEngine(small_cfg(tmp_path, device="cuda")).devices()
    with pytest.raises(BadInput, match="bf16 on a CPU is refused"):
        te.TorchEngine(small_cfg(tmp_path, device="cpu", dtype="bf16")).devices()
    assert te.TorchEngine(small_cfg(tmp_path, device="cpu", dtype="bf16", force_bf16_cpu=True)).devices()["platform"] == "cpu"
    with pytest.raises(BadInput, match="JAX device name"):
        te.TorchEngine(small_cfg(tmp_path, device="tpu")).devices()


def test_a_run_with_nothing_to_train_on_is_refused_before_a_run_directory(home, tmp_path):
    cfg = small_cfg(tmp_path, max_seq_len=8)  # every example is too long: nothing to train on
    with pytest.raises(BadInput, match="no training examples"):
        train(cfg, home)
    # bad input is refused before anything is written (issue 23 item 8); a failure once the run
    # is under way is recorded `failed`: tests/train/test_refused_runs.py
    assert not home.runs.is_dir() or not any(home.runs.iterdir())


def test_epochs_become_steps(tmp_path):
    from tunix_rt.models.store import load_tokenizer
    from tunix_rt.render import render_example

    tok = load_tokenizer("tiny-gemma3")
    ex = [render_example(f"e{i}", "q?", ["s"], "1", tok, "") for i in range(10)]
    cfg = small_cfg(tmp_path, max_steps=None, epochs=2.0, batch_size=3, grad_accum=2)
    from tunix_rt.train.common import steps_for

    assert steps_for(cfg, ex, 0) == 4  # 4 micro-batches per epoch, 2 epochs, 2 per step
    assert isinstance(BatchStream(ex, 3, 64, False, 0, 0).next_batch().n_tokens, int)


def test_a_run_the_plan_says_will_not_fit_is_refused_before_anything_is_written(home, tmp_path):
    cfg = small_cfg(tmp_path, model="gemma2-2b", method="full", batch_size=64, max_seq_len=8192,
                    loss_impl="plain", device="cpu")
    with pytest.raises(BadInput, match=r"(?s)does not fit.*--force"):
        train(cfg, home)
    assert not any(home.runs.iterdir())  # refused before a run directory exists
