"""Rewards for RL with verifiable rewards (the GRPO family): plain functions of one
completion, a registry of them by name, and the weighted set a run's config names.

Every reward has one signature:

    reward(record: Trace, completion: str, reasoning: str | None, answer: str | None) -> float

`completion` is the generated text (the stop token may or may not be there); `reasoning` and
`answer` are what `render.parse_completion` found in it (None when the tag is absent), parsed
once per completion by `RewardSet.score` and handed to every reward.

Built-ins (a factory per name; its parameters are the factory's keyword arguments):
- `format`: 1 when eval's `format_ok` holds, else 0.
- `answer`: 1 when eval's `correct` holds, else 0: by the record's own scorer (meta.scorer:
  numeric by default, `math`, `rg:<task>`; eval.scoring.score).
- `answer_close(rel_tol=0.1)`: 1 when correct; else, when the tagged answer and the gold
  are numbers, 1 - err / rel_tol floored at 0 with err = |pred - gold| / |gold| (a linear
  decay: 1% off earns 0.9, 5% off 0.5, 10% or more 0); 0 when gold is 0 or either is not
  a number.
- `arith(none_value=0.0)`: the share of the arithmetic claims in the reasoning that hold
  (`train.arith`: exact, with Fraction); `none_value` when the reasoning makes no claim.
  With tools, only the claims the model wrote itself count: one that overlaps a
  tool-written span (`<<48/2=24>>`: the tool wrote `24>>`) is neither true nor false.
- `tool_error(mode="count")`: a penalty for the tool calls that ended in an error (a
  calculator expression that does not parse or divides by zero, python code that raised or
  was cut off): `count` -1 per error (-3 for three), `any` -1 when at least one call
  erred; 0 without an error or without tools. Weight it low beside `answer` (0.1-0.2): it
  teaches well-formed calls, and it must not pay a policy for calling no tool at all.
- `length(budget, mode="linear")`: 0 up to `budget` characters of completion
  (`<end_of_turn>` not counted), then a penalty: `linear` -(n - budget) / budget floored
  at -1 (reached at twice the budget), or `step` -1. The budget is required: no length
  suits every task.

`format` and `answer` call `eval.scoring.score_completion` on the text, so a reward of 1
means exactly what eval counts: one rule, in one place.

Why `arith` gives 0 to a reasoning without claims by default: the reward is a share, so
any neutral value above 0 pays a model for leaving its arithmetic out (with 1, omitting it
earns the maximum, and a policy learns to stop showing its work). With 0, only claims that
hold earn anything; a false claim earns no less than none, which is `answer`'s job to
punish through the result. A share also saturates (one true `1 + 1 = 2` earns 1.0), so
weight `arith` below `answer`.

A config names rewards with weights, a parameter mapping where needed (`weight` defaults
to 1.0 there), and user rewards as `module:function` (a function with the signature above,
taking no parameters):

    {"format": 0.5, "answer": 1.0, "arith": {"weight": 0.5, "none_value": 0},
     "length": {"weight": 0.2, "budget": 1200}, "mymod:fn": 1.0}

A reward that raises, returns a non-number or a non-finite value stops the run with a
TunixRtError naming the reward and the record; nothing is zeroed silently (a bool counts
as the number 0 or 1).

A reward may also take a keyword-only parameter `tools` (detected from its signature): it
then receives the completion's `ToolUse` (which characters of the completion a tool wrote,
how many calls, how many errors), as the rollout recorded it; a completion scored without
that record (no tools) gets `NO_TOOLS`; `tool_use(generation, tok)` makes it from a generated
completion (its tool_mask and tool_calls). Nothing else changes for the other rewards.

A reward call has a time limit (`RewardSet(timeout_s=…)`, a run's `reward_timeout_s`): one
that runs longer (a sleep, a loop, a hung request) stops the run the same way. Rewards run
in-process, so the calls run on a daemon worker thread and the caller waits for each with a
timeout: the run fails at once, and a call that never returns is left behind (a daemon
thread does not keep the process alive). Not a subprocess: a reward is any Python callable
(closures of factories, a judge with its config), and crossing a process boundary would
mean pickling it. The one thing a thread cannot bound is C code that holds the GIL and
never checks for signals; such a reward blocks the whole process.

Registration point for rewards built from parameters (the LLM judge among them):
`register_reward(name, factory)`, where `factory(**params) -> reward`. The parameters of the
config entry (all but `weight`) are checked against the factory's signature before the
call; a factory taking `**params` checks them itself (raise BadInput), as `judge` does.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import numbers
import queue
import threading
from dataclasses import dataclass, field
from functools import reduce
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.eval.scoring import score_completion, score_record
from tunix_rt.render import END_OF_TURN, parse_completion, parse_number
from tunix_rt.traces.schema import Trace
from tunix_rt.train.arith import find_claims

Reward = Callable[[Trace, str, str | None, str | None], float]


@dataclass(frozen=True)
class ToolUse:
    """What the tools did in one completion (the keyword `tools` of a reward that asks)."""

    spans: tuple[tuple[int, int], ...] = ()
    """[start, end) character spans of the completion text that a tool wrote."""
    calls: int = 0
    """Tool calls the model closed."""
    errors: int = 0
    """Of those, the calls whose result was an error."""


NO_TOOLS = ToolUse()


def tool_use(gen, tok) -> ToolUse:
    """What the tools did in a generated completion (an eval.generate.Generation): the
    character spans of its text they wrote (eval.generate.tool_spans), its calls, its errors."""
    from tunix_rt.eval.generate import tool_spans

    if not gen.tool_calls:
        return NO_TOOLS
    return ToolUse(tool_spans(gen, tok), len(gen.tool_calls), sum(bool(c["error"]) for c in gen.tool_calls))


RewardFactory = Callable[..., Reward]

_REGISTRY: dict[str, RewardFactory] = {}


def is_user_reward(name: str) -> bool:
    """`name` names a user's function (`module:function`, imported when resolved: user code),
    not a registered reward. The one rule for it: registration refuses such names, the config
    resolves them by import, and the job API refuses them (no user code from HTTP)."""
    return ":" in str(name)


def register_reward(name: str, factory: RewardFactory) -> None:
    """Make `name` usable in a config: `factory(**params)` builds the reward."""
    if not name or is_user_reward(name):
        raise BadInput(f"reward name {name!r}: must be non-empty and without ':' (reserved for module:function)")
    if name in _REGISTRY:
        raise BadInput(f"reward {name!r} is already registered")
    _REGISTRY[name] = factory


def reward_names() -> list[str]:
    """The registered names, sorted."""
    return sorted(_REGISTRY)


# --- built-ins ---------------------------------------------------------------------------


def format_reward() -> Reward:
    def format_ok(record: Trace, completion: str, reasoning: str | None, answer: str | None) -> float:
        return float(score_completion(completion, record.answer).format_ok)

    return format_ok


def answer_reward() -> Reward:
    def correct(record: Trace, completion: str, reasoning: str | None, answer: str | None) -> float:
        return float(score_record(completion, record).correct)

    return correct


def answer_close_reward(rel_tol: float = 0.1) -> Reward:
    _check_positive("answer_close", "rel_tol", rel_tol)

    def answer_close(record: Trace, completion: str, reasoning: str | None, answer: str | None) -> float:
        if score_record(completion, record).correct:
            return 1.0
        pred, gold = parse_number(answer), parse_number(record.answer)
        if pred is None or gold is None or gold == 0:
            return 0.0
        err = abs(pred - gold) / abs(gold)
        return max(0.0, 1.0 - float(err) / rel_tol)

    return answer_close


def arith_reward(none_value: float = 0.0) -> Reward:
    if not _is_number(none_value) or not 0.0 <= none_value <= 1.0:
        raise BadInput(f"reward 'arith': none_value must be a number in [0, 1], got {none_value!r}")

    def arith(record: Trace, completion: str, reasoning: str | None, answer: str | None, *,
              tools: ToolUse = NO_TOOLS) -> float:
        claims = find_claims(reasoning or "", _spans_in(completion, reasoning, tools.spans))
        return sum(c.holds for c in claims) / len(claims) if claims else float(none_value)

    return arith


def _spans_in(completion: str, part: str | None, spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """`spans` of the completion, moved to be spans of `part`, a piece of it (the reasoning
    parse_completion found: the text after the first <reasoning> tag, stripped)."""
    if not spans or not part:
        return []
    at = completion.find(part, max(completion.find("<reasoning>"), 0))
    return [(a - at, b - at) for a, b in spans if b > at and a < at + len(part)] if at >= 0 else []


TOOL_ERROR_MODES = ("count", "any")


def tool_error_reward(mode: str = "count") -> Reward:
    if mode not in TOOL_ERROR_MODES:
        raise BadInput(f"reward 'tool_error': mode must be one of {'|'.join(TOOL_ERROR_MODES)}, got {mode!r}")

    def tool_error(record: Trace, completion: str, reasoning: str | None, answer: str | None, *,
                   tools: ToolUse = NO_TOOLS) -> float:
        if mode == "any":
            return -1.0 if tools.errors else 0.0
        return -float(tools.errors)

    return tool_error


LENGTH_MODES = ("linear", "step")


def length_reward(budget: int, mode: str = "linear") -> Reward:
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise BadInput(f"reward 'length': budget must be an integer >= 1 (characters), got {budget!r}")
    if mode not in LENGTH_MODES:
        raise BadInput(f"reward 'length': mode must be one of {'|'.join(LENGTH_MODES)}, got {mode!r}")

    def length(record: Trace, completion: str, reasoning: str | None, answer: str | None) -> float:
        over = len(completion.replace(END_OF_TURN, "")) - budget
        if over <= 0:
            return 0.0
        return -1.0 if mode == "step" else -min(1.0, over / budget)

    return length


def _check_positive(reward: str, name: str, value: Any) -> None:
    if not _is_number(value) or not value > 0:
        raise BadInput(f"reward {reward!r}: {name} must be a number > 0, got {value!r}")


def _is_number(value: Any) -> bool:
    """A finite real number (bool is not one here: `weight: true` is a config mistake)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def judge_reward(config: str | None = None, **fields: Any) -> Reward:
    """An LLM judge over any OpenAI-compatible endpoint (tunix_rt.eval.judge): the judge
    config inline (`judge: {weight: 1, url: ..., model: ..., rubric: ...}`) or as a YAML
    file (`judge: {weight: 1, config: judge.yaml}`). An endpoint that is down or answers
    garbage fails the run (JudgeError): there is no default score."""
    from tunix_rt.eval.judge import JudgeConfig, make_judge

    if config is not None:
        if fields:
            raise BadInput(f"reward 'judge': give config: FILE or the judge fields, not both (got {sorted(fields)})")
        return make_judge(JudgeConfig.from_yaml(config))
    return make_judge(JudgeConfig.from_dict(fields, "rewards.judge"))


for _name, _factory in (("format", format_reward), ("answer", answer_reward),
                        ("answer_close", answer_close_reward), ("arith", arith_reward),
                        ("length", length_reward), ("judge", judge_reward), ("tool_error", tool_error_reward)):
    register_reward(_name, _factory)


# --- the weighted set --------------------------------------------------------------------


@dataclass(frozen=True)
class RewardTerm:
    """One config entry: a registered name or `module:function`, its weight, its parameters."""

    name: str
    weight: float
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RewardSpec:
    """The rewards of a run, as configured (plain data: what config.yaml holds)."""

    terms: tuple[RewardTerm, ...]

    @classmethod
    def from_mapping(cls, data: Any, source: str = "rewards") -> "RewardSpec":
        """`{name: weight | {weight?, **params}}` → RewardSpec; BadInput on a malformed entry,
        an unknown name or a parameter the reward does not take. Nothing is imported or
        built here: `build` (at the run's setup, before any rollout) does that."""
        if not isinstance(data, Mapping) or not data:
            raise BadInput(f"{source}: expected a non-empty mapping of reward name to weight, got {data!r}")
        return cls(tuple(_term(name, value, source) for name, value in data.items()))

    def to_mapping(self) -> dict[str, Any]:
        return {t.name: ({"weight": t.weight, **t.params} if t.params else t.weight) for t in self.terms}

    def build(self, timeout_s: float | None = None) -> "RewardSet":
        return RewardSet([(t.name, t.weight, _resolve(t)) for t in self.terms], timeout_s)


def _term(name: Any, value: Any, source: str) -> RewardTerm:
    if not isinstance(name, str) or not name:
        raise BadInput(f"{source}: reward names are non-empty strings, got {name!r}")
    params = dict(value) if isinstance(value, Mapping) else {"weight": value}
    weight = params.pop("weight", 1.0)
    if not _is_number(weight):
        raise BadInput(f"{source}.{name}: weight must be a finite number, got {weight!r}")
    if any(not isinstance(k, str) for k in params):
        raise BadInput(f"{source}.{name}: parameter names are strings, got {list(params)!r}")
    term = RewardTerm(name, float(weight), params)
    _check_params(term)
    return term


def _check_params(term: RewardTerm) -> None:
    """The name is registered (or module:function, which takes no parameters) and the
    parameters bind to its factory's signature."""
    if is_user_reward(term.name):
        if term.params:
            raise BadInput(f"reward {term.name!r}: a module:function reward takes no parameters "
                           f"(got {sorted(term.params)}); register a factory for parameters")
        return
    factory = _REGISTRY.get(term.name)
    if factory is None:
        raise BadInput(f"unknown reward {term.name!r}; known: {', '.join(reward_names())}, or module:function")
    try:
        inspect.signature(factory).bind(**term.params)
    except TypeError as exc:
        raise BadInput(f"reward {term.name!r}: {exc} (parameters: {_params_of(factory)})") from None


def _resolve(term: RewardTerm) -> Reward:
    _check_params(term)  # a spec may be built by hand, not only from a mapping
    if is_user_reward(term.name):
        return _import_function(term.name)
    return _REGISTRY[term.name](**term.params)


def _params_of(factory: RewardFactory) -> str:
    names = [p for p in inspect.signature(factory).parameters]
    return ", ".join(names) or "none"


def _import_function(path: str) -> Reward:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise BadInput(f"reward {path!r}: expected module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BadInput(f"reward {path!r}: cannot import module {module_name!r}: {exc}") from None
    try:
        fn = reduce(getattr, attr.split("."), module)
    except AttributeError:
        raise BadInput(f"reward {path!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(fn):
        raise BadInput(f"reward {path!r}: {attr!r} is a {type(fn).__name__}, not a function")
    return fn


class RewardSet:
    """Named, weighted rewards; `score` runs all of them over a batch of completions, each
    call within `timeout_s` seconds (None: no limit)."""

    def __init__(self, terms: Sequence[tuple[str, float, Reward]], timeout_s: float | None = None):
        if not terms:
            raise BadInput("rewards: at least one reward is needed")
        if timeout_s is not None and not (_is_number(timeout_s) and timeout_s > 0):
            raise BadInput(f"rewards: timeout_s must be a number > 0 (or None), got {timeout_s!r}")
        self.terms = list(terms)
        self.timeout_s = timeout_s
        self._wants_tools = {name: takes_tools(fn) for name, _, fn in self.terms}

    @classmethod
    def from_config(cls, data: Any, source: str = "rewards", timeout_s: float | None = None) -> "RewardSet":
        return RewardSpec.from_mapping(data, source).build(timeout_s)

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.terms]

    def score(self, records: Sequence[Trace], completions: Sequence[str],
              tools: Sequence[ToolUse] | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(total [n], {name: [n]}): each reward unweighted in `parts`, the total their
        weighted sum. records[i] is the record completions[i] answers (repeat a record for
        each completion of its group); tools[i] what the tools did in it (None: nothing)."""
        if len(records) != len(completions):
            raise ValueError(f"{len(records)} records for {len(completions)} completions")
        uses = list(tools) if tools is not None else [NO_TOOLS] * len(completions)
        if len(uses) != len(completions):
            raise ValueError(f"{len(uses)} tool records for {len(completions)} completions")
        parts = {name: np.zeros(len(completions)) for name in self.names}
        worker = _Worker()  # one thread per batch: nothing is left behind once it is scored
        try:
            for i, (record, text) in enumerate(zip(records, completions)):
                reasoning, answer, _ = parse_completion(text)
                for name, _, fn in self.terms:
                    call = functools.partial(fn, tools=uses[i]) if self._wants_tools[name] else fn
                    parts[name][i] = self._call(worker, name, call, record, text, reasoning, answer)
        finally:
            worker.stop()
        total = np.zeros(len(completions))
        for name, weight, _ in self.terms:
            total += weight * parts[name]
        return total, parts

    def _call(self, worker: "_Worker", name: str, fn: Reward, record: Trace, text: str,
              reasoning: str | None, answer: str | None) -> float:
        where = f"reward {name!r} on record {record.id}"
        try:
            value = worker.call(fn, (record, text, reasoning, answer), self.timeout_s)
        except TimeoutError:
            raise TunixRtError(f"{where}: no result within reward_timeout_s={self.timeout_s:g} s (the call is "
                               "abandoned on its daemon thread)") from None
        except Exception as exc:
            raise TunixRtError(f"{where}: {type(exc).__name__}: {exc}") from exc
        if not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise TunixRtError(f"{where}: returned {value!r} ({type(value).__name__}), not a finite number")
        return float(value)


def takes_tools(fn: Callable) -> bool:
    """Whether a reward takes the keyword-only parameter `tools` (a ToolUse)."""
    try:
        param = inspect.signature(fn).parameters.get("tools")
    except (TypeError, ValueError):  # a callable without a signature Python can read
        return False
    return param is not None and param.kind is inspect.Parameter.KEYWORD_ONLY


class _Worker:
    """One daemon thread that runs calls one at a time; the caller waits for each result with
    a timeout. Daemon: a call that never returns does not keep the process alive at exit."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="tunix-rt-reward", daemon=True).start()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            fn, args = call
            try:
                self._results.put((True, fn(*args)))
            except BaseException as exc:  # handed to the caller, raised there
                self._results.put((False, exc))

    def call(self, fn: Callable, args: tuple, timeout_s: float | None) -> Any:
        """fn(*args), or TimeoutError after timeout_s seconds (this worker is then busy for good)."""
        self._calls.put((fn, args))
        try:
            ok, out = self._results.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError from None
        if not ok:
            raise out
        return out

    def stop(self) -> None:
        """The thread ends after the call in progress (at once when idle)."""
        self._calls.put(None)
