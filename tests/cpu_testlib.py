"""What the CPU kernel tests share (tests/eval/test_int8_kernel.py, tests/train/test_cpu_kernels.py):
the CPU's flags, a function's results on 1 and on 2 threads, and the decode kernels' instruction
sets this CPU runs (each test of them runs once per set: an AVX-512 CPU runs the AVX2 kernels too)."""

from __future__ import annotations

import contextlib
import os

ISA_FLAGS = {"avx512": {"avx512f", "avx512bw", "avx512_vnni"}, "avx2": {"avx2", "fma", "f16c"}}
"""What /proc/cpuinfo must list for each instruction set of the decode kernels (int8_kernel.ISAS)."""


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo), empty where there are none to read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def on_one_and_two_threads(fn) -> list:
    """[fn() on 1 torch thread, fn() on 2], the thread count restored after."""
    import torch

    before = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            outs.append(fn())
        return outs
    finally:
        torch.set_num_threads(before)


def decode_isas() -> list[str]:
    """The decode kernels' instruction sets this CPU runs, best first (["none"] where it runs
    neither, or TUNIX_RT_INT8_KERNEL=torch turns the library off)."""
    if os.environ.get("TUNIX_RT_INT8_KERNEL") == "torch":
        return ["none"]
    flags = cpu_flags()
    return [isa for isa, need in ISA_FLAGS.items() if need <= flags] or ["none"]


@contextlib.contextmanager
def using_isa(isa: str):
    """The decode kernels of `isa` in this process for the block (int8_kernel.set_isa; it must
    take: a CPU that lists the flags runs them), the best one back after."""
    from tunix_rt.eval import int8_kernel

    got = int8_kernel.set_isa(isa)
    assert got == isa, (got, int8_kernel.WHY)
    try:
        yield isa
    finally:
        int8_kernel.set_isa(decode_isas()[0])
