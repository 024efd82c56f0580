"""A sweep's search space, read from SPACE.yaml:

    params:                       # TrainConfig fields and what each trial may pick
      lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
      lora_rank: {type: int, low: 4, high: 32, step: 4}
      schedule: {type: categorical, choices: [cosine, constant]}
    enqueue:                      # optional: the first trials pin these values (a known-good
      - {lr: 3.0e-3}              # config, say); the others are asked of the sampler
    sampler: {n_startup_trials: 10}              # TPE: random trials before its model
    pruner: {n_startup_trials: 5, n_warmup_steps: 0}   # median rule, on the objective
    objective: {metric: eval_loss, direction: minimize}  # the default; any held-out metric
                                  # the base's method logs: eval_accuracy (maximize) for the
                                  # sampling methods (grpo, rft, dpo on rollouts), whose runs
                                  # log no eval_loss; eval_rewards_accuracy for dpo on pairs
                                  # (its eval_loss is not comparable across pref_loss or beta)

Everything is checked before a sweep is created: names are TrainConfig fields, every bound,
choice and enqueued value makes a valid config with the base (bad input, exit 2, nothing
written). optuna is imported only where a distribution or a trial is needed.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tunix_rt.errors import BadInput

Choice = str | int | float | bool | None
FORBIDDEN = ("run_name",)
"""Fields a trial may not vary: the job names its run."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FloatParam(_Strict):
    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: Annotated[float | None, Field(gt=0)] = None

    @model_validator(mode="after")
    def _check(self) -> "FloatParam":
        _check_range(self.low, self.high, self.log)
        if self.log and self.step is not None:
            raise ValueError("step and log cannot both be set")
        return self

    def distribution(self):
        from optuna.distributions import FloatDistribution

        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def suggest(self, trial, name: str) -> float:
        return trial.suggest_float(name, self.low, self.high, log=self.log, step=self.step)

    def candidates(self) -> list[Any]:
        return [self.low, self.high]

    def coerce(self, value: Any) -> float:
        if isinstance(value, str):  # YAML 1.1 reads 3e-3 (no dot) as a string
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not self.low <= value <= self.high:
            raise ValueError(f"{value!r} is not a number in [{self.low}, {self.high}]")
        return float(value)


class IntParam(_Strict):
    type: Literal["int"]
    low: int
    high: int
    log: bool = False
    step: Annotated[int, Field(ge=1)] = 1

    @model_validator(mode="after")
    def _check(self) -> "IntParam":
        _check_range(self.low, self.high, self.log)
        if self.log and self.step != 1:
            raise ValueError("step and log cannot both be set")
        return self

    def distribution(self):
        from optuna.distributions import IntDistribution

        return IntDistribution(self.low, self.high, log=self.log, step=self.step)

    def suggest(self, trial, name: str) -> int:
        return trial.suggest_int(name, self.low, self.high, log=self.log, step=self.step)

    def candidates(self) -> list[Any]:
        return [self.low, self.high]

    def coerce(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not self.low <= value <= self.high \
                or (value - self.low) % self.step:
            raise ValueError(f"{value!r} is not an integer in [{self.low}, {self.high}] on step {self.step}")
        return value


class CategoricalParam(_Strict):
    type: Literal["categorical"]
    choices: Annotated[list[Choice], Field(min_length=1)]

    @model_validator(mode="after")
    def _check(self) -> "CategoricalParam":
        if len(set(map(repr, self.choices))) != len(self.choices):
            raise ValueError(f"choices repeat a value: {self.choices}")
        return self

    def distribution(self):
        from optuna.distributions import CategoricalDistribution

        return CategoricalDistribution(self.choices)

    def suggest(self, trial, name: str) -> Choice:
        return trial.suggest_categorical(name, self.choices)

    def candidates(self) -> list[Any]:
        return list(self.choices)

    def coerce(self, value: Any) -> Choice:
        if value not in self.choices:
            raise ValueError(f"{value!r} is not one of {self.choices}")
        return value


Param = Annotated[FloatParam | IntParam | CategoricalParam, Field(discriminator="type")]


class SamplerSpec(_Strict):
    n_startup_trials: Annotated[int, Field(ge=0)] = 10
    """TPE samples at random until this many trials finished (Optuna's default)."""


class PrunerSpec(_Strict):
    n_startup_trials: Annotated[int, Field(ge=0)] = 5
    """Prune nothing until this many trials completed (Optuna's default)."""
    n_warmup_steps: Annotated[int, Field(ge=0)] = 0
    """Prune nothing before this training step."""


class ObjectiveSpec(_Strict):
    metric: Annotated[str, Field(pattern=r"^eval_[a-z0-9_]+$")] = "eval_loss"
    """A held-out metric the trials' runs log (a key of their eval rows and of their final
    metrics): eval_loss, eval_accuracy, eval_reward, eval_rewards_accuracy, eval_kl_teacher…"""
    direction: Literal["minimize", "maximize"] = "minimize"


class SweepSpace(_Strict):
    params: Annotated[dict[str, Param], Field(min_length=1)]
    enqueue: list[dict[str, Choice]] = Field(default_factory=list)
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    pruner: PrunerSpec = Field(default_factory=PrunerSpec)
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    """What every trial is scored by (a sweep stored before there was a choice: eval_loss, minimised)."""

    @model_validator(mode="after")
    def _check(self) -> "SweepSpace":
        from tunix_rt.train.config import TrainConfig

        known = {f.name for f in fields(TrainConfig)} - set(FORBIDDEN)
        unknown = sorted(set(self.params) - known)
        if unknown:
            raise ValueError(f"params {unknown} are not TrainConfig fields a trial may set")
        for i, entry in enumerate(self.enqueue):
            extra = sorted(set(entry) - set(self.params))
            if extra:
                raise ValueError(f"enqueue[{i}]: {extra} not in params")
            for name, value in entry.items():
                try:
                    entry[name] = self.params[name].coerce(value)
                except ValueError as e:
                    raise ValueError(f"enqueue[{i}].{name}: {e}") from None
        return self

    def distributions(self) -> dict[str, Any]:
        return {name: p.distribution() for name, p in self.params.items()}

    def suggest(self, trial) -> dict[str, Any]:
        """The trial's value of every parameter: stored ones as they are (a resumed or pinned
        trial), the others asked of the study's sampler now."""
        return {name: p.suggest(trial, name) for name, p in self.params.items()}

    def check_with(self, base: dict[str, Any]) -> None:
        """Every bound, choice and enqueued entry makes a valid job config with `base`."""
        for values in [{name: v} for name, p in self.params.items() for v in p.candidates()] + self.enqueue:
            trial_config(base, values, source=f"space {values}")


def trial_config(base: dict[str, Any], values: dict[str, Any], run_name: str | None = None,
                 source: str = "trial"):
    """The TrainConfig of a trial: the sweep's base with the trial's values (model and dataset
    names from the home, as every job's)."""
    from tunix_rt.registry.jobs import check_home_names
    from tunix_rt.train.config import TrainConfig

    cfg = TrainConfig.from_dict({**base, **values, "run_name": run_name}, source=source)
    try:
        check_home_names(cfg)
    except ValueError as e:
        raise BadInput(f"{source}: {e}") from None
    return cfg


def _check_range(low: float, high: float, log: bool) -> None:
    if not low < high:
        raise ValueError(f"low ({low}) must be below high ({high})")
    if log and low <= 0:
        raise ValueError(f"a log scale needs low > 0, got {low}")


def load_space(path: str | Path) -> SweepSpace:
    """SPACE.yaml as a checked SweepSpace (BadInput naming the file and each problem)."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise BadInput(f"{p}: cannot read the space file: {e}") from None
    except yaml.YAMLError as e:
        raise BadInput(f"{p}: not valid YAML: {e}") from None
    return parse_space(data, str(p))


def parse_space(data: Any, source: str = "space") -> SweepSpace:
    try:
        return SweepSpace.model_validate(data)
    except ValidationError as e:
        why = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'space'}: {err['msg']}" for err in e.errors())
        raise BadInput(f"{source}: {why}") from None
