"""tunix_rt.heap on glibc and jemalloc (Linux: /proc, libc's malloc), each case in a fresh process (the allocator's state is per process)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from requires import require_jemalloc
from tunix_rt import heap

PRELUDE = """
import ctypes, ctypes.util
from tunix_rt import heap
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
"""


def _run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", PRELUDE + code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_trim_gives_freed_small_blocks_back():
    """Every other of 6400 blocks of 64 KiB freed (200 MiB in holes between live blocks: not
    at the heap's top) stays resident until trim() returns the holes' pages."""
    out = _run("""
size = 64 << 10
blocks = [libc.malloc(size) for _ in range(6400)]
for b in blocks: libc.memset(b, 1, size)
for b in blocks[::2]: libc.free(b)
before = rss()
ok = heap.trim()
print(before - rss(), ok)
""")
    released, ok = out.split()
    assert ok == "True" and float(released) > 150, out


def test_trim_on_jemalloc_purges_its_dirty_pages():
    """Under jemalloc, freed pages stay resident (its dirty pages) until its decay timer runs
    out; trim() purges every arena at once. Before, trim() called glibc's malloc_trim there,
    which had nothing to give back."""
    require_jemalloc()
    code = PRELUDE + """
import time
assert heap.allocator() == "jemalloc"
libc = ctypes.CDLL(None)  # the process's malloc (jemalloc's), not libc.so's own
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
size = 64 << 10
blocks = [libc.malloc(size) for _ in range(6400)]
for b in blocks: libc.memset(b, 1, size)
for b in blocks: libc.free(b)
before = rss()
ok = heap.trim()
print(before - rss(), ok)
"""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TUNIX_RT_ALLOCATOR")}
    env["MALLOC_CONF"] = "dirty_decay_ms:60000,muzzy_decay_ms:60000"  # nothing returned by the timer during the test
    r = subprocess.run([sys.executable, "-c", code], env=heap.preload_env(env), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    released, ok = r.stdout.split()
    assert ok == "True" and float(released) > 80, r.stdout  # 120 MiB of the 400 measured; glibc's malloc_trim there: 0


def test_jax_programs_trim_the_heap_after_each_compile():
    """jax_devices.trim_after_compiles: once per process, then heap.trim after every XLA
    compile (jax.monitoring's backend-compile event), not after a cached call."""
    code = """
import jax, jax.numpy as jnp
from tunix_rt import heap, jax_devices
calls = []
heap.trim = lambda: calls.append(1) or True
jax.config.update("jax_compilation_cache_dir", None)
assert jax_devices.trim_after_compiles() and not jax_devices.trim_after_compiles()
f = jax.jit(lambda x: x * 2 + 1)
f(jnp.ones(3)); n1 = len(calls)
f(jnp.ones(3)); n2 = len(calls)
f(jnp.ones(4)); n3 = len(calls)
print(n1, n2, n3)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr
    n1, n2, n3 = map(int, r.stdout.split())
    assert n1 >= 1 and n2 == n1 and n3 > n2, r.stdout


@pytest.mark.parametrize("tuned, size_kib, returned", [(True, 300, True), (True, 200, False), (False, 300, False)])
def test_tuned_allocator_maps_blocks_of_256_kib_and_more(tuned, size_kib, returned):
    """After tune_cpu_allocator, a freed block of 256 KiB or more leaves RSS at once (mmapped);
    a smaller one stays in the heap (every other block freed: holes between live ones).
    Untuned, glibc's threshold had grown past 300 KiB after one large block was freed."""
    out = _run(f"""
assert {"heap.tune_cpu_allocator()" if tuned else "True"}
libc.free(libc.malloc(4 << 20))  # untuned, glibc would now raise its threshold to 4 MiB
n, size = 800, {size_kib} << 10
blocks = [libc.malloc(size) for _ in range(n)]
for b in blocks: libc.memset(b, 1, size)
full = rss()
for b in blocks[::2]: libc.free(b)
print(full - rss())
""")
    freed = float(out)
    total = 400 * size_kib / 1024
    assert (freed > 0.9 * total) if returned else (freed < 0.1 * total), (freed, total)


def test_preload_env_puts_jemalloc_first_once_and_glibc_opts_out():
    """preload_env: jemalloc ahead of what LD_PRELOAD already names, never twice, and nothing
    when TUNIX_RT_ALLOCATOR=glibc (or where jemalloc is not installed)."""
    lib = heap.jemalloc_path()
    base = {"PATH": "/usr/bin", "LD_PRELOAD": "/x/libfoo.so"}
    env = heap.preload_env(base)
    assert base == {"PATH": "/usr/bin", "LD_PRELOAD": "/x/libfoo.so"}  # a copy
    if lib is None:
        assert env == base
    else:
        assert env["LD_PRELOAD"] == f"{lib} /x/libfoo.so" and env["TUNIX_RT_ALLOCATOR"] == "jemalloc"
        assert heap.preload_env(env)["LD_PRELOAD"] == env["LD_PRELOAD"]
    assert heap.preload_env({**base, "TUNIX_RT_ALLOCATOR": "glibc"}) == {**base, "TUNIX_RT_ALLOCATOR": "glibc"}


def test_a_process_started_with_preload_env_runs_on_jemalloc():
    """The child names jemalloc as its allocator and leaves glibc's tuning alone; a plain
    child runs on glibc."""
    require_jemalloc()
    code = "from tunix_rt import heap; print(heap.allocator(), heap.tune_cpu_allocator())"
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TUNIX_RT_ALLOCATOR")}
    on = subprocess.run([sys.executable, "-c", code], env=heap.preload_env(env), capture_output=True, text=True,
                        timeout=120)
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert on.stdout.split() == ["jemalloc", "False"], on.stderr
    assert off.stdout.split() == ["glibc", "True"], off.stderr


@pytest.mark.parametrize("command, chosen, expect", [
    (["train", "--help"], None, "jemalloc"),           # a compute command runs itself again on jemalloc
    (["--home", "/tmp/x", "eval", "--help"], None, "jemalloc"),
    (["runs", "--help"], None, "glibc"),               # a registry listing does not
    (["train", "--help"], "glibc", "glibc"),           # the user's choice stands
])
def test_the_cli_reexecutes_compute_commands_with_jemalloc(tmp_path, command, chosen, expect):
    """`python -m tunix_rt.cli COMMAND`: the process that runs the command (same pid: exec)
    reports its allocator at exit, through a sitecustomize hook."""
    require_jemalloc()
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import atexit, os\n"
        "def _report():\n"
        "    from tunix_rt import heap\n"
        "    print('ALLOCATOR', heap.allocator(), os.getpid(), flush=True)\n"
        "atexit.register(_report)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TUNIX_RT_ALLOCATOR")}
    env["PYTHONPATH"] = os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])
    if chosen:
        env["TUNIX_RT_ALLOCATOR"] = chosen
    p = subprocess.Popen([sys.executable, "-m", "tunix_rt.cli", *command], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    lines = [x.split() for x in out.splitlines() if x.startswith("ALLOCATOR ")]
    assert lines == [["ALLOCATOR", expect, str(p.pid)]], (out[-2000:], err[-2000:])


@pytest.mark.parametrize("orig, own", [
    (["/v/bin/python", "/v/bin/tunix-rt", "train"], True),
    (["python", "-m", "tunix_rt.cli", "train"], True),
    (["python", "-u", "/v/bin/tunix-rt", "train"], True),           # torchrun's launch
    (["python", "-X", "dev", "/v/lib/tunix_rt/cli.py", "eval"], True),
    (["python", "-m", "pytest", "tests"], False),                     # a test calling cli.main() in-process
    (["python", "-c", "from tunix_rt.cli import main; main()"], False),
    (["python", "/v/bin/other-tool", "train"], False),
])
def test_only_the_programs_own_command_line_is_run_again(orig, own):
    from tunix_rt.cli import _command, _own_command_line

    assert _own_command_line(orig) is own
    assert _command(["--home", "/h", "train", "--config", "smoke"]) == "train" and _command(["--version"]) is None
