"""`tunix-rt demo --rl` (no --task: RL_TASK with the calculator, as `--task chain_sum --tools
calculator`) end to end on the tiny model, in a fresh home: the SFT run trains on the vendored
GSM8K split's calculator traces (dataset gsm8k-calc, imported on first use with its calculator
notes as tool calls), GRPO trains on the task with the calculator, the three evaluations (the
base model's too) decode with it, and the console and REPORT.md say so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from requires import require_module

from demo_support import DEMO_ARGS, tunix
from tunix_rt.demo import PYTHON_SFT_LIMIT, RL_TASK, TOOLS_DATASETS, DemoOptions, resolve
from tunix_rt.errors import BadInput

require_module("reasoning_gym")

TASK = RL_TASK  # what `demo --rl` runs
TOOLS_DATASET = TOOLS_DATASETS["calculator"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    home = tmp_path_factory.mktemp("tools-demo-home") / "home"
    done = tunix(home, *DEMO_ARGS, "--rl")
    runs = {}
    for m in (home / "runs").glob("*/run_manifest.json"):
        runs[json.loads(m.read_text())["config"]["method"]] = m.parent
    assert set(runs) == {"sft", "grpo"}, runs
    return home, runs, done.stdout


def _config(run: Path) -> dict:
    return json.loads((run / "run_manifest.json").read_text())["config"]


def test_sft_trains_on_the_calculator_traces(demo):
    from tunix_rt.home import Home
    from tunix_rt.traces.dataset import load_dataset

    home, runs, _ = demo
    sft = _config(runs["sft"])
    assert (sft["dataset"], sft["tools"]) == (TOOLS_DATASET, ["calculator"])
    ds = load_dataset(TOOLS_DATASET, Home(home))
    assert ds.version == "v1"
    with_calls = [r for r in ds.records if "calculator" in r.tools()]
    assert len(with_calls) > len(ds.records) // 2  # GSM8K's notes, kept as calls
    assert not (home / "datasets" / "gsm8k").exists()  # the plain split was never needed


def test_grpo_and_every_eval_call_the_calculator(demo):
    home, runs, out = demo
    rl = _config(runs["grpo"])
    assert rl["tools"] == ["calculator"] and rl["init"] == runs["sft"].name and rl["split"] == "train"
    assert rl["lr"] == 0.003  # the smoke preset's: TASK_RL_LR is the 270M's
    state = json.loads((runs["grpo"] / "demo.json").read_text())
    assert state["task"]["name"] == TASK and state["task"]["sft_dataset"] == TOOLS_DATASET
    for key in ("base_eval", "tuned_eval", "rl_eval"):
        d = Path(state[key])
        summary = json.loads((d / "eval_summary.json").read_text())
        assert summary["decoding"]["tools"] == ["calculator"], key
        assert summary["dataset"]["split"] == "test" and summary["metrics"]["n"] == 8, key
        preds = [json.loads(x) for x in (d / "predictions.jsonl").read_text().splitlines()]
        assert len(preds) == 8 and all("tool_calls" in p for p in preds), key
    assert f"tunix-rt demo --rl (reasoning-gym {TASK})" in out
    assert "tools: calculator (SFT, RL and every eval)" in " ".join(out.split())
    report = (runs["grpo"] / "REPORT.md").read_text()
    assert "- tools: calculator, called in SFT's traces, GRPO's rollouts and every evaluation" in report
    assert f"- SFT on `{TOOLS_DATASET}`" in report


def test_tools_option():
    cfg = resolve(DemoOptions(model="tiny-gemma3", tools=("calculator",))).cfg
    assert (cfg.dataset, cfg.tools) == (TOOLS_DATASET, ["calculator"])
    plain = resolve(DemoOptions(model="tiny-gemma3")).cfg
    assert (plain.dataset, plain.tools) == ("gsm8k", [])
    rl = resolve(DemoOptions(model="tiny-gemma3", rl=True))  # --rl alone: where GRPO gains (RL_TASK)
    assert (rl.rl, rl.task, rl.cfg.dataset, rl.cfg.tools) == (True, RL_TASK, TOOLS_DATASET, ["calculator"])
    picked = resolve(DemoOptions(model="tiny-gemma3", rl=True, task="basic_arithmetic"))  # --task wins, no tools
    assert (picked.task, picked.cfg.dataset, picked.cfg.tools) == ("basic_arithmetic", "gsm8k", [])
    py = resolve(DemoOptions(model="tiny-gemma3", task="gcd", tools=("python",)))  # the sandboxed python instead
    assert (py.task, py.cfg.dataset, py.cfg.tools, py.cfg.limit) == ("gcd", "gsm8k-python", ["python"], 64)  # smoke's
    demo_size = resolve(DemoOptions(model="tiny-gemma3", config="cpu-demo", tools=("python",))).cfg
    assert demo_size.limit == PYTHON_SFT_LIMIT  # rendering runs every call in the sandbox
    assert resolve(DemoOptions(model="tiny-gemma3", config="cpu-demo", tools=("calculator",))).cfg.limit is None
    for bad in (("abacus",), ("calculator", "python"), ("calculator", "calculator")):
        with pytest.raises(BadInput, match="--tools takes one of calculator, python"):
            DemoOptions(tools=bad)


def test_unknown_tool_exits_2(tmp_path):
    done = tunix(tmp_path / "home", "demo", "--model", "tiny-gemma3", "--tools", "abacus", check=False)
    assert done.returncode == 2, done.stderr
    assert "--tools takes one of calculator, python" in done.stderr
    assert not (tmp_path / "home" / "runs").exists() or not any((tmp_path / "home" / "runs").iterdir())
