"""roofline's read-only rate: the faster of torch's sum and its C read loop (C_READ), which must
read every element it is given (its sum is exact on small integers) wherever it builds."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.requires import require_module

torch = require_module("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_the_c_read_loop_reads_every_element_and_the_rate_is_the_faster():
    import roofline

    from cpu_testlib import cpu_flags

    fn = roofline.c_read()
    if "avx512f" in cpu_flags():  # the loop must build and run where the CPU has AVX-512
        assert fn is not None
    if fn is not None:
        a = torch.arange(4096 * 64, dtype=torch.float32) % 7  # small integers: every partial sum exact
        assert fn(a) == float(a.sum())
        a[4096 * 63 + 4095] = 1000.0  # the last element counts too
        assert fn(a) == float(a.sum())
    best, med = roofline.read_best(torch.ones(4096 * 256), 0.05)
    assert 0 < best <= med
    assert roofline.read_rate(0.05) > 0
