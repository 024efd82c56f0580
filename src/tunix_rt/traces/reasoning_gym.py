"""reasoning-gym tasks as datasets: procedural, verifiable problems with a scorer per task.

`reasoning-gym` (Apache-2.0, pure Python, the `tasks` extra) generates 100+ tasks
(arithmetic, algebra, logic, graphs, games, …), each with a difficulty config (a dataclass per
task) and its own verifier `score_answer(answer, entry)`. Nothing is downloaded: the
generators run here, from a seed.

A record (the trace record, DESIGN.md §2) of task T:

    {"id": "rg-basic_arithmetic-1234567-17", "question": "Calculate 5 - 3 - 6.", "steps": [],
     "answer": "-4", "source": "reasoning-gym",
     "meta": {"scorer": "rg:basic_arithmetic", "category": "basic_arithmetic", "split": "train",
              "rg": {"task": "basic_arithmetic", "seed": 1234567, "index": 17,
                     "config": {…the task's difficulty config, seed and size left out…},
                     "metadata": {…the entry's metadata, as JSON…}}}}

- `meta.scorer` names the verifier that scores it (eval.scoring dispatches on it); the
  scorer rebuilds the task's entry from `question`, `answer` and `meta.rg.metadata`, and the
  task from `meta.rg.config`. Every record is checked at creation: its own gold answer must
  score 1.0 through exactly that path, so a task whose metadata does not survive JSON (or
  that has no single answer) is refused here, not discovered as a 0% accuracy later.
- `steps` is empty: reasoning-gym gives answers, no worked solutions. Such a record (empty
  steps, a scorer named) is for RL and evaluation; SFT refuses a split that holds one
  (train.common.load_data), since it would teach an empty <reasoning> block. To SFT on a
  task, generate traces first (RFT, distillation) and import those.
- `meta.category` is the task, so eval's by_category reports accuracy per task.

Splits (`import_tasks`): train, dev and test are drawn from three seeds derived from the
user's seed S, `split_seed(S, split)` = the first 4 bytes of sha256("tunix-rt/rg/S/split")
as an unsigned integer. reasoning-gym seeds item i of a dataset with `Random(seed + i)`, so
consecutive seeds (S, S+1, S+2) would share almost every item; hashed seeds are ~2^31
apart on average. On top of that a question already drawn (in an earlier split, or earlier
in the same split) is skipped, so no question appears twice anywhere: the splits are
disjoint by construction, whatever the task's question space. Splits are filled in the
order test, dev, train (the held-out sets first: with --dev-n and --test-n fixed, a larger
--n only adds train records). dev and test hold n // 4 records each unless given. Each record's split is `meta.split`; the
dataset's split rule says so (traces.dataset.RECORD_SPLIT_METHOD).

A mixture (`TASK1,TASK2 --weights 3,1`) gives each task a share of every split's count by
the largest-remainder rule; each task draws from the split's seed on its own generator.

`make_items(task, n, seed, config)` is the one generator (the curriculum asks it for items at
a difficulty); the importer adds the split, the de-duplication and the mixture.
"""

from __future__ import annotations

import decimal
import hashlib
import json
import math
import threading
from dataclasses import MISSING, dataclass, field, fields
from decimal import Decimal
from enum import Enum
from fractions import Fraction
from typing import Any, Iterator

from tunix_rt.errors import BadInput
from tunix_rt.home import Home
from tunix_rt.traces.dataset import ImportResult, import_records
from tunix_rt.traces.schema import RecordError, make_trace, validate_trace

SOURCE = "reasoning-gym"
SCORER_PREFIX = "rg:"
RG_SPLITS = ("train", "dev", "test")
FILL_ORDER = ("test", "dev", "train")
"""The order splits are drawn in: held-out sets first."""
MAX_N = 1_000_000
"""The most records of one split (a guard against a typo'd --n)."""
DRAW_FACTOR, DRAW_SLACK = 4, 64
"""A split of n records may draw up to n * DRAW_FACTOR + DRAW_SLACK items per task before
the task's question space counts as too small for it (the import fails, naming the task)."""
RESERVED_CONFIG = ("seed", "size")
"""Config fields the importer sets itself."""
INSTALL_HINT = "pip install 'tunix-rt[tasks]' (reasoning-gym==0.1.25, math-verify)"


def _rg():
    try:
        import reasoning_gym
    except ImportError as e:
        raise BadInput(f"reasoning-gym tasks need the reasoning_gym package: {INSTALL_HINT} ({e})") from None
    return reasoning_gym


def task_names() -> list[str]:
    """Every task reasoning-gym registers, sorted."""
    return sorted(_rg().factory.DATASETS)


def check_task(task: str) -> None:
    if task not in _rg().factory.DATASETS:
        raise BadInput(f"unknown reasoning-gym task {task!r} (known: {', '.join(task_names())})")


def scorer_name(task: str) -> str:
    return SCORER_PREFIX + task


def task_config(task: str, config: dict[str, Any]) -> dict[str, Any]:
    """The task's full difficulty config as JSON (defaults filled in, seed and size left
    out); BadInput naming the field when `config` has an unknown field or fails the task's
    own validation."""
    check_task(task)
    if not isinstance(config, dict):
        raise BadInput(f"config of {task}: expected a JSON object, got {type(config).__name__}")
    if bad := [k for k in config if k in RESERVED_CONFIG]:
        raise BadInput(f"config of {task}: {bad[0]!r} is set by the importer (use --seed, --n)")
    _, config_cls = _rg().factory.DATASETS[task]
    known = {f.name for f in fields(config_cls)} - set(RESERVED_CONFIG)
    if unknown := sorted(set(config) - known):
        raise BadInput(f"config of {task}: unknown field {unknown[0]!r} (known: {', '.join(sorted(known))})")
    try:
        cfg = config_cls(**_typed(task, config))
        if hasattr(cfg, "validate"):
            cfg.validate()
    except (AssertionError, TypeError, ValueError) as e:
        raise BadInput(f"config of {task}: {e or type(e).__name__}") from None
    full = {f.name: getattr(cfg, f.name) for f in fields(config_cls) if f.name not in RESERVED_CONFIG}
    return _json(full, f"config of {task}")


def _enum_fields(config_cls: Any) -> dict[str, type[Enum]]:
    """The config fields whose default is an Enum member or a list of them: their enum class.
    JSON keeps such a value as its plain value (TaskType.SIBLINGS -> "siblings"), which the
    task's generator does not accept back (aiw calls .value on it)."""
    out: dict[str, type[Enum]] = {}
    for f in fields(config_cls):
        default = f.default if f.default is not MISSING else (
            f.default_factory() if f.default_factory is not MISSING else None)
        if isinstance(default, Enum):
            out[f.name] = type(default)
        elif isinstance(default, (list, tuple)) and default and all(isinstance(v, Enum) for v in default):
            out[f.name] = type(default[0])
    return out


def _typed(task: str, config: dict[str, Any]) -> dict[str, Any]:
    """`config` (JSON: a user's --config, or a record's meta.rg.config) with each enum field's
    plain values turned back into the task's enum members; BadInput naming a value that is
    not one."""
    _, config_cls = _rg().factory.DATASETS[task]
    out = dict(config)
    for name, enum in _enum_fields(config_cls).items():
        if name not in out:
            continue

        def member(v: Any, name: str = name, enum: type[Enum] = enum) -> Enum:
            if isinstance(v, enum):
                return v
            try:
                return enum(v)
            except ValueError:
                raise BadInput(f"config of {task}: {name}: {v!r} is not one of "
                               f"{', '.join(repr(m.value) for m in enum)}") from None

        value = out[name]
        out[name] = [member(v) for v in value] if isinstance(value, (list, tuple)) else member(value)
    return out


def _json(value: Any, what: str) -> Any:
    """`value` as plain JSON (tuples become lists, sets sorted lists, fractions and decimals
    their exact string); BadInput otherwise. What a scorer reads back as a string where it had
    a Fraction is caught by the gold-answer check of every record (_record)."""
    def fallback(v: Any) -> Any:
        if isinstance(v, (set, frozenset)):
            return sorted(v, key=repr)
        if isinstance(v, (Fraction, Decimal)):
            return str(v)
        raise TypeError(f"{type(v).__name__} is not JSON")

    try:
        out = json.loads(json.dumps(value, default=fallback, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise BadInput(f"{what}: not JSON-safe ({e})") from None
    return out


# --- the task instances the scorer and the generator share ---------------------------------

_SCORERS: dict[tuple[str, str], Any] = {}
_SCORERS_LOCK = threading.Lock()
_MAX_SCORERS = 256


def _own_decimal():
    """A decimal context of Python's defaults for one call into reasoning-gym, dropped after it:
    some tasks set the thread's context (decimal_arithmetic's generator sets its precision to the
    config's, 12 by default), which would otherwise leak into everything after it in the process
    (the calculator's results; every later score)."""
    return decimal.localcontext(decimal.Context())


def _create(task: str, config: dict[str, Any], seed: int, size: int):
    """A reasoning-gym dataset object (the generator of a seed, and the owner of score_answer)."""
    check_task(task)
    try:
        with _own_decimal():
            return _rg().create_dataset(task, seed=seed, size=size, **_typed(task, config))
    except (AssertionError, TypeError, ValueError) as e:
        raise BadInput(f"config of {task}: {e or type(e).__name__}") from None


def _scorer(task: str, config: dict[str, Any]):
    """The task object whose score_answer scores records of (task, config); cached, since some
    tasks load word lists or precompute in their constructor."""
    key = (task, json.dumps(config, sort_keys=True))
    with _SCORERS_LOCK:
        if key in _SCORERS:
            return _SCORERS[key]
    ds = _create(task, config, 0, 1)
    with _SCORERS_LOCK:
        if len(_SCORERS) >= _MAX_SCORERS:
            _SCORERS.clear()
        _SCORERS[key] = ds
    return ds


def score(record_meta: dict[str, Any], question: str, gold: str, answer: str) -> float:
    """reasoning-gym's own verdict on `answer` for the record (in [0, 1]): the task rebuilt
    from meta.rg.config, the entry from question, gold and meta.rg.metadata. No time limit
    here: eval.scoring runs it under one."""
    rg = record_meta.get("rg")
    if not isinstance(rg, dict) or not isinstance(rg.get("task"), str):
        raise BadInput(f"record names scorer {record_meta.get('scorer')!r} but has no meta.rg.task")
    ds = _scorer(rg["task"], rg.get("config") or {})
    entry = {"question": question, "answer": gold, "metadata": rg.get("metadata") or {}}
    with _own_decimal():
        value = ds.score_answer(answer, entry)
    return float(value)


# --- generation ---------------------------------------------------------------------------


def _entries(task: str, seed: int, config: dict[str, Any], limit: int) -> Iterator[tuple[int, dict]]:
    """Items 0..limit-1 of the task at `seed`; a generator that fails (reasoning-gym's own
    code, at some config) is BadInput naming the task, the item and the error."""
    ds = _create(task, config, seed, limit)
    for idx in range(limit):
        try:
            with _own_decimal():  # not across the yield: the caller's context stays its own
                entry = ds[idx]
        except Exception as e:  # noqa: BLE001 - the task's generator: any failure is the task's
            raise BadInput(f"{task} item {idx} (seed {seed}): reasoning-gym's generator failed at this config "
                           f"({type(e).__name__}: {e})") from None
        yield idx, entry


def _record(task: str, seed: int, config: dict[str, Any], idx: int, entry: dict) -> dict[str, Any]:
    """One entry as a checked record (a Trace's to_record()); BadInput naming the task and the
    index when it cannot be one."""
    where = f"{task} item {idx} (seed {seed})"
    answer = entry.get("answer")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = json.dumps(answer)
    if not isinstance(answer, str) or not answer.strip():
        raise BadInput(f"{where}: no single answer ({answer!r}); tasks verified without an oracle answer are "
                       "not importable")
    meta = {
        "scorer": scorer_name(task), "category": task,
        "rg": {"task": task, "seed": seed, "index": idx, "config": config,
               "metadata": _json(entry.get("metadata") or {}, f"{where}: metadata")},
    }
    try:
        trace = make_trace(id=f"rg-{task}-{seed}-{idx}", question=entry.get("question"), steps=[],
                           answer=answer, source=SOURCE, meta=meta)
    except RecordError as e:
        raise BadInput(f"{where}: {e}") from None
    if (gold := score(trace.meta, trace.question, trace.answer, trace.answer)) != 1.0:
        raise BadInput(f"{where}: its own gold answer scores {gold} through the stored record (the task's "
                       "metadata does not survive JSON, or it has no single answer); not importable")
    return trace.to_record()


def make_items(task: str, n: int, seed: int, config: dict[str, Any]) -> list[dict[str, Any]]:
    """`n` records of `task` at difficulty `config` (a JSON object of the task's config fields,
    {} for its defaults), items 0..n-1 of `seed`: deterministic, in the dataset's record shape
    (no meta.split; duplicates possible on a small question space)."""
    if not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise BadInput(f"n must be an integer in [1, {MAX_N}], got {n!r}")
    full = task_config(task, config)
    return [_record(task, seed, full, idx, entry) for idx, entry in _entries(task, seed, full, n)]


# --- the import: splits from derived seeds, a mixture, no question twice --------------------


def split_seed(seed: int, split: str) -> int:
    """The seed a split draws from: the first 4 bytes of sha256("tunix-rt/rg/SEED/SPLIT")."""
    return int.from_bytes(hashlib.sha256(f"tunix-rt/rg/{seed}/{split}".encode()).digest()[:4], "big")


def shares(count: int, weights: list[float]) -> list[int]:
    """`count` split by `weights` (largest remainder; ties to the earlier task); sums to count."""
    total = sum(weights)
    exact = [count * w / total for w in weights]
    out = [int(x) for x in exact]
    by_rest = sorted(range(len(weights)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in by_rest[: count - sum(out)]:
        out[i] += 1
    return out


@dataclass(frozen=True)
class TaskImport:
    """What `data import reasoning-gym` takes; defaults and checks live here."""

    tasks: tuple[str, ...]
    n: int
    """Records in train."""
    seed: int
    config: dict[str, Any] = field(default_factory=dict)
    """One task: its config fields. Several: {task: {fields}} (a task left out: its defaults)."""
    weights: tuple[float, ...] | None = None
    """The mixture's weights, one per task (None: equal)."""
    dev_n: int | None = None
    """Records in dev (None: n // 4, at least 1)."""
    test_n: int | None = None
    """Records in test (None: n // 4, at least 1)."""
    name: str | None = None
    """Dataset name (None: rg-<task>[-<task>…], cut to 100 characters)."""
    version: str | None = None

    def __post_init__(self) -> None:
        if not self.tasks or any(not t for t in self.tasks):
            raise BadInput("TASK: give one or more reasoning-gym task names, comma-separated")
        if len(set(self.tasks)) != len(self.tasks):
            raise BadInput(f"TASK: {','.join(self.tasks)} names a task twice")
        for t in self.tasks:
            check_task(t)
        if not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            raise BadInput(f"--n {self.n}: must be in [1, {MAX_N}]")
        for what, v in (("--dev-n", self.dev_n), ("--test-n", self.test_n)):
            if v is not None and not 0 <= v <= MAX_N:
                raise BadInput(f"{what} {v}: must be in [0, {MAX_N}]")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise BadInput(f"--seed {self.seed}: must be a non-negative integer")
        if self.weights is not None:
            if len(self.weights) != len(self.tasks):
                raise BadInput(f"--weights: {len(self.weights)} weight(s) for {len(self.tasks)} task(s)")
            if not all(math.isfinite(w) and w > 0 for w in self.weights):
                raise BadInput(f"--weights {','.join(map(str, self.weights))}: each must be a positive number")
        self.configs()  # a bad config fails here, before anything is drawn

    def configs(self) -> dict[str, dict[str, Any]]:
        """Each task's full config (task_config)."""
        cfg = self.config
        if not isinstance(cfg, dict):
            raise BadInput(f"--config: expected a JSON object, got {type(cfg).__name__}")
        if len(self.tasks) == 1 and not (cfg and set(cfg) <= set(self.tasks)):
            return {self.tasks[0]: task_config(self.tasks[0], cfg)}
        if unknown := sorted(set(cfg) - set(self.tasks)):
            raise BadInput(f"--config: with several tasks, key it by task name ({unknown[0]!r} is not one of "
                           f"{', '.join(self.tasks)})")
        return {t: task_config(t, cfg.get(t, {})) for t in self.tasks}

    def counts(self) -> dict[str, int]:
        held_out = max(1, self.n // 4)
        return {"train": self.n, "dev": held_out if self.dev_n is None else self.dev_n,
                "test": held_out if self.test_n is None else self.test_n}

    def dataset_name(self) -> str:
        return self.name or ("rg-" + "-".join(self.tasks))[:100]


def draw_records(req: TaskImport) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The records of every split (train, dev, test order; tasks interleaved by their share)
    and the manifest's account of how they were drawn."""
    configs, counts = req.configs(), req.counts()
    weights = list(req.weights or [1.0] * len(req.tasks))
    seen: set[str] = set()
    by_split: dict[str, list[dict[str, Any]]] = {}
    drawn: dict[str, dict[str, int]] = {}
    for split in FILL_ORDER:
        per_task = dict(zip(req.tasks, shares(counts[split], weights)))
        drawn[split] = per_task
        lists = [_draw(t, k, split_seed(req.seed, split), configs[t], split, seen) for t, k in per_task.items()]
        by_split[split] = _interleave(lists)
    records = [r for split in RG_SPLITS for r in by_split[split]]
    account = {"tasks": list(req.tasks), "weights": weights, "seed": req.seed,
               "split_seeds": {s: split_seed(req.seed, s) for s in RG_SPLITS}, "counts": drawn,
               "configs": configs, "reasoning_gym_version": _rg_version(),
               "rule": "split seed = first 4 bytes of sha256('tunix-rt/rg/SEED/SPLIT'); splits drawn test, dev, "
                       "train; a question already drawn is skipped"}
    return records, account


def _draw(task: str, k: int, seed: int, config: dict[str, Any], split: str, seen: set[str]) -> list[dict[str, Any]]:
    """k records of a task from `seed`, skipping questions in `seen` (which it extends)."""
    out: list[dict[str, Any]] = []
    if k == 0:
        return out
    limit = k * DRAW_FACTOR + DRAW_SLACK
    for idx, entry in _entries(task, seed, config, limit):
        if entry.get("question") in seen:
            continue
        rec = _record(task, seed, config, idx, entry)
        rec["meta"] = {**rec["meta"], "split": split}
        seen.add(rec["question"])
        out.append(rec)
        if len(out) == k:
            return out
    raise BadInput(f"{task}: only {len(out)} new distinct questions for {split} in {limit} draws (needed {k}); "
                   "its question space at this config is too small: lower --n or raise the difficulty (--config)")


def _interleave(lists: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Records of several tasks spread evenly (item j of a task with k items sits at (j+½)/k),
    so the first records of a split are already a mixture (eval --limit)."""
    keyed = [((j + 0.5) / len(lst), t, rec) for t, lst in enumerate(lists) for j, rec in enumerate(lst)]
    return [rec for _, _, rec in sorted(keyed, key=lambda x: (x[0], x[1]))]


def _rg_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("reasoning-gym")
    except PackageNotFoundError:
        return "unknown"


def import_tasks(req: TaskImport, home: Home | None = None) -> ImportResult:
    """Draw the records and store them as a dataset version (traces.dataset.import_records:
    atomic, versioned; the same request twice reuses the version)."""
    records, account = draw_records(req)
    traces = [validate_trace(r) for r in records]
    source = f"reasoning-gym:{','.join(req.tasks)}?n={req.n}&seed={req.seed}"
    return import_records(traces, req.dataset_name(), req.version, source, SOURCE, {"reasoning_gym": account}, home)
