"""An LLM judge: any OpenAI-compatible endpoint scores a completion, as an RL reward and
as an eval metric.

    cfg = JudgeConfig(url="http://127.0.0.1:8765/v1", model="gemma3-1b-judge")
    judge = make_judge(cfg)                  # reward(record, completion, reasoning, answer) -> float
    judge(record, completion, reasoning, answer)          # in [0, 1]
    make_batch_judge(cfg)([(record, completion, reasoning, answer), ...])  # concurrent

The rubric is a `str.format` template over {question}, {gold}, {completion}, {reasoning}
and {answer}; the judge's reply is searched with `score_pattern` (one group: the score),
which must lie in [score_min, score_max] and is scaled to [0, 1].

A judge never invents a score: an endpoint that is down, times out, answers an HTTP error,
or answers text without a valid score is retried (at most `max_retries` more times, for
what a retry can fix), then fails the caller with JudgeError naming the endpoint, the model
and what came back. The API key is read from the environment variable `api_key_env`, so no
config file holds a secret.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from tunix_rt.errors import BadInput, TunixRtError

DEFAULT_RUBRIC = (
    "You are grading a student's answer. Question:\n{question}\n\nReference answer: {gold}\n\n"
    "Student's reasoning:\n{reasoning}\n\nStudent's final answer: {answer}\n\n"
    "Rate the student's reasoning and answer from 0 (wrong or useless) to 10 (correct and clearly "
    "argued). Reply with one line: Score: <0-10>"
)
FIELDS = ("question", "gold", "completion", "reasoning", "answer")
RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}
BACKOFF_S = 0.5

Reward = Callable[[Any, str, "str | None", "str | None"], float]


class JudgeError(TunixRtError):
    """The judge could not score: the run fails, it never gets a default score."""


@dataclass(frozen=True)
class JudgeConfig:
    """Where the judge is and how to read it; `judge:` in a YAML file has these keys."""

    url: str
    """Base URL of an OpenAI-compatible API (…/v1); the judge POSTs {url}/chat/completions."""
    model: str
    """The judge model's name on that endpoint."""
    rubric: str = DEFAULT_RUBRIC
    """str.format template over {question}, {gold}, {completion}, {reasoning}, {answer}."""
    score_pattern: str = r"(?i)score\s*[:=]\s*(-?\d+(?:\.\d+)?)"
    """Regex with one group holding the score; its first match in the reply counts."""
    score_min: float = 0.0
    score_max: float = 10.0
    """The rubric's scale; a score outside it is an invalid reply. Scaled to [0, 1]."""
    api_key_env: str = "TUNIX_RT_JUDGE_API_KEY"
    """Environment variable with the endpoint's bearer token (none sent when unset)."""
    max_tokens: int = 64
    temperature: float = 0.0
    timeout_s: float = 60.0
    """Per request."""
    max_retries: int = 2
    """Extra attempts after a failed one (connection, timeout, 408/429/5xx, no valid score)."""
    concurrency: int = 4
    """Requests in flight at once in the batched judge and the eval pass."""

    def __post_init__(self) -> None:
        if not re.match(r"^https?://[^\s/]+", self.url):
            raise BadInput(f"judge url must be http(s)://HOST[:PORT]/…, got {self.url!r}")
        if not self.model:
            raise BadInput("judge model is empty")
        try:
            groups = re.compile(self.score_pattern).groups
        except re.error as e:
            raise BadInput(f"judge score_pattern {self.score_pattern!r}: {e}") from None
        if groups != 1:
            raise BadInput(f"judge score_pattern must have exactly one group (the score), it has {groups}")
        try:
            self.rubric.format(**{f: "" for f in FIELDS})
        except (KeyError, IndexError, ValueError) as e:
            raise BadInput(f"judge rubric: unknown or malformed field {e} (use {', '.join('{' + f + '}' for f in FIELDS)})") from None
        if not self.score_min < self.score_max:
            raise BadInput(f"judge score_min {self.score_min} must be below score_max {self.score_max}")
        for name, low in (("timeout_s", 1e-9), ("max_tokens", 1), ("concurrency", 1), ("max_retries", 0)):
            if getattr(self, name) < low:
                raise BadInput(f"judge {name} must be >= {low}, got {getattr(self, name)}")

    @classmethod
    def from_dict(cls, data: dict, source: str = "judge config") -> "JudgeConfig":
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise BadInput(f"{source}: unknown judge keys {unknown} (known: {sorted(cls.__dataclass_fields__)})")
        try:
            return cls(**data)
        except TypeError as e:
            raise BadInput(f"{source}: {e}") from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> "JudgeConfig":
        """A YAML file holding these keys at the top or under `judge:`."""
        import yaml

        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as e:
            raise BadInput(f"{path}: unreadable judge config ({e})") from None
        data = data.get("judge", data) if isinstance(data, dict) else data
        if not isinstance(data, dict):
            raise BadInput(f"{path}: a judge config is a mapping of {sorted(cls.__dataclass_fields__)}")
        return cls.from_dict(data, str(path))

    def describe(self) -> dict:
        """What eval_summary.json records (no secret: only the variable's name)."""
        return asdict(self)


def _field(record: Any, name: str) -> str:
    value = record.get(name) if isinstance(record, dict) else getattr(record, name, None)
    return "" if value is None else str(value)


def judge_prompt(cfg: JudgeConfig, record: Any, completion: str, reasoning: str | None, answer: str | None) -> str:
    return cfg.rubric.format(question=_field(record, "question"), gold=_field(record, "answer"),
                             completion=completion, reasoning=reasoning or "", answer=answer or "")


def parse_score(cfg: JudgeConfig, reply: str) -> float:
    """The reply's score scaled to [0, 1]; ValueError when it holds no valid score."""
    m = re.search(cfg.score_pattern, reply)
    if not m:
        raise ValueError("no score in the reply")
    score = float(m.group(1))
    if not cfg.score_min <= score <= cfg.score_max:
        raise ValueError(f"score {score} outside [{cfg.score_min}, {cfg.score_max}]")
    return (score - cfg.score_min) / (cfg.score_max - cfg.score_min)


def score_once(cfg: JudgeConfig, prompt: str) -> float:
    """Ask the endpoint, retrying what a retry can fix; JudgeError after the last attempt."""
    problem = ""
    for attempt in range(cfg.max_retries + 1):
        if attempt:
            time.sleep(BACKOFF_S * 2 ** (attempt - 1))
        try:
            reply = _chat(cfg, prompt)
        except _Fatal as e:
            raise JudgeError(f"judge {cfg.url} model {cfg.model!r}: {e}") from None
        except _Retry as e:
            problem = str(e)
            continue
        try:
            return parse_score(cfg, reply)
        except ValueError as e:
            problem = f"{e}: {reply[:300]!r}"
    raise JudgeError(f"judge {cfg.url} model {cfg.model!r}: {problem} (after {cfg.max_retries + 1} attempts)")


class _Retry(Exception):
    pass


class _Fatal(Exception):
    pass


def _chat(cfg: JudgeConfig, prompt: str) -> str:
    """One chat completion's text; _Retry or _Fatal on failure."""
    body = json.dumps({"model": cfg.model, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": cfg.max_tokens, "temperature": cfg.temperature}).encode()
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(cfg.api_key_env)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(cfg.url.rstrip("/") + "/chat/completions", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=cfg.timeout_s) as r:  # noqa: S310 - the configured endpoint
            raw = r.read()
    except urllib.error.HTTPError as e:
        detail = e.read()[:300].decode("utf-8", "replace")
        msg = f"HTTP {e.code}: {detail}"
        raise (_Retry if e.code in RETRY_STATUS else _Fatal)(msg) from None
    except (urllib.error.URLError, OSError) as e:  # TimeoutError and ConnectionError are OSErrors
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError):
            raise _Retry(f"no answer: timed out after {cfg.timeout_s} s") from None
        raise _Retry(f"cannot reach the endpoint ({reason})") from None
    try:
        return json.loads(raw)["choices"][0]["message"]["content"] or ""
    except (ValueError, KeyError, IndexError, TypeError):
        raise _Retry(f"not an OpenAI chat completion: {raw[:300]!r}") from None


def make_judge(cfg: JudgeConfig) -> Reward:
    """reward(record, completion, reasoning, answer) -> score in [0, 1]; raises JudgeError."""

    def judge(record: Any, completion: str, reasoning: str | None, answer: str | None) -> float:
        return score_once(cfg, judge_prompt(cfg, record, completion, reasoning, answer))

    judge.__name__ = "judge"
    return judge


def make_batch_judge(cfg: JudgeConfig) -> Callable[[Sequence[tuple]], list[float]]:
    """Scores of many (record, completion, reasoning, answer) at once, `concurrency` in
    flight; the first JudgeError fails the whole batch."""
    judge = make_judge(cfg)

    def batch(items: Sequence[tuple]) -> list[float]:
        with ThreadPoolExecutor(max_workers=cfg.concurrency) as pool:
            return list(pool.map(lambda it: judge(*it), items))

    return batch


def judge_predictions(cfg: JudgeConfig, records: Sequence[Any], preds: list[dict]) -> dict:
    """The eval pass: sets `judge_score` on every prediction; returns the metrics to add
    ({"judge_score": mean})."""
    scores = make_batch_judge(cfg)([(r, p["completion"], p["reasoning"], p["answer"]) for r, p in zip(records, preds)])
    for p, s in zip(preds, scores):
        p["judge_score"] = s
    return {"judge_score": sum(scores) / len(scores) if scores else 0.0}
