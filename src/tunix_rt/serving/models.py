"""Which models can be served, and the loaded ones: a catalog name or a run id, resolved
exactly as `tunix-rt eval` resolves `--model` / `--adapter` (a run's LoRA adapter merged
into its base model, or its merged weights; the run's system prompt and tools), loaded on
first use and kept in an LRU of at most `max_models`.

A run trained with tools (its config.yaml `tools: [calculator]`) is served with them by
default: a reply's calls are answered by the tool, as in training and eval
(`ServedModel.decoding`); `ServeConfig(tools=False)` (`tunix-rt serve --no-tools`, `tunix-rt
chat --no-tools`) serves every model without, and a request may turn them off for itself."""

from __future__ import annotations

import collections
import re
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.eval.generate import DecodeConfig
from tunix_rt.home import Home
from tunix_rt.models.catalog import PRESETS
from tunix_rt.models.store import MODEL_MANIFEST, installed_dir
from tunix_rt.rundir import Run
from tunix_rt.serving.scheduler import Scheduler

MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,199}$")
"""A model id is a catalog name or a run id: never a path."""
RETRY_AFTER_S = 5
"""What a request refused for want of a free model slot is told to wait before retrying."""


class ModelNotFound(BadInput):
    """No catalog model or run of that name (404 from the API, exit 2 from the CLI)."""


class ModelsBusy(TunixRtError):
    """Every loaded model has requests in flight and no room is left for another: retry
    after `retry_after_s` (503 from the API)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class ServeConfig:
    """How the models are served; defaults live in service Settings."""

    device: str = "auto"
    max_models: int = 2
    max_batch: int = 8
    max_queue: int = 64
    load_wait_s: float = 30.0
    """How long a load waits for a loaded model to go idle before ModelsBusy."""
    tools: bool = True
    """Decode with each run's tools (its config.yaml `tools`); False: every model without."""
    weights: str = "fp32"
    """fp32 | int8 | int4: serve every model on weight-only int8 or int4 weights
    (tunix_rt.eval.int8_weights; Gemma 3/2 only; int4 on a CPU with its kernel)."""


@dataclass
class ServedModel:
    """A loaded model: its scheduler, tokenizer, system prompt and context length."""

    id: str
    scheduler: Scheduler
    system_prompt: str
    max_context: int
    run_id: str | None
    max_prompt_chars: int = 0
    """Characters of message text past which the prompt cannot fit the context whatever the
    tokenization (0: no bound known); checked before tokenizing."""
    tools: tuple[str, ...] = ()
    """The tools its replies call (the run's, unless the server turned them off)."""

    @property
    def tok(self):
        return self.scheduler.gen.tok

    def decoding(self, cfg: DecodeConfig, tools: bool = True) -> DecodeConfig:
        """A request's decoding with this model's tools (tools=False: without any)."""
        return replace(cfg, tools=self.tools if tools else ())


def run_tools(run_dir: Path | None) -> tuple[str, ...]:
    """The tools a run trained with (its config.yaml `tools`; none for a catalog model or a
    run from before tools existed)."""
    from tunix_rt.eval.runner import run_config
    from tunix_rt.tools import check_tools

    if run_dir is None:
        return ()
    return tuple(check_tools(run_config(run_dir).get("tools") or [], f"{run_dir.name}/config.yaml: tools"))


def run_has_weights(run_dir: Path) -> bool:
    return Run(run_dir).adapter is not None or Run(run_dir).merged is not None


def available(home: Home) -> list[dict]:
    """What /v1/models lists: tiny presets (built on first use), imported catalog models,
    and runs with final weights; newest run first."""
    out = []
    for name, preset in PRESETS.items():
        manifest = installed_dir(name, home) / MODEL_MANIFEST
        if preset.tiny or manifest.is_file():
            out.append({"id": name, "kind": "catalog", "created": int(manifest.stat().st_mtime) if manifest.is_file() else 0,
                        "tools": []})
    runs = [d for d in home.runs.glob("*") if d.is_dir() and run_has_weights(d)] if home.runs.is_dir() else []
    for d in sorted(runs, key=lambda d: d.stat().st_mtime, reverse=True):
        out.append({"id": d.name, "kind": "run", "created": int(d.stat().st_mtime), "tools": list(_listed_tools(d))})
    return out


def _listed_tools(run_dir: Path) -> tuple[str, ...]:
    """A listed run's tools; one whose config.yaml cannot be read is listed without (loading
    it says why), so one broken run does not hide the others."""
    try:
        return run_tools(run_dir)
    except TunixRtError:
        return ()


def eval_request(model_id: str, home: Home):
    """The EvalRequest naming this model (catalog name → --model, run id → --adapter)."""
    from tunix_rt.eval.runner import EvalRequest

    if not MODEL_ID.match(model_id):
        raise ModelNotFound(f"model {model_id!r} does not exist (a catalog name or a run id)")
    if model_id in PRESETS:
        preset = PRESETS[model_id]
        if not preset.tiny and not (installed_dir(model_id, home) / MODEL_MANIFEST).is_file():
            raise ModelNotFound(f"model {model_id!r} is not imported: run `tunix-rt model import {model_id}`")
        return EvalRequest(dataset="(serve)", model=model_id)
    run = home.runs / model_id
    if not run.is_dir():
        raise ModelNotFound(f"model {model_id!r} does not exist (a catalog name or a run id; see /v1/models)")
    if not run_has_weights(run):
        raise ModelNotFound(f"run {model_id!r} has no final/adapter or final/merged weights (still training?)")
    return EvalRequest(dataset="(serve)", adapter=model_id)


def max_prompt_chars(tok, max_context: int) -> int:
    """No token decodes to more characters than its piece has, so a text of more than
    max_context × (longest piece) characters needs more than max_context tokens: a bound
    that refuses only prompts that could never fit, without tokenizing them."""
    if not max_context:
        return 0
    longest = max(len(tok.token_text(i) or "") for i in range(tok.vocab_size))
    return max_context * max(longest, 1)


def load(model_id: str, home: Home, cfg: ServeConfig, on_idle: Callable[[], None] = lambda: None) -> ServedModel:
    """Resolve and load a model onto the eval generator, with its scheduler running
    (`on_idle`: called whenever its batch empties)."""
    from tunix_rt.eval.generate import TorchGenerator
    from tunix_rt.devices import resolve_device
    from tunix_rt.eval.runner import load_model, resolve_target
    from tunix_rt.models.store import load_tokenizer
    from tunix_rt.train import engines

    engines.require("torch")
    target = resolve_target(eval_request(model_id, home), home)
    device = resolve_device("torch", cfg.device)
    tok = load_tokenizer(target.tokenizer, home)
    from tunix_rt.eval.int8_weights import check_weights, use_weights

    check_weights(cfg.weights)
    gen = TorchGenerator(load_model(target.model_dir, target.adapter_dir, device), tok, device)
    if cfg.weights != "fp32":
        use_weights(gen, cfg.weights)
    ctx = int(getattr(gen.model.config, "max_position_embeddings", 0) or 0)
    sched = Scheduler(gen, cfg.max_batch, cfg.max_queue, name=model_id, on_idle=on_idle)
    return ServedModel(model_id, sched, target.system_prompt, ctx, target.run_dir.name if target.run_dir else None,
                       max_prompt_chars(tok, ctx), run_tools(target.run_dir) if cfg.tools else ())


class ModelCache:
    """Loaded models, at most `max_models`. A request holds its model from `acquire` until
    it is submitted (`release`); after that its scheduler counts it until its rows finish.
    Loading another model first unloads the least recently used model that is idle (held
    by nobody, its scheduler empty), waiting up to `load_wait_s` for one to become idle, so
    a request in flight never loses its model (ModelsBusy past the wait). Loads run one at
    a time (transformers' lazy imports are not thread-safe, and two loads gain nothing on
    one machine); a request for a model already loaded never waits for another's load."""

    def __init__(self, home: Home, cfg: ServeConfig) -> None:
        self.home, self.cfg = home, cfg
        self._models: collections.OrderedDict[str, ServedModel] = collections.OrderedDict()
        self._held: collections.Counter[str] = collections.Counter()
        self._cond = threading.Condition()
        self._load_lock = threading.Lock()

    def acquire_loaded(self, model_id: str) -> ServedModel | None:
        """The model held, if it is loaded; None (at once, never blocking) if it is not."""
        with self._cond:
            return self._hold(model_id) if model_id in self._models else None

    def acquire(self, model_id: str) -> ServedModel:
        """The model, loaded if need be, held until `release` (it cannot be unloaded meanwhile)."""
        if (served := self.acquire_loaded(model_id)) is not None:
            return served
        deadline = time.monotonic() + self.cfg.load_wait_s  # time spent behind other loads counts
        with self._load_lock:
            with self._cond:
                if model_id in self._models:
                    return self._hold(model_id)
                evicted = self._make_room(deadline)
            for old in evicted:
                old.scheduler.close()
            served = load(model_id, self.home, self.cfg, on_idle=self._wake)
            with self._cond:
                self._models[model_id] = served
                return self._hold(model_id)

    def release(self, served: ServedModel) -> None:
        with self._cond:
            self._held[served.id] -= 1
            self._cond.notify_all()

    def get(self, model_id: str) -> ServedModel:
        """The model, loaded if need be, without holding it (to look at it)."""
        served = self.acquire(model_id)
        self.release(served)
        return served

    def _hold(self, model_id: str) -> ServedModel:
        self._models.move_to_end(model_id)
        self._held[model_id] += 1
        return self._models[model_id]

    def _make_room(self, deadline: float) -> list[ServedModel]:
        """The least recently used idle model taken out if one more would not fit, waiting
        until `deadline` for one to go idle. Call holding _cond; close what it returns."""
        while len(self._models) >= self.cfg.max_models:
            idle = next((k for k, m in self._models.items() if not self._held[k] and m.scheduler.idle), None)
            if idle is not None:
                return [self._models.pop(idle)]  # the bound holds: never more than max_models loaded
            left = deadline - time.monotonic()
            if left <= 0:
                raise ModelsBusy(f"all {len(self._models)} loaded models (the server's limit) are serving requests; "
                                 "retry shortly", retry_after_s=RETRY_AFTER_S)
            self._cond.wait(left)
        return []

    def _wake(self) -> None:
        """A scheduler's batch emptied: a load waiting for room may go on."""
        with self._cond:
            self._cond.notify_all()

    def loaded(self) -> list[str]:
        with self._cond:
            return list(self._models)

    def close(self) -> None:
        with self._cond:
            models, self._models = list(self._models.values()), collections.OrderedDict()
        for m in models:
            m.scheduler.close()
