"""tunix_rt.heap on glibc (Linux: /proc, libc's malloc), each case in a fresh process (the allocator's state is per process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

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
