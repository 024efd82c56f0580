"""The int8 kernel of our decoders (tunix_rt.eval.int8_kernel): exact int32 products equal to an
fp64 reference at every shape the decoders use and at the edges (tails of rows, -128, ±127,
no rows), `qlinear` giving the same bits as int8_weights's torch path, the same numbers on 1 and
2 threads, and the fallbacks (no compiler, the switch, another CPU) still exact; `q4linear`
(int4 weights) giving the bits of its torch twin, whatever the batch or the threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.requires import require_module

torch = require_module("torch")

import numpy as np  # noqa: E402

from cpu_testlib import ISA_FLAGS, cpu_flags, decode_isas, on_one_and_two_threads, using_isa  # noqa: E402
from tunix_rt.eval import int8_kernel  # noqa: E402
from tunix_rt.eval.int8_weights import QuantLinear, int4_reference, quantize, quantize4, quantize_activations  # noqa: E402




@pytest.fixture(params=decode_isas())
def isa(request):
    """Each decode-kernel test once per instruction set this CPU runs ("none": the fallbacks)."""
    with using_isa(request.param):
        yield request.param


def exact(lhs, w):
    """lhs @ w.T in fp64 (every sum below 2^53: exact), as int32."""
    return (lhs.double() @ w.double().t()).to(torch.int32)


def torch_path(x, ql: QuantLinear):
    """int8_weights's torch path (two activation levels, exact int sums, fp32 combination)."""
    m = x.shape[0]
    lhs, step = quantize_activations(x)
    acc = exact(lhs, ql.q)
    return (acc[:m].float() * 127.0 + acc[m:].float()) * step * ql.scale


def test_the_kernel_is_built_where_the_cpu_runs_it():
    """On a CPU with AVX-512 VNNI, or AVX2 with FMA and F16C, the kernel must load (a broken build
    fails here, not silently in the decoders' speed) and serve int_mm; elsewhere it says why it
    is not used."""
    lib = int8_kernel.library()
    if decode_isas()[0] != "none":
        assert lib is not None, int8_kernel.WHY
        assert int8_kernel.applies(torch.zeros(2, 64, dtype=torch.int8), torch.zeros(16, 64, dtype=torch.int8))
    else:
        assert lib is None and int8_kernel.WHY


ISA_CHILD = textwrap.dedent("""
    import json
    from tunix_rt.eval import int8_kernel as K
    try:
        print(json.dumps({"isa": K.decode_isa()}))
    except ValueError as e:
        print(json.dumps({"error": str(e)}))
""")


def test_the_decode_kernels_run_on_the_best_instruction_set_the_cpu_has(tmp_path):
    """AVX-512 VNNI where the CPU lists it, else AVX2 with FMA and F16C (AMD's Zen 1-3, Intel's
    client cores), else none; TUNIX_RT_KERNEL_ISA=avx2 picks the AVX2 kernels at load, a set the
    CPU lacks is never taken, and a name that is none of them is refused."""
    best = decode_isas()[0]
    assert int8_kernel.decode_isa() == best, int8_kernel.WHY
    assert (int8_kernel.decode_library() is not None) == (best != "none")
    if best != "none":
        assert int8_kernel.set_isa("avx512") == best  # no more than the CPU has
        assert int8_kernel.set_isa("none") == "none" and int8_kernel.decode_library() is None
        assert not int8_kernel.qlinear_applies(torch.zeros(1, 64), torch.zeros(16, 64, dtype=torch.int8))
        assert int8_kernel.set_isa(best) == best
    with pytest.raises(ValueError, match="isa must be one of"):
        int8_kernel.set_isa("sse2")

    def run(value: str) -> dict:
        env = {**os.environ, "TUNIX_RT_KERNEL_DIR": str(tmp_path / "kernels"), "TUNIX_RT_KERNEL_ISA": value}
        r = subprocess.run([sys.executable, "-c", ISA_CHILD], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])

    assert run("avx2") == {"isa": "avx2" if "avx2" in decode_isas() else "none"}
    assert "TUNIX_RT_KERNEL_ISA must be one of none|avx2|avx512" in run("avx3")["error"]


def test_qlinear_takes_the_whole_int8_range(isa):
    """Weights of -128 (whose magnitude, 128, is what the AVX2 kernels multiply as an unsigned
    byte) and of 127 against activations at both levels' extremes: the exact sums, row-major and
    on panels."""
    g = torch.Generator().manual_seed(12)
    w = torch.randint(-128, 128, (48, 640), dtype=torch.int8, generator=g)
    w[0] = -128
    w[1] = 127
    w[2, ::2], w[2, 1::2] = -128, 127
    ql = QuantLinear(w, torch.rand(48, generator=g) + 0.5)
    x = torch.randn(4, 640, generator=g)
    x[1] = torch.where(torch.arange(640) % 2 == 0, -1.0, 1.0) * 7.0  # every q1 at -127 or 127
    x[2] = -x[1]
    x[2, :320] += 7.0 / 254  # q2 near its own extremes
    x[3, 0] = -1e4  # one large value: the rest of the row falls to the second level
    if isa == "none":
        assert not int8_kernel.qlinear_applies(x, w)
        return
    want = torch_path(x, ql)
    assert torch.equal(int8_kernel.qlinear(x, w, ql.sums, ql.scale), want)
    assert torch.equal(int8_kernel.qlinear(x, int8_kernel.pack_rows(w), ql.sums, ql.scale, packed=True), want)
    assert torch.equal(int8_kernel.qlinear(x, int8_kernel.pack_vnni(w), ql.sums, ql.scale, packed=True, vnni=True), want)


@pytest.mark.parametrize("k", [64, 640, 2048])
@pytest.mark.parametrize("n", [1, 15, 16, 33, 80, 4096])
def test_int_mm_is_exact(k, n, isa):
    """Row-major and on `pack_vnni`'s layout: 4 and more rows go four at a time row-major
    (the last group padded); on the broadcast layout up to 8 rows a tile (the last few padded
    to 1, 2 or 4) against 2 or 4 blocks of 16 weight rows (80 rows: 5 blocks, a last tile of
    one block; 33: a row past the blocks). Activations of -128 (which the AVX2 kernels hand to
    an fp64 sum) and weights of -128 too."""
    g = torch.Generator().manual_seed(k * 7919 + n)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    w[0] = 127  # the largest sums of both signs (where an int16 pair sum would saturate)
    if n > 1:
        w[1] = -127
    if n > 2:
        w[2] = -128
    sums = int8_kernel.row_sums(w)
    vnni = int8_kernel.pack_vnni(w)
    for m in (0, 1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17):
        lhs = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
        if m:
            lhs[0] = 127
            lhs[-1] = -127 if m % 2 else -128  # AVX-512: shifted to 0 or 1, the compensation takes it back
        got = int8_kernel.int_mm(lhs, w, sums)
        assert got.dtype == torch.int32 and got.shape == (m, n)
        assert torch.equal(got, exact(lhs, w)), (m, n, k)
        assert torch.equal(int8_kernel.int_mm(lhs, vnni, sums, vnni=True), got), (m, n, k)
    assert torch.equal(int8_kernel.int_mm(lhs, w), exact(lhs, w))  # the sums computed when not given
    assert torch.equal(int8_kernel.int_mm(lhs, vnni, vnni=True), exact(lhs, w))


def test_pack_vnni_puts_four_bytes_of_16_rows_in_a_vector_and_unpack_vnni_undoes_it():
    g = torch.Generator().manual_seed(2)
    w = torch.randint(-128, 128, (37, 128), dtype=torch.int8, generator=g)
    p = int8_kernel.pack_vnni(w)
    assert p.shape == w.shape and torch.equal(int8_kernel.unpack_vnni(p), w)
    flat = p[:16].reshape(-1)  # vector q of block 0: bytes 4q..4q+3 of rows 0..15
    assert torch.equal(flat[:4], w[0, :4]) and torch.equal(flat[4:8], w[1, :4])
    assert torch.equal(flat[64 + 60: 64 + 64], w[15, 4:8])
    assert torch.equal(p[32:], w[32:])  # the rows past the last whole block stay row-major


def test_int_mm_takes_views_and_other_widths_through_torch():
    g = torch.Generator().manual_seed(3)
    w = torch.randint(-127, 128, (640, 256), dtype=torch.int8, generator=g)
    lhs = torch.randint(-127, 128, (32, 640), dtype=torch.int8, generator=g)
    view = w.t()  # [256, 640], not contiguous
    assert not int8_kernel.applies(lhs, view)
    assert torch.equal(int8_kernel.int_mm(lhs, view), exact(lhs, view))
    odd = torch.randint(-127, 128, (32, 96), dtype=torch.int8, generator=g)  # K not a multiple of 64
    assert not int8_kernel.applies(odd, odd)
    with pytest.raises(ValueError, match="wsum must be int32"):
        if int8_kernel.applies(lhs, view.contiguous()):
            int8_kernel.int_mm(lhs, view.contiguous(), torch.zeros(3, dtype=torch.int32))
        else:
            raise ValueError("wsum must be int32 (no kernel here: the check is the kernel path's)")


def test_qlinear_gives_the_bits_of_the_torch_path(isa):
    """20,000 activation rows of many scales: `127 / s` formed as torch forms it (a reciprocal,
    then a product) matters in a few of them, and a fused multiply-add would change more."""
    g = torch.Generator().manual_seed(11)
    ql = quantize(torch.randn(272, 640, generator=g))  # 17 blocks of 16 rows
    x = torch.randn(20000, 640, generator=g) * torch.rand(20000, 1, generator=g) * 10
    x[0] = 0  # the scale's floor
    x[1, :7] = 1e-30  # tiny values
    if isa == "none":
        assert not int8_kernel.qlinear_applies(x, ql.q)
        return
    got = int8_kernel.qlinear(x, ql.q, ql.sums, ql.scale)
    assert torch.equal(got, torch_path(x, ql))
    tail = quantize(torch.randn(37, 128, generator=g))  # rows past the last block of 16
    xt = torch.randn(5, 128, generator=g)
    assert torch.equal(int8_kernel.qlinear(xt, tail.q, tail.sums, tail.scale), torch_path(xt, tail))
    bad = x[:3].clone()
    bad[1, 5] = float("nan")
    out = int8_kernel.qlinear(bad, ql.q, ql.sums, ql.scale)
    assert torch.isnan(out[1]).all() and torch.equal(out[[0, 2]], torch_path(bad[[0, 2]], ql))
    with pytest.raises(ValueError, match="qlinear takes fp32"):
        int8_kernel.qlinear(x[:, :600].contiguous(), ql.q, ql.sums, ql.scale)


@pytest.mark.parametrize("n, k", [(272, 640), (37, 128), (16, 64), (5, 64), (1552, 2048)])
def test_qlinear_on_panels_gives_the_row_major_bits(n, k, isa):
    """`pack_rows` reorders the bytes of each whole block of 16 rows into panels (the tail rows
    stay row-major); `qlinear(..., packed=True)` on them (and with vnni=True on `pack_vnni`'s
    broadcast layout, the AVX2 kernels' own) gives exactly the row-major call's
    numbers (the same int32 sums), at 1 to 9 activation rows (the prefetch distance passes the
    end of the panels at the last blocks), and `unpack_rows` gives the weight back."""
    g = torch.Generator().manual_seed(n + k)
    ql = quantize(torch.randn(n, k, generator=g))
    panels = int8_kernel.pack_rows(ql.q)
    assert panels.shape == ql.q.shape and torch.equal(int8_kernel.unpack_rows(panels), ql.q)
    if n >= 16:  # piece j of row r of a block at byte 1024 j + 64 r of the block
        flat = panels[:16].reshape(-1)
        assert torch.equal(flat[64:128], ql.q[1, :64]) and torch.equal(flat[960:1024], ql.q[15, :64])
        if k >= 128:
            assert torch.equal(flat[1024 + 128: 1024 + 192], ql.q[2, 64:128])
    assert torch.equal(panels[n // 16 * 16:], ql.q[n // 16 * 16:])
    packed = QuantLinear(panels, ql.scale, ql.sums, packed=True)
    assert torch.equal(packed.rows(), ql.q) and torch.equal(packed.dequantize(), ql.dequantize())
    vnni = int8_kernel.pack_vnni(ql.q)  # the AVX2 kernels' layout (int8_kernel.panel_layout)
    assert torch.equal(QuantLinear(vnni, ql.scale, ql.sums, packed=True, vnni=True).rows(), ql.q)
    for m in (1, 2, 8, 9):
        x = torch.randn(m, k, generator=g) * 3
        if isa == "none":
            assert not int8_kernel.qlinear_applies(x, ql.q)
            return
        want = int8_kernel.qlinear(x, ql.q, ql.sums, ql.scale)
        assert torch.equal(int8_kernel.qlinear(x, panels, ql.sums, ql.scale, packed=True), want)
        assert torch.equal(int8_kernel.qlinear(x, vnni, ql.sums, ql.scale, packed=True, vnni=True), want)
        assert torch.equal(want, torch_path(x, ql))
    with pytest.raises(ValueError, match="row sums must be given"):
        int8_kernel.qlinear(x, panels, None, ql.scale, packed=True)
    with pytest.raises(ValueError, match="needs its row sums"):
        QuantLinear(panels, ql.scale, packed=True)


def test_one_and_two_threads_give_the_same_numbers(isa):
    g = torch.Generator().manual_seed(5)
    w = torch.randint(-127, 128, (8192, 640), dtype=torch.int8, generator=g)
    lhs = torch.randint(-127, 128, (4, 640), dtype=torch.int8, generator=g)
    ql = quantize(torch.randn(8192, 640, generator=g))
    x = torch.randn(3, 640, generator=g)
    vnni = int8_kernel.pack_vnni(w)
    outs = on_one_and_two_threads(lambda: (int8_kernel.int_mm(lhs, w), int8_kernel.qlinear(x, ql.q, ql.sums, ql.scale)
                                           if int8_kernel.qlinear_applies(x, ql.q) else None,
                                           int8_kernel.int_mm(lhs, vnni, vnni=True)))
    assert torch.equal(outs[0][0], exact(lhs, w)) and torch.equal(outs[1][0], exact(lhs, w))
    assert torch.equal(outs[0][2], exact(lhs, w)) and torch.equal(outs[1][2], exact(lhs, w))
    if outs[0][1] is not None:
        assert torch.equal(outs[0][1], outs[1][1])


def test_pack4_keeps_every_code_and_unpack4_undoes_it():
    g = torch.Generator().manual_seed(6)
    codes = torch.randint(0, 16, (48, 96), dtype=torch.uint8, generator=g)
    packed = int8_kernel.pack4(codes)
    assert packed.shape == (48, 48) and torch.equal(int8_kernel.unpack4(packed), codes)
    # the layout itself: row 17 (block 1, row 1), group 1, chunk 2 -> k = 32 + 16 + i and + 4
    b = packed.reshape(-1)[1 * 16 * 48 + 1 * 256 + 2 * 64 + 1 * 4:][:4]
    assert torch.equal(b & 0x0F, codes[17, 48:52]) and torch.equal(b >> 4, codes[17, 52:56])
    with pytest.raises(ValueError, match="multiple of 16"):
        int8_kernel.pack4(codes[:40])


@pytest.mark.parametrize("m", [1, 3, 4, 5, 9])
@pytest.mark.parametrize("n,k", [(48, 96), (256, 640)])
def test_q4linear_gives_the_bits_of_its_torch_twin(m, n, k, isa):
    """The kernel's int4 product equals int8_weights.int4_reference (the same integer sums and
    the same fp32 operations in the same order) to the bit, at the decode step's row counts
    (one, a group of four and its remainders), with negative, zero and tiny activation rows."""
    g = torch.Generator().manual_seed(7)
    q4 = quantize4(torch.randn(n, k, generator=g) * 0.05)
    x = torch.randn(m, k, generator=g)
    x[0, :7] = 0.0
    if m > 2:
        x[1] = 0.0
        x[2] *= 1e-30
    if isa == "none":  # no kernel here: the twin alone, against fp64 on the same levels
        assert not int8_kernel.q4linear_applies(x, n, k)
        lhs, step = quantize_activations(x)
        xh = (lhs[:m].double() * 127 + lhs[m:].double()) * step.double()
        assert torch.allclose(int4_reference(x, q4).double(), xh @ q4.dequantize().double().t(), rtol=1e-5, atol=1e-6)
        return
    got = int8_kernel.q4linear(x, q4.q, q4.sm, n)
    assert torch.equal(got, int4_reference(x, q4)), float((got - int4_reference(x, q4)).abs().max())
    assert torch.equal(int4_reference(x, q4, rows=16), int4_reference(x, q4))  # its row chunks change nothing


def test_q4linear_rows_depend_on_neither_the_batch_nor_the_threads(isa):
    g = torch.Generator().manual_seed(8)
    q4 = quantize4(torch.randn(8192, 640, generator=g) * 0.05)
    x = torch.randn(6, 640, generator=g)
    if isa == "none":  # nothing of the kernel's to compare here
        assert not int8_kernel.q4linear_applies(x, 8192, 640)
        return
    outs = on_one_and_two_threads(lambda: int8_kernel.q4linear(x, q4.q, q4.sm, 8192))
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(int8_kernel.q4linear(x[4:5].contiguous(), q4.q, q4.sm, 8192), outs[0][4:5])


def test_q4linear_takes_only_its_own_layout(isa):
    q4 = quantize4(torch.randn(32, 64))
    x = torch.randn(2, 64)
    if isa == "none":
        assert not int8_kernel.q4linear_applies(x, 32, 64)
        return
    assert int8_kernel.q4linear_applies(x, 32, 64) and not int8_kernel.q4linear_applies(x.double(), 32, 64)
    assert not int8_kernel.q4linear_applies(x, 40, 64)  # rows not in whole blocks of 16
    assert not int8_kernel.q4linear_applies(torch.randn(64, 4).t(), 32, 64)  # [4, 64], not contiguous
    assert not int8_kernel.q4linear_applies(torch.randn(2, 48), 32, 48)  # K not a multiple of 32
    with pytest.raises(ValueError, match="pack4 codes"):
        int8_kernel.q4linear(x, q4.q[:, :16].contiguous(), q4.sm, 32)
    with pytest.raises(ValueError, match="sm must be"):
        int8_kernel.q4linear(x, q4.q, q4.sm.float(), 32)


CHILD = textwrap.dedent("""
    import json, torch
    from tunix_rt.eval import int8_kernel as K
    g = torch.Generator().manual_seed(1)
    w = torch.randint(-127, 128, (100, 640), dtype=torch.int8, generator=g)
    a = torch.randint(-128, 128, (3, 640), dtype=torch.int8, generator=g)
    want = (a.double() @ w.double().t()).to(torch.int32)
    ok = torch.equal(K.int_mm(a, w), want) and torch.equal(K.int_mm(a, K.pack_vnni(w), vnni=True), want)
    print(json.dumps({"ok": ok, "kernel": K.library() is not None, "why": K.WHY}))
""")


def child(tmp_path, **env) -> dict:
    full = {**os.environ, "TUNIX_RT_KERNEL_DIR": str(tmp_path / "kernels"), **env}
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=full, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_without_a_compiler_or_with_the_switch_torch_multiplies(tmp_path):
    out = child(tmp_path, CC="false")
    assert out["ok"] and not out["kernel"] and ("no kernel" in out["why"][0] or "CPU" in out["why"][0])
    assert not (tmp_path / "kernels").exists() or not any((tmp_path / "kernels").glob("*.so"))
    out = child(tmp_path, TUNIX_RT_INT8_KERNEL="torch")
    assert out == {"ok": True, "kernel": False, "why": ["TUNIX_RT_INT8_KERNEL=torch"]}


def test_processes_building_at_once_both_load_the_kernel(tmp_path):
    """Two processes find no library and build it at the same moment: each compiles in its own
    temporary directory and renames; neither reads a half-written file."""
    full = {**os.environ, "TUNIX_RT_KERNEL_DIR": str(tmp_path / "kernels")}
    full.pop("TUNIX_RT_INT8_KERNEL", None)
    procs = [subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=full) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    kernel = decode_isas()[0] != "none"
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        got = json.loads(out.strip().splitlines()[-1])
        assert got["ok"] and got["kernel"] == kernel, got
    assert [p.name for p in (tmp_path / "kernels").iterdir() if not p.name.endswith(".so")] == []


def test_the_noise_bits_equal_numpys():
    """The sampling noise's hash through the kernel (`noise_bits`) gives the numpy path's bits:
    negative and extreme seeds, shared ([n]) and per-row ([r, n]) offsets, a column slice of a
    wider output (its row stride), odd widths; other operands are refused (False, nothing
    written). Where the kernel does not load, it always refuses and gumbel keeps numpy."""
    from tunix_rt.eval.sampling import GOLDEN, _bits_numpy

    g = torch.Generator().manual_seed(4)
    seed = torch.tensor([0, -1, 2**63 - 1, -(2**63), 12345, -987654321], dtype=torch.int64)
    shared = torch.randint(-(2**62), 2**62, (1003,), dtype=torch.int64, generator=g).mul_(3)
    per_row = (torch.arange(6 * 1003, dtype=torch.int64).view(6, 1003) + 1).mul_(GOLDEN)
    ok = ISA_FLAGS["avx512"] | {"avx512dq", "avx512cd"} <= cpu_flags() and int8_kernel.library() is not None
    for off in (shared, per_row):
        want = torch.empty((6, 1003), dtype=torch.int64)
        x, t = torch.empty_like(want), torch.empty_like(want)
        _bits_numpy(seed, off, want, x, t)
        wide = torch.full((6, 1100), 7, dtype=torch.int64)
        got = wide[:, 50:1053]
        assert int8_kernel.noise_bits(seed, off, got) == ok
        if ok:
            assert torch.equal(got, want)
            assert bool((wide[:, :50] == 7).all() and (wide[:, 1053:] == 7).all())  # only its columns
        else:
            assert bool((wide == 7).all())
    wide = torch.full((6, 1003), 7, dtype=torch.int64)
    assert not int8_kernel.noise_bits(seed.int(), shared, wide)  # int32 seeds
    assert not int8_kernel.noise_bits(seed, shared[::2][:502], wide[:, :502].t().contiguous().t())  # strided
    assert not int8_kernel.noise_bits(seed[:5], shared, wide)  # one seed short
    assert bool((wide == 7).all())


def _kernel_here() -> bool:
    """Whether the fp32 products loaded: they must on a CPU with AVX-512 (the int8 kernel's)
    or AVX2 with FMA, where the library builds; elsewhere f32_applies says no, and the
    decoders take torch's product."""
    if int8_kernel.f32_library() is None:
        assert int8_kernel.WHY and not int8_kernel.f32_applies(torch.zeros(1, 64), torch.zeros(16, 64))
        assert not ({"avx2", "fma"} <= cpu_flags() and int8_kernel.library() is not None)
        return False
    return True


def test_the_f32_products_load_on_avx2_too():
    """The fp32 products need no VNNI: on AVX2 with FMA (AMD's Zen 1-3) they load and take the
    AVX2 path; on a CPU with AVX-512 VNNI, the AVX-512 one."""
    if os.environ.get("TUNIX_RT_INT8_KERNEL") == "torch" or not {"avx2", "fma"} <= cpu_flags():
        return
    lib = int8_kernel.f32_library()
    assert lib is not None, int8_kernel.WHY
    assert lib.f32_path == (2 if ISA_FLAGS["avx512"] <= cpu_flags() else 1)


def _fma32(a, b, c):
    """fp32 a * b + c rounded once (a fused multiply-add), in numpy: the product is exact in
    fp64, the sum's fp64 rounding error is recovered (TwoSum), and where the fp64 sum falls on
    a midpoint between two fp32 values the error decides the side."""
    a, b, c = (np.asarray(v, dtype=np.float64) for v in (a, b, c))
    p = a * b
    s = p + c
    bb = s - p
    e = (p - (s - bb)) + (c - bb)
    r = s.astype(np.float32)
    r64 = r.astype(np.float64)
    up, dn = np.nextafter(r, np.float32(np.inf)), np.nextafter(r, np.float32(-np.inf))
    other = np.where(s > r64, up, dn).astype(np.float64)  # the fp32 value on s's other side
    tie = (s != r64) & ((s - r64) * 2 == other - r64) & (e != 0)
    lower, upper = np.where(s > r64, r, dn), np.where(s > r64, up, r)
    return np.where(tie, np.where(e > 0, upper, lower), r)


def _in_kernel_order(x, w, a=None, b=None, scale=1.0):
    """f32_linear's outputs, in numpy, in the order its source fixes: per output 16 lanes of
    fused multiply-adds along K (lane k mod 16, the tail's lanes zero), then the lanes summed
    as ((q0 + q1) + (q2 + q3)), q_j = (l[4j] + l[4j+2]) + (l[4j+1] + l[4j+3]); an adapter's
    t = sums(x, a) * scale, its sums(t, b) added to the base's."""
    def sums(x, w):
        (m, k), n = x.shape, w.shape[0]
        kp = -(-k // 16) * 16
        xp, wp = np.zeros((m, kp), np.float32), np.zeros((n, kp), np.float32)
        xp[:, :k], wp[:, :k] = x, w
        acc = np.zeros((m, n, 16), np.float32)
        for k0 in range(0, kp, 16):
            acc = _fma32(xp[:, None, k0: k0 + 16], wp[None, :, k0: k0 + 16], acc)
        q = [(acc[..., 4 * j] + acc[..., 4 * j + 2]) + (acc[..., 4 * j + 1] + acc[..., 4 * j + 3]) for j in range(4)]
        return (q[0] + q[1]) + (q[2] + q[3])

    x, w = x.numpy(), w.numpy()
    y = sums(x, w)
    if a is not None:
        y = y + sums(sums(x, a.numpy()) * np.float32(scale), b.numpy())
    return torch.from_numpy(y)


@pytest.mark.parametrize("n,k", [(37, 100), (33, 640), (20, 16), (5, 7)])
def test_f32_linear_has_the_bits_its_order_fixes(n, k):
    """The kernel's outputs equal, bit for bit, the same sums done in numpy in the order the
    source fixes: so its AVX-512 and AVX2 paths give the same bits (each is held to this), and
    an RL rollout decodes the same ids on either CPU."""
    if not _kernel_here():
        return
    g = torch.Generator().manual_seed(n * 31 + k)
    w = torch.randn(n, k, generator=g)
    for m in (1, 2, 3, 4, 5, 8):
        x = torch.randn(m, k, generator=g) * 3
        assert torch.equal(int8_kernel.f32_linear(x, w), _in_kernel_order(x, w)), (m, n, k)
        for r in (16, 3):
            a, b = torch.randn(r, k, generator=g) * 0.1, torch.randn(n, r, generator=g) * 0.1
            got = int8_kernel.f32_linear(x, w, a, b, 2.0)
            assert torch.equal(got, _in_kernel_order(x, w, a, b, 2.0)), (m, n, k, r)


def _f32_reference(x, w, a=None, b=None, scale=1.0):
    """x @ w.T (+ (x @ a.T) @ b.T * scale) in fp64, and a bound on fp32 rounding: a few ulps of
    the sum of the terms' magnitudes."""
    x64, w64 = x.double(), w.double()
    ref, mag = x64 @ w64.t(), x64.abs() @ w64.abs().t()
    if a is not None:
        t = x64 @ a.double().t()
        ref = ref + (t @ b.double().t()) * scale
        mag = mag + ((x64.abs() @ a.double().abs().t()) @ b.double().abs().t()) * abs(scale)
    return ref, mag * 4e-7 * 8 + 1e-30


@pytest.mark.parametrize("n,k", [(1024, 640), (256, 640), (640, 2048), (2051, 640), (37, 100), (16, 640)])
def test_f32_linear_matches_fp64_with_and_without_an_adapter(n, k):
    """Every row count a decode step has (1 to 8), the decoder's shapes and ragged ones (a tail
    of weight rows, K not a multiple of 16), with a LoRA adapter of rank 16 and of rank 3: within
    a few ulps of the fp64 product (the same sums as F.linear, in another order)."""
    if not _kernel_here():
        return
    g = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=g)
    for m in range(1, 9):
        x = torch.randn(m, k, generator=g)
        ref, tol = _f32_reference(x, w)
        assert ((int8_kernel.f32_linear(x, w).double() - ref).abs() <= tol).all(), (m, n, k)
        for r in (16, 3):
            a, b = torch.randn(r, k, generator=g) * 0.1, torch.randn(n, r, generator=g) * 0.1
            ref, tol = _f32_reference(x, w, a, b, 2.0)
            got = int8_kernel.f32_linear(x, w, a, b, 2.0).double()
            assert ((got - ref).abs() <= tol).all(), (m, n, k, r)


def test_f32_linear_rows_do_not_depend_on_the_batch_or_the_threads():
    """A row's outputs are the same bits whatever rows decode beside it (1 to 8 of them, each
    count its own blocking of the weight rows, the tail rows included) and on 1 or 2 threads."""
    if not _kernel_here():
        return
    g = torch.Generator().manual_seed(7)
    w, a, b = torch.randn(2051, 640, generator=g), torch.randn(16, 640, generator=g), torch.randn(2051, 16, generator=g)
    x = torch.randn(8, 640, generator=g)
    alone = [int8_kernel.f32_linear(x[i: i + 1].contiguous(), w, a, b, 0.5) for i in range(8)]
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for m in range(1, 9):
                out = int8_kernel.f32_linear(x[:m].contiguous(), w, a, b, 0.5)
                for i in range(m):
                    assert torch.equal(out[i], alone[i][0]), (threads, m, i)
    finally:
        torch.set_num_threads(before)


def test_f32_linear_takes_only_its_own_shapes():
    if not _kernel_here():
        return
    w = torch.zeros(32, 64)
    assert int8_kernel.f32_applies(torch.zeros(8, 64), w)
    assert not int8_kernel.f32_applies(torch.zeros(9, 64), w)  # more rows: torch's blocked matmul
    assert not int8_kernel.f32_applies(torch.zeros(0, 64), w)
    assert not int8_kernel.f32_applies(torch.zeros(2, 64, dtype=torch.float64), w.double())
    assert not int8_kernel.f32_applies(torch.zeros(64, 2).t(), w)  # not contiguous
    with pytest.raises(ValueError, match="f32_linear takes"):
        int8_kernel.f32_linear(torch.zeros(2, 63), w)
    with pytest.raises(ValueError, match="adapter factors"):
        int8_kernel.f32_linear(torch.zeros(2, 64), w, torch.zeros(4, 64), torch.zeros(31, 4))
    with pytest.raises(ValueError, match="both factors"):
        int8_kernel.f32_linear(torch.zeros(2, 64), w, torch.zeros(4, 64), None)
    x, out = torch.randn(3, 64), torch.full((3, 32), 7.0)
    assert int8_kernel.f32_linear(x, torch.randn(32, 64), out=out) is out and not (out == 7.0).any()
    for bad in (torch.zeros(3, 31), torch.zeros(3, 32, dtype=torch.float64), torch.zeros(32, 3).t()):
        with pytest.raises(ValueError, match="out must be"):
            int8_kernel.f32_linear(x, w, out=bad)


def test_f32_rows_are_the_columns_of_the_whole_product():
    """The screened head rescores a rollout's candidates with `f32_rows`: any subset of the
    head's rows, read in place, gives the bits of the whole product's columns, at every row count
    (the tail of the blocks and repeated ids included); ids out of range are refused."""
    if not _kernel_here():
        return
    g = torch.Generator().manual_seed(11)
    w = torch.randn(3000, 640, generator=g)
    ids = torch.cat([torch.randperm(3000, generator=g)[:1001], torch.tensor([5, 5, 2999, 0])])
    for m in range(1, 9):
        x = torch.randn(m, 640, generator=g) * 30  # a large hidden state: large logits
        assert torch.equal(int8_kernel.f32_rows(x, w, ids), int8_kernel.f32_linear(x, w)[:, ids]), m
    assert int8_kernel.f32_rows(x, w, ids[:0]).shape == (8, 0)
    with pytest.raises(ValueError, match="out of range"):
        int8_kernel.f32_rows(x, w, torch.tensor([3000]))


def test_the_noise_screen_on_the_screens_integers_is_the_same_on_one_and_two_threads():
    """noise_screen_comb shares the rows among the threads, each row's hits kept apart and
    joined in row order: the same positions in the same order and the same bits (the counter's,
    as sampling computes them) on 1 and 2 threads; past `cap` hits, None on both."""
    from tunix_rt.eval import sampling

    g = torch.Generator().manual_seed(8)
    r, groups, per = 5, 4, 1003
    comb = torch.randint(-5000, 5000, (r, groups, per), dtype=torch.int32, generator=g)
    step = torch.rand(r, groups, dtype=torch.float64, generator=g) * 1e-3 + 1e-3
    width = torch.rand(r, groups, dtype=torch.float64, generator=g)
    seeds = [sampling.row_seed(3, k, 1) for k in range(r)]
    off = sampling.offsets(torch.randperm(groups * per, generator=g))
    sc = (comb.double() * step[:, :, None] + width[:, :, None]).view(r, -1)
    thr = sc.amax(1) + 2.0  # a token needs a noise above ~2 + its gap to the row's top

    def screen(cap):
        bits = torch.zeros((r, groups * per), dtype=torch.int64)
        pos = int8_kernel.noise_screen_comb(sampling.seed_tensor(seeds), off, comb, step, width, 1.0, thr, bits, cap)
        return pos, bits

    lib = int8_kernel.library()
    if lib is None or not lib.noise_ok:
        assert screen(10_000)[0] is None
        return
    (p1, b1), (p2, b2) = on_one_and_two_threads(lambda: screen(10_000))
    assert p1 is not None and 0 < p1.numel() < r * groups * per and torch.equal(p1, p2)
    assert bool((p1[1:] > p1[:-1]).all()) and set((p1 // (groups * per)).tolist()) == set(range(r))
    assert torch.equal(b1, sampling.noise_bits_of(seeds, off)) and torch.equal(b1, b2)
    assert on_one_and_two_threads(lambda: screen(p1.numel() - 1)[0]) == [None, None]
    assert torch.equal(on_one_and_two_threads(lambda: screen(p1.numel())[0])[1], p1)


def test_the_levels_round_halves_to_even_as_torch_does(isa):
    """The activations' two int8 levels (vectorised in the kernel) at the values where a rounding
    mode shows: x / s exactly half-way between integers (s = 1: a row whose largest |x| is 127),
    and residuals half-way too; both products keep the torch path's bits on them, with a row of
    width 16·k + 0 and tails of the scalar path (K not a multiple of 16 never reaches the kernel)."""
    if isa == "none":  # nothing of the kernel's to compare here
        assert not int8_kernel.q4linear_applies(torch.zeros(1, 64), 16, 64)
        return
    k = 640
    x = torch.zeros(3, k)
    x[:, 0] = 127.0
    x[0, 1:k] = torch.arange(1, k) % 9 - 4.5  # ±0.5, ±1.5, ... : ties of the first level
    x[1, 1:k] = (torch.arange(1, k) % 7 - 3) + (torch.arange(1, k) % 2) * (0.5 / 127)  # ties of the second
    x[2, 1:k] = -x[0, 1:k]
    g = torch.Generator().manual_seed(3)
    ql = quantize(torch.randn(64, k, generator=g) * 0.05)
    assert torch.equal(int8_kernel.qlinear(x, ql.q, None, ql.scale), torch_path(x, ql))
    q4 = quantize4(torch.randn(64, k, generator=g) * 0.05)
    assert torch.equal(int8_kernel.q4linear(x, q4.q, q4.sm, 64), int4_reference(x, q4))


def test_argmax_gives_torchs_indices(isa):
    """The kernel's greedy pick equals torch.argmax's on a CPU: ties go to the first index, a NaN
    wins (the first NaN), -0.0 and +0.0 are equal, a row of -inf picks 0, rows of any width (the
    16-lane tail) and rows of a wider tensor (a stride); other tensors take torch's own."""
    g = torch.Generator().manual_seed(5)
    cases = [torch.randn(3, 262144, generator=g), torch.randn(1, 17, generator=g),
             torch.full((2, 33), -float("inf")), torch.zeros(1, 40), torch.randn(4, 600, generator=g)[:, :300]]
    t = torch.randn(2, 1000, generator=g)
    t[0, 5] = t[0, 700] = 9.0
    t[1, 999] = t[1, 3] = float("nan")
    cases.append(t)
    z = torch.zeros(2, 50)
    z[0, 3] = z[0, 10] = -0.0
    z[1, :20] = -0.0
    cases.append(z)
    t = torch.randn(1, 70, generator=g)
    t[0, 66] = float("nan")  # in the tail
    cases.append(t)
    cases.append(torch.randn(0, 8))
    for c in cases:
        assert torch.equal(int8_kernel.argmax(c), c.argmax(dim=-1)), c
    assert torch.equal(int8_kernel.argmax(cases[0].double()), cases[0].argmax(dim=-1))  # torch's path
    outs = on_one_and_two_threads(lambda: int8_kernel.argmax(cases[0]))
    assert torch.equal(outs[0], outs[1])
