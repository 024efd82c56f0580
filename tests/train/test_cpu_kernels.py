"""train.cpu_kernels: Gemma's RMSNorm and gelu_tanh(gate) * up, forward and backward, against
fp64 and against torch's ops; the same bits on 1 and 2 threads and in every build the library
holds (AVX-512, AVX2, baseline); layouts; the switch that turns it off."""

from __future__ import annotations

import subprocess

import pytest
import torch
import torch.nn.functional as F

from cpu_testlib import cpu_flags, on_one_and_two_threads
from tunix_rt.eval.int8_kernel import compiled
from tunix_rt.train import cpu_kernels as ck
from train_testlib import one_torch_thread  # noqa: E402,F401 (autouse fixture)


@pytest.fixture(autouse=True)
def _built():
    """Every test here needs the library: a broken build fails, never skips (cc is part of the
    machine the project builds on)."""
    assert ck.library() is not None, ck.WHY


def _gelu_mul64(gate, up):
    g = gate.double()
    return F.gelu(g, approximate="tanh") * up.double()


def _norm64(x, w1, eps):
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w1.double()


def _gates(n=3000):
    torch.manual_seed(0)
    gate = torch.randn(n) * 3
    gate[:12] = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-3, -1e-3, 8.0, -8.0, 20.0, -20.0, 100.0, -100.0])
    return gate.reshape(3, n // 3), torch.randn(3, n // 3)


def test_gelu_mul_forward_against_fp64_and_torch():
    gate, up = _gates()
    y = ck.gelu_tanh_mul(gate, up)
    ref = _gelu_mul64(gate, up)
    torch_err = (F.gelu(gate, approximate="tanh") * up - ref).abs().max()
    err = (y.double() - ref).abs()
    assert err.max() <= 2 * torch_err + 1e-7, (err.max(), torch_err)
    assert (err <= 4e-7 * ref.abs() + 1e-6).all()
    assert y[0, 0] == 0 and torch.isfinite(y).all()


@pytest.mark.parametrize("need", [(True, True), (True, False), (False, True), (False, False)])
def test_gelu_mul_backward_against_fp64(need):
    gate, up = _gates()
    grad = torch.randn_like(gate)
    g64, u64 = gate.double().requires_grad_(), up.double().requires_grad_()
    (_gelu_mul64(g64, u64) * grad.double()).sum().backward()
    dg, du = ck.gelu_tanh_mul_backward(grad, gate, up, *need)
    assert (dg is not None, du is not None) == need
    if dg is not None:
        torch_dg = torch.ops.aten.gelu_backward(grad * up, gate, approximate="tanh")
        bound = (torch_dg.double() - g64.grad).abs().max()
        assert (dg.double() - g64.grad).abs().max() <= 2 * bound + 1e-6
    if du is not None:
        torch.testing.assert_close(du.double(), u64.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(5, 640), (2, 3, 7), (130, 256), (1, 1)])
def test_rms_norm_forward_and_backward_against_fp64(shape):
    torch.manual_seed(1)
    x = torch.randn(shape) * 4
    w1 = 1 + torch.randn(shape[-1])
    grad = torch.randn(shape)
    y, rstd = ck.rms_norm(x, w1, 1e-6)
    x64, w64 = x.double().requires_grad_(), w1.double().requires_grad_()
    ref = _norm64(x64, w64, 1e-6)
    (ref * grad.double()).sum().backward()
    torch.testing.assert_close(y.double(), ref.detach(), rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(rstd.double(), torch.rsqrt(x.double().pow(2).mean(-1) + 1e-6).reshape(-1),
                               rtol=1e-6, atol=0)
    dx, dw = ck.rms_norm_backward(grad, x, w1, rstd, True, True)
    torch.testing.assert_close(dx.double(), x64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw.double(), w64.grad, rtol=1e-5, atol=1e-5)
    only_w = ck.rms_norm_backward(grad, x, w1, rstd, False, True)
    only_x = ck.rms_norm_backward(grad, x, w1, rstd, True, False)
    assert only_w[0] is None and torch.equal(only_w[1], dw)
    assert only_x[1] is None and torch.equal(only_x[0], dx)


def test_rms_norm_of_a_transposed_view_keeps_its_layout():
    """Gemma 3's q_norm reads q_proj's output viewed [B, T, H, D] and transposed to [B, H, T, D]:
    the rows are read where they lie, the output has the input's strides, and a gradient in
    another layout is taken as well."""
    torch.manual_seed(2)
    base = torch.randn(2, 5, 3, 16)
    x = base.transpose(1, 2)
    assert not x.is_contiguous() and ck.applies(x)
    w1 = 1 + torch.randn(16)
    y, rstd = ck.rms_norm(x, w1, 1e-6)
    assert y.stride() == x.stride()
    torch.testing.assert_close(y.double(), _norm64(x, w1, 1e-6), rtol=2e-6, atol=2e-6)
    grad = torch.randn(2, 3, 5, 16)  # contiguous: another layout than x's
    dx, _ = ck.rms_norm_backward(grad, x, w1, rstd, True, False)
    x64 = x.double().requires_grad_()
    (_norm64(x64, w1, 1e-6) * grad.double()).sum().backward()
    torch.testing.assert_close(dx.double(), x64.grad, rtol=1e-5, atol=1e-5)
    y2, _ = ck.rms_norm(x.contiguous(), w1, 1e-6)
    assert torch.equal(y, y2)  # a row's bits do not depend on where it lies


def test_what_the_library_does_not_take():
    x = torch.randn(4, 8)
    assert ck.applies(x, torch.randn(8))
    assert not ck.applies(x.double())
    assert not ck.applies(x, torch.randn(8, dtype=torch.float64))
    assert not ck.applies(x[:, ::2])  # rows not contiguous
    assert not ck.applies(x[::2])  # rows not dense
    assert not ck.applies(torch.randn(0, 8))
    assert not ck.applies(torch.randn(4, 8).expand(3, 4, 8))  # overlapping


def test_the_same_bits_on_one_and_two_threads():
    torch.manual_seed(3)
    x, w1 = torch.randn(300, 640), 1 + torch.randn(640)
    gate, up = torch.randn(70000), torch.randn(70000)  # more than one block of each kind
    grad = torch.randn(300, 640)

    def run():
        y, rstd = ck.rms_norm(x, w1, 1e-6)
        dx, dw = ck.rms_norm_backward(grad, x, w1, rstd, True, True)
        return [y, rstd, dx, dw, ck.gelu_tanh_mul(gate, up), *ck.gelu_tanh_mul_backward(up, gate, up, True, True)]

    for a, b in zip(*on_one_and_two_threads(run)):
        assert torch.equal(a, b)


def _build(clones: str):
    """The library's source built with one target instead of the three clones."""
    return compiled(f"cpu_ops_{clones or 'base'}".replace(",", "_"), ck.SOURCE,
                    ["cc", *ck.FLAGS, f"-DCLONES=__attribute__((target(\"{clones}\")))" if clones else "-DCLONES="])


def test_every_build_gives_the_same_bits():
    """The AVX-512, AVX2 and baseline builds (one of them what the CPU runs) compute the same
    bits: no sum depends on the vector width."""
    import ctypes

    torch.manual_seed(4)
    x, w1 = torch.randn(70, 200), 1 + torch.randn(200)
    gate, up, grad = torch.randn(40000) * 3, torch.randn(40000), torch.randn(40000)
    gx = torch.randn(70, 200)
    p = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731

    def run(lib):
        y, rstd, dx, dw, part = (torch.empty(70, 200), torch.empty(70), torch.empty(70, 200), torch.empty(200),
                                 torch.empty(2, 200))
        lib.tunix_rms_norm(p(x), p(w1), p(y), p(rstd), ctypes.c_long(70), ctypes.c_long(200), ctypes.c_float(1e-6))
        lib.tunix_rms_norm_back(p(gx), p(x), p(w1), p(rstd), p(dx), p(dw), p(part), ctypes.c_long(70),
                                ctypes.c_long(200))
        a, b, c = torch.empty(40000), torch.empty(40000), torch.empty(40000)
        lib.tunix_gelu_mul(p(gate), p(up), p(a), ctypes.c_long(40000))
        lib.tunix_gelu_mul_back(p(grad), p(gate), p(up), p(b), p(c), ctypes.c_long(40000))
        return [y, rstd, dx, dw, a, b, c]

    flags = cpu_flags()
    targets = [""] + (["avx2"] if "avx2" in flags else []) + (["avx512f"] if "avx512f" in flags else [])
    ref = run(ck.library())
    for t in targets:
        for a, b in zip(ref, run(_build(t))):
            assert torch.equal(a, b), t


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv(ck.ENV, "torch")
    assert ck.library() is None and not ck.applies(torch.randn(2, 8))
    monkeypatch.setenv(ck.ENV, "fast")
    with pytest.raises(ValueError, match="TUNIX_RT_CPU_KERNELS='fast': expected one of c, torch"):
        ck.library()


def test_without_a_compiler_it_says_why(tmp_path):
    """A machine without a C compiler trains on torch's ops and says why (a fresh process: the
    library is loaded once per process)."""
    import os
    import sys

    code = ("from tunix_rt.train import cpu_kernels as ck, fused_mlp as fm; import torch;"
            "g = torch.randn(3, 8); u = torch.randn(3, 8);"
            "assert torch.equal(fm.gelu_tanh_mul(g, u), torch.nn.functional.gelu(g, approximate='tanh') * u);"
            "print(ck.library() is None, ck.WHY[0].split(':')[0])")
    env = {**os.environ, "CC": str(tmp_path / "no-cc"), "TUNIX_RT_KERNEL_DIR": str(tmp_path / "k")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True no library"
