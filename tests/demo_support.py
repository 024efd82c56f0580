"""One real tiny-model demo per test session, shared by test_demo, test_evidence and
test_submit (a module-level cache: pytest imports this helper once per process).

It runs the command a user runs, `tunix-rt demo --model tiny-gemma3 --steps 20 --eval-n 8`,
in a subprocess against its own home, so every test reads what the CLI really wrote."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DEMO_ARGS = ["demo", "--model", "tiny-gemma3", "--steps", "20", "--eval-n", "8", "--max-new-tokens", "48"]
_CACHE: dict[str, "DemoOutput"] = {}


@dataclass(frozen=True)
class DemoOutput:
    home: Path
    run_dir: Path
    stdout: str
    seconds: float


def tunix(home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`tunix-rt --home HOME ARGS…` as a user would run it."""
    env = {**os.environ, "TUNIX_RT_HOME": str(home), "COLUMNS": "160"}
    env.pop("DATABASE_URL", None)
    done = subprocess.run([sys.executable, "-m", "tunix_rt.cli", "--home", str(home), *args],
                          capture_output=True, text=True, env=env, timeout=900)
    if check and done.returncode != 0:
        raise AssertionError(f"tunix-rt {' '.join(args)} exited {done.returncode}:\n"
                             f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def tiny_demo(tmp_path_factory) -> DemoOutput:
    """The shared demo output (built on first use)."""
    if "demo" not in _CACHE:
        home = tmp_path_factory.mktemp("demo-home")
        t0 = time.perf_counter()
        done = tunix(home, *DEMO_ARGS)
        runs = [p for p in (home / "runs").iterdir() if (p / "run_manifest.json").is_file()]
        assert len(runs) == 1, runs
        _CACHE["demo"] = DemoOutput(home, runs[0], done.stdout, time.perf_counter() - t0)
    return _CACHE["demo"]


TASK = "basic_arithmetic"
TASK_DEMO_ARGS = [*DEMO_ARGS, "--task", TASK]


def task_demo(tmp_path_factory) -> DemoOutput:
    """`tunix-rt demo … --task basic_arithmetic` (the shared demo's flags, so its GSM8K SFT run
    is reused) in a copy of the shared demo's home (its registry left out: the copy indexes
    what it uses), so the shared home stays as the other tests expect it. `run_dir` is the
    task demo's RL run."""
    import shutil

    if "task" not in _CACHE:
        shared = tiny_demo(tmp_path_factory)
        home = tmp_path_factory.mktemp("task-demo-home") / "home"
        shutil.copytree(shared.home, home, ignore=shutil.ignore_patterns("registry.db*"))
        t0 = time.perf_counter()
        done = tunix(home, *TASK_DEMO_ARGS)
        new = [p for p in (home / "runs").iterdir() if p.name != shared.run_dir.name]
        assert len(new) == 1, new  # the RL run; the SFT run is the shared demo's
        _CACHE["task"] = DemoOutput(home, new[0], done.stdout, time.perf_counter() - t0)
    return _CACHE["task"]
