"""The plan as a package split by job (issue 22): the facade only re-exports, and the model
directory's model_type is read through the JAX loader's one map, not a copy."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import tunix_rt.plan as plan
from tunix_rt.errors import BadInput
from tunix_rt.models.catalog import get_preset
from tunix_rt.models.jax_loader import FAMILIES
from tunix_rt.plan.inputs import resolve_preset

PLAN = Path(plan.__file__).parent


def test_the_facade_defines_nothing_and_re_exports_every_public_name():
    tree = ast.parse((PLAN / "__init__.py").read_text())
    kinds = {type(node).__name__ for node in tree.body[1:]}  # after the docstring
    assert kinds <= {"ImportFrom", "Assign"}
    assigned = [t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets]
    assert assigned == ["__all__"]
    for name in plan.__all__:  # functions and classes live in the job's module
        obj = getattr(plan, name)
        if callable(obj):
            assert obj.__module__.startswith("tunix_rt.plan."), name
    assert {"GiB", "SLACK", "JAX_KINDS", "PlanInputs", "make_plan", "plan_train", "update_inputs"} <= set(plan.__all__)


def test_each_job_is_its_own_module_of_modest_size():
    sizes = {p.name: len(p.read_text().splitlines()) for p in PLAN.glob("*.py")}
    assert {"devices.py", "inputs.py", "step.py", "rl.py", "suggest.py", "verdict.py", "make.py", "xla.py",
            "cli.py"} <= set(sizes)
    assert max(sizes.values()) < 400, sizes


def test_the_plan_spells_no_model_type_map_of_its_own():
    for path in PLAN.glob("*.py"):
        assert '"gemma3_text"' not in path.read_text(), path.name


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_a_model_directory_resolves_through_the_loaders_map(tmp_path, model_type):
    hf = {**get_preset("tiny-gemma3").hf_config, "model_type": model_type}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert resolve_preset(str(tmp_path)).family == FAMILIES[model_type]


def test_a_model_type_the_loader_does_not_know_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(BadInput, match="is not a Gemma the plan knows"):
        resolve_preset(str(tmp_path))


def test_the_xla_estimate_lowers_the_engines_own_step_not_a_copy():
    tree = ast.parse((PLAN / "xla.py").read_text())
    called = {node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
              for node in ast.walk(tree) if isinstance(node, ast.Call)}
    assert {"make_grad_fn", "make_update_fn"} <= called
    assert not called & {"value_and_grad", "grad", "apply_updates", "make_loss_fn", "MultiSteps"}
