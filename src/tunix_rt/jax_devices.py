"""The JAX devices of a run: joining a multi-host run, picking the asked platform's devices
(with a clear error saying what exists), checking a mesh spans every process, and the
device facts and peak memory a run records.

Both the JAX engine and the JAX eval generator use it; JAX is imported inside the functions
only, so importing this module stays cheap.
"""

from __future__ import annotations

import os
from typing import Any

from tunix_rt.devices import JAX_PLATFORM
from tunix_rt.errors import BadInput

PLATFORMS = JAX_PLATFORM  # device name -> JAX platform (the one vocabulary: tunix_rt.devices)
HOW_TO_GET = {
    "tpu": "on Kaggle set Accelerator to TPU v3-8 / v5e-8 (Notebook options); elsewhere run on a "
           "TPU VM with `pip install jax[tpu]`",
    "gpu": "install a CUDA build of jaxlib (`pip install jax[cuda12]`) on a machine where "
           "`nvidia-smi` lists a GPU",
    "cpu": "the CPU backend is always built in; check JAX_PLATFORMS",
}


def maybe_init_distributed() -> bool:
    """Join a multi-host run when the environment describes one (a coordinator address, or
    a TPU pod slice with several workers). Must run before JAX touches a backend."""
    import jax

    pod = len([h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1
    if not (os.environ.get("JAX_COORDINATOR_ADDRESS") or pod):
        return False
    if jax.distributed.is_initialized():
        return True
    jax.distributed.initialize()
    return True


CACHE_ENV = "TUNIX_RT_JAX_CACHE"
"""Where compiled XLA programs are kept between processes: a directory, or "off"."""
CACHE_MAX_BYTES = 2 << 30


def compilation_cache_dir() -> str | None:
    """JAX's persistent compilation cache for this process, set before anything compiles:
    JAX_COMPILATION_CACHE_DIR where the user set it (JAX reads it itself), else
    $TUNIX_RT_JAX_CACHE, else $XDG_CACHE_HOME/tunix-rt/jax (~/.cache/tunix-rt/jax); None
    when TUNIX_RT_JAX_CACHE is "off". The train step, the rollouts and the evals of a model
    then compile once per machine and shapes, not once per process (a TPU compile of a 2B
    step takes minutes; Gemma 3 270M's LoRA step takes 20 s on a 2-core CPU). JAX keys each
    entry by the program, the compile options, the backend and the jaxlib version, keeps
    the programs that took >= 1 s to compile (its default: on the notebook's tiny-model
    pipeline, whose compiles are many and short, 231 -> 226 s with it and 196 s with 0, a
    2-core EPYC), and drops the least recently used beyond CACHE_MAX_BYTES. On the CPU a hit
    costs some host memory: Gemma 3 270M's LoRA step peaked at 2.72 GiB with its programs
    loaded from the cache against 2.61 compiled (12 s saved); TUNIX_RT_JAX_CACHE=off if that counts."""
    import jax

    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    path = os.environ.get(CACHE_ENV, "").strip()
    if path.lower() == "off":
        return None
    if not path:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(base, "tunix-rt", "jax")
    jax.config.update("jax_compilation_cache_dir", path)
    if "JAX_COMPILATION_CACHE_MAX_SIZE" not in os.environ:
        jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
    return path


_COMPILE_DONE = "/jax/core/compile/backend_compile_duration"
"""jax.monitoring's event when XLA has compiled a program (or read it from the cache)."""
_trimming: list[bool] = []


def trim_after_compiles() -> bool:
    """From now on, give the C heap's free pages back to the OS (heap.trim) after every XLA
    compile in this process, before the program first runs. XLA:CPU's compile frees its
    scratch in pieces that the step's large buffers cannot reuse, so that without it each
    new program's first run mapped fresh pages on top of them. Measured on Gemma 3 270M's LoRA
    step (bench_jax_loss's batches, two width buckets, jemalloc, 2-core Xeon): peak RSS 2.15
    -> 2.08 GiB with the programs read from the persistent cache, 2.22 -> 2.00 compiled; RSS
    after the load 1.52 -> 1.33. Once per process; False if it was on already."""
    import jax

    from tunix_rt import heap

    if _trimming:
        return False

    def on_event(name: str, secs: float, **_kw) -> None:
        if name == _COMPILE_DONE:
            heap.trim()

    jax.monitoring.register_event_duration_secs_listener(on_event)
    _trimming.append(True)
    return True


def select_devices(device: str) -> list:
    """The devices of the asked platform; a clear error saying what exists when it is absent.
    Also turns on the persistent compilation cache (compilation_cache_dir) and the heap's
    trim after each compile (trim_after_compiles)."""
    import jax

    compilation_cache_dir()
    trim_after_compiles()
    want = PLATFORMS[device]
    if want is None:
        return jax.devices()
    try:
        found = jax.devices(want)
    except RuntimeError:
        found = []
    if not found:
        have = jax.devices()
        names = ", ".join(sorted({str(d.device_kind) for d in have}))
        raise BadInput(
            f"--device {device}: JAX found no {want.upper()} device; it sees {len(have)} "
            f"{have[0].platform} device(s) ({names}). To get one: {HOW_TO_GET[want]}"
        )
    return found


def check_mesh_spans_processes(shape, devices) -> None:
    """Several processes: the mesh must hold devices of every one of them (a process without
    a device in it would have nothing to run)."""
    import jax

    from tunix_rt.models.jax_loader import make_mesh

    mesh = make_mesh(shape, devices)
    held = {d.process_index for d in mesh.devices.flat}
    if len(held) < jax.process_count():
        raise BadInput(f"mesh {dict(mesh.shape)} holds devices of {len(held)} of the {jax.process_count()} processes; "
                       f"with several processes the mesh must span them all (fsdp x tp = {len(devices)}, "
                       "or mesh=auto)")


def device_facts(devices) -> dict[str, Any]:
    """The devices of the run (every process's: `count` is global); several processes add
    `processes`."""
    import jax

    facts = {
        "platform": devices[0].platform,
        "count": len(devices),
        "process_count": jax.process_count(),
        "names": [f"{d.platform}:{d.id} {d.device_kind}" for d in devices],
        "memory_bytes": [_device_limit(d) for d in devices],
    }
    if jax.process_count() > 1:
        facts["processes"] = jax.process_count()
    return facts


def _device_limit(d) -> int:
    try:
        stats = (d.memory_stats() if d.process_index == _process_index() else None) or {}
    except Exception:  # the CPU backend has no memory stats
        stats = {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    import psutil

    return int(psutil.virtual_memory().total)


def _process_index() -> int:
    import jax

    return jax.process_index()


def peak_memory_bytes(devices) -> int:
    """Accelerators: the largest peak bytes in use of any device; CPU: peak RSS. (Several
    processes: of this process's devices, and its RSS.)"""
    from tunix_rt.files import peak_rss_bytes

    peaks = []
    for d in devices:
        if d.process_index != _process_index():
            continue
        try:
            peaks.append(int((d.memory_stats() or {}).get("peak_bytes_in_use", 0)))
        except Exception:
            peaks.append(0)
    if max(peaks, default=0) > 0:
        return max(peaks)
    return peak_rss_bytes()
