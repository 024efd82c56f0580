"""Sweeps as Optuna studies in the registry's database, and their trials as queue jobs.

A sweep is an Optuna study (its name is the sweep's) whose user attribute `tunix_rt` holds the
base TrainConfig (resolved), the search space and the settings every worker builds its
sampler and pruner from. `create_sweep` writes the study and enqueues one `trial` job per
trial; a worker that claims one asks the study for its trial then (tunix_rt.sweep.trial), so
TPE learns from every trial finished by then. A trial carries the id of its job in the user
attribute `job`: that link is how a retried job finds its own trial instead of asking again.

Optuna's tables (studies, trials, …) live beside the registry's, in the same database (SQLite
file or PostgreSQL schema, the same URL). Optuna versions its schema with Alembic's default
`alembic_version` table, which in this database holds the registry's revision, so:
- the registry is migrated first (db.get_engine), so Optuna finds that table filled and never
  stamps it;
- Optuna's tables are created by the pinned optuna itself (pyproject), under the registry's
  schema lock (db.exclusive), and RDBStorage's compatibility check, which would read our
  revision as Optuna's, is skipped. Moving to another optuna release that changes its schema
  needs a step of our own; `optuna storage upgrade` must not run on this database.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from typing import Any

from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.home import Home
from tunix_rt.registry import db
from tunix_rt.registry.queries import NotFound
from tunix_rt.sweep.space import SweepSpace, trial_config

ATTR = "tunix_rt"
"""Study user attribute: {"base", "space", "trials", "seed", "created_at"}."""
JOB_ATTR = "job"
"""Trial user attribute: the id of the queue job that runs the trial."""
RUN_ATTR = "run_id"
"""Trial user attribute: the trial's run directory under <home>/runs."""
OBJECTIVE = "eval_loss"
"""What a trial is scored by unless the space says otherwise (space.ObjectiveSpec): the
held-out loss at the end of its run, minimised."""


@contextlib.contextmanager
def opened(url: str | None = None) -> Iterator[Any]:
    """Optuna's RDBStorage on the registry's database (its engine disposed afterwards)."""
    try:
        import optuna
    except ImportError as e:
        raise TunixRtError(f"sweeps need optuna: pip install 'tunix-rt[sweep]' ({e})") from None

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own lines say what happened
    url = db.normalize_url(url or Home.resolve().database_url)
    engine = db.get_engine(url)  # migrated: Optuna must find alembic_version filled (see above)
    sqlite = engine.dialect.name == "sqlite"
    kwargs = {"connect_args": {"timeout": 30, "check_same_thread": False}} if sqlite else {"pool_pre_ping": True}
    with db.exclusive(engine):
        storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs, skip_compatibility_check=True)
    if sqlite:  # the registry's SQLite rules (BEGIN IMMEDIATE, WAL) for Optuna's connections too
        db.sqlite_immediate(storage.engine)
        storage.engine.dispose()
    try:
        yield storage
    finally:
        storage.engine.dispose()


class Sweep:
    """A loaded study with the settings tunix-rt stored in it."""

    def __init__(self, name: str, settings: dict[str, Any]) -> None:
        self.study = None
        """The optuna Study (set by load)."""
        self.name = name
        self.base: dict[str, Any] = settings["base"]
        self.space = SweepSpace.model_validate(settings["space"])
        self.trials: int = settings["trials"]
        self.seed: int = settings["seed"]
        self.created_at: str = settings["created_at"]

    @property
    def objective(self) -> str:
        """The held-out metric every trial is scored by (the final one told to Optuna, each
        eval row's reported for pruning)."""
        return self.space.objective.metric

    @property
    def direction(self) -> str:
        return self.space.objective.direction

    def config(self, values: dict[str, Any], run_name: str | None = None):
        return trial_config(self.base, values, run_name, source=f"sweep {self.name}")

    def sampler(self, job_id: int):
        """TPE, seeded per job: workers in different processes draw different trials, and a
        job draws the same ones again on a rerun of the same sweep."""
        import optuna

        return optuna.samplers.TPESampler(seed=(self.seed * 1_000_003 + job_id) % 2 ** 32,
                                          n_startup_trials=self.space.sampler.n_startup_trials, constant_liar=True)

    def pruner(self):
        import optuna

        p = self.space.pruner
        return optuna.pruners.MedianPruner(n_startup_trials=p.n_startup_trials, n_warmup_steps=p.n_warmup_steps)


def load(storage, name: str, job_id: int = 0) -> Sweep:
    """The sweep `name` (NotFound when there is none), with its job's sampler and the pruner."""
    import optuna

    try:
        settings = storage.get_study_user_attrs(storage.get_study_id_from_name(name)).get(ATTR)
    except KeyError:
        raise NotFound(f"no sweep {name!r}") from None
    if settings is None:
        raise NotFound(f"study {name!r} was not created by `tunix-rt sweep`")
    sweep = Sweep(name, settings)
    sweep.study = optuna.load_study(study_name=name, storage=storage, sampler=sweep.sampler(job_id),
                                    pruner=sweep.pruner())
    return sweep


def create_sweep(name: str, base: dict[str, Any], space: SweepSpace, trials: int, *, seed: int = 0,
                 max_attempts: int = 3, url: str | None = None) -> list[int]:
    """Create the study and enqueue `trials` trial jobs (the first ones pinned to the space's
    `enqueue` entries); returns the job ids. Everything is checked before anything is written."""
    import optuna

    from tunix_rt.registry import queue
    from tunix_rt.registry.jobs import TrialParams

    if not 1 <= trials <= 10_000:
        raise BadInput(f"--trials must be in 1..10000, got {trials}")
    if len(space.enqueue) > trials:
        raise BadInput(f"the space enqueues {len(space.enqueue)} trials, more than --trials {trials}")
    base = {k: v for k, v in base.items() if k != "run_name"}
    space.check_with(base)
    params = [TrialParams(study=name, fixed=space.enqueue[i] if i < len(space.enqueue) else {}).model_dump()
              for i in range(trials)]
    with opened(url) as storage:
        try:
            study = optuna.create_study(study_name=name, storage=storage, direction=space.objective.direction)
        except optuna.exceptions.DuplicatedStudyError:
            raise BadInput(f"sweep {name!r} exists already; pick another --name") from None
        study.set_user_attr(ATTR, {"base": base, "space": space.model_dump(mode="json"), "trials": trials,
                                   "seed": seed, "created_at": dt.datetime.now(dt.timezone.utc).isoformat()})
    return [queue.enqueue("trial", p, max_attempts=max_attempts, url=url) for p in params]


def sweep_jobs(name: str, url: str | None = None) -> list:
    """The trial jobs of sweep `name`, oldest first."""
    from tunix_rt.registry import queue

    jobs = queue.list_jobs(kind="trial", limit=100_000, url=url)
    return sorted((j for j in jobs if j.params.get("study") == name), key=lambda j: j.id)


def describe(name: str, url: str | None = None) -> dict[str, Any]:
    """A sweep for `sweep show` and the API: one row per trial job (its Optuna trial once a
    worker asked for it), the best COMPLETE trial with its full config, the space."""
    with opened(url) as storage:
        sweep = load(storage, name)
        trials = sweep.study.get_trials(deepcopy=False)
    by_job = {t.user_attrs.get(JOB_ATTR): t for t in sorted(trials, key=lambda t: -t.number)}  # a job's first
    rows = [_row(j, by_job.get(j.id)) for j in sweep_jobs(name, url)]
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    sign = 1 if sweep.direction == "minimize" else -1
    best = min(complete, key=lambda t: (sign * t.value, t.number)) if complete else None
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    return {
        "name": name, "created_at": sweep.created_at, "objective": sweep.objective, "direction": sweep.direction,
        "trials_requested": sweep.trials, "counts": counts, "base": sweep.base,
        "space": sweep.space.model_dump(mode="json"), "trials": rows,
        "best": None if best is None else {
            "trial": best.number, "value": best.value, "params": best.params,
            "run_id": best.user_attrs.get(RUN_ATTR), "job_id": best.user_attrs.get(JOB_ATTR),
            "config": sweep.config(best.params).to_dict()},
    }


def _row(job, trial) -> dict[str, Any]:
    steps = sorted(trial.intermediate_values) if trial is not None else []
    return {
        "job_id": job.id, "job_status": job.status, "attempts": job.attempts,
        "trial": trial.number if trial is not None else None,
        "state": trial.state.name if trial is not None else "QUEUED",
        "value": trial.value if trial is not None else None,
        "params": trial.params if trial is not None else job.params.get("fixed", {}),
        "last_step": steps[-1] if steps else None,
        "intermediate": {str(s): trial.intermediate_values[s] for s in steps},
        "run_id": (trial.user_attrs.get(RUN_ATTR) if trial is not None else None) or job.run_id,
        "started_at": _iso(trial.datetime_start) if trial is not None else None,
        "finished_at": _iso(trial.datetime_complete) if trial is not None else None,
    }


def _iso(t: dt.datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def list_sweeps(url: str | None = None) -> list[dict[str, Any]]:
    """Every sweep made by `tunix-rt sweep`, newest first: name, trials, counts, best value."""
    import optuna

    with opened(url) as storage:
        summaries = [s for s in optuna.get_all_study_summaries(storage, include_best_trial=True)
                     if ATTR in s.user_attrs]
    out = [{"name": s.study_name, "created_at": s.user_attrs[ATTR]["created_at"],
            "trials_requested": s.user_attrs[ATTR]["trials"], "trials_asked": s.n_trials,
            "best_value": s.best_trial.value if s.best_trial is not None else None,
            "objective": s.user_attrs[ATTR]["space"].get("objective", {}).get("metric", OBJECTIVE),
            "direction": s.direction.name.lower(),
            "params": sorted(s.user_attrs[ATTR]["space"]["params"])} for s in summaries]
    return sorted(out, key=lambda s: s["created_at"], reverse=True)
