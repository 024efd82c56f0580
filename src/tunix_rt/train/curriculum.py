"""Which prompts a step that samples GRPO's rollouts trains on (grpo; rft, whose step here is
a round; dpo with pairs=rollouts): a difficulty curriculum over reasoning-gym tasks, and online
filtering of prompts by their estimated pass rate.

Curriculum (`curriculum:` in the config; datasets imported from reasoning-gym):
- each task of the training split has a level, 0 .. (its curriculum's longest attribute
  list) - 1, set on reasoning-gym's curriculum with `set_global_level` (an attribute with
  fewer levels stays at its last). A level's generator config is the task's config as the
  dataset recorded it, with the curriculum's attributes set by `generate_configuration`
  (`ranges: upper_bound`: exactly that level's values; `inclusive`: every level up to it);
- a task starts at `start_level`: an integer, a level per task, or `nearest`, the level
  whose config is nearest the dataset's (reasoning-gym's level 0 is not its default config);
- the dataset's seeded order still picks each prompt, so the task mixture is the training
  split's (its weights as imported); the picked record is then replaced by a fresh item of
  its task at the task's current level, generated online (`traces.reasoning_gym.make_items`);
  a generated prompt too long for max_seq_len - rollout_max_new_tokens, or whose question is
  a held-out record's (the dataset's records outside the training split), keeps the
  dataset's record instead (counted: curriculum_kept_dataset);
- `mix`: the share of each draw's picks that keep the dataset's own record (drawn at the
  dataset's config, the one its test split was drawn with) instead of an online item at the
  task's level, so a curriculum that starts easy keeps training on the target difficulty too;
  pick i of a draw of n keeps it iff floor((i + 1) mix) > floor(i mix) (mix 0.5: every second
  pick; an exact share, and the dataset's seeded order decides the tasks). Counted:
  curriculum_mixed;
- after every step each task's window of the last `window` rollout answers at its level
  (correct as eval scores them, the rollout_accuracy figure; a record the draw kept from the
  dataset, by `mix` or as a fallback, is not at the level and does not count) moves the level: up one when
  the window is full and its accuracy >= raise_at, down one when full and < lower_below;
  the window empties on a move (what was measured at the old level says nothing of the
  new one). Levels stay fixed within a step: every draw of a step uses the same ones;
- online seeds: ONLINE_SEED_LOW + (sha256 of run seed, task, step, draw) mod ONLINE_SEED_SPAN,
  in [2**31, 2**31 + 2**30); the items of one call use seed .. seed + n - 1 (reasoning-gym
  seeds item i with seed + i). A seed whose items would reach a seed of one of the dataset's
  own items of that task (train, dev and test: each record keeps meta.rg.seed and index) is
  passed over for the next attempt's hash, so an online prompt never shares a seed with a
  record of the dataset. Seeds stay uint32: some tasks seed numpy's global generator;
- the state (levels, windows, moves) is part of the method's checkpoint state, so a resumed
  run generates exactly the prompts of an uninterrupted one.

Filtering (`filter_pass_rate: [low, high]`, any dataset): a prompt's pass rate is estimated
from its own G rollouts (the share answered correctly); a group outside [low, high] is
skipped and another prompt drawn, at most dapo_max_draws x rl_prompts groups a step (the
budget DAPO's zero-variance redraw has always had; a step that runs out trains on what it
kept). `keep_rule` is the one rule: dapo's zero-variance test and the pass-rate band, each
when configured; advantages.select_informative draws with it.

Metrics (GRPO.draw_metrics, added to the row of every method that samples these rollouts): curriculum_level_<task>, curriculum_move_<task> (+1, 0, -1),
curriculum_window_accuracy_<task> (once its window holds an answer), curriculum_moves,
curriculum_kept_dataset, curriculum_mixed (where mix > 0); filter_skipped_share (groups drawn and skipped / drawn, where a
filter is configured).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Callable

from tunix_rt.errors import BadInput
from tunix_rt.ranges import Range, is_int, is_number

ONLINE_SEED_LOW = 2 ** 31
ONLINE_SEED_SPAN = 2 ** 30
"""Online seeds lie in [LOW, LOW + SPAN); a call's n items reach at most n - 1 further."""
RANGE_MODES = ("upper_bound", "inclusive")
UNIT = Range(0, 1)


@dataclass(frozen=True)
class CurriculumSpec:
    """The `curriculum:` mapping of a config, validated; its keys and defaults."""

    window: int = 32
    """Rollout answers (completions) per task the level decision looks at."""
    raise_at: float = 0.75
    """Raise a task's level when its full window's accuracy is at least this."""
    lower_below: float = 0.25
    """Lower it when the full window's accuracy is below this."""
    start_level: Any = 0
    """Each task's first level: an integer for every task (capped at a task's top level), a
    mapping {task: level} (a task it does not name starts at 0; a level above the task's top is
    refused), or `nearest`: each task at the level whose generator config is nearest the
    dataset's (`nearest_level`), so that training starts at the difficulty the test split was
    drawn with."""
    ranges: str = "upper_bound"
    """How a level becomes a generator config: upper_bound (that level's values) or inclusive
    (every level from 0 up to it)."""
    mix: float = 0.0
    """The share of each draw's prompts kept as the dataset's own records, at the dataset's
    config (the test split's difficulty), beside the online items at the levels; in [0, 1).
    Their answers do not move the levels."""

    @classmethod
    def from_mapping(cls, data: Any, where: str = "config: curriculum") -> "CurriculumSpec":
        if not isinstance(data, dict):
            raise BadInput(f"{where} must be a mapping like {{window: 32, raise_at: 0.75, lower_below: 0.25}} "
                           f"(or true for the defaults), got {data!r}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise BadInput(f"{where}: unknown key(s) {unknown}; known: {known}")
        spec = cls(**data)
        for name, rng, integer in (("window", Range(1), True), ("raise_at", UNIT, False),
                                   ("lower_below", UNIT, False)):
            value = getattr(spec, name)
            if not is_number(value) or (integer and not is_int(value)) or not rng.holds(value):
                raise BadInput(f"{where}.{name} must be {'an integer' if integer else 'a number'} {rng}, "
                               f"got {value!r}")
        if spec.lower_below >= spec.raise_at:
            raise BadInput(f"{where}: lower_below ({spec.lower_below}) must be below raise_at ({spec.raise_at})")
        start = spec.start_level
        pairs = start.items() if isinstance(start, dict) else [("", start)]
        if start != "nearest" and not all(isinstance(k, str) and is_int(v) and v >= 0 for k, v in pairs):
            raise BadInput(f"{where}.start_level must be an integer >= 0, a mapping {{task: level}} or nearest "
                           f"(each task at the level nearest the dataset's config), got {start!r}")
        if not is_number(spec.mix) or not Range(0, 1, high_open=True).holds(spec.mix):
            raise BadInput(f"{where}.mix must be a number in [0, 1) (the share of prompts kept at the dataset's "
                           f"config), got {spec.mix!r}")
        if spec.ranges not in RANGE_MODES:
            raise BadInput(f"{where}.ranges must be one of {'|'.join(RANGE_MODES)}, got {spec.ranges!r}")
        return spec

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def pass_band(value: Any, where: str = "config: filter_pass_rate") -> tuple[float, float]:
    """[low, high] with 0 <= low <= high <= 1, as a tuple; BadInput otherwise."""
    if (not isinstance(value, (list, tuple)) or len(value) != 2 or not all(is_number(v) for v in value)
            or not (UNIT.holds(value[0]) and UNIT.holds(value[1]) and value[0] <= value[1])):
        raise BadInput(f"{where} must be [low, high] with 0 <= low <= high <= 1 (the pass rates kept), "
                       f"got {value!r}")
    return float(value[0]), float(value[1])


def pass_rate(group) -> float:
    """A group's estimated pass rate: the share of its rollouts answered correctly."""
    return float(sum(bool(c) for c in group.correct)) / max(len(group.correct), 1)


def keep_rule(rl_loss: str, band: Any) -> Callable[[Any, Any], bool] | None:
    """Whether a drawn (group, rewards[G]) trains: dapo needs reward variance, a pass-rate band
    needs the group's pass rate inside it; None when neither applies (every group trains)."""
    from tunix_rt.train.advantages import has_variance

    low, high = pass_band(band) if band is not None else (None, None)
    if rl_loss != "dapo" and band is None:
        return None

    def keep(group, rewards) -> bool:
        if rl_loss == "dapo" and not has_variance(rewards):
            return False
        return band is None or low <= pass_rate(group) <= high

    return keep


def online_seed(run_seed: int, task: str, step: int, draw: int, n: int = 1,
                avoid: list[tuple[int, int]] = ()) -> int:
    """The reasoning-gym seed of one online call of n items: the first attempt whose seeds
    seed .. seed + n - 1 miss every [low, high] of `avoid` (see the module docstring)."""
    attempt = 0
    while True:
        text = f"curriculum:{run_seed}:{task}:{step}:{draw}" + (f":{attempt}" if attempt else "")
        seed = ONLINE_SEED_LOW + int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") % ONLINE_SEED_SPAN
        if all(seed + n - 1 < low or seed > high for low, high in avoid):
            return seed
        attempt += 1


def dataset_seeds(records: list) -> dict[str, list[tuple[int, int]]]:
    """task -> the [seed, seed + largest index] spans of the reasoning-gym seeds its records
    were drawn from (meta.rg.seed, meta.rg.index)."""
    top: dict[tuple[str, int], int] = {}
    for r in records:
        rg = (r.meta or {}).get("rg")
        if isinstance(rg, dict) and isinstance(rg.get("seed"), int) and isinstance(rg.get("index"), int):
            key = (rg.get("task"), rg["seed"])
            top[key] = max(top.get(key, 0), rg["index"])
    out: dict[str, list[tuple[int, int]]] = {}
    for (task, seed), last in sorted(top.items()):
        out.setdefault(task, []).append((seed, seed + last))
    return out


class Curriculum:
    """The tasks' levels and windows, and the prompts of their current levels.

    `tasks`: task -> the generator config the dataset recorded for it (seed and size dropped);
    `make_items(task, n, seed, config)` -> trace records; `prompt_of(record)` -> its prompt ids,
    or None when it leaves no room for a completion; `held_out`: questions never trained on;
    `avoid`: task -> the seed spans of the dataset's items (online seeds stay out of them)."""

    def __init__(self, spec: CurriculumSpec, tasks: dict[str, dict[str, Any]], run_seed: int,
                 make_items: Callable[..., list], prompt_of: Callable[[Any], Any], held_out: set[str] = frozenset(),
                 avoid: dict[str, list[tuple[int, int]]] | None = None):
        from reasoning_gym.factory import create_curriculum, has_curriculum

        missing = [t for t in tasks if not has_curriculum(t)]
        if missing:
            raise BadInput(f"config: curriculum: reasoning-gym has no curriculum for task(s) {missing}")
        self.spec, self.run_seed = spec, run_seed
        self.make_items, self.prompt_of, self.held_out = make_items, prompt_of, held_out
        self.avoid = avoid or {}
        self.base = {t: {k: v for k, v in c.items() if k not in ("seed", "size")} for t, c in sorted(tasks.items())}
        self.curricula = {t: create_curriculum(t) for t in self.base}
        self.top = {t: max((len(a.levels) for a in c.attributes.values()), default=1) - 1
                    for t, c in self.curricula.items()}
        self.levels = self.start_levels(spec.start_level)
        self.windows: dict[str, list[int]] = {t: [] for t in self.base}
        self.moves = {t: 0 for t in self.base}
        self.kept_dataset = self.mixed = 0
        self.online: list[bool] = []
        """Of the last prompts() call's picks, which are online items at their task's level
        (pass it to observe)."""

    def start_levels(self, start: Any) -> dict[str, int]:
        """Each task's first level of a spec's start_level (see CurriculumSpec.start_level)."""
        if start == "nearest":
            return {t: self.nearest_level(t) for t in self.base}
        if not isinstance(start, dict):
            return {t: min(int(start), self.top[t]) for t in self.base}
        unknown = sorted(set(start) - set(self.base))
        if unknown:
            raise BadInput(f"config: curriculum.start_level names task(s) {unknown} the dataset does not have; "
                           f"its tasks: {sorted(self.base)}")
        high = {t: f"{v} (its top is {self.top[t]})" for t, v in sorted(start.items()) if v > self.top[t]}
        if high:
            raise BadInput(f"config: curriculum.start_level: no such level for {high}")
        return {t: int(start.get(t, 0)) for t in self.base}

    def nearest_level(self, task: str) -> int:
        """The level whose generator config is nearest the dataset's: over the attributes of the
        task's curriculum, the sum of |log((1 + a) / (1 + b))| between the level's value and the
        dataset's (a range attribute by its midpoint; a value that is not a number counts 1
        where it differs); the lower level on a tie."""
        attrs = self.curricula[task].attributes.values()

        def values(config: dict[str, Any]) -> list[Any]:
            out = []
            for a in attrs:
                if hasattr(a, "lower_field_name"):
                    lo, hi = config.get(a.lower_field_name), config.get(a.upper_field_name)
                    out.append((lo + hi) / 2 if is_number(lo) and is_number(hi) else (lo, hi))
                else:
                    out.append(config.get(a.field_name))
            return out

        def gap(a: Any, b: Any) -> float:
            if is_number(a) and is_number(b):
                return abs(math.log((1 + abs(a)) / (1 + abs(b))))
            return float(a != b)

        base = values(self.base[task])
        gaps = [sum(gap(a, b) for a, b in zip(values(self.config_at(task, level)), base))
                for level in range(self.top[task] + 1)]
        return min(range(len(gaps)), key=lambda i: (round(gaps[i], 12), i))

    # ----------------------------------------------------------------- prompts
    def config_of(self, task: str) -> dict[str, Any]:
        """The generator config of `task` at its current level (JSON values)."""
        return self.config_at(task, self.levels[task])

    def config_at(self, task: str, level: int) -> dict[str, Any]:
        """The generator config of `task` at `level` (JSON values)."""
        from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode

        cur = self.curricula[task]
        cur.set_global_level(level)
        context = DefaultCurriculumContext(mode=RangeAttributeMode(self.spec.ranges))
        made = cur.generate_configuration(defaults=dict(self.base[task]), context=context)
        out = json.loads(json.dumps(dataclasses.asdict(made)))
        return {k: v for k, v in out.items() if k not in ("seed", "size")}

    def mixed_at(self, i: int) -> bool:
        """Whether pick i of a draw keeps the dataset's record by `mix` (the module docstring)."""
        mix = self.spec.mix
        return math.floor((i + 1) * mix) > math.floor(i * mix)

    def prompts(self, picked: list[tuple[Any, Any]], step: int, draw: int) -> list[tuple[Any, Any]]:
        """`picked` ((record, prompt) from the dataset's order) with each record replaced by a
        fresh item of its task at the task's level, but the picks `mix` keeps (see the module
        docstring). Sets `online` for the observe() of these picks' groups."""
        wanted: dict[str, list[int]] = {}
        self.online = [False] * len(picked)
        for i, (rec, _p) in enumerate(picked):
            if self.mixed_at(i):
                self.mixed += 1
            else:
                wanted.setdefault(task_of(rec), []).append(i)
        out = list(picked)
        for task in sorted(wanted):
            rows = wanted[task]
            seed = online_seed(self.run_seed, task, step, draw, len(rows), self.avoid.get(task, []))
            items = self.make_items(task, len(rows), seed, self.config_of(task))
            for i, rec in zip(rows, items):
                prompt = None if rec.question in self.held_out else self.prompt_of(rec)
                if prompt is None:
                    self.kept_dataset += 1
                    continue
                out[i] = (rec, prompt)
                self.online[i] = True
        return out

    # ----------------------------------------------------------------- levels
    def observe(self, groups: list, online: list[bool] | None = None) -> None:
        """Add the answers of a draw's groups to their tasks' windows, newest last; with
        `online` (prompts()'s, for the groups of its picks in order) only the online items at
        their level count."""
        if online is not None and len(groups) != len(online):
            raise ValueError(f"observe: {len(groups)} groups for the {len(online)} picks of the last prompts()")
        for g, at_level in zip(groups, online if online is not None else [True] * len(groups)):
            task = task_of(g.record)
            if at_level and task in self.windows:
                self.windows[task] = (self.windows[task] + [int(bool(c)) for c in g.correct])[-self.spec.window:]

    def end_step(self) -> dict[str, Any]:
        """Move the levels the windows call for; the step's metrics."""
        row: dict[str, Any] = {}
        total = 0
        for task, win in self.windows.items():
            acc = sum(win) / len(win) if win else None
            move = decide(self.spec, acc if len(win) >= self.spec.window else None, self.levels[task], self.top[task])
            if move:
                self.levels[task] += move
                self.windows[task] = []
                self.moves[task] += 1
            total += abs(move)
            row[f"curriculum_level_{task}"] = self.levels[task]
            row[f"curriculum_move_{task}"] = move
            if acc is not None:
                row[f"curriculum_window_accuracy_{task}"] = acc
        row["curriculum_moves"] = total
        row["curriculum_kept_dataset"] = self.kept_dataset
        if self.spec.mix:
            row["curriculum_mixed"] = self.mixed
        self.kept_dataset = self.mixed = 0
        return row

    def state(self) -> dict[str, Any]:
        return {"levels": dict(self.levels), "windows": {t: list(w) for t, w in self.windows.items()},
                "moves": dict(self.moves)}

    def load_state(self, state: dict[str, Any]) -> None:
        if sorted(state["levels"]) != sorted(self.levels):
            raise BadInput(f"the checkpoint's curriculum tasks {sorted(state['levels'])} are not this run's "
                           f"{sorted(self.levels)}")
        self.levels = {t: int(v) for t, v in state["levels"].items()}
        self.windows = {t: [int(x) for x in w] for t, w in state["windows"].items()}
        self.moves = {t: int(v) for t, v in state["moves"].items()}

    def summary(self) -> dict[str, Any]:
        """Each task's level (of 0..top) and what that level changes in the dataset's generator
        config: reasoning-gym's levels are not its defaults (chain_sum's level 0 is two 1-digit
        terms where the default draws 2-6 terms of 1-4 digits; lcm's draws values of 100-1000
        where the default's are 1-100), so a run says what it trains on beside what it is tested on."""
        out = {}
        for t in self.levels:
            level = self.config_of(t)
            differ = sorted(k for k in level if level[k] != self.base[t].get(k))
            out[t] = {"level": self.levels[t], "top": self.top[t], "level_config": {k: level[k] for k in differ},
                      "dataset_config": {k: self.base[t].get(k) for k in differ}}
        return {"curriculum_tasks": out}

    @staticmethod
    def describe(tasks: dict[str, Any]) -> list[str]:
        """The run's start lines of a summary's curriculum_tasks."""
        def values(config: dict[str, Any]) -> str:
            return ", ".join(f"{k} {v}" for k, v in config.items())

        return [f"curriculum: {t} at level {c['level']} of 0..{c['top']}: "
                + (f"{values(c['level_config'])} (the dataset's: {values(c['dataset_config'])})"
                   if c["level_config"] else "the dataset's own config")
                for t, c in tasks.items()]


def decide(spec: CurriculumSpec, accuracy: float | None, level: int, top: int) -> int:
    """+1, -1 or 0: the move of a task at `level` (of 0..top) whose full window has
    `accuracy` (None: the window is not full yet, no move)."""
    if accuracy is None:
        return 0
    if accuracy >= spec.raise_at and level < top:
        return 1
    if accuracy < spec.lower_below and level > 0:
        return -1
    return 0


def make_curriculum(cfg, ds, records: list, prompt_of: Callable[[Any], Any]) -> Curriculum:
    """The curriculum of a config (its `curriculum` set) over the tasks of `records` (the
    training prompts of dataset `ds`); a task's generator config is that of its first record.
    The questions of ds's records outside the training split are never trained on."""
    from tunix_rt.traces import reasoning_gym as rg
    from tunix_rt.traces.schema import validate_trace

    train_ids = {r.id for r in ds.split(cfg.split)}
    tasks: dict[str, dict[str, Any]] = {}
    for r in records:
        task = task_of(r)
        if not task:
            raise BadInput(f"config: curriculum needs a dataset imported from reasoning-gym (`tunix-rt data import "
                           f"reasoning-gym TASK`); record {r.id} of {cfg.dataset} names no reasoning-gym task")
        tasks.setdefault(task, dict(r.meta["rg"].get("config") or {}))

    def make_items(task: str, n: int, seed: int, config: dict[str, Any]) -> list:
        return [validate_trace(d) for d in rg.make_items(task, n, seed, config)]

    return Curriculum(CurriculumSpec.from_mapping(cfg.curriculum), tasks, cfg.seed, make_items, prompt_of,
                      held_out={r.question for r in ds.records if r.id not in train_ids},
                      avoid=dataset_seeds(ds.records))


def task_of(record) -> str:
    """The reasoning-gym task a record belongs to (meta.rg.task, traces.reasoning_gym's record
    layout); '' for a record of another source."""
    rg = (record.meta or {}).get("rg")
    task = rg.get("task") if isinstance(rg, dict) else None
    return task if isinstance(task, str) else ""
