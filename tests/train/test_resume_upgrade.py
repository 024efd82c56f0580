"""Resume across an upgrade: a checkpoint written by a release that had fewer config fields
(its config.yaml and its config digest lack the newer ones) continues here, bit-exact,
when the run holds those fields at their defaults; a real change is still refused, naming
the fields. CPU, fp32, the tiny model."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tunix_rt.errors import BadInput
from tunix_rt.train import checkpoint
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.driver import train
from tunix_rt.train.metrics import read_jsonl
from train_testlib import write_traces  # noqa: E402

#: fields an older release did not have (the newest ones here), held at their defaults
NEWER = ("kd_on_policy", "rft_accept", "rft_round_steps")


def _config(tmp_path) -> TrainConfig:
    return TrainConfig(model="tiny-gemma3", dataset=write_traces(tmp_path / "traces.jsonl", 12), split="all",
                       eval_split="all", eval_limit=2, system_prompt="Be brief.", batch_size=2, grad_accum=2,
                       max_seq_len=128, max_steps=4, lr=1e-2, save_interval=2, log_interval=1,
                       lora_dropout=0.1, device="cpu")


def _stop_after(n):
    calls = iter(range(1, 10 ** 6))
    return lambda: next(calls) >= n


def _as_older_release(run, drop=NEWER):
    """Rewrite the run and its checkpoint as a release without the `drop` fields wrote
    them: config.yaml without them, state.json's digest taken of what is left."""
    ckpt = checkpoint.latest(run)
    for path in (run / "config.yaml", ckpt / "config.yaml"):
        data = yaml.safe_load(path.read_text())
        for k in drop:
            del data[k]
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    kept = {k: v for k, v in data.items() if k not in checkpoint.DIGEST_EXEMPT}
    state = json.loads((ckpt / "state.json").read_text())
    state["config_digest"] = hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()
    (ckpt / "state.json").write_text(json.dumps(state, indent=2))
    return ckpt


def _stopped_run(cfg, home):
    from tunix_rt.train.run import RunStopped

    with pytest.raises(RunStopped):
        train(cfg, home, should_stop=_stop_after(2))
    run = next(p for p in home.runs.iterdir() if not p.name.startswith("."))
    assert checkpoint.latest(run).name == "step-000002"
    return run


def test_a_checkpoint_of_an_older_release_resumes_bit_exact(home, tmp_path):
    cfg = _config(tmp_path)
    run = _stopped_run(cfg, home)
    ckpt = _as_older_release(run)
    assert json.loads((ckpt / "state.json").read_text())["config_digest"] != checkpoint.config_digest(cfg)

    assert train(cfg, home, resume=run.name) == run
    assert json.loads((run / "run_manifest.json").read_text())["status"] == "succeeded"
    ref = train(cfg, home)  # never interrupted, same config
    got, want = (load_file(str(r / "final/adapter/adapter_model.safetensors")) for r in (run, ref))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    losses = [[r["loss"] for r in read_jsonl(r / "metrics.jsonl") if "loss" in r] for r in (run, ref)]
    assert losses[0] == losses[1] and len(losses[0]) == 4


def test_a_real_change_is_refused_naming_the_fields(home, tmp_path):
    cfg = _config(tmp_path)
    run = _stopped_run(cfg, home)
    ckpt = _as_older_release(run)
    ok = checkpoint.check_resumable(ckpt, {}, cfg)  # the older checkpoint, the same meaning
    assert ok["step"] == 2
    for change, named in (({"lr": 0.5}, ["config lr: the checkpoint has 0.01, this run 0.5"]),
                          ({"max_steps": 6}, ["config max_steps: the checkpoint has 4, this run 6"]),
                          ({"model": "tiny-gemma3-other", "lr": 0.5}, ["config model:", "config lr:"]),
                          # a field the older release lacked, held here at another value than its default
                          ({"rft_round_steps": 7},
                           ["config rft_round_steps: not in the checkpoint (written before it existed; "
                            "its default 4), this run 7"])):
        with pytest.raises(BadInput) as e:
            checkpoint.check_resumable(ckpt, {}, dataclasses.replace(cfg, **change))
        msg = str(e.value)
        assert all(n in msg for n in named), msg
        assert "cannot continue this run" in msg and "lora_rank" not in msg
    # what a resume may change (DIGEST_EXEMPT) is no change
    assert checkpoint.check_resumable(ckpt, {}, dataclasses.replace(cfg, log_interval=3, reward_timeout_s=2.0))
    # and through the driver: the changed run is refused and nothing of it is touched
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "stopped"
    before = {f: (run / f).read_bytes() for f in ("metrics.jsonl", "config.yaml", "run_manifest.json")}
    for change in ({"lr": 0.5}, {"max_steps": 6}):
        with pytest.raises(BadInput, match=list(change)[0]):
            train(dataclasses.replace(cfg, **change), home, resume=run.name)
        assert {f: (run / f).read_bytes() for f in before} == before


def test_a_config_yaml_that_is_not_what_the_digest_was_taken_of_is_refused(home, tmp_path):
    cfg = _config(tmp_path)
    run = _stopped_run(cfg, home)
    ckpt = _as_older_release(run)
    data = yaml.safe_load((ckpt / "config.yaml").read_text())
    (ckpt / "config.yaml").write_text(yaml.safe_dump({**data, "lr": 0.5}))  # edited after the digest
    with pytest.raises(BadInput, match="not the config that digest was taken of"):
        checkpoint.check_resumable(ckpt, {}, dataclasses.replace(cfg, lr=0.5))
