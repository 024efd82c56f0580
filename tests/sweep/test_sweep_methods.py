"""A sweep over the preference methods: pref_loss and pref_beta of SimPO/DPO on on-policy pairs
(tiny-gemma3, real trials run by an in-process worker), scored by the objective its space
names (eval_accuracy, maximised: a sampling method's runs log no eval_loss, and a preference
loss is not comparable across pref_loss or beta); a space without one keeps eval_loss,
minimised, and a trial whose run does not log it fails naming what the run did log."""

from __future__ import annotations

import pytest

from registry_testlib import import_tiny_dataset

BASE = {"model": "tiny-gemma3", "dataset": "tiny@v1", "split": "all", "eval_split": "all", "eval_limit": 2,
        "method": "dpo", "pairs": "rollouts", "batch_size": 2, "max_seq_len": 128, "max_steps": 2, "lr": 0.003,
        "warmup_steps": 0, "log_interval": 1, "eval_interval": 1, "save_interval": 0, "group_size": 2, "rl_prompts": 2,
        "rollout_max_new_tokens": 8, "seed": 0}
SPACE = {"params": {"pref_loss": {"type": "categorical", "choices": ["dpo", "simpo"]},
                    "pref_beta": {"type": "float", "low": 0.05, "high": 2.5, "log": True}},
         "enqueue": [{"pref_loss": "simpo", "pref_beta": 2.0}, {"pref_loss": "dpo", "pref_beta": 0.1}],
         "objective": {"metric": "eval_accuracy", "direction": "maximize"}}


@pytest.fixture
def tiny_home(home):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    import_tiny_dataset(home, n=8)
    yield home
    torch.set_num_threads(threads)


def _run_all(home, n: int) -> None:
    from tunix_rt.registry.worker import Worker, WorkerConfig

    assert Worker(home, WorkerConfig(lease_s=10, poll_s=0.05, max_jobs=n)).run() == n


def test_a_sweep_of_pref_loss_and_beta_scored_by_held_out_accuracy(tiny_home, monkeypatch, capsys):
    from registry_testlib import cli_main
    from tunix_rt.sweep.space import parse_space
    from tunix_rt.sweep.study import create_sweep, describe, list_sweeps

    create_sweep("pref", BASE, parse_space(SPACE), 2)
    _run_all(tiny_home, 2)
    d = describe("pref")
    assert (d["objective"], d["direction"]) == ("eval_accuracy", "maximize")
    assert [r["state"] for r in d["trials"]] == ["COMPLETE", "COMPLETE"]
    assert sorted((r["params"]["pref_loss"], r["params"]["pref_beta"]) for r in d["trials"]) == \
        [("dpo", 0.1), ("simpo", 2.0)]
    for r in d["trials"]:  # each value is its run's final held-out accuracy, reported at each eval
        assert 0.0 <= r["value"] <= 1.0 and sorted(r["intermediate"]) == ["1", "2"]
    assert d["best"]["value"] == max(r["value"] for r in d["trials"])
    assert d["best"]["config"]["method"] == "dpo" and d["best"]["config"]["pairs"] == "rollouts"
    [summary] = list_sweeps()
    assert (summary["objective"], summary["direction"]) == ("eval_accuracy", "maximize")
    code, out, _ = cli_main(monkeypatch, capsys, "sweep", "show", "pref")
    assert code == 0 and f"best: trial {d['best']['trial']}, eval_accuracy" in out and "pref_loss" in out
    code, out, _ = cli_main(monkeypatch, capsys, "sweep", "list")
    assert code == 0 and "eval_accura" in out and "(max)" in out  # the table may wrap the cell


def test_a_trial_whose_run_lacks_the_objective_fails_naming_what_it_logged(tiny_home):
    from tunix_rt.sweep.space import parse_space
    from tunix_rt.sweep.study import create_sweep, describe

    space = {"params": {"pref_beta": {"type": "float", "low": 0.05, "high": 2.5, "log": True}}}
    assert parse_space(space).objective.model_dump() == {"metric": "eval_loss", "direction": "minimize"}
    create_sweep("pref-loss", {**BASE, "eval_interval": 0}, parse_space(space), 1)
    _run_all(tiny_home, 1)
    d = describe("pref-loss")
    assert d["trials"][0]["state"] == "FAIL" and (d["objective"], d["direction"]) == ("eval_loss", "minimize")
    from tunix_rt.registry import queue

    [job] = queue.list_jobs(kind="trial")
    why = job.result["error"]
    assert job.result["state"] == "FAIL" and "has no final eval_loss" in why, job.result
    assert "it logged eval_accuracy, eval_format_rate, eval_reward: set the space's objective" in why, why


@pytest.mark.parametrize("objective,why", [
    ({"metric": "loss"}, "objective.metric"),
    ({"metric": "eval_loss; rm"}, "objective.metric"),
    ({"direction": "up"}, "objective.direction"),
    ({"metric": "eval_accuracy", "nosuch": 1}, "objective.nosuch"),
])
def test_bad_objectives(objective, why):
    from tunix_rt.errors import BadInput
    from tunix_rt.sweep.space import parse_space

    with pytest.raises(BadInput, match=why):
        parse_space({"params": {"lr": {"type": "float", "low": 1e-4, "high": 1e-2}}, "objective": objective})
