"""Evidence: what a run or an evaluation leaves behind so that someone else can trust it.

The system tunix-rt replaces filled its reports with nulls, "N/A" and a mock judge. Here
every evidence file is written atomically and checked for placeholders before it counts:
- `environment_snapshot()`: python, packages, CPU/GPU/TPU facts, relevant env vars.
- `git_sha()`: which tunix-rt produced it.
- `find_placeholders()` / `assert_real_values()`: nulls, NaN, empty strings and placeholder
  words anywhere in a JSON tree.
- `check_run_evidence()`: the run directory's files (REPORT.md is written by train.report).
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from tunix_rt import __version__
from tunix_rt.errors import TunixRtError
from tunix_rt.files import write_json_atomic
from tunix_rt.rundir import (ADAPTER_WEIGHTS, CONFIG, ENVIRONMENT, LOSS_PLOT, MANIFEST, PREDICTIONS, SUMMARY, Run,
                             adapter_dir)

# Packages whose versions change results; reported as "not installed" when absent.
PACKAGES = (
    "torch", "transformers", "peft", "tokenizers", "safetensors",
    "jax", "jaxlib", "flax", "qwix", "google-tunix", "optax", "orbax-checkpoint", "tunix-rt",
)

# Env vars that change what a run does. TPU_* and LIBTPU_* are matched by prefix.
ENV_VARS = (
    "XLA_FLAGS", "JAX_PLATFORMS", "JAX_ENABLE_X64", "CUDA_VISIBLE_DEVICES", "LIBTPU_INIT_ARGS",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TUNIX_RT_HOME", "DATABASE_URL",
)
ENV_PREFIXES = ("TPU_",)

# A string is a placeholder when, stripped of whitespace and of surrounding <>, [], (), {},
# it equals one of these (case-insensitive). Whole-string matches only: a question that
# contains the word "unknown" is data, a field whose whole value is "unknown" is a hole.
# "none"/"null"/"nan" are here because they are what str(None)/str(float('nan')) print
# when a missing value leaks into a string field.
PLACEHOLDER_WORDS = frozenset({
    "todo", "tbd", "tba", "fixme", "xxx", "n/a", "na", "placeholder", "mock", "mocked",
    "dummy", "fake", "unknown", "null", "none", "nil", "undefined", "nan", "?", "...", "-",
})


def now_iso() -> str:
    """UTC timestamp with seconds, the one format every evidence file uses."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------- placeholders

def _is_placeholder_str(s: str) -> bool:
    core = s.strip().strip("<>[](){}").strip()
    return core == "" or core.casefold() in PLACEHOLDER_WORDS


def find_placeholders(obj: Any, allow: Iterable[str] = (), path: str = "$") -> list[str]:
    """Paths (`$.a.b[2].c`) of every null, NaN/inf, empty string or placeholder string in
    a JSON tree. `allow` holds paths that may hold such values, `*` standing for any one
    key or index (e.g. `$.reasoning` for a base model that wrote none, `$.items[*].note`). Empty lists/dicts and zeros are real
    values (zero tokens, no categories) and are not flagged."""
    found: list[str] = []
    _walk(obj, path, _allow_regex(allow), found)
    return found


def _allow_regex(patterns: Iterable[str]) -> re.Pattern | None:
    """Patterns are literal paths in which `*` stands for one key or one index."""
    parts = [re.escape(p).replace(r"\*", r"[^.\[\]]*") for p in patterns]
    return re.compile("|".join(f"(?:{p})" for p in parts)) if parts else None


def _walk(obj: Any, path: str, allow: re.Pattern | None, found: list[str]) -> None:
    if allow is not None and allow.fullmatch(path):
        return
    if obj is None:
        found.append(path)
    elif isinstance(obj, bool):
        return
    elif isinstance(obj, float) and not math.isfinite(obj):
        found.append(path)
    elif isinstance(obj, str):
        if _is_placeholder_str(obj):
            found.append(path)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk(v, f"{path}.{k}", allow, found)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk(v, f"{path}[{i}]", allow, found)


def assert_real_values(obj: Any, where: str, allow: Iterable[str] = ()) -> None:
    """Raise TunixRtError naming `where` and every offending path (evidence must not hold
    holes)."""
    bad = find_placeholders(obj, allow)
    if bad:
        shown = ", ".join(bad[:20]) + (f" (+{len(bad) - 20} more)" if len(bad) > 20 else "")
        raise TunixRtError(f"{where}: null or placeholder values at {shown}")


# --------------------------------------------------------------------------- provenance

def repo_root() -> Path:
    """The checkout this tunix_rt was imported from (src/tunix_rt/ -> repo)."""
    return Path(__file__).resolve().parents[2]


def git_sha() -> str:
    """The commit of the tunix-rt checkout, `+dirty` when tracked files differ from it;
    `tunix-rt <version> (no git checkout)` when installed from a wheel. Never empty."""
    root = repo_root()
    if (root / ".git").exists():
        try:
            sha = _git(root, "rev-parse", "HEAD")
            dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
            return sha + ("+dirty" if dirty else "")
        except (OSError, subprocess.SubprocessError):
            pass
    return f"tunix-rt {__version__} (no git checkout)"


def _git(root: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                         timeout=30, check=True)
    return out.stdout.strip()


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str]:
    """Installed versions; "not installed" (never null) for a missing package."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def cpu_facts() -> dict[str, Any]:
    """CPU model, logical cores, cores this process may use, total and available RAM."""
    import psutil

    vm = psutil.virtual_memory()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "model": _cpu_model(),
        "cores_logical": os.cpu_count() or 1,
        "cores_usable": usable or 1,
        "ram_total_bytes": int(vm.total),
        "ram_available_bytes": int(vm.available),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                value = line.split(":", 1)[1].strip()
                if value:
                    return value
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu model not reported by the OS"


def gpu_facts() -> dict[str, Any]:
    """CUDA devices as torch sees them (names, memory, capability)."""
    try:
        import torch
    except ImportError:
        return {"available": False, "count": 0, "reason": "torch not installed"}
    if not torch.cuda.is_available():
        return {"available": False, "count": 0, "torch_cuda": torch.version.cuda or "cpu-only build"}
    devices = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devices.append({"index": i, "name": p.name, "memory_bytes": int(p.total_memory),
                        "capability": f"{p.major}.{p.minor}"})
    runtime = torch.version.cuda or getattr(torch.version, "hip", None) or "not reported by torch"
    return {"available": True, "count": len(devices), "torch_cuda": runtime, "devices": devices}


def jax_facts() -> dict[str, Any]:
    """JAX devices (TPU, GPU or CPU) — only when this process already imported jax:
    importing it just to look costs seconds and may grab an accelerator."""
    if "jax" not in sys.modules:
        return {"checked": False, "reason": "jax not imported by this process"}
    import jax

    devices = jax.devices()
    listed = []
    for d in devices:
        item = {"id": int(d.id), "platform": d.platform, "kind": str(d.device_kind)}
        stats = _memory_stats(d)
        if stats:
            item["memory_bytes"] = stats
        listed.append(item)
    return {"checked": True, "backend": jax.default_backend(), "count": len(devices),
            "process_count": jax.process_count(), "devices": listed}


def _memory_stats(device: Any) -> int:
    try:
        stats = device.memory_stats() or {}
    except Exception:  # CPU devices and some plugins do not implement it
        return 0
    return int(stats.get("bytes_limit", 0))


def redact_url(url: str) -> str:
    """`postgresql://user:secret@host/db` -> `postgresql://user:***@host/db`."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def env_facts() -> dict[str, str]:
    """The relevant environment variables that are set (non-empty), secrets redacted."""
    out = {}
    for name, value in sorted(os.environ.items()):
        if name in ENV_VARS or name.startswith(ENV_PREFIXES):
            if value.strip():
                out[name] = redact_url(value) if name == "DATABASE_URL" else value
    return out


def environment_snapshot() -> dict[str, Any]:
    """Everything about where a run happened that can change its numbers. Real values only:
    a missing package says "not installed", an unchecked accelerator says why."""
    snap = {
        "captured_at": now_iso(),
        "tunix_rt": {"version": __version__, "git_sha": git_sha()},
        "python": {"version": platform.python_version(),
                   "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "platform": {"system": platform.system(), "release": platform.release(),
                     "machine": platform.machine(), "description": platform.platform()},
        "packages": package_versions(),
        "cpu": cpu_facts(),
        "gpu": gpu_facts(),
        "jax": jax_facts(),
        "env": env_facts(),
    }
    return snap


# --------------------------------------------------------------------------- run evidence

# DESIGN.md §2 field lists; a missing key is as much a hole as a null one.
PREDICTION_KEYS = ("id", "question", "gold", "completion", "reasoning", "answer", "correct",
                   "format_ok", "n_tokens", "finish_reason")
SUMMARY_KEYS = ("model", "adapter", "engine", "device", "dataset", "decoding", "metrics",
                "by_category", "started_at", "finished_at", "duration_s", "tokens_per_s")
METRIC_KEYS = ("accuracy", "format_rate", "answer_found_rate", "mean_completion_tokens",
               "truncated_rate", "n")
# Enumerations whose member is spelled like a placeholder word: checked against their
# members instead ("none" = no answer could be extracted, a real outcome).
ENUMS = {"answer_source": ("tag", "fallback", "none"), "finish_reason": ("stop", "length")}

# The placeholder check judges what the program recorded (versions, shas, devices, metrics,
# timings), never what a user chose: a config with an empty system prompt, a dataset named
# "dummy", a question whose text is "none" or a model that answered "N/A" are all real.
# Each list names the subtrees of one file that the program itself fills in.
RUN_FACTS = ("$.run_id", "$.engine", "$.git_sha", "$.started_at", "$.finished_at", "$.status",
             "$.device", "$.dataset.sha256", "$.dataset.n_examples", "$.model.sha256", "$.summary",
             "$.final", "$.outputs")
ENVIRONMENT_FACTS = ("$.captured_at", "$.tunix_rt", "$.python", "$.platform", "$.packages", "$.cpu",
                     "$.gpu", "$.jax")
SUMMARY_FACTS = ("$.engine", "$.device", "$.dataset.sha256", "$.dataset.n", "$.metrics",
                 "$.by_category", "$.started_at", "$.finished_at", "$.duration_s", "$.tokens_per_s")
PREDICTION_FACTS = ("$.correct", "$.format_ok", "$.n_tokens")
SUCCEEDED_RUN_KEYS = ("run_id", "engine", "git_sha", "started_at", "finished_at", "status", "device",
                      "dataset", "model", "final", "outputs")


def recorded_facts(obj: Any, paths: Iterable[str]) -> list[tuple[str, Any]]:
    """(path, value) of each listed `$.a.b` path present in obj."""
    out = []
    for path in paths:
        node, found = obj, True
        for key in path[2:].split("."):
            if isinstance(node, dict) and key in node:
                node = node[key]
            else:
                found = False
                break
        if found:
            out.append((path, node))
    return out


def find_fact_placeholders(obj: Any, paths: Iterable[str]) -> list[str]:
    """find_placeholders over the program-recorded subtrees of obj only."""
    found: list[str] = []
    for path, value in recorded_facts(obj, paths):
        found += find_placeholders(value, path=path)
    return found


def load_evidence(path: Path) -> list[tuple[str, Any]]:
    """(label, parsed) pairs: one for a JSON/YAML file, one per line of a JSONL file."""
    if path.suffix == ".jsonl":
        out = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            out.append((f"{path.name}:{n}", json.loads(line) if line.strip() else None))
        return out
    if path.suffix in (".yaml", ".yml"):
        import yaml

        return [(path.name, yaml.safe_load(path.read_text(encoding="utf-8")))]
    return [(path.name, json.loads(path.read_text(encoding="utf-8")))]


def check_file(path: Path, facts: Iterable[str], keys: Iterable[str] = ()) -> list[str]:
    """Problems of one evidence file as `label: $.path` strings (empty list: all real): the
    listed keys must be present, the recorded facts real."""
    if not path.is_file():
        return [f"{path.name}: missing"]
    try:
        items = load_evidence(path)
    except ValueError as e:
        return [f"{path.name}: unreadable ({e})"]
    if not items:
        return [f"{path.name}: empty"]
    problems = []
    for label, obj in items:
        if not isinstance(obj, dict):
            problems.append(f"{label}: not a JSON object")
            continue
        problems += [f"{label}: {p}" for p in find_fact_placeholders(obj, facts)]
        problems += [f"{label}: $.{k} missing" for k in keys if k not in obj]
    return problems


def check_run_evidence(run_dir: Path, eval_dir: Path | None = None) -> list[str]:
    """Every problem of a run's evidence: holes in what the program recorded, missing
    fields or files. `eval_dir` (the evaluation to check) defaults to none: only the run's
    own files."""
    run_dir = Path(run_dir)
    problems = check_file(run_dir / MANIFEST, RUN_FACTS, SUCCEEDED_RUN_KEYS)
    problems += check_file(run_dir / ENVIRONMENT, ENVIRONMENT_FACTS, ("python", "packages"))
    problems += check_file(run_dir / CONFIG, ())
    problems += _check_png(run_dir / LOSS_PLOT)
    if not (adapter_dir(run_dir) / ADAPTER_WEIGHTS).is_file():
        problems.append("final/adapter/adapter_model.safetensors: missing")
    if eval_dir is not None:
        problems += check_eval_evidence(eval_dir)
    return problems


def check_eval_evidence(eval_dir: Path) -> list[str]:
    """eval_summary.json and predictions.jsonl: every DESIGN.md field, real recorded facts."""
    problems = check_file(eval_dir / SUMMARY, SUMMARY_FACTS, SUMMARY_KEYS)
    if not problems:
        metrics = json.loads((eval_dir / SUMMARY).read_text())["metrics"]
        problems += [f"eval_summary.json: $.metrics.{k} missing" for k in METRIC_KEYS if k not in metrics]
    problems += check_file(eval_dir / PREDICTIONS, PREDICTION_FACTS, PREDICTION_KEYS)
    return problems + _check_enums(eval_dir / PREDICTIONS)


def _check_enums(path: Path) -> list[str]:
    if not path.is_file():
        return []
    problems = []
    for label, rec in load_evidence(path):
        for key, members in ENUMS.items():
            if isinstance(rec, dict) and key in rec and rec[key] not in members:
                problems.append(f"{label}: $.{key} = {rec[key]!r} not in {list(members)}")
    return problems


def _check_png(path: Path) -> list[str]:
    if not path.is_file():
        return [f"{path.name}: missing"]
    with open(path, "rb") as f:
        if f.read(8) != b"\x89PNG\r\n\x1a\n":
            return [f"{path.name}: not a PNG"]
    return []


def ensure_environment(run_dir: Path) -> Path:
    """environment.json of a run: the snapshot its trainer took at start (kept in the
    manifest), else one taken now (marked with captured_at, so the reader can tell)."""
    path = Path(run_dir) / ENVIRONMENT
    if not path.is_file():
        manifest = Run(Path(run_dir)).manifest
        write_json_atomic(path, manifest.get("environment") or environment_snapshot())
    return path
