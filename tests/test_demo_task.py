"""`tunix-rt demo --task basic_arithmetic` end to end on the tiny model: SFT stays on GSM8K (the
plain demo's run is reused), GRPO trains on the task with its curriculum, the three evaluations
are of the task's held-out test split scored by the task's own verifier, and REPORT.md and the
console name the task and each stage's time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from requires import require_module

from demo_support import TASK, task_demo, tiny_demo, tunix
from tunix_rt.demo import DemoOptions, resolve
from tunix_rt.errors import BadInput

require_module("reasoning_gym")

STAGES = ("model", "dataset", "task", "base eval", "train", "tuned eval", "RL", "RL eval", "evidence")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return task_demo(tmp_path_factory)


@pytest.fixture(scope="module")
def state(demo):
    return json.loads((demo.run_dir / "demo.json").read_text())


def _evals(state: dict) -> dict[str, Path]:
    return {"base": Path(state["base_eval"]), "SFT": Path(state["tuned_eval"]), "SFT+RL": Path(state["rl_eval"])}


def test_every_stage_runs_and_sft_is_the_plain_demos(demo, tmp_path_factory):
    out = demo.stdout
    for i, stage in enumerate(STAGES, 1):
        assert f"[{i}/{len(STAGES)}] {stage}" in out
        assert f"✓ {stage}:" in out
    sft = tiny_demo(tmp_path_factory).run_dir.name
    assert f"reusing finished run {demo.home / 'runs' / sft}" in out  # GSM8K SFT, shared with `demo`
    assert "before / after on 8 rg-basic_arithmetic test items" in out
    assert f"task: reasoning-gym {TASK}, scored by rg:{TASK}" in out
    times = next(line for line in out.splitlines() if line.startswith("stage times:"))
    for stage in STAGES[:-1]:
        assert f"{stage} " in times
    assert str(demo.run_dir) in out


def test_evals_are_the_tasks_test_split_by_its_scorer(demo, state):
    from tunix_rt.eval.scoring import score_record
    from tunix_rt.traces import reasoning_gym as rg
    from tunix_rt.home import Home
    from tunix_rt.traces.dataset import load_dataset

    assert state["task"]["name"] == TASK and state["task"]["scorer"] == f"rg:{TASK}"
    ds = load_dataset(state["task"]["dataset"], Home(demo.home))
    test = {r.id: r for r in ds.split("test")[:8]}
    assert len(test) == 8 and all(r.meta["split"] == "test" for r in test.values())
    train_questions = {r.question for r in ds.split("train")}
    for label, eval_dir in _evals(state).items():
        summary = json.loads((eval_dir / "eval_summary.json").read_text())
        assert (summary["dataset"]["name"], summary["dataset"]["split"], summary["metrics"]["n"]) \
            == (ds.name, "test", 8), label
        assert set(summary["by_category"]) == {TASK}, label
        preds = [json.loads(x) for x in (eval_dir / "predictions.jsonl").read_text().splitlines()]
        assert [p["id"] for p in preds] == list(test), label
        for p in preds:
            rec = test[p["id"]]
            assert rec.meta["scorer"] == f"rg:{TASK}" and rec.question not in train_questions
            assert p["gold"] == rec.answer
            assert p["correct"] == score_record(p["completion"], rec).correct
            if p["answer"]:  # the task's own verifier, called directly
                verdict = rg.score(rec.meta, rec.question, rec.answer, p["answer"]) == 1.0
                assert p["correct"] == verdict, (label, p["id"])


def test_the_constant_answer_baseline_is_reported(demo, state):
    """The floor a gain must clear: always the train split's most common answer, scored on the
    evaluated items by the task's verifier; in demo.json, on the console and in REPORT.md."""
    from collections import Counter

    from tunix_rt.eval.scoring import is_correct, score
    from tunix_rt.home import Home
    from tunix_rt.traces.dataset import load_dataset

    ds = load_dataset(state["task"]["dataset"], Home(demo.home))
    counts = Counter(r.answer for r in ds.split("train"))
    top = max(counts.values())
    answer = next(r.answer for r in ds.split("train") if counts[r.answer] == top)
    items = ds.split("test")[:8]
    acc = sum(is_correct(score(r, answer)) for r in items) / 8
    assert state["task"]["constant_baseline"] == {"answer": answer, "accuracy": acc, "n": 8}
    text = f'always answering "{answer}" (the train split\'s most common answer) scores {100 * acc:.1f}% of these 8 items'
    assert text in " ".join(demo.stdout.split())
    assert f"- baseline: {text}" in (demo.run_dir / "REPORT.md").read_text()


def test_grpo_trains_on_the_task_with_its_curriculum_from_the_gsm8k_sft(demo, state):
    rl = json.loads((demo.run_dir / "run_manifest.json").read_text())["config"]
    sft = json.loads((demo.home / "runs" / state["run_id"] / "run_manifest.json").read_text())["config"]
    assert (sft["method"], sft["dataset"]) == ("sft", "gsm8k")
    assert (rl["method"], rl["dataset"], rl["split"]) == ("grpo", state["task"]["dataset"], "train")
    assert rl["init"] == state["run_id"] and rl["curriculum"] is not None and state["task"]["curriculum"]
    rows = [json.loads(x) for x in (demo.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(f"curriculum_level_{TASK}" in r for r in rows)


def test_report_names_the_task_and_stage_times(demo, state, tmp_path_factory):
    report = (demo.run_dir / "REPORT.md").read_text()
    assert "## Task" in report
    assert f"reasoning-gym task `{TASK}`, scored by its own verifier `rg:{TASK}`" in report
    assert f"evaluation: {state['task']['dataset']} `test`" in report  # the head's evaluation line
    assert "| metric | base model | SFT | SFT+RL | change (RL vs base) |" in report
    for stage in STAGES[:-1]:
        assert f"| {stage} | {state['stage_seconds'][stage]:.1f} |" in report
    # the shared SFT run's GSM8K report is the plain demo's, untouched
    shared = tiny_demo(tmp_path_factory).run_dir / "REPORT.md"
    assert (demo.home / "runs" / state["run_id"] / "REPORT.md").read_text() == shared.read_text()


def test_task_options():
    assert resolve(DemoOptions(model="tiny-gemma3", task=TASK)).rl
    assert not resolve(DemoOptions(model="tiny-gemma3")).rl
    with pytest.raises(BadInput, match="unknown reasoning-gym task 'no_such_task'"):
        DemoOptions(task="no_such_task")
    with pytest.raises(BadInput, match="--task takes one reasoning-gym task"):
        DemoOptions(task=f"{TASK},chain_sum")


def test_unknown_task_exits_2(tmp_path):
    done = tunix(tmp_path / "home", "demo", "--model", "tiny-gemma3", "--task", "no_such_task", check=False)
    assert done.returncode == 2, done.stderr
    assert "unknown reasoning-gym task" in done.stderr
