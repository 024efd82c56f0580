"""The one model identity: the registry names a model version by files.weights_sha256, the
sha256 a run's manifest (and its checkpoints) record for the model it trained."""

from __future__ import annotations

import json
from pathlib import Path

from tunix_rt import rundir
from tunix_rt.files import weights_sha256
from tunix_rt.registry import queries
from tunix_rt.registry.record import record_model


def test_the_registry_names_a_model_by_the_sha256_its_runs_record(home):
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.driver import train

    cfg = TrainConfig.load("smoke", ["max_steps=1", "warmup_steps=0", "limit=8", "eval_interval=0", "eval_limit=2",
                                     "save_interval=0", "device=cpu", "engine=torch"])
    manifest = json.loads((train(cfg, home) / rundir.MANIFEST).read_text())
    model_dir = Path(manifest["model"]["dir"])
    sha = record_model(model_dir, strict=True)
    assert sha == manifest["model"]["sha256"] == weights_sha256(model_dir)
    assert [v.sha256 for v in queries.list_models(name="tiny-gemma3")] == [sha]
