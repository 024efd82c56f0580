"""google-tunix's modules without its package __init__.

`import tunix` runs tunix/__init__.py, which imports every trainer Tunix ships (SFT, DPO, the
RL learners and their cluster, distillation, the sampler): PyTorch, pandas, pyarrow, IPython
and orbax come with them. The JAX engine uses Tunix's model code (tunix.models.*) and a few
helpers (tunix.sft.utils, tunix.utils), which need none of that. Measured in one process
after `import jax` (Gemma 3 270M's engine, 2-core EPYC, 2026-11-29): `import tunix` then the
model modules add 290 MiB of RSS; the model modules alone 50 MiB (torch not imported).

`install()` registers a bare package object as `tunix` (its real directory as __path__) when
no module of that name is loaded yet, so `from tunix.models.gemma3 import model` imports the
submodules it names and nothing else. Every submodule works as under the full import (they
import one another by absolute name; Tunix's subpackages have no __init__ of their own); only
the names tunix/__init__.py re-exports (`tunix.PeftTrainer`, `tunix.__version__`) are absent:
`from tunix.sft.peft_trainer import PeftTrainer` is the way to reach them in this process. A
process that imported tunix before keeps the full package. Call it before the first import
of a tunix module (the modules that import tunix call it at their top).
"""

from __future__ import annotations

import importlib.util
import sys
import types


def install() -> bool:
    """Register the bare `tunix` package; False when a `tunix` module is already loaded (or
    google-tunix is not installed: the import that follows then fails as it would anyway)."""
    if "tunix" in sys.modules:
        return False
    spec = importlib.util.find_spec("tunix")
    if spec is None or not spec.submodule_search_locations:
        return False
    module = types.ModuleType("tunix", "google-tunix, its submodules imported one by one (tunix_rt.models.tunix_lean)")
    module.__path__ = list(spec.submodule_search_locations)
    module.__spec__ = spec
    module.__file__ = spec.origin
    module.__package__ = "tunix"
    sys.modules["tunix"] = module
    return True
