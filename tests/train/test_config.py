"""TrainConfig: every shipped preset parses, overrides are typed, bad values fail clearly."""

from __future__ import annotations

import pytest

from tunix_rt.errors import BadInput
from tunix_rt.train.config import PRESET_DIR, TrainConfig


@pytest.mark.parametrize("preset", sorted(p.stem for p in PRESET_DIR.glob("*.yaml")))
def test_every_shipped_preset_parses(preset):
    cfg = TrainConfig.load(preset)
    assert cfg.dataset and cfg.model
    assert (cfg.max_steps is None) != (cfg.epochs is None)
    # the resolved YAML reloads to the same config
    again = TrainConfig.from_dict(__import__("yaml").safe_load(cfg.to_yaml()))
    assert again == cfg


def test_presets_are_the_three_documented():
    assert {p.stem for p in PRESET_DIR.glob("*.yaml")} >= {"smoke", "cpu-demo", "gpu"}


def test_overrides_are_typed_and_win():
    cfg = TrainConfig.load("smoke", ["max_steps=3", "lr=1e-4", "lora_targets=q_proj,v_proj", "packing=true"])
    assert cfg.max_steps == 3 and cfg.lr == pytest.approx(1e-4) and cfg.packing is True
    assert cfg.lora_targets == ["q_proj", "v_proj"]


def test_defaults_resolved_once():
    cfg = TrainConfig(dataset="gsm8k")
    assert cfg.max_steps == 100 and cfg.epochs is None  # neither given: a short run
    assert cfg.loss_impl == "chunked"  # the fused loss is the default
    assert cfg.eval_limit == 256


@pytest.mark.parametrize("items, needle", [
    (["method=qlora"], "method must be one of sft|grpo"),
    (["finetune=qlora"], "finetune must be one of lora|full"),
    (["batch_size=0"], "batch_size must be >= 1"),
    (["max_steps=5", "epochs=1"], "not both"),
    (["lr=0"], "lr must be > 0"),
    (["lora_targets=q_proj,foo"], "foo"),
    (["eval_limit=0"], "eval_limit must be >= 1"),
    (["limit=0"], "limit must be >= 1"),
    (["batch_size=two"], "batch_size must be an integer"),
    (["nonsense=1"], "unknown field"),
    (["dtype=fp16"], "dtype must be one of fp32|bf16"),
])
def test_bad_values_fail_with_the_field_named(items, needle):
    with pytest.raises(BadInput, match=needle):
        TrainConfig.load("smoke", items)


def test_dataset_required_and_unknown_preset():
    with pytest.raises(BadInput, match="dataset is required"):
        TrainConfig()
    with pytest.raises(BadInput, match="no shipped preset"):
        TrainConfig.load("no-such-preset")


def test_older_method_spellings_mean_sft_with_that_finetune():
    cfg = TrainConfig.load("smoke", ["method=full"])
    assert (cfg.method, cfg.finetune) == ("sft", "full")
    assert (TrainConfig.load("smoke").method, TrainConfig.load("smoke").finetune) == ("sft", "lora")
