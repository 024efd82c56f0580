"""What the CPU kernel tests share (tests/eval/test_int8_kernel.py, tests/train/test_cpu_kernels.py):
the CPU's flags, and a function's results on 1 and on 2 threads."""

from __future__ import annotations


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
