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
order test, dev, train (the held-out sets first, so they stay the same for a seed when only
--n changes… as long as the dev/test sizes do). Each record's split is `meta.split`; the
dataset's split rule says so (traces.dataset.RECORD_SPLIT_METHOD).

A mixture (`TASK1,TASK2 --weights 3,1`) gives each task a share of every split's count by
the largest-remainder rule; each task draws from the split's seed on its own generator.

`make_items(task, n, seed, config)` is the one generator (the curriculum asks it for items at
a difficulty); the importer adds the split, the de-duplication and the mixture.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import fields
from typing import Any, Iterator

from tunix_rt.errors import BadInput
from tunix_rt.traces.schema import RecordError, make_trace

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
        cfg = config_cls(**config)
        if hasattr(cfg, "validate"):
            cfg.validate()
    except (AssertionError, TypeError, ValueError) as e:
        raise BadInput(f"config of {task}: {e or type(e).__name__}") from None
    full = {f.name: getattr(cfg, f.name) for f in fields(config_cls) if f.name not in RESERVED_CONFIG}
    return _json(full, f"config of {task}")


def _json(value: Any, what: str) -> Any:
    """`value` as plain JSON (tuples become lists, sets sorted lists); BadInput otherwise."""
    def fallback(v: Any) -> Any:
        if isinstance(v, (set, frozenset)):
            return sorted(v, key=repr)
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


def _create(task: str, config: dict[str, Any], seed: int, size: int):
    """A reasoning-gym dataset object (the generator of a seed, and the owner of score_answer)."""
    check_task(task)
    try:
        return _rg().create_dataset(task, seed=seed, size=size, **config)
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
    value = ds.score_answer(answer, entry)
    return float(value)


# --- generation ---------------------------------------------------------------------------


def _entries(task: str, seed: int, config: dict[str, Any], limit: int) -> Iterator[tuple[int, dict]]:
    ds = _create(task, config, seed, limit)
    for idx in range(limit):
        yield idx, ds[idx]


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
