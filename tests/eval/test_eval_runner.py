"""`tunix-rt eval` on the tiny model: where the files go, every DESIGN §2 field present and
never null, prompts rendered with the run's system prompt, bad input refused cleanly."""

from __future__ import annotations

from tunix_rt.eval.runner import NO_ADAPTER, NO_RUN

import json
import re

import pytest
from requires import require_module

from tunix_rt.models.tokenizer import ChatTokenizer
from tunix_rt.render import DEFAULT_SYSTEM_PROMPT, prompt_ids
from tunix_rt.train.config import TrainConfig

PRED_FIELDS = ["id", "question", "gold", "completion", "reasoning", "answer", "correct", "format_ok",
               "n_tokens", "finish_reason"]
SUMMARY_FIELDS = ["model", "adapter", "engine", "device", "dataset", "decoding", "metrics", "by_category",
                  "started_at", "finished_at", "duration_s", "tokens_per_s"]
METRIC_FIELDS = ["accuracy", "format_rate", "answer_found_rate", "mean_completion_tokens", "truncated_rate", "n"]


def _records(n=6):
    return [{"id": f"q{i}", "question": f"What is {i}+{i}?", "steps": [f"{i}+{i}={2 * i}"], "answer": str(2 * i),
             "meta": {"category": "even" if i % 2 == 0 else "odd"}} for i in range(n)]


@pytest.fixture
def traces(tmp_path):
    p = tmp_path / "toy.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    return p


def _no_nulls(obj, where="") -> None:
    if obj is None:
        raise AssertionError(f"null at {where or 'top'}")
    if isinstance(obj, dict):
        for k, v in obj.items():
            _no_nulls(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _no_nulls(v, f"{where}[{i}]")


def _read(out_dir):
    summary = json.loads((out_dir / "eval_summary.json").read_text())
    preds = [json.loads(line) for line in (out_dir / "predictions.jsonl").read_text().splitlines()]
    return summary, preds


def test_eval_base_model_on_a_trace_file(cli, home, traces, tiny_dirs):
    r = cli("eval", "--model", tiny_dirs["tiny-gemma3"], "--dataset", traces, "--max-new-tokens", "6",
            "--batch-size", "4", "--device", "cpu", "--json")
    assert r.code == 0, r.err
    printed = json.loads(r.out)
    evals = list((home.root / "evals").iterdir())
    assert len(evals) == 1 and re.fullmatch(r"toy-all-\d{8}-\d{6}-[0-9a-f]{4}", evals[0].name)
    summary, preds = _read(evals[0])
    assert printed == summary
    _no_nulls(summary)
    assert all(k in summary for k in SUMMARY_FIELDS)
    assert all(k in summary["metrics"] for k in METRIC_FIELDS)
    assert summary["adapter"] == NO_ADAPTER and summary["run_id"] == NO_RUN
    assert summary["engine"] == "torch" and summary["device"] == "cpu"
    assert summary["dataset"]["name"] == "toy" and summary["dataset"]["n"] == 6
    assert summary["dataset"]["split"] == "all" and len(summary["dataset"]["sha256"]) == 64
    assert summary["decoding"]["strategy"] == "greedy" and summary["decoding"]["max_new_tokens"] == 6
    assert summary["metrics"]["n"] == 6 and summary["tokens_per_s"] > 0
    assert set(summary["by_category"]) == {"even", "odd"}
    assert summary["system_prompt"] == DEFAULT_SYSTEM_PROMPT
    assert [p["id"] for p in preds] == [f"q{i}" for i in range(6)]  # dataset order kept
    import sqlite3  # `eval` records the evaluation and its per-item predictions in the registry

    with sqlite3.connect(home.registry_db) as db:
        assert db.execute("select count(*) from evaluations").fetchone()[0] == 1
        assert db.execute("select count(*) from predictions").fetchone()[0] == 6
    tok = ChatTokenizer.from_file(tiny_dirs["tiny-gemma3"])
    for p, rec in zip(preds, _records()):
        _no_nulls(p)
        assert list(p)[: len(PRED_FIELDS)] == PRED_FIELDS
        assert p["gold"] == rec["answer"] and p["question"] == rec["question"]
        assert 1 <= p["n_tokens"] <= 6 and p["finish_reason"] in ("stop", "length")
        assert p["answer_source"] in ("tag", "fallback", "none")
        assert p["prompt_tokens"] == len(prompt_ids(rec["question"], tok, DEFAULT_SYSTEM_PROMPT))
    # a random model neither answers in format nor stops: reported as such
    assert summary["metrics"]["format_rate"] == 0.0
    assert summary["metrics"]["truncated_rate"] == sum(p["finish_reason"] == "length" for p in preds) / 6


def test_eval_named_dataset_dev_split(cli, home, traces, tiny_dirs):
    assert cli("data", "import", "record", traces, "--name", "toyset", "--dev-fraction", "0.5").code == 0
    r = cli("eval", "--model", "tiny-gemma3", "--dataset", "toyset", "--limit", "2", "--max-new-tokens", "3",
            "--device", "cpu", "--json")
    assert r.code == 0, r.err
    s = json.loads(r.out)
    assert s["dataset"]["name"] == "toyset" and s["dataset"]["version"] == "v1"
    assert s["dataset"]["split"] == "dev" and 1 <= s["dataset"]["n"] <= 2
    assert re.fullmatch(r"toyset-dev-\d{8}-\d{6}-[0-9a-f]{4}", s["eval_id"])


def _make_adapter_run(home, tiny_dir, system_prompt: str):
    """A run dir as the engines write it: config.yaml and a PEFT adapter (random, nonzero)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from tunix_rt.eval.runner import load_model

    torch.manual_seed(1)
    model = get_peft_model(load_model(tiny_dir, None, "cpu"),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    run = home.runs / "tiny-run-1"
    model.save_pretrained(run / "final" / "adapter", safe_serialization=True)
    (run / "config.yaml").write_text(TrainConfig(model="tiny-gemma3", dataset="x.jsonl", system_prompt=system_prompt).to_yaml())
    return run


def test_eval_a_runs_adapter_uses_its_config(cli, home, traces, tiny_dirs):
    run = _make_adapter_run(home, tiny_dirs["tiny-gemma3"], "Be brief.")
    r = cli("eval", "--adapter", "tiny-run-1", "--dataset", traces, "--max-new-tokens", "5", "--device", "cpu", "--json")
    assert r.code == 0, r.err
    s = json.loads(r.out)
    out = run / "eval" / s["eval_id"]
    summary, preds = _read(out)
    assert summary["model"] == "tiny-gemma3" and summary["run_id"] == "tiny-run-1"
    assert summary["adapter"] == str((run / "final" / "adapter").resolve())
    assert summary["system_prompt"] == "Be brief."
    tok = ChatTokenizer.from_file(tiny_dirs["tiny-gemma3"])
    assert [p["prompt_tokens"] for p in preds] == [len(prompt_ids(x["question"], tok, "Be brief.")) for x in _records()]
    # the adapter was applied: the base model on the very same prompts decodes otherwise
    from tunix_rt.eval.generate import DecodeConfig, TorchGenerator
    from tunix_rt.eval.runner import load_model

    prompts = [prompt_ids(x["question"], tok, "Be brief.") for x in _records()]
    base = TorchGenerator(load_model(tiny_dirs["tiny-gemma3"], None, "cpu"), tok).generate(prompts, DecodeConfig(max_new_tokens=5))
    assert [p["completion"] for p in preds] != [g.text for g in base]


def test_adapter_on_the_wrong_base_model_is_refused(cli, home, traces, tiny_dirs):
    _make_adapter_run(home, tiny_dirs["tiny-gemma3"], "Be brief.")
    r = cli("eval", "--model", "tiny-gemma2", "--adapter", "tiny-run-1", "--dataset", traces, "--device", "cpu")
    assert r.code == 2 and "trained on tiny-gemma3" in r.err


@pytest.mark.parametrize("args, message", [
    (["--dataset", "nope.jsonl"], "nope.jsonl"),
    (["--limit", "0"], "limit"),
    (["--max-new-tokens", "0"], "max_new_tokens"),
    (["--temperature", "-1"], "temperature"),
    (["--engine", "tensorflow"], "engine"),
    (["--engine", "torch", "--device", "tpu"], "device"),
    (["--adapter", "no-such-run"], "no-such-run"),
])
def test_bad_input_exits_2_and_writes_nothing(cli, home, traces, args, message):
    base = ["eval", "--model", "tiny-gemma3", "--dataset", traces]
    if args[0] == "--dataset":
        base = base[:3]
    r = cli(*base, *args)
    assert r.code == 2, r.err
    assert message in r.err
    assert not (home.root / "evals").exists() or not any((home.root / "evals").iterdir())


def test_existing_out_dir_is_refused_before_generating(cli, home, traces, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    r = cli("eval", "--model", "tiny-gemma3", "--dataset", traces, "--out", taken)
    assert r.code == 2 and "already exists" in r.err
    assert list(taken.iterdir()) == []


@pytest.mark.parametrize("device, engine", [("auto", "torch"), ("cpu", "torch"), ("cuda", "torch"),
                                            ("gpu", "jax"), ("tpu", "jax")])
def test_engine_defaults_to_auto_resolved_as_train_resolves_it(device, engine):
    """No engine given: auto, resolved by train.engines.pick (torch is installed here)."""
    from tunix_rt.eval.runner import EvalRequest
    from tunix_rt.train.config import TrainConfig

    assert EvalRequest(dataset="x", model="m", device=device).engine == engine
    assert TrainConfig(dataset="x", device=device).engine == "auto"  # train resolves the same way:
    from tunix_rt.train import engines

    assert engines.pick("auto", device) == engine


def test_eval_without_engine_on_tpu_goes_to_jax(cli, home, traces):
    """No --engine: auto, so --device tpu means JAX, which says what it found and how to get
    one (torch, the old default, would refuse the device name itself)."""
    require_module("jax")
    r = cli("eval", "--model", "tiny-gemma3", "--dataset", traces, "--device", "tpu")
    assert r.code == 2 and "JAX found no TPU device" in r.err and "Kaggle" in r.err, r.err
    assert not (home.root / "evals").exists() or not any((home.root / "evals").iterdir())
