"""reasoning-gym tasks as datasets (traces.reasoning_gym): `data import reasoning-gym`, its
splits from derived seeds, the mixture, the refusals, and a GRPO run on what it wrote."""

from __future__ import annotations

import json

import pytest
from requires import require_module

require_module("reasoning_gym")

from tunix_rt.errors import BadInput  # noqa: E402
from tunix_rt.traces.dataset import load_dataset  # noqa: E402
from tunix_rt.traces.reasoning_gym import (  # noqa: E402
    TaskImport, draw_records, make_items, shares, split_seed,
)


def _questions(ds, split):
    return [r.question for r in ds.split(split)]


def test_import_basic_arithmetic_disjoint_deterministic_splits(cli, home, tmp_path, monkeypatch):
    r = cli("data", "import", "reasoning-gym", "basic_arithmetic", "--n", "64", "--seed", "1")
    assert r.code == 0, r.err
    assert "rg-basic_arithmetic@v1: 96 records (train 64, dev 16, test 16)" in r.out
    ds = load_dataset("rg-basic_arithmetic", home)
    assert ds.manifest["splits"] == {"train": 64, "dev": 16, "test": 16}
    assert ds.manifest["importer"] == "reasoning-gym"
    qs = {s: _questions(ds, s) for s in ("train", "dev", "test")}
    assert {s: len(q) for s, q in qs.items()} == {"train": 64, "dev": 16, "test": 16}
    every = [q for s in qs.values() for q in s]
    assert len(set(every)) == len(every) == 96  # no question in two splits (nor twice in one)
    assert len({r.id for r in ds.records}) == 96
    for rec in ds.records:
        assert rec.steps == [] and rec.meta["scorer"] == "rg:basic_arithmetic"
        assert rec.meta["category"] == "basic_arithmetic" and rec.meta["rg"]["task"] == "basic_arithmetic"
        assert rec.meta["rg"]["config"]["max_terms"] == 6  # the task's defaults, written out
        assert rec.meta["rg"]["seed"] == split_seed(1, rec.meta["split"])
    seeds = ds.manifest["reasoning_gym"]["split_seeds"]
    assert len(set(seeds.values())) == 3
    # the same command again reuses the version; in another home it writes the same bytes
    again = cli("data", "import", "reasoning-gym", "basic_arithmetic", "--n", "64", "--seed", "1")
    assert again.code == 0 and "already imported as rg-basic_arithmetic@v1" in again.out
    monkeypatch.setenv("TUNIX_RT_HOME", str(tmp_path / "other"))
    assert cli("data", "import", "reasoning-gym", "basic_arithmetic", "--n", "64", "--seed", "1").code == 0
    other = load_dataset("rg-basic_arithmetic")
    assert other.sha256 == ds.sha256 and (other.path / "data.jsonl").read_bytes() == (ds.path / "data.jsonl").read_bytes()
    assert cli("data", "import", "reasoning-gym", "basic_arithmetic", "--n", "64", "--seed", "2").code == 0
    assert load_dataset("rg-basic_arithmetic@v2").sha256 != ds.sha256  # another seed, other items


@pytest.mark.parametrize("args, message", [
    (["nosuch_task"], "unknown reasoning-gym task 'nosuch_task'"),
    (["basic_arithmetic", "--config", "{bad"], "--config: not JSON"),
    (["basic_arithmetic", "--config", '{"max_termz": 3}'], "unknown field 'max_termz'"),
    (["basic_arithmetic", "--config", '{"min_terms": 0}'], "min_terms must be positive"),
    (["basic_arithmetic", "--config", '{"seed": 3}'], "'seed' is set by the importer"),
    (["basic_arithmetic", "--config", "[1]"], "expected a JSON object"),
    (["basic_arithmetic", "--n", "0"], "--n 0: must be in [1, 1000000]"),
    (["basic_arithmetic", "--n", "1000001"], "--n 1000001"),
    (["basic_arithmetic", "--test-n", "-1"], "--test-n -1"),
    (["basic_arithmetic", "--seed", "-1"], "--seed -1"),
    (["basic_arithmetic,leg_counting", "--weights", "1"], "1 weight(s) for 2 task(s)"),
    (["basic_arithmetic,leg_counting", "--weights", "1,0"], "each must be a positive number"),
    (["basic_arithmetic,leg_counting", "--config", '{"min_terms": 2}'], "key it by task name"),
    (["basic_arithmetic,basic_arithmetic"], "names a task twice"),
    (["graph_color"], "no single answer"),  # a verifier without an oracle answer
    (["basic_arithmetic", "--name", ".hidden"], "--name '.hidden'"),
])
def test_bad_requests_are_refused_before_anything_is_written(cli, home, args, message):
    base = {"--n": "8", "--seed": "1"}
    extra = [a for k, v in base.items() if k not in args for a in (k, v)]
    r = cli("data", "import", "reasoning-gym", *args, *extra)
    assert r.code == 2, (r.out, r.err)
    assert message in r.err
    assert not home.datasets.exists() or list(home.datasets.iterdir()) == []


def test_options_of_one_importer_are_refused_by_the_other(cli, home):
    r = cli("data", "import", "generic", "x.jsonl", "--name", "x", "--n", "3")
    assert r.code == 2 and "--n is for `data import reasoning-gym` only" in r.err
    r = cli("data", "import", "reasoning-gym", "basic_arithmetic", "--n", "3")
    assert r.code == 2 and "needs --n and --seed" in r.err


def test_a_question_space_too_small_fails_naming_the_task(home):
    tiny = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"],
            "allow_parentheses": False, "allow_negation": False}  # at most 100 distinct questions
    with pytest.raises(BadInput, match="basic_arithmetic: only .* new distinct questions"):
        draw_records(TaskImport(("basic_arithmetic",), 200, 1, tiny))


def test_mixture_shares_and_interleaving():
    assert shares(10, [3.0, 1.0]) == [8, 2]  # 7.5 / 2.5: the tie goes to the earlier task
    assert shares(7, [1.0, 1.0, 1.0]) == [3, 2, 2] and sum(shares(101, [0.2, 0.3, 0.5])) == 101
    req = TaskImport(("basic_arithmetic", "leg_counting"), 12, 5, {"leg_counting": {"max_animals": 3}},
                     weights=(2.0, 1.0), dev_n=3, test_n=0)
    records, account = draw_records(req)
    assert account["counts"] == {"test": {"basic_arithmetic": 0, "leg_counting": 0},
                                 "dev": {"basic_arithmetic": 2, "leg_counting": 1},
                                 "train": {"basic_arithmetic": 8, "leg_counting": 4}}
    train = [r["meta"]["category"] for r in records if r["meta"]["split"] == "train"]
    assert train[:3].count("leg_counting") == 1 and train[-3:].count("leg_counting") == 1  # spread out
    legs = [r for r in records if r["meta"]["category"] == "leg_counting"]
    assert all(r["meta"]["rg"]["config"]["max_animals"] == 3 for r in legs)
    assert all(r["meta"]["scorer"] == "rg:leg_counting" for r in legs)


def test_make_items_is_deterministic_and_keeps_the_config():
    a = make_items("basic_arithmetic", 5, 11, {"max_terms": 2})
    assert a == make_items("basic_arithmetic", 5, 11, {"max_terms": 2})
    assert a != make_items("basic_arithmetic", 5, 12, {"max_terms": 2})
    assert [r["id"] for r in a] == [f"rg-basic_arithmetic-11-{i}" for i in range(5)]
    for r in a:
        assert r["meta"]["rg"]["metadata"]["num_terms"] == 2 and r["meta"]["rg"]["config"]["max_terms"] == 2
        json.dumps(r, allow_nan=False)  # plain JSON
    with pytest.raises(BadInput, match="n must be an integer"):
        make_items("basic_arithmetic", 0, 1, {})


def test_a_task_that_sets_the_decimal_context_leaves_the_callers_alone():
    """decimal_arithmetic's generator sets the thread's decimal precision to its config's (12):
    drawing and scoring its items must leave the caller's context as it was (a GRPO run with a
    curriculum draws items in-process, and the calculator's rounding then failed)."""
    import decimal

    from tunix_rt.tools.calculator import calculate
    from tunix_rt.traces.reasoning_gym import score

    before = decimal.getcontext().prec
    items = make_items("decimal_arithmetic", 4, 3, {})
    assert decimal.getcontext().prec == before
    r = items[0]
    assert score(r["meta"], r["question"], r["answer"], r["answer"]) == 1.0
    assert decimal.getcontext().prec == before
    assert calculate("123456789.5 / 3") == ("41152263.1667", False)  # quantized to 4 places past 9 digits


def test_enum_configs_fractions_and_failing_generators():
    """A config field of enum members (aiw's task_types) survives JSON and comes back as the
    task's enum; metadata holding a Fraction (gsm_symbolic) is kept as its exact string and the
    gold answer still scores 1.0; a generator that raises is named, not a traceback."""
    from reasoning_gym.logic.aiw import TaskType

    from tunix_rt.traces.reasoning_gym import _typed, score, task_config

    aiw = make_items("aiw", 3, 4, {"task_types": ["siblings"], "task_type_weights": [1.0]})
    assert aiw[0]["meta"]["rg"]["config"]["task_types"] == ["siblings"]
    assert _typed("aiw", aiw[0]["meta"]["rg"]["config"])["task_types"] == [TaskType.SIBLINGS]
    assert all(score(r["meta"], r["question"], r["answer"], r["answer"]) == 1.0 for r in aiw)
    assert all("sister" in r["question"] or "brother" in r["question"] for r in aiw)
    assert task_config("aiw", {})["task_types"] == ["siblings", "friends", "colleagues"]
    with pytest.raises(BadInput, match="task_types: 'cousins' is not one of 'siblings'"):
        task_config("aiw", {"task_types": ["cousins"]})
    sym = make_items("gsm_symbolic", 16, 12345, {})
    fractions = [r for r in sym if any("/" in str(v) for v in r["meta"]["rg"]["metadata"].values())]
    assert fractions, "no item of this seed holds a Fraction: pick another seed"
    with pytest.raises(BadInput, match=r"aiw item 0 \(seed 4\): reasoning-gym's generator failed .*ValueError"):
        make_items("aiw", 1, 4, {"task_types": ["siblings", "friends"], "task_type_weights": [1.0]})


def test_empty_steps_only_in_a_record_that_names_a_scorer():
    from tunix_rt.traces.schema import RecordError, validate_trace

    rec = make_items("basic_arithmetic", 1, 1, {})[0]
    assert validate_trace(rec).steps == []
    no_scorer = {**rec, "meta": {k: v for k, v in rec["meta"].items() if k != "scorer"}}
    with pytest.raises(RecordError, match="steps: empty list"):
        validate_trace(no_scorer)


def _rg_dataset(cli, n="16"):
    r = cli("data", "import", "reasoning-gym", "basic_arithmetic", "--n", n, "--seed", "3", "--name", "arith",
            "--config", '{"max_terms": 2, "max_digits": 1}')
    assert r.code == 0, r.err


def test_sft_refuses_a_dataset_without_reasoning(cli, home, tiny_tok):
    from tunix_rt.train.common import load_data
    from tunix_rt.train.config import TrainConfig

    _rg_dataset(cli)
    cfg = TrainConfig.load("smoke", ["dataset=arith", "max_steps=1", "warmup_steps=0"])
    with pytest.raises(BadInput, match=r"16 record\(s\) without reasoning steps .*\(use method=grpo"):
        load_data(cfg, home, tiny_tok)


def test_grpo_smoke_on_a_reasoning_gym_dataset(cli, home):
    require_module("torch")
    _rg_dataset(cli)
    r = cli("train", "--config", "smoke", "dataset=arith", "method=grpo", "max_steps=1", "warmup_steps=0", "engine=torch",
            "device=cpu", "max_seq_len=160", "rollout_max_new_tokens=8", "rl_prompts=2", "group_size=2",
            "batch_size=4", "eval_interval=0", "save_interval=0", "eval_limit=4")
    assert r.code == 0, r.err
    run = sorted((home.root / "runs").iterdir())[-1]
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "succeeded" and manifest["summary"]["method"] == "grpo"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("rollout_accuracy" in row for row in rows)
