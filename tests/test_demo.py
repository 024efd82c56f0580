"""`tunix-rt demo` end to end on the tiny model: every stage runs, the evidence is real,
a second run reuses everything, and bad flags are refused with exit code 2."""

from __future__ import annotations

import json

import pytest

from demo_support import DEMO_ARGS, tiny_demo, tunix
from tunix_rt import evidence
from tunix_rt.demo import DemoOptions, resolve
from tunix_rt.errors import BadInput


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return tiny_demo(tmp_path_factory)


def test_demo_prints_table_and_run(demo):
    out = demo.stdout
    for label in ("accuracy", "format rate", "mean tokens", "base model", "fine-tuned"):
        assert label in out
    assert str(demo.run_dir) in out
    for i, stage in enumerate(("model", "dataset", "base eval", "train", "tuned eval", "evidence"), 1):
        assert f"[{i}/6] {stage}" in out
        assert f"✓ {stage}:" in out


def test_demo_leaves_every_evidence_file(demo):
    run = demo.run_dir
    for name in ("run_manifest.json", "config.yaml", "environment.json", "metrics.jsonl",
                 "loss.png", "REPORT.md", "demo.json", "final/adapter/adapter_model.safetensors"):
        assert (run / name).is_file(), name
    state = json.loads((run / "demo.json").read_text())
    tuned = evidence.Path(state["tuned_eval"])
    assert evidence.check_run_evidence(run, tuned) == []
    summary = json.loads((tuned / "eval_summary.json").read_text())
    assert summary["metrics"]["n"] == 8
    assert summary["dataset"]["split"] == "dev"
    assert json.loads((run / "run_manifest.json").read_text())["config"]["max_steps"] == 20
    base = json.loads((evidence.Path(state["base_eval"]) / "eval_summary.json").read_text())
    assert [json.loads(x)["id"] for x in (evidence.Path(state["base_eval"]) / "predictions.jsonl").read_text().splitlines()] \
        == [json.loads(x)["id"] for x in (tuned / "predictions.jsonl").read_text().splitlines()]
    assert base["decoding"] == summary["decoding"]


def test_report_has_table_loss_and_five_examples(demo):
    report = (demo.run_dir / "REPORT.md").read_text()
    assert "| metric | base model | fine-tuned | change |" in report
    assert "![loss](loss.png)" in report
    assert report.count("**Question.**") == 5
    assert report.count("— **gold:**") == 5
    preds = [json.loads(x) for x in
             (evidence.Path(json.loads((demo.run_dir / "demo.json").read_text())["tuned_eval"])
              / "predictions.jsonl").read_text().splitlines()]
    for p in preds[:5]:
        assert p["id"] in report


def test_second_demo_reuses_everything(demo):
    before = sorted(p.name for p in (demo.home / "runs").iterdir())
    done = tunix(demo.home, *DEMO_ARGS)
    assert "reusing finished run" in done.stdout
    assert sorted(p.name for p in (demo.home / "runs").iterdir()) == before
    for stage in ("model", "dataset", "base eval", "train", "tuned eval"):
        assert f"{stage}" in done.stdout
    assert done.stdout.count("(cached)") >= 4  # model, dataset, base eval, tuned eval (+ train)


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps must be >= 1"),
    (["--eval-n", "-1"], "--eval-n must be >= 1"),
    (["--engine", "tensorflow"], "engine must be one of auto|torch|jax"),
    (["--config", "no-such-preset"], "no such file and no shipped preset"),
])
def test_bad_flags_exit_2(tmp_path, args, message):
    done = tunix(tmp_path / "home", "demo", "--model", "tiny-gemma3", *args, check=False)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


def test_resolve_defaults():
    real = resolve(DemoOptions())
    assert real.cfg.model == "gemma3-270m" and real.eval_n == 32 and not real.tiny
    tiny = resolve(DemoOptions(model="tiny-gemma3", steps=7))
    assert tiny.tiny and tiny.eval_n == 8 and tiny.cfg.max_steps == 7 and tiny.cfg.epochs is None
    assert resolve(DemoOptions(engine="jax")).cfg.engine == "jax"
    # fewer steps than the preset's warmup (cpu-demo: 5): warmup shortened, not refused
    short = resolve(DemoOptions(steps=3))
    assert (short.cfg.max_steps, short.cfg.warmup_steps) == (3, 3)
    assert resolve(DemoOptions(steps=30)).cfg.warmup_steps == 5
    with pytest.raises(BadInput):
        DemoOptions(max_new_tokens=0)


def test_demo_run_is_in_the_registry(demo):
    done = tunix(demo.home, "runs", "list", "--json")
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert demo.run_dir.name in json.dumps(rows)
