"""TrainConfig: every shipped preset parses, overrides are typed, bad values fail clearly."""

from __future__ import annotations

from dataclasses import fields

import pytest

from tunix_rt.errors import BadInput
from tunix_rt.eval.generate import DECODE_RANGES, DecodeConfig
from tunix_rt.train.config import PRESET_DIR, RANGES, ROLLOUT, TrainConfig


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


# --- every numeric field finite and in range (issue 23) ----------------------------------

NUMERIC = [f.name for f in fields(TrainConfig) if str(f.type).split(" |")[0] in ("int", "float")]
FLOATS = [f.name for f in fields(TrainConfig) if str(f.type).startswith("float")]


def test_every_numeric_field_has_a_range():
    # the rollout_* decoding settings have DecodeConfig's ranges (one place), the rest RANGES
    assert set(RANGES).isdisjoint(ROLLOUT)
    assert set(NUMERIC) == set(RANGES) | set(ROLLOUT), set(NUMERIC) ^ (set(RANGES) | set(ROLLOUT))
    assert set(ROLLOUT.values()) <= set(DECODE_RANGES)
    assert {"lr", "weight_decay", "grad_clip", "lora_alpha", "reward_timeout_s"} <= set(FLOATS)


@pytest.mark.parametrize("value", ["nan", ".nan", "inf", "-inf", ".inf", "1e999"])
@pytest.mark.parametrize("name", FLOATS)
def test_nan_and_infinity_are_refused_in_every_float_field(name, value):
    items = [f"{name}={value}"] + (["max_steps=null"] if name == "epochs" else [])
    with pytest.raises(BadInput, match=rf"config: {name} must be a finite number, got .*(nan|inf)"):
        TrainConfig.load("smoke", items)


@pytest.mark.parametrize("items, needle", [
    (["seed=-1"], r"seed must be in \[0, 4294967295\], got -1"),
    (["seed=4294967296"], r"seed must be in \[0, 4294967295\]"),
    (["lora_alpha=-5"], "lora_alpha must be > 0, got -5.0"),
    (["lora_alpha=0"], "lora_alpha must be > 0"),
    (["warmup_steps=1000000", "max_steps=2"], r"warmup_steps \(1000000\) exceeds the run's 2 optimizer steps"),
    (["weight_decay=-0.1"], "weight_decay must be >= 0"),
    (["grad_clip=-1"], "grad_clip must be >= 0"),
    (["min_lr_ratio=1.5"], r"min_lr_ratio must be in \[0, 1\]"),
    (["lora_dropout=1"], r"lora_dropout must be in \[0, 1\)"),
    (["epsilon=1"], r"epsilon must be in \(0, 1\)"),
    (["epsilon_high=0"], r"epsilon_high must be > 0 \(or null: epsilon\)"),
    (["rollout_top_p=0"], r"rollout_top_p must be in \(0, 1\]"),
    (["rollout_top_k=-1"], "rollout_top_k must be >= 0"),
    (["rollout_max_new_tokens=0"], "config: rollout_max_new_tokens must be >= 1, got 0"),
    (["rollout_temperature=0"], "config: rollout_temperature must be > 0, got 0.0"),
    (["rollout_temperature=-1"], "config: rollout_temperature must be > 0, got -1.0"),
    (["reward_timeout_s=0"], "reward_timeout_s must be > 0"),
    (["mu=0"], "mu must be >= 1"),
    (["eval_interval=-1"], "eval_interval must be >= 0"),
    (["max_steps=null", "epochs=0"], "epochs must be > 0"),
    (["mesh={fsdp: 1.5}"], "mesh axes must be fsdp/tp with sizes >= 1"),
    (["mesh={fsdp: .nan}"], "mesh axes must be fsdp/tp with sizes >= 1"),
    (["method=grpo", "rewards={nosuch: 1}"], "unknown reward 'nosuch'"),
    (["method=grpo", "rewards={format: .nan}"], "weight must be a finite number"),
])
def test_out_of_range_values_fail_naming_the_field(items, needle):
    with pytest.raises(BadInput, match=needle):
        TrainConfig.load("smoke", items)


def test_an_int_field_set_in_code_must_be_an_integer():
    with pytest.raises(BadInput, match="batch_size must be an integer, got 2.5"):
        TrainConfig(dataset="x", batch_size=2.5)
    with pytest.raises(BadInput, match="seed must be a finite number, got True"):
        TrainConfig(dataset="x", seed=True)


def test_the_rollout_settings_are_one_decode_config_checked_by_it():
    cfg = TrainConfig.load("smoke", ["method=grpo", "rollout_max_new_tokens=24", "rollout_temperature=0.7",
                                     "rollout_top_p=0.9", "rollout_top_k=5"])
    decode = cfg.rollout_decode(seed=7, batch_size=8)
    assert decode == DecodeConfig(max_new_tokens=24, temperature=0.7, top_p=0.9, top_k=5, seed=7, batch_size=8)
    assert cfg.rollout_decode() == DecodeConfig(max_new_tokens=24, temperature=0.7, top_p=0.9, top_k=5,
                                                seed=0, batch_size=1)
    # DecodeConfig's own check names the config's keys; it refuses what TrainConfig refuses
    assert DecodeConfig.problem({"top_p": 0}, prefix="rollout_") == "rollout_top_p must be in (0, 1], got 0"
    with pytest.raises(BadInput, match="config: rollout_max_new_tokens must be an integer, got 2.5"):
        TrainConfig(dataset="x", rollout_max_new_tokens=2.5)
    for bad, needle in [({"temperature": float("nan")}, "temperature must be a finite number, got nan"),
                        ({"max_new_tokens": 2.5}, "max_new_tokens must be an integer, got 2.5"),
                        ({"top_k": -1}, "top_k must be >= 0, got -1"), ({"batch_size": 0}, "batch_size must be >= 1")]:
        with pytest.raises(BadInput, match=needle):
            DecodeConfig(**bad)


def test_the_edges_of_each_range_are_accepted():
    cfg = TrainConfig.load("smoke", ["seed=0", "warmup_steps=12", "max_steps=12", "min_lr_ratio=1", "grad_clip=0",
                                     "weight_decay=0", "rollout_top_p=1", "rollout_top_k=0", "beta=0",
                                     "reward_timeout_s=0.5", "seed=4294967295"])
    assert cfg.seed == 2 ** 32 - 1 and cfg.warmup_steps == cfg.max_steps == 12
    assert TrainConfig(dataset="x").reward_timeout_s == 10.0  # a few seconds by default


def test_warmup_is_checked_against_the_steps_that_epochs_become():
    cfg = TrainConfig.load("smoke", ["max_steps=null", "epochs=1", "warmup_steps=50"])  # steps unknown yet
    cfg.check_total_steps(50)
    with pytest.raises(BadInput, match=r"warmup_steps \(50\) exceeds the run's 3 optimizer steps"):
        cfg.check_total_steps(3)
