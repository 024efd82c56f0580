# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # tunix-rt on a Kaggle TPU: teach Gemma to show its reasoning
#
# This notebook fine-tunes a Gemma checkpoint with LoRA on GSM8K reasoning traces using
# the JAX engine (google-tunix), sharded over every TPU chip, then evaluates it and
# packages the adapter with its evidence as a verifiable zip.
#
# 1. Settings: Accelerator **TPU VM v5e-8** (or any TPU), Internet on for the install,
#    or attach a tunix-rt wheel as a dataset.
# 2. Weights: attach the Gemma model (`google/gemma-3/transformers/gemma-3-270m`) to the
#    notebook (WEIGHTS = "dir"), or let kagglehub download it (WEIGHTS = "kagglehub").
# 3. Run all. Every step runs the `tunix-rt` command line and stops the notebook at the
#    first failure; nothing below a failed cell runs.

# %% tags=["parameters"]
ALLOW_CPU = False  # True runs on the CPU when no TPU is found (tests; very slow for real models)
INSTALL = "tunix-rt[jax,hub]"  # pip requirement for tunix-rt (a wheel path, a git URL); "" skips. No torch: the JAX path needs none
INSTALL_JAX_TPU = True  # also install jax[tpu] matching the pinned jax when a TPU is present
MODEL = "gemma3-270m"  # catalog preset of the checkpoint
WEIGHTS = "dir"  # "dir": a mounted Kaggle model dir; "kagglehub": download; "builtin": offline preset (needs tunix-rt[torch,demo-model])
WEIGHTS_DIR = "/kaggle/input/gemma-3/transformers/gemma-3-270m/1"
KAGGLE_HANDLE = "google/gemma-3/transformers/gemma-3-270m"
CONFIG = "gpu"  # training preset (bf16 LoRA; its batch is split over the chips)
STEPS = 300  # optimizer steps
EXTRA = []  # more key=value config overrides, e.g. ["lr=1e-4", "batch_size=32"]
EVAL_N = 200  # dev items evaluated before and after
MAX_NEW_TOKENS = 256
HOME_DIR = "/kaggle/working/tunix-rt-home"
OUT_ZIP = "/kaggle/working/tunix-rt-submission.zip"

# %% [markdown]
# ## Helpers: every command is checked
# `run(...)` prints the command, streams its output and raises on a non-zero exit code,
# so a failure stops the notebook right there.

# %%
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ["TUNIX_RT_HOME"] = HOME_DIR
TUNIX = [sys.executable, "-m", "tunix_rt.cli"]


def run(*args: str, capture: bool = False) -> str:
    """Run a command; raise CalledProcessError (stopping the notebook) when it fails."""
    print("$", " ".join(str(a) for a in args), flush=True)
    done = subprocess.run([str(a) for a in args], check=False, text=True,
                          capture_output=capture)
    if done.returncode != 0:
        if capture:
            print(done.stdout, done.stderr, sep="\n", file=sys.stderr)
        raise subprocess.CalledProcessError(done.returncode, args)
    return done.stdout if capture else ""


def tunix(*args: str, capture: bool = False) -> str:
    return run(*TUNIX, *args, capture=capture)


# %% [markdown]
# ## Install tunix-rt

# %%
if INSTALL:
    run(sys.executable, "-m", "pip", "install", "-q", INSTALL)
run(sys.executable, "-c", "import importlib.metadata as m; print('tunix-rt', m.version('tunix-rt'))")
tunix("--help", capture=True)  # the command line starts

# %% [markdown]
# ## Find the accelerator
# Probed in a child process: a TPU can be held by one process only, and the training
# command below must get it.

# %%
PROBE = ("import jax, json; d = jax.devices(); "
         "print(json.dumps({'platform': d[0].platform, 'count': len(d), 'kind': d[0].device_kind}))")
devices = json.loads(run(sys.executable, "-c", PROBE, capture=True).strip().splitlines()[-1])
print(devices)
if devices["platform"] != "tpu":
    if not ALLOW_CPU:
        raise RuntimeError(
            f"No TPU found (JAX sees {devices['count']} {devices['platform']} device(s)). "
            "In Kaggle: Settings > Accelerator > TPU VM, then restart. "
            "Set ALLOW_CPU = True to run on the CPU anyway (hours for a real model).")
    print(f"ALLOW_CPU is set: running on {devices['count']} {devices['platform']} device(s)")
elif INSTALL and INSTALL_JAX_TPU:
    import importlib.metadata

    run(sys.executable, "-m", "pip", "install", "-q", f"jax[tpu]=={importlib.metadata.version('jax')}")
DEVICE = "tpu" if devices["platform"] == "tpu" else "cpu"
N_DEVICES = devices["count"]

# %% [markdown]
# ## Weights
# Imported into the tunix-rt home: tensor names and shapes are checked against the preset,
# and the manifest records the sha256 of every file.

# %%
if WEIGHTS == "dir":
    tunix("model", "import", "--from-dir", WEIGHTS_DIR, "--preset", MODEL)
elif WEIGHTS == "kagglehub":
    tunix("model", "import", "--from-kaggle", KAGGLE_HANDLE, "--preset", MODEL)
elif WEIGHTS == "builtin":
    tunix("model", "import", MODEL)
else:
    raise ValueError(f"WEIGHTS must be dir, kagglehub or builtin, got {WEIGHTS!r}")
tunix("model", "list")

# %% [markdown]
# ## Plan: will it fit?
# The memory plan per device, before anything is allocated.

# %%
from tunix_rt.plan import JAX_KINDS
from tunix_rt.train.config import TrainConfig

OVERRIDES = [f"model={MODEL}", f"max_steps={STEPS}", "epochs=", "engine=jax",
             f"device={DEVICE}", "mesh=auto", *EXTRA]
cfg = TrainConfig.load(CONFIG, OVERRIDES)
if DEVICE == "tpu" and devices["kind"] not in JAX_KINDS:
    raise RuntimeError(f"TPU kind {devices['kind']!r} has no memory model yet; known: {sorted(JAX_KINDS)}")
PLAN_DEVICE = JAX_KINDS[devices["kind"]] if DEVICE == "tpu" else "cpu"
plan = json.loads(tunix(
    "plan", "--model", MODEL, "--method", cfg.method, "--seq", str(cfg.max_seq_len),
    "--batch", str(cfg.batch_size), "--grad-accum", str(cfg.grad_accum), "--dtype", cfg.dtype,
    "--optimizer", cfg.optimizer, "--lora-rank", str(cfg.lora_rank), "--engine", "jax",
    "--device", PLAN_DEVICE, "--devices", str(N_DEVICES), "--json", capture=True))
print(json.dumps({k: plan[k] for k in ("fits", "peak_bytes_per_device", "capacity_bytes", "estimators")}, indent=2))
if not plan["fits"]:
    raise RuntimeError(f"the plan says this run does not fit: {json.dumps(plan['suggestions'], indent=2)}")

# %% [markdown]
# ## Train with the JAX engine, sharded over all chips (`mesh=auto`: every chip on fsdp)

# %%
runs = Path(HOME_DIR) / "runs"
before = set(runs.glob("*")) if runs.is_dir() else set()
tunix("train", "--config", CONFIG, "--engine", "jax", *OVERRIDES)
new = [p for p in runs.glob("*") if p not in before and (p / "run_manifest.json").is_file()]
if len(new) != 1:
    raise RuntimeError(f"expected one new run under {runs}, found {new}")
RUN = new[0]
manifest = json.loads((RUN / "run_manifest.json").read_text())
if manifest["status"] != "succeeded":
    raise RuntimeError(f"run {RUN.name} ended {manifest['status']}: {manifest.get('error')}")
print(RUN)

# %% [markdown]
# ## Evaluate: the base model and the fine-tuned adapter on the same dev items

# %%
EVAL = ["--dataset", cfg.dataset, "--split", "dev", "--limit", str(EVAL_N),
        "--max-new-tokens", str(MAX_NEW_TOKENS), "--engine", "jax", "--device", DEVICE]
BASE_EVAL = Path(HOME_DIR) / "evals" / f"base-for-{RUN.name}"
TUNED_EVAL = RUN / "eval" / "kaggle-tuned"
tunix("eval", "--model", MODEL, *EVAL, "--out", str(BASE_EVAL))
tunix("eval", "--model", MODEL, "--adapter", str(RUN), *EVAL, "--out", str(TUNED_EVAL))
tunix("compare", str(BASE_EVAL), str(TUNED_EVAL))

# %% [markdown]
# ## Package: adapter, evaluation, report and evidence, with sha256 of every file

# %%
tunix("submit", str(RUN), "--out", OUT_ZIP, "--baseline", str(BASE_EVAL))
tunix("submit", "--verify", OUT_ZIP)

# %%
from IPython.display import Markdown, display

report = RUN / "REPORT.md"  # written by `submit`: before/after table, loss curve, examples
display(Markdown(report.read_text()))
print(f"package: {OUT_ZIP} ({Path(OUT_ZIP).stat().st_size / 1e6:.1f} MB)")
