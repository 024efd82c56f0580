"""A tiny model trained for a few steps on a toy task must reach a known accuracy through
the eval stage: proof that rendering, generation (stopping at <end_of_turn>) and scoring
agree with training. Plain PyTorch AdamW on tiny-gemma3 (full fine-tune), fixed seed; the
result is saved as a run's final/merged model with a config.yaml holding a custom system
prompt, so the eval also shows it reads the prompt from the run.

Measured (seed 0, 150 steps, 2-core CPU): accuracy 1.0, format_rate 1.0 on all 25 items;
the bar below leaves room for float differences across machines."""

from __future__ import annotations

from tunix_rt.eval.runner import NO_ADAPTER, NO_RUN

import json
import shutil

import torch

from tunix_rt.eval.generate import DecodeConfig
from tunix_rt.eval.runner import PREDICTIONS, SUMMARY, EvalRequest, run_eval
from tunix_rt.models.tokenizer import ChatTokenizer
from tunix_rt.render import render_example
from tunix_rt.train.config import TrainConfig

SYSTEM = "Add."
STEPS = 150
ACCURACY_BAR = 0.9


def toy_records():
    return [{"id": f"add-{a}-{b}", "question": f"What is {a}+{b}?", "steps": [f"{a}+{b}={a + b}"],
             "answer": str(a + b), "meta": {"category": "small" if a + b < 5 else "large"}}
            for a in range(5) for b in range(5)]


def train_toy(model_dir, tok: ChatTokenizer, records, steps: int = STEPS):
    """Full fine-tune with AdamW on every record at once (one batch), loss on the model turn."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, use_safetensors=True)
    rendered = [render_example(r["id"], r["question"], r["steps"], r["answer"], tok, SYSTEM) for r in records]
    width = max(len(r.ids) for r in rendered)
    ids = torch.full((len(rendered), width), tok.pad_id)
    labels = torch.full((len(rendered), width), -100)
    attn = torch.zeros((len(rendered), width), dtype=torch.long)
    for i, r in enumerate(rendered):  # right padding for training
        ids[i, : len(r.ids)] = torch.tensor(r.ids)
        attn[i, : len(r.ids)] = 1
        labels[i, : len(r.ids)] = torch.tensor([t if m else -100 for t, m in zip(r.ids, r.loss_mask)])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), float(loss.detach())


def test_toy_model_reaches_known_accuracy(tiny_dirs, home, tmp_path):
    base = tiny_dirs["tiny-gemma3"]
    tok = ChatTokenizer.from_file(base)
    records = toy_records()
    model, final_loss = train_toy(base, tok, records)
    assert final_loss < 0.05

    run = home.runs / "toy-run"
    merged = run / "final" / "merged"
    model.save_pretrained(merged, safe_serialization=True)
    shutil.copyfile(base / "tokenizer.json", merged / "tokenizer.json")
    (run / "config.yaml").write_text(TrainConfig(model=str(base), dataset="toy.jsonl", system_prompt=SYSTEM).to_yaml())
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))

    out = run_eval(EvalRequest(dataset=str(data), adapter=str(run), device="cpu",
                               decode=DecodeConfig(max_new_tokens=40, batch_size=25)))
    assert out.parent == run / "eval"  # evaluating a run writes under the run
    s = json.loads((out / SUMMARY).read_text())
    preds = [json.loads(line) for line in (out / PREDICTIONS).read_text().splitlines()]
    assert s["system_prompt"] == SYSTEM and s["run_id"] == "toy-run" and s["adapter"] == NO_ADAPTER
    assert s["dataset"]["split"] == "all" and s["dataset"]["n"] == 25
    assert s["metrics"]["accuracy"] >= ACCURACY_BAR, preds
    assert s["metrics"]["format_rate"] >= ACCURACY_BAR
    assert s["metrics"]["truncated_rate"] == 0.0  # every item stopped at <end_of_turn>
    assert all(p["finish_reason"] == "stop" for p in preds)
    assert set(s["by_category"]) == {"small", "large"}
    assert sum(c["n"] for c in s["by_category"].values()) == 25
