"""The `trial` job: one trial of a sweep, run exactly once however many workers race.

    find the job's trial (or ask the study for it, fenced) → its config (base + values)
    → train the job's run (a retry resumes it), reporting each value of the sweep's objective
    (eval_loss unless its space says otherwise) to Optuna and stopping at the step the median
    rule prunes → tell Optuna: COMPLETE with the final value, PRUNED, or FAIL

Exactly once: the queue gives a job to one worker at a time (lease, fencing token). The trial
is created with the job's id in it (one insert), only after the fence renewed the lease, and a
retried job (lost lease, killed worker, shutdown hand-back) finds that trial by the id and
resumes the same run from its last committed checkpoint; a trial already told is only
reported. Every Optuna write (create, report, tell) and every file write is fenced, so an
attempt that lost its lease stops writing. What no check-then-write closes (tunix_rt.fence) is
a worker paused for a whole lease between its guard and its insert: should two attempts ever
both insert, each keeps the lower-numbered trial and the other is told FAIL.

A pruned trial stops like a stopped run (a checkpoint of the step just done, RunStopped), but
its job succeeds: the trial is told PRUNED and its run marked `pruned`. A run stopped for the
worker's shutdown is handed back to the queue as before (the trial stays RUNNING); a cancelled
one, or one whose last attempt failed, is told FAIL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tunix_rt import fence
from tunix_rt.errors import BadInput
from tunix_rt.registry.jobs import JobContext, TrialParams
from tunix_rt.registry.train_job import require_succeeded, train_for_job
from tunix_rt.rundir import METRICS, Run
from tunix_rt.sweep.study import JOB_ATTR, RUN_ATTR, Sweep, load, opened
from tunix_rt.train.run import RunDir, RunStopped


def run_trial(ctx: JobContext, p: TrialParams) -> dict[str, Any]:
    from tunix_rt.registry.queries import NotFound

    with opened(ctx.home.database_url) as storage:
        try:
            sweep = load(storage, p.study, ctx.job_id)
        except NotFound as e:
            raise BadInput(str(e)) from None
        frozen = own_trial(sweep, ctx, p.fixed)
        if frozen.state.is_finished():  # an earlier attempt told Optuna, then lost its outcome
            return outcome(sweep, frozen)
        return _run(sweep, frozen, ctx)


def own_trial(sweep: Sweep, ctx: JobContext, fixed: dict[str, Any]):
    """The job's trial (a FrozenTrial): the one carrying its id, or a new one (fenced)."""
    import optuna

    mine = _trials_of(sweep, ctx.job_id)
    if not mine:
        dists = sweep.space.distributions()
        unknown = sorted(set(fixed) - set(dists))
        if unknown:
            raise BadInput(f"trial job {ctx.job_id}: fixed {unknown} not in the space of sweep {sweep.name}")
        fence.guard(f"a new trial of sweep {sweep.name} for job {ctx.job_id}")
        sweep.study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.RUNNING, params=fixed, distributions={k: dists[k] for k in fixed},
            user_attrs={JOB_ATTR: ctx.job_id}))
        mine = _trials_of(sweep, ctx.job_id)
    for extra in mine[1:]:  # two attempts both inserted (see above): every attempt keeps the first
        if extra.state == optuna.trial.TrialState.RUNNING:
            fence.guard(f"failing trial {extra.number}, a second trial of job {ctx.job_id}")
            sweep.study.tell(extra.number, state=optuna.trial.TrialState.FAIL)
    return mine[0]


def _trials_of(sweep: Sweep, job_id: int) -> list:
    return sorted((t for t in sweep.study.get_trials(deepcopy=False) if t.user_attrs.get(JOB_ATTR) == job_id),
                  key=lambda t: t.number)


def _run(sweep: Sweep, frozen, ctx: JobContext) -> dict[str, Any]:
    import optuna

    trial = optuna.trial.Trial(sweep.study, frozen._trial_id)  # the running trial, as ask() makes it
    values = sweep.space.suggest(trial)  # asked now (TPE sees every trial finished so far)
    cfg = sweep.config(values, run_name=f"{ctx.run_prefix}-{sweep.name}-t{trial.number}")
    print(f"sweep {sweep.name}: trial {trial.number} (job {ctx.job_id}): "
          + ", ".join(f"{k}={v}" for k, v in values.items()), flush=True)
    watch = PruneWatch(trial, frozen.intermediate_values, ctx, sweep.objective)
    try:
        run_dir = train_for_job(ctx, cfg, watch, one_run=True)
    except RunStopped:
        if watch.pruned_at is not None:
            return _pruned(sweep, trial, ctx, watch, frozen.user_attrs)
        if ctx.cancelled.is_set():
            _fail(sweep, trial, "its job was cancelled")
        raise  # a shutdown: the job goes back to the queue, the trial stays RUNNING
    except fence.LeaseLost:
        raise
    except BadInput as e:
        _fail(sweep, trial, f"bad input: {e}")
        raise
    except Exception as e:
        if _last_attempt(ctx):
            _fail(sweep, trial, f"its last attempt failed: {type(e).__name__}: {e}")
        raise
    require_succeeded(run_dir)
    _record(run_dir, ctx)
    final = Run(run_dir).manifest.get("final", {})
    _set_run(trial, run_dir, frozen.user_attrs)
    metric = sweep.objective
    if metric not in final:
        logged = sorted(k for k in final if k.startswith("eval_"))
        _fail(sweep, trial, f"run {run_dir.name} has no final {metric} (empty or non-finite; it logged "
                            f"{', '.join(logged) or 'no held-out metric'}: set the space's objective to one of them)")
    else:
        fence.guard(f"the result of trial {trial.number}")
        if final.get("steps") is not None and final["steps"] not in watch.reported:
            trial.report(final[metric], int(final["steps"]))  # the last point of its curve
        sweep.study.tell(trial, final[metric])
        print(f"sweep {sweep.name}: trial {trial.number} complete: {metric} {final[metric]:.4f}", flush=True)
    return outcome(sweep, _trials_of(sweep, ctx.job_id)[0])


class PruneWatch:
    """The driver's should_stop for a trial: True when the job must stop (ctx.should_stop), or
    when a new eval row of the objective (`metric`) in the run's metrics.jsonl, reported to
    Optuna, makes the median rule prune the trial (`pruned_at` holds that step)."""

    def __init__(self, trial, reported: dict[int, float], ctx: JobContext, metric: str) -> None:
        self.trial, self.ctx, self.metric = trial, ctx, metric
        self.reported = dict(reported)
        """step -> objective value already in Optuna (a resumed trial's earlier reports included)."""
        self.recheck = bool(self.reported)  # resumed: the last report may have pruned it already
        self.path: Path | None = None
        self.offset = 0
        self.pruned_at: int | None = None

    def __call__(self) -> bool:
        if self.ctx.should_stop():
            return True
        rows = self._new_eval_rows()
        for row in rows:
            if row["step"] not in self.reported:
                fence.guard(f"{self.metric} of trial {self.trial.number} at step {row['step']}")
                self.trial.report(row[self.metric], row["step"])
                self.reported[row["step"]] = row[self.metric]
        if (rows or self.recheck) and self.trial.should_prune():
            self.pruned_at = max(self.reported)
            return True
        self.recheck = False
        return False

    def _new_eval_rows(self) -> list[dict[str, Any]]:
        """Eval rows appended since the last call (the driver writes whole lines before it polls)."""
        if self.path is None:
            run_dir = self.ctx.find_run_dir()
            if run_dir is None:
                return []
            self.path = run_dir / METRICS
        if not self.path.is_file():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        rows = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
        return [r for r in rows if self.metric in r and "step" in r]


def _pruned(sweep: Sweep, trial, ctx: JobContext, watch: PruneWatch, attrs: dict[str, Any]) -> dict[str, Any]:
    """Mark the run pruned, then tell Optuna: a retry before the tell resumes the run and is
    pruned again at its next step; one after it finds the trial PRUNED and only reports it."""
    import optuna

    from tunix_rt.train import checkpoint

    run_dir = ctx.find_run_dir()
    step, kept = watch.pruned_at, checkpoint.latest(run_dir)
    note = (f"sweep {sweep.name}: trial {trial.number} pruned by the median rule at step {step} "
            f"({watch.metric} {watch.reported[step]:.4f}); checkpoint {kept.name if kept else '-'} kept")
    RunDir.open(run_dir).update(status="pruned", error=None,
                                sweep={"name": sweep.name, "trial": trial.number, "pruned_at_step": step, "note": note})
    _record(run_dir, ctx)
    _set_run(trial, run_dir, attrs)
    fence.guard(f"pruning trial {trial.number}")
    sweep.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    print(note, flush=True)
    return outcome(sweep, _trials_of(sweep, ctx.job_id)[0])


def _fail(sweep: Sweep, trial, why: str) -> None:
    import optuna

    fence.guard(f"failing trial {trial.number}")
    trial.set_user_attr("fail_reason", why)
    sweep.study.tell(trial, state=optuna.trial.TrialState.FAIL)
    print(f"sweep {sweep.name}: trial {trial.number} failed: {why}", flush=True)


def _set_run(trial, run_dir: Path | None, attrs: dict[str, Any]) -> None:
    if run_dir is not None and attrs.get(RUN_ATTR) != run_dir.name:
        fence.guard(f"the run of trial {trial.number}")
        trial.set_user_attr(RUN_ATTR, run_dir.name)


def _record(run_dir: Path, ctx: JobContext) -> None:
    from tunix_rt.registry.record import record_run

    record_run(run_dir, strict=True, job_id=ctx.job_id)


def _last_attempt(ctx: JobContext) -> bool:
    from tunix_rt.registry import queue

    return ctx.attempt >= queue.get_job(ctx.job_id, url=ctx.home.database_url).max_attempts


def outcome(sweep: Sweep, frozen) -> dict[str, Any]:
    """The job's result: which trial, how it ended, its values and run."""
    out = {"study": sweep.name, "trial": frozen.number, "state": frozen.state.name, "params": frozen.params,
           "run_id": frozen.user_attrs.get(RUN_ATTR)}
    if frozen.value is not None:
        out["value"] = frozen.value
    if frozen.user_attrs.get("fail_reason"):
        out["error"] = frozen.user_attrs["fail_reason"]
    return out
