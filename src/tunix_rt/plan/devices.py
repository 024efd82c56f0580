"""The devices a plan knows: the catalogue of kinds (usable bytes per device), and the
resolution of a name to one, probing the live GPU or the running JAX process's device."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from tunix_rt.errors import BadInput

GiB = 1024**3
MiB = 1024**2


@dataclass(frozen=True)
class DeviceSpec:
    """One device kind: usable bytes per device (what the runtime lets a program use)."""

    name: str
    kind: str  # cpu | gpu | tpu
    capacity_bytes: int
    note: str
    bf16: bool = True


def _tpu(name: str, hbm_gib: float, note: str) -> DeviceSpec:
    # XLA reports 15.75G usable of a v5e chip's 16 GiB; the other chips keep the same share.
    usable = 15.75 if name == "tpu-v5e" else hbm_gib * 15.75 / 16
    return DeviceSpec(name, "tpu", int(usable * GiB), note)


DEVICES: dict[str, DeviceSpec] = {
    d.name: d
    for d in [
        # GPUs: the memory nvidia-smi reports; the CUDA context is counted in workspace.
        DeviceSpec("t4-16gb", "gpu", 15360 * MiB, "NVIDIA T4 16 GB (no bf16 tensor cores)", bf16=False),
        DeviceSpec("l4-24gb", "gpu", 23034 * MiB, "NVIDIA L4 24 GB"),
        DeviceSpec("a100-40gb", "gpu", 40960 * MiB, "NVIDIA A100 40 GB"),
        DeviceSpec("a100-80gb", "gpu", 81920 * MiB, "NVIDIA A100 80 GB"),
        DeviceSpec("h100-80gb", "gpu", 81559 * MiB, "NVIDIA H100 80 GB"),
        DeviceSpec("h200-141gb", "gpu", 143771 * MiB, "NVIDIA H200 141 GB"),
        _tpu("tpu-v3", 16, "TPU v3, per core (Kaggle's v3-8: 8 devices x 16 GiB)"),
        _tpu("tpu-v4", 32, "TPU v4, per chip (32 GiB HBM)"),
        _tpu("tpu-v5e", 16, "TPU v5e (v5 lite), per chip (16 GiB HBM, 15.75G usable)"),
        _tpu("tpu-v5p", 95, "TPU v5p, per chip (95 GiB HBM)"),
        _tpu("tpu-v6e", 32, "TPU v6e (Trillium), per chip (32 GiB HBM)"),
    ]
}
#: JAX device_kind -> our name, for plans made inside a running JAX engine
JAX_KINDS = {"TPU v3": "tpu-v3", "TPU v4": "tpu-v4", "TPU v5 lite": "tpu-v5e", "TPU v5e": "tpu-v5e",
             "TPU v5p": "tpu-v5p", "TPU v5": "tpu-v5p", "TPU v6 lite": "tpu-v6e", "TPU v6e": "tpu-v6e"}


def device_spec(name: str) -> DeviceSpec:
    """A named device, `cpu` (this host's RAM), `cuda`/`gpu` (the GPU present) or `tpu`
    (the TPU a running JAX process sees)."""
    if name in DEVICES:
        return DEVICES[name]
    if name == "cpu":
        import psutil

        return DeviceSpec("cpu", "cpu", int(psutil.virtual_memory().total), "this host's RAM", bf16=False)
    if name in ("cuda", "gpu", "tpu"):
        live = _live_jax_device(name) if name != "cuda" else None
        return live or _live_cuda_device(name)
    known = ", ".join(["cpu", "cuda", *DEVICES])
    raise BadInput(f"unknown device {name!r}; known: {known}")


def _live_jax_device(name: str) -> DeviceSpec | None:
    """The device of a JAX process that already imported jax (the JAX engine); never
    imports jax itself, so a plan stays cheap."""
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        dev = jax.devices(name)[0]
    except RuntimeError:
        return None
    kind = str(getattr(dev, "device_kind", ""))
    stats = {}
    try:
        stats = dev.memory_stats() or {}
    except Exception:  # some backends have none
        pass
    if stats.get("bytes_limit"):
        return DeviceSpec(name, "tpu" if name == "tpu" else "gpu", int(stats["bytes_limit"]), kind)
    if kind in JAX_KINDS:
        return DEVICES[JAX_KINDS[kind]]
    return None


def _live_cuda_device(name: str) -> DeviceSpec:
    if name == "tpu":
        raise BadInput("device tpu: name the chip (tpu-v3, tpu-v4, tpu-v5e, tpu-v5p, tpu-v6e)")
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        raise BadInput(f"device {name}: no CUDA device here; name one instead ({', '.join(n for n, d in DEVICES.items() if d.kind == 'gpu')})")
    props = torch.cuda.get_device_properties(0)
    major, _ = torch.cuda.get_device_capability(0)
    return DeviceSpec("cuda", "gpu", int(props.total_memory), props.name, bf16=major >= 8)
