"""tunix_rt.models.tunix_lean: the JAX engine's modules import Tunix's model code without
tunix/__init__.py's trainers (and torch), and Tunix's submodules still import as usual."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.jax


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def test_engine_modules_import_tunix_models_without_its_trainers():
    out = _run(
        "import sys\n"
        "import tunix_rt.train.jax_engine, tunix_rt.train.jax_loss\n"
        "from tunix_rt.models import jax_loader\n"
        "from tunix.models.gemma3 import model\n"
        "from tunix.sft import utils\n"
        "print(sorted(m for m in ('torch', 'pandas', 'tunix.sft.peft_trainer', 'tunix.rl.rl_cluster') if m in sys.modules))\n"
        "print(hasattr(sys.modules['tunix'], 'PeftTrainer'))\n"
        # a submodule __init__ would have re-exported is still importable by its own name
        "from tunix.sft.peft_trainer import PeftTrainer\n"
        "print(PeftTrainer.__module__)\n"
    )
    assert out.splitlines() == ["[]", "False", "tunix.sft.peft_trainer"]


def test_a_full_import_before_is_kept():
    out = _run(
        "import tunix\n"
        "from tunix_rt.models import tunix_lean\n"
        "print(tunix_lean.install(), hasattr(tunix, 'PeftTrainer'))\n"
        "from tunix_rt.models import jax_loader\n"
        "import sys; print(sys.modules['tunix'] is tunix)\n"
    )
    assert out.splitlines() == ["False True", "True"]
