"""GRPO's prompt selection (train.curriculum): the level controller's moves on a scripted
accuracy sequence, the generator config of a level and its online prompts (seeds outside the
dataset's, held-out questions never trained), the pass-rate band and its redraw budget (one
rule with dapo's zero-variance filter), the config fields, and `tunix-rt train --config smoke
dataset=<reasoning-gym dataset> method=grpo curriculum=…` on the torch and the JAX engine,
with a stop + resume that gives the uninterrupted run's weights, levels and prompts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from requires import require_module

from tunix_rt.errors import BadInput

require_module("reasoning_gym")

TASK = "basic_arithmetic"


def records(n: int, seed: int = 1, config: dict | None = None, task: str = TASK) -> list:
    from tunix_rt.traces import reasoning_gym as rg
    from tunix_rt.traces.schema import validate_trace

    return [validate_trace(d) for d in rg.make_items(task, n, seed, config or {})]


def group(record, correct: list[int], rewards: list[float] | None = None):
    from tunix_rt.train.grpo import Group

    c = np.array(correct, bool)
    r = np.array(rewards if rewards is not None else c.astype(float))
    return Group(record, [], [None] * len(c), r, {}, c, np.ones_like(c))


def curriculum(spec=None, tasks=None, prompt_of=lambda r: [1, 2, 3], held_out=frozenset()):
    from tunix_rt.traces import reasoning_gym as rg
    from tunix_rt.traces.schema import validate_trace
    from tunix_rt.train.curriculum import Curriculum, CurriculumSpec

    def make_items(task, n, seed, config):
        return [validate_trace(d) for d in rg.make_items(task, n, seed, config)]

    return Curriculum(spec or CurriculumSpec(window=4, raise_at=0.75, lower_below=0.25),
                      tasks if tasks is not None else {TASK: {}}, 0, make_items, prompt_of, held_out=held_out)


# ----------------------------------------------------------------------------- the levels
def test_decide_at_the_thresholds_and_the_ends():
    from tunix_rt.train.curriculum import CurriculumSpec, decide

    spec = CurriculumSpec(raise_at=0.75, lower_below=0.25)
    assert decide(spec, None, 2, 4) == 0  # window not full yet
    assert decide(spec, 0.75, 2, 4) == 1 and decide(spec, 0.74, 2, 4) == 0  # at raise_at: up
    assert decide(spec, 0.25, 2, 4) == 0 and decide(spec, 0.24, 2, 4) == -1  # below lower_below: down
    assert decide(spec, 1.0, 4, 4) == 0 and decide(spec, 0.0, 0, 4) == 0  # the top and the floor hold


def test_levels_follow_a_scripted_accuracy_sequence():
    """window 4: each step adds one group of 4 answers; a move empties the window."""
    cur = curriculum()
    rec = records(1)[0]
    assert cur.levels == {TASK: 0} and cur.top == {TASK: 4}  # basic_arithmetic: num_terms has 5 levels
    script = [  # answers of the step -> (level after, move)
        ([1, 1, 1, 0], (1, 1)),      # 0.75 >= raise_at: up
        ([1, 1, 0, 0], (1, 0)),      # 0.5: stays
        ([1, 1, 1, 1], (2, 1)),      # 1.0: up
        ([0, 0, 0, 0], (1, -1)),     # 0.0 < 0.25: down
        ([0, 1, 0, 0], (1, 0)),      # 0.25: not below lower_below
        ([0, 0, 0, 0], (0, -1)),     # down to the floor
        ([0, 0, 0, 0], (0, 0)),      # the floor holds
    ]
    seen = []
    for answers, _ in script:
        cur.observe([group(rec, answers)])
        row = cur.end_step()
        seen.append((row[f"curriculum_level_{TASK}"], row[f"curriculum_move_{TASK}"]))
        assert row["curriculum_moves"] == abs(row[f"curriculum_move_{TASK}"])
    assert seen == [want for _, want in script]
    assert cur.state()["moves"] == {TASK: 4}


def test_the_window_must_fill_before_a_move_and_rolls():
    from tunix_rt.train.curriculum import CurriculumSpec

    cur = curriculum(CurriculumSpec(window=6, raise_at=0.5, lower_below=0.2))
    rec = records(1)[0]
    cur.observe([group(rec, [1, 1, 1, 1])])
    row = cur.end_step()
    assert row[f"curriculum_level_{TASK}"] == 0 and row[f"curriculum_window_accuracy_{TASK}"] == 1.0  # 4 < 6
    cur.observe([group(rec, [0, 0, 0, 0])])  # window: the last 6 = 1,1,0,0,0,0
    row = cur.end_step()
    assert row[f"curriculum_window_accuracy_{TASK}"] == pytest.approx(2 / 6) and row[f"curriculum_move_{TASK}"] == 0
    assert cur.windows[TASK] == [1, 1, 0, 0, 0, 0]


def test_tasks_move_apart_and_the_state_round_trips():
    other = "chain_sum"
    cur = curriculum(tasks={TASK: {}, other: {}})
    a, b = records(1)[0], records(1, task=other)[0]
    cur.observe([group(a, [1, 1, 1, 1]), group(b, [1, 0, 0, 0])])
    row = cur.end_step()
    assert (row[f"curriculum_level_{TASK}"], row[f"curriculum_level_{other}"]) == (1, 0)
    again = curriculum(tasks={TASK: {}, other: {}})
    again.load_state(json.loads(json.dumps(cur.state())))
    assert again.state() == cur.state()
    with pytest.raises(BadInput, match="curriculum tasks"):
        curriculum().load_state(cur.state())


# ----------------------------------------------------------------------------- online prompts
def test_a_level_is_the_curriculum_config_over_the_dataset_config():
    cur = curriculum(tasks={TASK: {"allow_parentheses": False, "seed": 5, "size": 9}})
    low = cur.config_of(TASK)
    assert (low["min_terms"], low["max_terms"], low["min_digits"], low["max_digits"]) == (2, 2, 1, 1)
    assert low["allow_parentheses"] is False and "seed" not in low and "size" not in low
    cur.levels[TASK] = 3
    high = cur.config_of(TASK)
    assert (high["min_terms"], high["max_terms"], high["max_digits"]) == (5, 5, 4)
    inclusive = curriculum(json_spec(ranges="inclusive"))
    inclusive.levels[TASK] = 3
    assert (inclusive.config_of(TASK)["min_terms"], inclusive.config_of(TASK)["max_terms"]) == (2, 5)


def json_spec(**over):
    from tunix_rt.train.curriculum import CurriculumSpec

    return CurriculumSpec.from_mapping({"window": 4, **over})


def test_online_prompts_replace_the_picked_records_at_their_level_with_fresh_seeds():
    from tunix_rt.train.curriculum import ONLINE_SEED_LOW, ONLINE_SEED_SPAN, online_seed

    data = records(3)
    cur = curriculum()
    cur.levels[TASK] = 2
    picked = [(r, [0]) for r in data]
    out = cur.prompts(picked, step=5, draw=1)
    seed = online_seed(0, TASK, 5, 1)
    assert ONLINE_SEED_LOW <= seed < ONLINE_SEED_LOW + ONLINE_SEED_SPAN and seed + 3 < 2 ** 32
    assert [r.id for r, _ in out] == [f"rg-{TASK}-{seed}-{i}" for i in range(3)]
    assert all(r.meta["rg"]["config"]["max_terms"] == 4 for r, _ in out)  # level 2: 4 terms
    assert [p for _, p in out] == [[1, 2, 3]] * 3
    assert [r.id for r, _ in cur.prompts(picked, step=5, draw=1)] == [r.id for r, _ in out]  # deterministic
    assert online_seed(0, TASK, 5, 2) != seed and online_seed(1, TASK, 5, 1) != seed


def test_a_mixture_replaces_each_pick_by_its_own_task_at_its_own_level():
    other = "chain_sum"
    cur = curriculum(tasks={TASK: {}, other: {}})
    cur.levels[other] = 3
    picked = [(r, [0]) for r in (records(1)[0], records(1, task=other)[0], records(2)[1])]
    out = cur.prompts(picked, 0, 0)
    assert [r.meta["rg"]["task"] for r, _ in out] == [TASK, other, TASK]  # the dataset's mixture
    assert [r.meta["rg"]["config"] == cur.config_of(r.meta["rg"]["task"]) for r, _ in out] == [True] * 3
    assert out[1][0].meta["rg"]["config"] != curriculum(tasks={other: {}}).config_of(other)  # level 3, not 0


def test_held_out_questions_and_overlong_prompts_keep_the_dataset_record():
    from tunix_rt.train.curriculum import online_seed

    data = records(2)
    fresh = records(2, seed=online_seed(0, TASK, 0, 0), config=curriculum().config_of(TASK))
    cur = curriculum(held_out={fresh[0].question})
    out = cur.prompts([(r, [0]) for r in data], 0, 0)
    assert [r.id for r, _ in out] == [data[0].id, fresh[1].id]
    too_long = curriculum(prompt_of=lambda r: None)
    assert [r.id for r, _ in too_long.prompts([(r, [0]) for r in data], 0, 0)] == [r.id for r in data]
    assert cur.end_step()["curriculum_kept_dataset"] == 1 and too_long.end_step()["curriculum_kept_dataset"] == 2


def test_mix_keeps_an_exact_share_of_dataset_records_that_do_not_move_the_levels():
    from tunix_rt.train.curriculum import online_seed

    data = records(8)
    cur = curriculum(json_spec(mix=0.25))
    out = cur.prompts([(r, [0]) for r in data], 0, 0)
    kept = [i for i, (r, _) in enumerate(out) if r.id == data[i].id]
    assert kept == [3, 7] and cur.online == [i not in kept for i in range(8)]  # every fourth pick
    fresh = records(6, seed=online_seed(0, TASK, 0, 0), config=cur.config_of(TASK))
    assert [r.id for i, (r, _) in enumerate(out) if i not in kept] == [r.id for r in fresh]
    assert [cur.mixed_at(i) for i in range(4)] == [False, False, False, True]
    half = curriculum(json_spec(mix=0.5))
    assert [half.mixed_at(i) for i in range(4)] == [False, True, False, True]
    # the kept records are right, the online ones wrong: the window holds only the online answers
    cur.observe([group(r, [int(i in kept)] * 4) for i, (r, _) in enumerate(out)], cur.online)
    assert cur.windows[TASK] == [0, 0, 0, 0]
    row = cur.end_step()
    assert row["curriculum_mixed"] == 2 and row["curriculum_kept_dataset"] == 0
    assert row[f"curriculum_window_accuracy_{TASK}"] == 0.0 and cur.end_step()["curriculum_mixed"] == 0
    assert "curriculum_mixed" not in curriculum().end_step()  # only where mix > 0
    with pytest.raises(ValueError, match="2 groups for the 8 picks"):
        cur.observe([group(data[0], [1]), group(data[1], [1])], cur.online)


def test_online_seeds_pass_over_the_dataset_own_item_seeds():
    from tunix_rt.train.curriculum import dataset_seeds, online_seed

    first = online_seed(0, TASK, 5, 1, 3)
    assert online_seed(0, TASK, 5, 1, 3, [(first - 10, first - 1), (first + 3, first + 9)]) == first  # missed
    moved = online_seed(0, TASK, 5, 1, 3, [(first + 2, first + 2)])  # its third item's seed is taken
    assert moved != first and not moved <= first + 2 <= moved + 2
    data = records(3, seed=first + 1)  # a dataset drawn right where the online items would fall
    spans = dataset_seeds(data)
    assert spans == {TASK: [(first + 1, first + 3)]}
    cur = curriculum()
    cur.avoid = spans
    out = cur.prompts([(r, [0]) for r in data], step=5, draw=1)
    seeds = {int(r.id.rsplit("-", 2)[1]) for r, _ in out}
    assert seeds == {online_seed(0, TASK, 5, 1, 3, spans[TASK])} and first not in seeds


# ----------------------------------------------------------------------------- filtering
def test_the_pass_band_and_dapo_are_one_keep_rule():
    from tunix_rt.train.curriculum import keep_rule

    rec = records(1)[0]
    none, half, all_ = group(rec, [0, 0, 0, 0]), group(rec, [1, 1, 0, 0]), group(rec, [1, 1, 1, 1])
    assert keep_rule("grpo", None) is None  # nothing to filter: every group trains
    band = keep_rule("grpo", [0.1, 0.9])
    assert [band(g, g.rewards) for g in (none, half, all_)] == [False, True, False]
    edges = keep_rule("grpo", [0.5, 1.0])  # the band is closed
    assert [edges(g, g.rewards) for g in (none, half, all_)] == [False, True, True]
    dapo = keep_rule("dapo", None)  # reward variance, whatever the answers
    varied = group(rec, [0, 0, 0, 0], rewards=[0.5, 0.0, 0.5, 0.5])
    assert [dapo(g, g.rewards) for g in (none, half, all_, varied)] == [False, True, False, True]
    both = keep_rule("dapo", [0.0, 0.25])
    assert [both(g, g.rewards) for g in (none, half, varied)] == [False, False, True]


def test_the_band_draws_within_the_budget():
    from tunix_rt.train.advantages import select_informative
    from tunix_rt.train.curriculum import keep_rule

    rec = records(1)[0]
    stream = [group(rec, a) for a in ([0, 0], [1, 0], [1, 1], [0, 0], [0, 1], [1, 0])]
    keep = keep_rule("grpo", [0.2, 0.8])
    batch = select_informative(((g, g.rewards) for g in stream), 2, 6, keep=keep)
    assert batch.groups == [stream[1], stream[4]] and batch.drawn == 5 and batch.filled  # lazily: not the 6th
    short = select_informative(((g, g.rewards) for g in stream), 2, 4, keep=keep)
    assert short.groups == [stream[1]] and short.drawn == 4 and not short.filled  # the budget ran out


@pytest.mark.parametrize("over,said", [
    (["curriculum={window: 0}"], "curriculum.window must be an integer >= 1"),
    (["curriculum={raise_at: 0.2, lower_below: 0.3}"], "lower_below (0.3) must be below raise_at (0.2)"),
    (["curriculum={levels: 3}"], "unknown key(s) ['levels']"),
    (["curriculum={ranges: last_k}"], "curriculum.ranges must be one of upper_bound|inclusive"),
    (["curriculum=[1]"], "curriculum must be a mapping"),
    (["curriculum={start_level: -1}"], "curriculum.start_level must be an integer >= 0, a mapping"),
    (["curriculum={start_level: near}"], "curriculum.start_level must be an integer >= 0, a mapping"),
    (["curriculum={start_level: {chain_sum: 1.5}}"], "curriculum.start_level must be an integer >= 0, a mapping"),
    (["curriculum={start_level: {1: 2}}"], "curriculum.start_level must be an integer >= 0, a mapping"),
    (["curriculum={mix: 1}"], "curriculum.mix must be a number in [0, 1)"),
    (["curriculum={mix: -0.1}"], "curriculum.mix must be a number in [0, 1)"),
    (["curriculum={mix: half}"], "curriculum.mix must be a number in [0, 1)"),
    (["filter_pass_rate=[0.9, 0.1]"], "filter_pass_rate must be [low, high]"),
    (["filter_pass_rate=[0.1, 2]"], "filter_pass_rate must be [low, high]"),
    (["filter_pass_rate=[0.1]"], "filter_pass_rate must be [low, high]"),
    (["filter_pass_rate=[a, b]"], "filter_pass_rate must be a list of numbers"),
    (["method=sft", "curriculum=true"], "method=sft as configured has none"),
    (["method=sft", "filter_pass_rate=[0, 1]"], "method=sft as configured has none"),
    (["method=dpo", "pairs=dataset", "curriculum=true"], "method=dpo as configured has none"),
    (["method=distill", "teacher=tiny-gemma3", "kd_on_policy=true", "filter_pass_rate=[0, 1]"],
     "method=distill as configured has none"),
])
def test_config_refuses_bad_settings_naming_the_field(over, said):
    from tunix_rt.train.config import TrainConfig

    with pytest.raises(BadInput) as e:
        TrainConfig.load("smoke", ["method=grpo", *over])
    assert said in str(e.value)


def test_config_resolves_the_defaults():
    from tunix_rt.train.config import TrainConfig

    cfg = TrainConfig.load("smoke", ["method=grpo", "curriculum=true", "filter_pass_rate=0.1,0.9"])
    assert cfg.curriculum == {"window": 32, "raise_at": 0.75, "lower_below": 0.25, "start_level": 0,
                              "ranges": "upper_bound", "mix": 0.0}
    assert cfg.filter_pass_rate == [0.1, 0.9]
    off = TrainConfig.load("smoke", ["method=grpo", "curriculum=false"])
    assert off.curriculum is None and off.filter_pass_rate is None
    assert TrainConfig.load("smoke", ["method=sft", "curriculum=false"]).curriculum is None


# ----------------------------------------------------------------------------- runs
def import_rg(monkeypatch, capsys) -> str:
    """`tunix-rt data import reasoning-gym basic_arithmetic --n 64 --seed 1`: its dataset name."""
    from cli_testlib import cli_main

    code, _out, err = cli_main(monkeypatch, capsys, "data", "import", "reasoning-gym", TASK, "--n", "64", "--seed", "1")
    assert code == 0, err[-2000:]
    return f"rg-{TASK}"


def smoke_args(dataset: str, *extra: str) -> list[str]:
    return ["--config", "smoke", f"dataset={dataset}", "method=grpo", "max_steps=2",
            "curriculum={window: 4, start_level: 2}", "rl_prompts=2", "group_size=2",
            "rollout_max_new_tokens=4", "max_seq_len=128", "eval_limit=1", "batch_size=4",
            "warmup_steps=0", "device=cpu", *extra]


def check_curriculum_run(run: Path, order: bool = True) -> list[dict]:
    """A random tiny model answers nothing: from level 2 the window (4 = 2 prompts x 2) is full
    after every step and lowers the level, 2 -> 1 -> 0; step 2 drew its prompts at level 1
    (order: data_order.jsonl names them)."""
    from tunix_rt.home import Home
    from tunix_rt.traces.dataset import load_dataset
    from tunix_rt.train.curriculum import dataset_seeds, online_seed
    from tunix_rt.train.metrics import read_jsonl

    assert json.loads((run / "run_manifest.json").read_text())["status"] == "succeeded"
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert [(r["step"], r[f"curriculum_level_{TASK}"], r[f"curriculum_move_{TASK}"]) for r in rows] == \
        [(1, 1, -1), (2, 0, -1)]
    assert all("filter_skipped_share" not in r and r["curriculum_moves"] == 1 for r in rows)  # no filter
    avoid = dataset_seeds(load_dataset(f"rg-{TASK}", Home.resolve()).records)[TASK]
    assert len(avoid) == 3  # train, dev, test: each from its own seed
    if order:
        assert [o["ids"] for o in read_jsonl(run / "data_order.jsonl")] == \
            [[f"rg-{TASK}-{online_seed(0, TASK, s, 0, 2, avoid)}-{i}" for i in range(2)] for s in range(2)]
    state = json.loads(sorted((run / "checkpoints").glob("step-*/state.json"))[-1].read_text())
    assert state["curriculum"]["levels"] == {TASK: 0}
    return rows


START_LINE = ("curriculum: basic_arithmetic at level 2 of 0..4: max_digits 3, max_terms 4, min_digits 3, min_terms 4 "
              "(the dataset's: max_digits 4, max_terms 6, min_digits 1, min_terms 2)")


def test_smoke_grpo_with_a_curriculum_on_torch(home, monkeypatch, capsys):
    from cli_testlib import cli_main

    code, _out, err = cli_main(monkeypatch, capsys, "train", *smoke_args(import_rg(monkeypatch, capsys), "engine=torch"))
    assert code == 0, err[-3000:]
    assert START_LINE in err.splitlines()  # what the run trains on, beside the dataset it is tested on
    check_curriculum_run(next(p for p in home.runs.iterdir() if not p.name.startswith(".")))


def test_a_run_with_mix_trains_on_dataset_records_that_do_not_move_the_levels(home, monkeypatch, capsys):
    """mix 0.5 of 2 prompts a step: the second pick is the dataset's own record (data_order
    names it), the first an online item at the level. Only the online item's 2 answers a step
    enter the window of 4, so it fills at step 2 and the level goes 2 -> 1 there (were the
    dataset's answers counted, it would fill and move at step 1)."""
    from cli_testlib import cli_main
    from tunix_rt.traces.dataset import load_dataset
    from tunix_rt.train.curriculum import dataset_seeds, online_seed
    from tunix_rt.train.metrics import read_jsonl

    dataset = import_rg(monkeypatch, capsys)
    args = [a if not a.startswith("curriculum=") else "curriculum={window: 4, start_level: 2, mix: 0.5}"
            for a in smoke_args(dataset, "engine=torch")]
    code, _out, err = cli_main(monkeypatch, capsys, "train", *args)
    assert code == 0, err[-3000:]
    run = next(p for p in home.runs.iterdir() if not p.name.startswith("."))
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert [(r[f"curriculum_level_{TASK}"], r["curriculum_mixed"]) for r in rows] == [(2, 1), (1, 1)]
    ds = load_dataset(dataset, home)
    avoid, train = dataset_seeds(ds.records)[TASK], {r.id for r in ds.split("train")}
    order = [o["ids"] for o in read_jsonl(run / "data_order.jsonl")]
    assert [ids[0] for ids in order] == [f"rg-{TASK}-{online_seed(0, TASK, s, 0, 1, avoid)}-0" for s in range(2)]
    assert all(ids[1] in train for ids in order)


def test_a_run_names_each_level_beside_the_datasets_config():
    """reasoning-gym's levels are not its defaults, in either direction: chain_sum's level 0 is
    easier than the default a test set is drawn with, lcm's harder (what the 25.5 measurement
    trained on); the summary and the run's start lines say so. Only the fields that differ."""
    from tunix_rt.traces import reasoning_gym as rg
    from tunix_rt.train.curriculum import Curriculum, CurriculumSpec

    cur = curriculum(tasks={t: rg.task_config(t, {}) for t in ("chain_sum", "lcm")})
    got = cur.summary()["curriculum_tasks"]
    assert got["chain_sum"]["level_config"] == {"max_digits": 1, "max_terms": 2}
    assert got["chain_sum"]["dataset_config"] == {"max_digits": 4, "max_terms": 6}
    assert got["lcm"]["level_config"] == {"max_value": 1000, "min_value": 100}
    assert got["lcm"]["dataset_config"] == {"max_value": 100, "min_value": 1}
    assert Curriculum.describe(got) == [
        "curriculum: chain_sum at level 0 of 0..10: max_digits 1, max_terms 2 (the dataset's: max_digits 4, max_terms 6)",
        "curriculum: lcm at level 0 of 0..3: max_value 1000, min_value 100 (the dataset's: max_value 100, min_value 1)"]
    lvl1 = {"min_digits": 2, "max_digits": 2, "min_terms": 3, "max_terms": 3}  # a dataset at level 1 (upper_bound)
    same = curriculum(spec=CurriculumSpec(start_level=1), tasks={"chain_sum": {**rg.task_config("chain_sum", {}), **lvl1}})
    assert same.summary()["curriculum_tasks"]["chain_sum"]["level_config"] == {}
    assert Curriculum.describe(same.summary()["curriculum_tasks"]) == [
        "curriculum: chain_sum at level 1 of 0..10: the dataset's own config"]


def test_start_level_per_task_or_nearest_the_datasets_config():
    """start_level: nearest starts each task at the level nearest the config its dataset (and
    test split) was drawn with: chain_sum's default (2-6 terms of 1-4 digits) is nearest level 2
    (4 terms of 3 digits), decimal_arithmetic's nearest 1, lcm's (values 1-100) below every level,
    so 0. A mapping sets the tasks it names; a task it does not have, or a level above a task's
    top, is refused naming them; an integer is capped at each task's top."""
    from tunix_rt.traces import reasoning_gym as rg
    from tunix_rt.train.curriculum import CurriculumSpec

    tasks = {t: rg.task_config(t, {}) for t in ("chain_sum", "decimal_arithmetic", "lcm")}

    def levels(start):
        return curriculum(spec=CurriculumSpec.from_mapping({"start_level": start}), tasks=tasks).levels

    assert levels("nearest") == {"chain_sum": 2, "decimal_arithmetic": 1, "lcm": 0}
    assert levels({"chain_sum": 10, "lcm": 3}) == {"chain_sum": 10, "decimal_arithmetic": 0, "lcm": 3}
    assert levels(5) == {"chain_sum": 5, "decimal_arithmetic": 3, "lcm": 3}
    with pytest.raises(BadInput, match=r"names task\(s\) \['gcd'\] the dataset does not have"):
        levels({"gcd": 1})
    with pytest.raises(BadInput, match=r"no such level for \{'lcm': '4 \(its top is 3\)'\}"):
        levels({"lcm": 4})
    # a dataset drawn at a level is nearest that level, whatever its neighbours
    lvl3 = {"min_digits": 4, "max_digits": 4, "min_terms": 5, "max_terms": 5}
    at3 = curriculum(spec=CurriculumSpec.from_mapping({"start_level": "nearest"}),
                     tasks={"chain_sum": {**tasks["chain_sum"], **lvl3}})
    assert at3.levels == {"chain_sum": 3} and at3.summary()["curriculum_tasks"]["chain_sum"]["level_config"] == {}


@pytest.mark.parametrize("method", [("method=rft", "rft_round_steps=1"), ("method=dpo", "pairs=rollouts")],
                         ids=["rft", "dpo-rollouts"])
def test_rft_and_rollout_pairs_move_the_curriculum_as_grpo_does(home, monkeypatch, capsys, method):
    """The other methods that sample GRPO's rollouts: the tiny model answers nothing, so RFT
    keeps nothing and each step samples a new round (a round is the curriculum's step), and
    rollout pairs find no pair; the levels go 2 -> 1 -> 0 as GRPO's do, from the same online
    prompts (RFT names them in data_order.jsonl; a step with no pair names none)."""
    from cli_testlib import cli_main

    code, _out, err = cli_main(monkeypatch, capsys, "train",
                               *smoke_args(import_rg(monkeypatch, capsys), "engine=torch", *method))
    assert code == 0, err[-3000:]
    run = next(p for p in home.runs.iterdir() if not p.name.startswith("."))
    assert json.loads((run / "run_manifest.json").read_text())["config"]["method"] == method[0].split("=")[1]
    rows = check_curriculum_run(run, order=method[0] == "method=rft")
    assert all(r["groups_drawn"] == 2 for r in rows)
    assert START_LINE in err.splitlines()
    summary = json.loads((run / "run_manifest.json").read_text())["summary"]
    assert summary["curriculum_tasks"][TASK]["level"] == 2  # where it started


@pytest.mark.jax
def test_smoke_grpo_with_a_curriculum_on_jax(home, monkeypatch, capsys):
    from cli_testlib import cli_main

    require_module("jax")
    code, _out, err = cli_main(monkeypatch, capsys, "train", *smoke_args(import_rg(monkeypatch, capsys), "engine=jax"))
    assert code == 0, err[-3000:]
    check_curriculum_run(next(p for p in home.runs.iterdir() if not p.name.startswith(".")))


def test_stop_and_resume_keeps_the_levels_and_is_bit_exact(home, monkeypatch, capsys):
    """Stopped after step 1 (checkpoint step-000001: level 1), resumed: the same prompts,
    levels, rewards and final weights as an uninterrupted run; with a pass-rate band."""
    from safetensors.numpy import load_file

    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.driver import train
    from tunix_rt.train.metrics import read_jsonl
    from tunix_rt.train.run import RunStopped

    over = [a for a in smoke_args(import_rg(monkeypatch, capsys), "engine=torch", "lora_dropout=0.1",
                                  "filter_pass_rate=[0, 0.5]") if a not in ("--config", "smoke")]
    cfg = TrainConfig.load("smoke", over)
    with pytest.raises(RunStopped):
        train(cfg, home, should_stop=lambda: True)
    run = next(p for p in home.runs.iterdir() if not p.name.startswith("."))
    assert json.loads((run / "checkpoints/step-000001/state.json").read_text())["curriculum"]["levels"] == {TASK: 1}
    train(cfg, home, resume=run.name)
    ref = train(cfg, home)
    got = load_file(str(run / "final/adapter/adapter_model.safetensors"))
    want = load_file(str(ref / "final/adapter/adapter_model.safetensors"))
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
    keys = ("step", "loss", "reward", f"curriculum_level_{TASK}", "filter_skipped_share", "groups_drawn")
    rows = lambda d: [tuple(r[k] for k in keys) for r in read_jsonl(d / "metrics.jsonl") if "loss" in r]
    assert rows(run) == rows(ref) and [r[3] for r in rows(ref)] == [1, 0]
    assert read_jsonl(run / "data_order.jsonl") == read_jsonl(ref / "data_order.jsonl")


def test_the_band_filters_any_dataset_and_a_step_that_keeps_nothing_still_runs(home, tmp_path):
    """Plain traces (no task, a numeric answer, as GSM8K): the tiny model answers nothing, so
    a band [0.5, 1] skips every group of the dapo_max_draws x rl_prompts budget, and [0, 0.5]
    keeps the first rl_prompts."""
    import train_testlib
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.train.curriculum import keep_rule
    from tunix_rt.train.grpo import GRPO
    from tunix_rt.train.torch_engine import TorchEngine

    cfg = train_testlib.rl_cfg(tmp_path, engine="torch", filter_pass_rate=[0.5, 1.0], dapo_max_draws=2)
    tok = load_tokenizer(cfg.model, home)
    engine, method = TorchEngine(cfg), GRPO(cfg, home, tok)
    engine.devices()
    engine.setup(ensure_model(cfg.model, home), tok)
    row, ids = method.step(engine, 0, 1e-2)
    assert ids == [] and row["groups_drawn"] == 4 and row["filter_skipped_share"] == 1.0 and row["loss"] == 0.0
    method.keep = keep_rule("grpo", [0.0, 0.5])
    row, ids = method.step(engine, 1, 1e-2)
    assert len(ids) == 2 and row["groups_drawn"] == 2 and row["filter_skipped_share"] == 0.0
