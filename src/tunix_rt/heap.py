"""The C heap of a CPU process: which allocator serves it (jemalloc where installed, else
glibc's), where freed memory goes, and giving it back.

Why jemalloc: glibc either keeps freed activation buffers in its heap, fragmented (its
default), or, tuned to map every block of 256 KiB and more (tune_cpu_allocator), hands them
back to the OS at once, so that every new [tokens, width] tensor of a training step is fresh
pages the kernel must fault in and zero. Measured on Gemma 3 270M's LoRA SFT step
(benchmarks/bench_torch_vs_trl.py's batches, fp32, 2-core AMD EPYC with AVX-512, nine steps
each, one process per allocator): glibc tuned 5.8-7.5 s a step, 1.5-1.7 million page faults
and ~3.5 s of system CPU a step, peak RSS 2.19 GiB; glibc's default 3.7-4.7 s, no faults,
2.60-2.78 GiB; jemalloc (Debian's libjemalloc2, its default settings) 3.8-4.9 s, 0.15-0.2
million faults, 2.16-2.17 GiB. jemalloc reuses freed memory without glibc's fragmentation,
as Intel's PyTorch CPU launcher (torch.backends.xeon.run_cpu) preloads it too.

jemalloc must replace malloc before the process starts (LD_PRELOAD): the compute commands
re-execute themselves with it (reexec_with_jemalloc, called by the CLI for
cli.COMPUTE_COMMANDS), and the benchmarks start our sides with it (preload_env).
TUNIX_RT_ALLOCATOR=glibc keeps glibc's.

Nothing here imports torch or JAX; both engines, the tokenizer and the model loader use it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from pathlib import Path

#: the environment variable that chooses the allocator: "glibc" keeps glibc's; unset, or
#: "jemalloc", preloads jemalloc where it is installed (the re-executed process has it set)
ALLOCATOR_ENV = "TUNIX_RT_ALLOCATOR"
#: where Linux distributions install jemalloc's shared library (Debian/Ubuntu: libjemalloc2)
JEMALLOC_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
                 "/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
JEMALLOC_NAMES = ("libjemalloc.so.2", "libjemalloc.so.1", "libjemalloc.so")


@functools.cache
def jemalloc_path() -> str | None:
    """jemalloc's shared library on this machine (Linux only), or None."""
    if not sys.platform.startswith("linux"):
        return None
    for d in JEMALLOC_DIRS:
        for name in JEMALLOC_NAMES:
            p = Path(d) / name
            if p.is_file():
                return str(p)
    return None


def allocator() -> str:
    """Which allocator serves this process's malloc: "jemalloc" when its library is mapped
    here (preloaded), else "glibc" on glibc, else "system"."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    if "libjemalloc" in maps:
        return "jemalloc"
    return "glibc" if _libc() is not None and sys.platform.startswith("linux") else "system"


def preload_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of `env` (default: this process's) under which a new process starts with
    jemalloc preloaded, where it is installed and TUNIX_RT_ALLOCATOR is not "glibc"; the
    same environment otherwise."""
    env = dict(os.environ if env is None else env)
    lib = jemalloc_path()
    if env.get(ALLOCATOR_ENV, "jemalloc") == "glibc" or lib is None:
        return env
    preload = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p]
    if not any("libjemalloc" in p for p in preload):
        env["LD_PRELOAD"] = " ".join([lib, *preload])
    env[ALLOCATOR_ENV] = "jemalloc"
    return env


def reexec_with_jemalloc(argv: list[str]) -> None:
    """Run `argv` (this process's own command line, sys.orig_argv) again in this process
    (same pid and environment) with jemalloc preloaded, when it is installed, is not serving
    this process already, and TUNIX_RT_ALLOCATOR is unset (the new process has it set: no
    loop). Returns otherwise. Call it first thing, before any thread is started."""
    if os.environ.get(ALLOCATOR_ENV) or jemalloc_path() is None or allocator() == "jemalloc":
        return
    try:
        os.execve(sys.executable, argv, preload_env())
    except OSError:  # the interpreter cannot be run again (frozen, removed): go on with glibc
        os.environ[ALLOCATOR_ENV] = "glibc"


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        lib = ctypes.CDLL(name)
        return lib if hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim") else None
    except OSError:
        return None


#: blocks of this size and more are mmapped (tune_cpu_allocator)
MMAP_THRESHOLD = 256 << 10


def tune_cpu_allocator() -> bool:
    """On glibc: allocate blocks of 256 KiB and more with mmap, so that freed buffers go back
    to the OS at once. glibc's default (a threshold that grows to 32 MiB) keeps freed
    activation buffers in the heap, where fragmentation adds to the peak RSS at no gain in
    speed (measured with a 1 MiB threshold: ~0.5 GB for a Gemma 3 270M LoRA step on the torch
    engine, ~0.1 GB on the JAX engine). 1 MiB still left the heap growing a step at a time
    under the 270M's DPO step (its [2, 381, 256] attention tensors, 0.75 MiB, and smaller:
    329 -> 418 -> 537 -> 590 MiB of heap over three steps); at 256 KiB it stays at 329 MiB and
    the step's peak RSS is 2.69 GiB against 2.73, at no measured cost in time (a scratch A/B
    alternating both in one process, 8 steps each, 2-core EPYC). Call it on CPU runs only,
    before the model is loaded; False where it does not apply (musl, macOS, or jemalloc
    serves malloc: module docstring)."""
    if allocator() == "jemalloc":
        return False
    lib = _libc()
    return bool(lib.mallopt(-3, MMAP_THRESHOLD)) if lib else False  # M_MMAP_THRESHOLD


def trim() -> bool:
    """Give the heap's free pages back to the OS: glibc's malloc_trim, or where jemalloc
    serves malloc, a purge of every arena's dirty pages (mallctl "arena.<all>.purge"; jemalloc
    would otherwise return them only as its decay timer runs out, and only while the process
    keeps allocating). After a load that parses a large file into many small blocks and frees
    most of them: loading Gemma 3's tokenizer.json (33 MB, 262K tokens, 514K merges) leaves
    ~190 MiB of freed parse blocks in the heap, counted in RSS until reused: 338 -> 146 MiB
    after a trim (measured on the 270M's tokenizer). A training step reuses those blocks
    anyway, so its peak is the same with or without the trim (measured on the 270M's DPO
    step). After an XLA compile (jax_devices.trim_after_compiles): its scratch is freed in
    pieces that a step's large buffers cannot reuse. False where it does not apply."""
    if allocator() == "jemalloc":
        mallctl = _jemalloc_mallctl()
        return mallctl is not None and mallctl(b"arena.%d.purge" % MALLCTL_ARENAS_ALL, None, None, None, 0) == 0
    lib = _libc()
    return bool(lib.malloc_trim(0)) if lib else False


#: jemalloc's index for "every arena" in an arena.<i> control name
MALLCTL_ARENAS_ALL = 4096


@functools.cache
def _jemalloc_mallctl():
    """jemalloc's mallctl, from the library this process preloaded (None if it has none)."""
    path = jemalloc_path()
    try:
        fn = ctypes.CDLL(path).mallctl if path else None
    except (OSError, AttributeError):
        return None
    if fn is not None:
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return fn
