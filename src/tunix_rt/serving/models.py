"""Which models can be served, and the loaded ones: a catalog name or a run id, resolved
exactly as `tunix-rt eval` resolves `--model` / `--adapter` (a run's LoRA adapter merged
into its base model, or its merged weights; the run's system prompt), loaded on first use
and kept in an LRU of at most `max_models`."""

from __future__ import annotations

import collections
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from tunix_rt.errors import BadInput
from tunix_rt.home import Home
from tunix_rt.models.catalog import PRESETS
from tunix_rt.models.store import MODEL_MANIFEST, installed_dir
from tunix_rt.rundir import Run
from tunix_rt.serving.scheduler import Scheduler

MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,199}$")
"""A model id is a catalog name or a run id: never a path."""


class ModelNotFound(BadInput):
    """No catalog model or run of that name (404 from the API, exit 2 from the CLI)."""


@dataclass(frozen=True)
class ServeConfig:
    """How the models are served; defaults live in service Settings."""

    device: str = "auto"
    max_models: int = 2
    max_batch: int = 8
    max_queue: int = 64


@dataclass
class ServedModel:
    """A loaded model: its scheduler, tokenizer, system prompt and context length."""

    id: str
    scheduler: Scheduler
    system_prompt: str
    max_context: int
    run_id: str | None

    @property
    def tok(self):
        return self.scheduler.gen.tok


def run_has_weights(run_dir: Path) -> bool:
    return Run(run_dir).adapter is not None or Run(run_dir).merged is not None


def available(home: Home) -> list[dict]:
    """What /v1/models lists: tiny presets (built on first use), imported catalog models,
    and runs with final weights; newest run first."""
    out = []
    for name, preset in PRESETS.items():
        manifest = installed_dir(name, home) / MODEL_MANIFEST
        if preset.tiny or manifest.is_file():
            out.append({"id": name, "kind": "catalog", "created": int(manifest.stat().st_mtime) if manifest.is_file() else 0})
    runs = [d for d in home.runs.glob("*") if d.is_dir() and run_has_weights(d)] if home.runs.is_dir() else []
    for d in sorted(runs, key=lambda d: d.stat().st_mtime, reverse=True):
        out.append({"id": d.name, "kind": "run", "created": int(d.stat().st_mtime)})
    return out


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


def load(model_id: str, home: Home, cfg: ServeConfig) -> ServedModel:
    """Resolve and load a model onto the eval generator, with its scheduler running."""
    from tunix_rt.eval.generate import TorchGenerator
    from tunix_rt.eval.runner import load_model, resolve_device, resolve_target
    from tunix_rt.models.store import load_tokenizer
    from tunix_rt.train import engines

    engines.require("torch")
    target = resolve_target(eval_request(model_id, home), home)
    device = resolve_device("torch", cfg.device)
    tok = load_tokenizer(target.tokenizer, home)
    gen = TorchGenerator(load_model(target.model_dir, target.adapter_dir, device), tok, device)
    ctx = int(getattr(gen.model.config, "max_position_embeddings", 0) or 0)
    sched = Scheduler(gen, cfg.max_batch, cfg.max_queue, name=model_id)
    return ServedModel(model_id, sched, target.system_prompt, ctx, target.run_dir.name if target.run_dir else None)


class ModelCache:
    """Loaded models, least recently used evicted past `max_models`. Loads run one at a time
    (transformers' lazy imports are not thread-safe, and two loads gain nothing on one
    machine); a request for a model already loaded never waits for another's load."""

    def __init__(self, home: Home, cfg: ServeConfig) -> None:
        self.home, self.cfg = home, cfg
        self._models: collections.OrderedDict[str, ServedModel] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()

    def get(self, model_id: str) -> ServedModel:
        with self._lock:
            if model_id in self._models:
                self._models.move_to_end(model_id)
                return self._models[model_id]
        with self._load_lock:
            with self._lock:
                if model_id in self._models:
                    return self._models[model_id]
            served = load(model_id, self.home, self.cfg)
            with self._lock:
                self._models[model_id] = served
                evicted = []
                while len(self._models) > self.cfg.max_models:
                    evicted.append(self._models.popitem(last=False)[1])
        for old in evicted:
            old.scheduler.close()
        return served

    def loaded(self) -> list[str]:
        with self._lock:
            return list(self._models)

    def close(self) -> None:
        with self._lock:
            models, self._models = list(self._models.values()), collections.OrderedDict()
        for m in models:
            m.scheduler.close()
