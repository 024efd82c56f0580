"""The engines and the one rule that picks one: train, eval, plan, jobs and the demo all
call `pick()` and `engine_class()`; nothing else names an engine module.

    torch   PyTorch: CPU, CUDA (one process, or several under torchrun)
    jax     JAX on google-tunix's model code: CPU, GPU, TPU, sharded over a mesh

Nothing here imports torch or JAX at module load (`tunix-rt --help` stays fast, and a JAX-only
install never touches torch).
"""

from __future__ import annotations

import importlib

from tunix_rt import devices
from tunix_rt.errors import BadInput

#: engine name -> (module, class, the package it needs, how to install it)
ENGINES: dict[str, tuple[str, str, str, str]] = {
    "torch": ("tunix_rt.train.torch_engine", "TorchEngine", "torch", "pip install 'tunix-rt[torch]'"),
    "jax": ("tunix_rt.train.jax_engine", "JaxEngine", "jax", "pip install 'tunix-rt[jax]'"),
}
CHOICES = ("auto", *ENGINES)
#: device names (the one vocabulary: tunix_rt.devices)
DEVICES, JAX_ONLY_DEVICES = devices.NAMES, devices.JAX_ONLY


def installed(name: str) -> bool:
    try:
        importlib.import_module(ENGINES[name][2])
    except ImportError:
        return False
    return True


def pick(engine: str, device: str = "auto") -> str:
    """What engine=auto means, everywhere: JAX for the devices only it serves (gpu, tpu) and
    where torch is not installed but JAX is (a `tunix-rt[jax]` install, as on a Kaggle TPU
    image); PyTorch otherwise. A named engine is kept as it is."""
    if engine not in CHOICES:
        raise BadInput(f"engine must be one of {'|'.join(CHOICES)}, got {engine!r}")
    if engine != "auto":
        return engine
    if device in JAX_ONLY_DEVICES:
        return "jax"
    if not installed("torch") and installed("jax"):
        return "jax"
    return "torch"


def require(name: str) -> None:
    """A clear BadInput when the engine's framework is not installed here."""
    module, _cls, package, how = ENGINES[name]
    if not installed(name):
        other = [n for n in ENGINES if n != name and installed(n)]
        alt = f", or use --engine {other[0]}" if other else ""
        raise BadInput(f"the {name} engine needs {package}, which is not installed here: {how}{alt}")


def engine_class(name: str) -> type:
    """The class of the named engine (it implements train.engine.Engine, which takes a
    TrainConfig: config.py reads this module's names, so it names neither)."""
    require(name)
    module, cls, _package, _how = ENGINES[name]
    return getattr(importlib.import_module(module), cls)
