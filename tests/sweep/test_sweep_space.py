"""SPACE.yaml and `tunix-rt sweep` input: every problem is bad input (exit 2) naming the file
and the field, found before anything is written (no study, no job)."""

from __future__ import annotations

import pytest

from sweep_testlib import BASE, cli_main, write_base, write_space
from tunix_rt.errors import BadInput

LR = {"type": "float", "low": 1e-4, "high": 0.1, "log": True}


@pytest.mark.parametrize("space, why", [
    ({"params": {"learning_rate": LR}}, "params ['learning_rate'] are not TrainConfig fields"),
    ({"params": {"run_name": {"type": "categorical", "choices": ["a"]}}}, "params ['run_name']"),
    ({"params": {"lr": {**LR, "low": 0.0}}}, "a log scale needs low > 0"),
    ({"params": {"lr": {**LR, "low": 0.5}}}, "low (0.5) must be below high (0.1)"),
    ({"params": {"lr": {**LR, "step": 0.01}}}, "step and log cannot both be set"),
    ({"params": {"lr": {"type": "normal", "mean": 1}}}, "params.lr: Input tag 'normal'"),
    ({"params": {"lr": LR}, "enqueue": [{"lr": 0.5}]}, "enqueue[0].lr: 0.5 is not a number in [0.0001, 0.1]"),
    ({"params": {"lr": LR}, "enqueue": [{"seed": 1}]}, "enqueue[0]: ['seed'] not in params"),
    ({"params": {"lora_rank": {"type": "int", "low": 4, "high": 16, "step": 4}}, "enqueue": [{"lora_rank": 6}]},
     "enqueue[0].lora_rank: 6 is not an integer in [4, 16] on step 4"),
    ({"params": {}}, "params: Dictionary should have at least 1 item"),
    ({"params": {"lr": LR}, "pruner": {"n_startup": 1}}, "pruner.n_startup: Extra inputs are not permitted"),
])
def test_bad_spaces(tmp_path, space, why):
    from tunix_rt.sweep.space import load_space

    with pytest.raises(BadInput) as e:
        load_space(write_space(tmp_path / "space.yaml", space))
    assert str(e.value).startswith(f"{tmp_path / 'space.yaml'}: ") and why in str(e.value), str(e.value)


@pytest.mark.parametrize("space, why", [
    ({"params": {"lr": {"type": "float", "low": -1.0, "high": 0.1}}}, "lr must be > 0"),
    ({"params": {"dataset": {"type": "categorical", "choices": ["tiny@v1", "/etc/data.jsonl"]}}},
     "dataset must be a name from the home, not a path"),
    ({"params": {"finetune": {"type": "categorical", "choices": ["lora", "half"]}}}, "finetune must be one of"),
])
def test_spaces_that_make_a_bad_config_write_nothing(home, tmp_path, monkeypatch, capsys, space, why):
    from tunix_rt.registry import queue
    from tunix_rt.sweep.study import list_sweeps

    args = ("sweep", "--config", str(write_base(tmp_path / "base.yaml")), "--space",
            str(write_space(tmp_path / "space.yaml", space)), "--trials", "3", "--name", "bad")
    code, _, err = cli_main(monkeypatch, capsys, *args)
    assert code == 2 and why in err, err
    assert list_sweeps() == [] and queue.list_jobs() == []


def test_sweep_usage_errors(home, tmp_path, monkeypatch, capsys):
    from tunix_rt.registry import queue

    base, space = write_base(tmp_path / "base.yaml"), write_space(tmp_path / "space.yaml", {"params": {"lr": LR}})
    code, _, err = cli_main(monkeypatch, capsys, "sweep", "--config", str(base), "--space", str(space))
    assert code == 2 and "give --config BASE --space SPACE.yaml --trials N" in err
    code, _, err = cli_main(monkeypatch, capsys, "sweep", "--config", str(base), "--space", str(space),
                            "--trials", "2", "--name", "../x")
    assert code == 2 and "--name '../x'" in err
    code, _, err = cli_main(monkeypatch, capsys, "sweep", "--config", str(base), "--space",
                            str(write_space(tmp_path / "s2.yaml", {"params": {"lr": LR}, "enqueue": [{}, {}, {}]})),
                            "--trials", "2")
    assert code == 2 and "enqueues 3 trials, more than --trials 2" in err
    assert queue.list_jobs() == []
    code, out, _ = cli_main(monkeypatch, capsys, "sweep", "--config", str(base), "--space", str(space),
                            "--trials", "2", "--name", "once", "--set", "max_steps=4")
    assert code == 0 and "sweep once: 2 trial job(s) queued" in out
    code, _, err = cli_main(monkeypatch, capsys, "sweep", "--config", str(base), "--space", str(space),
                            "--trials", "2", "--name", "once")
    assert code == 2 and "sweep 'once' exists already" in err
    assert [j.params for j in queue.list_jobs()] == [{"study": "once", "fixed": {}}] * 2
    code, out, _ = cli_main(monkeypatch, capsys, "sweep", "show", "once", "--json")
    import json

    shown = json.loads(out)
    assert shown["base"]["max_steps"] == 4 and shown["base"]["lr"] == BASE["lr"] and shown["best"] is None
    assert [t["state"] for t in shown["trials"]] == ["QUEUED", "QUEUED"]
