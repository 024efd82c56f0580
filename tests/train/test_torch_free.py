"""The JAX path with no torch: what a Kaggle TPU image with `pip install tunix-rt[jax,hub]`
runs. Every command is the real CLI in a subprocess whose interpreter cannot see torch: a
sitecustomize replaces the path finder with one for which `torch` (and torchgen, functorch)
do not exist, as modules and as installed distributions, so `import torch` fails exactly
as when it is not installed and transformers' `is_torch_available()` says False (peft,
which needs torch, does not import).

- the blocker blocks (control runs), and only torch;
- `model import --from-dir` of a tiny checkpoint, `data import`, `train --engine auto`
  (smoke preset, 2 steps) and `eval` of its adapter (engine auto by default) both pick JAX,
  succeed and write their files;
- what needs PyTorch (building a tiny preset, the torch engine, torch eval) stops with a
  BadInput naming the extra to install, not an ImportError traceback;
- the torch-free tensor table of `model import --from-dir` equals transformers' models.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from requires import require_module

pytestmark = pytest.mark.jax

require_module("jax")

from train_testlib import write_traces as _traces  # noqa: E402 (tests/train is on sys.path)

from tunix_rt.heap import jemalloc_path  # noqa: E402
from tunix_rt.models.catalog import PRESETS  # noqa: E402

BLOCKER = textwrap.dedent('''
    """Test helper: torch is not installed, as far as this interpreter can tell."""
    import importlib.machinery
    import sys

    BLOCKED = ("torch", "torchgen", "functorch")


    def _blocked(name):
        return bool(name) and any(name == b or name.startswith(b + ".") for b in BLOCKED)


    class NoTorchPathFinder(importlib.machinery.PathFinder):
        @classmethod
        def find_spec(cls, fullname, path=None, target=None):
            return None if _blocked(fullname) else super().find_spec(fullname, path, target)

        @classmethod
        def find_distributions(cls, context=None, **kwargs):
            from importlib.metadata import DistributionFinder

            context = context or DistributionFinder.Context(**kwargs)
            for dist in super().find_distributions(context):
                name = (dist.metadata["Name"] or "").lower().replace("-", "_")
                if not _blocked(name):
                    yield dist


    sys.meta_path[:] = [NoTorchPathFinder if f is importlib.machinery.PathFinder else f
                        for f in sys.meta_path]
''')

CONTROL = textwrap.dedent('''
    import importlib.metadata, importlib.util, json
    out = {"find_spec": importlib.util.find_spec("torch") is not None}
    for mod in ("torch", "torch.nn", "peft"):
        try:
            __import__(mod)
            out[mod] = "imported"
        except ImportError as e:
            out[mod] = type(e).__name__
    try:
        importlib.metadata.version("torch")
        out["dist"] = "found"
    except importlib.metadata.PackageNotFoundError:
        out["dist"] = "missing"
    from transformers.utils import is_torch_available
    out["transformers_torch"] = is_torch_available()
    import jax, numpy, safetensors.numpy
    out["jax"] = jax.__version__
    print("CONTROL " + json.dumps(out))
''')


@pytest.fixture
def no_torch(tmp_path, home):
    """Environment for subprocesses that cannot import torch (and the home's path)."""
    block = tmp_path / "no-torch"
    block.mkdir()
    (block / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "TUNIX_RT_HOME": str(home.root), "JAX_PLATFORMS": "cpu", "COLUMNS": "200",
           "PYTHONPATH": os.pathsep.join([str(block), *filter(None, [os.environ.get("PYTHONPATH")])])}
    for key in ("TUNIX_RT_FAULT", "DATABASE_URL", "TUNIX_RT_ALLOCATOR", "LD_PRELOAD"):
        env.pop(key, None)
    return env


def _py(env, *args, timeout=300):
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _cli(env, *args, timeout=300):
    return _py(env, "-m", "tunix_rt.cli", *args, timeout=timeout)


def _ok(r):
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-6000:]}"
    return r


def _bad_input(r, *words):
    """Exit 2 (BadInput) with a message naming the way out; no traceback."""
    assert r.returncode == 2, f"exit {r.returncode}\nstderr:\n{r.stderr[-4000:]}"
    assert "Traceback" not in r.stderr and "ModuleNotFoundError" not in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def test_the_blocker_blocks_torch_only(no_torch):
    import importlib.util

    assert importlib.util.find_spec("torch") is not None, "torch is installed here: the control needs it"
    r = _ok(_py(no_torch, "-c", CONTROL))
    line = next(x for x in r.stdout.splitlines() if x.startswith("CONTROL "))
    got = json.loads(line[len("CONTROL "):])
    assert got["find_spec"] is False and got["dist"] == "missing"
    assert got["torch"] == got["torch.nn"] == "ModuleNotFoundError"
    assert got["peft"] != "imported"  # peft imports torch at the top
    assert got["transformers_torch"] is False  # transformers cannot use torch behind our back
    assert got["jax"]  # and everything else still imports
    plain = _py(no_torch, "-c", "import torch")
    assert plain.returncode == 1 and "No module named 'torch'" in plain.stderr


def test_import_train_eval_with_the_jax_engine_without_torch(no_torch, home, tmp_path):
    require_module("transformers")
    from safetensors.numpy import load_file

    from tunix_rt.models.catalog import get_preset
    from tunix_rt.models.tiny import build_tiny
    from tunix_rt.train.metrics import read_jsonl

    # weights made elsewhere (here: with torch, in this process), as a Kaggle model dir
    src = build_tiny(get_preset("tiny-gemma3"), tmp_path / "tiny-src", seed=0)

    # what needs PyTorch says which extra to install
    _bad_input(_cli(no_torch, "model", "import", "tiny-gemma3"), "tunix-rt[torch]", "--from-dir")
    assert not (home.models / "tiny-gemma3").exists()

    _ok(_cli(no_torch, "model", "import", "--from-dir", str(src), "--preset", "tiny-gemma3"))
    manifest = json.loads((home.models / "tiny-gemma3" / "tunix_rt_model.json").read_text())
    assert manifest["source"]["kind"] == "local-dir" and manifest["param_count"] == get_preset("tiny-gemma3").param_count()

    traces = _traces(tmp_path / "traces.jsonl", n=12)
    _ok(_cli(no_torch, "data", "import", "record", traces, "--name", "nt"))

    common = ["dataset=nt", "split=all", "eval_split=all", "eval_limit=4"]
    _bad_input(_cli(no_torch, "train", "--config", "smoke", "--engine", "torch", *common, "max_steps=2"),
               "tunix-rt[torch]", "--engine jax")
    assert not home.runs.is_dir() or not any(home.runs.iterdir())  # refused before making a run dir

    r = _ok(_cli(no_torch, "train", "--config", "smoke", "--engine", "auto", *common, "max_steps=2",
                 timeout=600))  # auto: JAX, since torch is not installed
    run = Path(r.stdout.strip().splitlines()[-1])
    assert run.parent == home.runs
    m = json.loads((run / "run_manifest.json").read_text())
    assert m["status"] == "succeeded" and m["engine"] == "jax"
    # the train command ran itself again with jemalloc preloaded where it is installed (tunix_rt.heap)
    assert m["device"]["allocator"] == ("jemalloc" if jemalloc_path() else "glibc")
    assert m["model"]["sha256"] == manifest["files"]["model.safetensors"]
    rows = [x for x in read_jsonl(run / "metrics.jsonl") if "loss" in x]
    assert [x["step"] for x in rows] == [1, 2] and all(x["loss"] > 0 for x in rows)
    assert any("eval_loss" in x for x in read_jsonl(run / "metrics.jsonl"))
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))  # tensorboardX, not torch's writer
    assert (run / "loss.png").is_file() and (run / "checkpoints" / "step-000002" / "COMMIT").is_file()
    assert load_file(str(run / "final" / "adapter" / "adapter_model.safetensors"))
    assert json.loads((run / "final" / "adapter" / "adapter_config.json").read_text())["peft_type"] == "LORA"

    _bad_input(_cli(no_torch, "eval", "--adapter", run.name, "--dataset", "nt", "--split", "all", "--limit", "1",
                    "--engine", "torch"), "tunix-rt[torch]", "--engine jax")

    r = _ok(_cli(no_torch, "eval", "--adapter", run.name, "--dataset", "nt", "--split", "all", "--limit", "2",
                 "--max-new-tokens", "4", "--json"))  # no --engine: auto, JAX since torch is not installed
    summary = json.loads(r.stdout[r.stdout.index("{"):])
    assert summary["engine"] == "jax" and summary["run_id"] == run.name
    assert summary["dataset"]["n"] == 2 and summary["adapter"].endswith("final/adapter")
    evals = list((run / "eval").iterdir())
    assert len(evals) == 1 and len(read_jsonl(evals[0] / "predictions.jsonl")) == 2


@pytest.mark.parametrize("name", list(PRESETS))
def test_torch_free_tensor_table_equals_transformers(name):
    """`model import --from-dir` checks names and shapes without torch; the table it uses
    is transformers' own model, built here on the meta device."""
    torch = require_module("torch")
    from transformers import AutoModelForCausalLM

    from tunix_rt.models.importer import expected_shapes
    from tunix_rt.models.tiny import hf_config

    preset = PRESETS[name]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(preset))
    shapes, tied = expected_shapes(preset)
    assert shapes == {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert tied == (set(model.all_tied_weights_keys) if preset.tied_embeddings else set())


def test_metrics_without_any_tensorboard_writer(tmp_path, monkeypatch, capsys):
    """No tensorboardX and no torch: metrics.jsonl is still written, with a note."""
    from tunix_rt.train import metrics as run_mod

    monkeypatch.setattr(run_mod, "TB_WRITERS", ("tunix_rt_no_such_writer", "tunix_rt_no_such_writer.either"))
    log = run_mod.MetricsLog(tmp_path)
    log.log({"step": 1, "loss": 2.5})
    log.close()
    assert run_mod.read_jsonl(tmp_path / run_mod.METRICS) == [{"step": 1, "loss": 2.5}]
    assert not (tmp_path / "tensorboard").exists()
    assert "no TensorBoard writer installed" in capsys.readouterr().err
