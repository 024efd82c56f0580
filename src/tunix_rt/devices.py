"""The device names a run, an eval or a plan is given, and what each means per engine.

Ground floor (imports nothing of tunix_rt but errors; torch and JAX only inside the functions,
so `tunix-rt --help` stays fast):

    auto   the best the engine finds here (CUDA for torch when present; JAX's default backend)
    cpu    both engines
    cuda   the torch engine's GPU (the JAX engine reads it as gpu)
    gpu    the JAX engine's GPU
    tpu    the JAX engine's TPU
"""

from __future__ import annotations

from tunix_rt.errors import BadInput

#: every device name a config or a --device flag accepts
NAMES = ("auto", "cpu", "cuda", "gpu", "tpu")
#: the concrete devices the torch engine runs on
TORCH = ("cpu", "cuda")
#: device names only the JAX engine serves (engine=auto picks JAX for these)
JAX_ONLY = ("gpu", "tpu")
#: device name -> the JAX platform it asks for (None: JAX's default)
JAX_PLATFORM = {"auto": None, "cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "tpu": "tpu"}
#: the --device help text of every CLI
HELP = "auto | cpu | cuda (torch) | gpu | tpu (jax)"


def resolve_device(engine: str, device: str) -> str:
    """The concrete device `device` names on `engine`: "auto" made concrete (so a summary
    names the device that ran), any other name as given."""
    if device != "auto":
        return device
    if engine == "jax":
        import jax

        return jax.default_backend()  # cpu | gpu | tpu
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_device(device: str, local_rank: int = 0):
    """The torch device for a device name (CUDA: this process's GPU under torchrun); a clear
    error naming what was asked and what exists."""
    import torch

    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    have = "cpu" + (f", cuda ({n_cuda} device{'s' if n_cuda > 1 else ''})" if n_cuda else "")
    if device in JAX_ONLY:
        raise BadInput(f"device {device!r} is a JAX device name; the torch engine runs on {' or '.join(TORCH)} "
                       f"(available here: {have}); use --engine jax for {device}")
    if device == "cuda" and not n_cuda:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise BadInput(f"device 'cuda' was asked, but torch {torch.__version__} ({build}) sees no CUDA "
                       f"device; available here: {have}")
    if device == "cuda" or (device == "auto" and n_cuda):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")
