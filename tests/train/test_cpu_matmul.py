"""train.cpu_matmul: oneDNN's fp32 products for training on the CPU, chosen once per process.

Each test forces the library it checks (TUNIX_RT_CPU_MATMUL), so both paths run on every
machine; oneDNN ships in torch's CPU build here."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tunix_rt.train import cpu_matmul


@pytest.fixture
def lib(monkeypatch):
    """Force a library for the test: lib("onednn") or lib("mkl"); the choice is re-read."""
    def use(name: str) -> None:
        monkeypatch.setenv(cpu_matmul.ENV, name)
        cpu_matmul.backend.cache_clear()

    yield use
    cpu_matmul.backend.cache_clear()


def close(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """fp32 against an fp64 reference: within 1e-5 of the reference's largest magnitude."""
    err, scale = (got.double() - want.double()).abs().max().item(), max(1.0, want.abs().max().item())
    assert got.shape == want.shape and err <= 1e-5 * scale, (what, err, scale)


def fp32_bound(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A bound on an fp32 product's rounding error, elementwise: K·eps·(|a| @ |b|)."""
    return a.shape[-1] * torch.finfo(torch.float32).eps * (a.abs().double() @ b.abs().double())


def test_the_choice_is_read_once_and_a_bad_value_is_refused(lib, monkeypatch):
    lib("mkl")
    assert cpu_matmul.backend() == "mkl"
    monkeypatch.setenv(cpu_matmul.ENV, "onednn")
    assert cpu_matmul.backend() == "mkl"  # cached: the whole process keeps its first choice
    lib("onednn")
    assert cpu_matmul.backend() == "onednn"
    lib("auto")
    auto = cpu_matmul.backend()
    amd = cpu_matmul._cpu_vendor() == "AuthenticAMD"
    assert auto == ("onednn" if amd and torch.backends.cpu.get_cpu_capability() == "AVX512" else "mkl")
    lib("blas")
    with pytest.raises(ValueError, match="TUNIX_RT_CPU_MATMUL='blas': expected one of auto, onednn, mkl"):
        cpu_matmul.backend()


def test_onednn_products_are_fp32_sums(lib):
    """Against fp64, within fp32's rounding (no bf16 or tf32 step inside: bf16 would miss the
    bound by ~1000x), for both operand layouts the head uses (W and its transposed view)."""
    lib("onednn")
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(37, 640, generator=g), torch.randn(300, 640, generator=g)
    for x, b in ((a, w.t()), (torch.randn(37, 300, generator=g), w)):  # b [K, N]: a transposed view, then plain
        got = cpu_matmul.mm(x, b)
        want = x.double() @ b.double()
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert ((got.double() - want).abs() <= fp32_bound(x, b)).all()
    bf16 = (a.bfloat16() @ w.t().bfloat16()).double()
    assert ((bf16 - a.double() @ w.t().double()).abs() > fp32_bound(a, w.t())).any()  # the bound can fail


def test_mm_falls_back_where_onednn_does_not_apply(lib):
    lib("onednn")
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    assert cpu_matmul.applies(a, b)
    for x, y in ((a.double(), b.double()), (a.bfloat16(), b.bfloat16())):
        assert not cpu_matmul.applies(x, y)
        assert torch.equal(cpu_matmul.mm(x, y), x @ y)
    lib("mkl")
    assert not cpu_matmul.applies(a, b)
    assert torch.equal(cpu_matmul.mm(a, b), a @ b)


@pytest.mark.parametrize("shape", [(5, 24), (2, 7, 24)])
@pytest.mark.parametrize("trains", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_values_and_gradients_equal_f_linear(lib, shape, trains, bias):
    """_Linear forward and backward against F.linear's autograd in fp64 (inputs 2-D and 3-D,
    frozen and trained weights, with and without a bias, a non-contiguous incoming gradient)."""
    lib("onednn")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, generator=g, requires_grad=True)
    w = torch.randn(40, 24, generator=g).requires_grad_(trains)
    b = torch.randn(40, generator=g).requires_grad_(trains) if bias else None
    y = cpu_matmul.linear(x, w, b)
    assert y.grad_fn is not None and type(y.grad_fn).__name__ == "_LinearBackward"
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_(trains)
    bd = b.detach().double().requires_grad_(trains) if bias else None
    yd = torch.nn.functional.linear(xd, wd, bd)
    close(y, yd)
    up = torch.randn(*shape[:-1], 80, generator=g)[..., ::2]  # a strided incoming gradient
    y.backward(up)
    yd.backward(up.double())
    close(x.grad, xd.grad)
    if trains:
        close(w.grad, wd.grad)
        if bias:
            close(b.grad, bd.grad)
    else:
        assert w.grad is None


def test_a_frozen_layer_keeps_only_its_weight_for_backward(lib):
    """The input is kept only where the weight trains (as autograd's own mm does)."""
    lib("onednn")
    x = torch.randn(6, 24, requires_grad=True)
    frozen = cpu_matmul.linear(x, torch.randn(40, 24))
    assert frozen.grad_fn.saved_tensors[0] is None
    trained = cpu_matmul.linear(x, torch.randn(40, 24, requires_grad=True))
    assert trained.grad_fn.saved_tensors[0] is not None


def test_route_linears_changes_fp32_cpu_layers_only_under_onednn(lib):
    model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.GELU(), nn.Linear(16, 4), nn.Linear(4, 4).double())
    lib("mkl")
    assert cpu_matmul.route_linears(model) == 0
    lib("onednn")
    assert cpu_matmul.route_linears(model) == 2  # the fp64 layer keeps its own forward
    x = torch.randn(3, 8)
    y = model[:3](x)
    assert type(y.grad_fn).__name__ == "_LinearBackward"
    torch.testing.assert_close(y, torch.nn.functional.linear(
        torch.nn.functional.gelu(torch.nn.functional.linear(x, model[0].weight)), model[2].weight, model[2].bias))


def _batch() -> dict[str, torch.Tensor]:
    """Two rows of 24 tokens for a tiny model, the first 8 of each unlabelled."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 200, (2, 24), generator=g)
    labels = ids.clone()
    labels[:, :8] = -100
    return {"input_ids": ids, "labels": labels, "position_ids": torch.arange(24).expand(2, 24),
            "coef": torch.ones(2, 24)}


def test_a_lora_training_step_on_either_library_agrees(lib, tmp_path):
    """The torch engine's model (tiny Gemma 3 with PEFT LoRA, train.recompute's hooks, the fused
    loss) through oneDNN and through MKL: losses and LoRA gradients equal to float rounding, and
    oneDNN's products really ran (its backward nodes in the graph)."""
    from tunix_rt.models.catalog import get_preset
    from tunix_rt.models.tiny import build_tiny
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.loss import ObjectiveModule
    from tunix_rt.train.torch_engine import attention_of, load_model

    model_dir = build_tiny(get_preset("tiny-gemma3"), tmp_path / "tiny")
    cfg = TrainConfig(model=str(model_dir), dataset="x", finetune="lora", lora_rank=4, lora_alpha=8,
                      batch_size=2, max_seq_len=32, dtype="fp32", device="cpu", engine="torch")
    batch = _batch()
    out = {}
    for name in ("mkl", "onednn"):
        lib(name)
        attn = attention_of(model_dir)
        model = load_model(cfg, model_dir, torch.device("cpu"), attn)
        loss, _ = ObjectiveModule(model, attn=attn)(batch)
        nodes, stack = set(), [loss.grad_fn]
        while stack:
            fn = stack.pop()
            if fn is not None and fn not in nodes:
                nodes.add(fn)
                stack.extend(f for f, _ in fn.next_functions)
        routed = sum(type(f).__name__ in ("_LinearBackward", "_LoraLinearBackward") for f in nodes)
        assert (routed > 0) == (name == "onednn")
        loss.backward()
        out[name] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    torch.testing.assert_close(out["onednn"][0], out["mkl"][0], rtol=1e-5, atol=1e-6)
    assert out["onednn"][1].keys() == out["mkl"][1].keys() and len(out["mkl"][1]) > 0
    for n, gm in out["mkl"][1].items():
        torch.testing.assert_close(out["onednn"][1][n], gm, rtol=1e-4, atol=1e-6, msg=n)


def _lora_block(alpha: int, dropout: float = 0.0):
    """One PEFT LoRA layer (r 4) on a [40, 24] projection, B random (PEFT starts it at zero)."""
    from peft import LoraConfig, inject_adapter_in_model

    torch.manual_seed(5)
    model = nn.Sequential()
    model.add_module("proj", nn.Linear(24, 40, bias=False))
    model = inject_adapter_in_model(LoraConfig(r=4, lora_alpha=alpha, lora_dropout=dropout,
                                               target_modules=["proj"]), model)
    model.proj.base_layer.weight.requires_grad_(False)
    with torch.no_grad():
        model.proj.lora_B["default"].weight.normal_()
    return model


@pytest.mark.parametrize("alpha", [8, 6])  # scaling 2 (a power of two) and 1.5
def test_a_plain_lora_layer_is_one_fused_op_with_peft_values_and_gradients(lib, alpha):
    import copy

    lib("onednn")
    model = _lora_block(alpha)
    ref = copy.deepcopy(model).double()  # PEFT's own forward, in fp64
    assert cpu_matmul.route_linears(model) == 4  # the LoRA layer, its base and its two factors
    x = torch.randn(3, 5, 24, requires_grad=True)
    y = model(x)
    assert type(y.grad_fn).__name__ == "_LoraLinearBackward"
    xd = x.detach().double().requires_grad_()
    yd = ref(xd)
    close(y, yd)
    up = torch.randn(3, 5, 40)
    y.backward(up)
    yd.backward(up.double())
    close(x.grad, xd.grad)
    for name in ("lora_A", "lora_B"):
        got = getattr(model.proj, name)["default"].weight.grad
        want = getattr(ref.proj, name)["default"].weight.grad
        close(got, want, name)
    assert model.proj.base_layer.weight.grad is None


def test_a_lora_layer_with_dropout_in_training_keeps_peft_forward(lib):
    """Dropout in effect (training) is PEFT's own forward (through the routed factors); in eval
    mode the same layer fuses; merged or disabled adapters are the base layer alone."""
    lib("onednn")
    model = _lora_block(8, dropout=0.1)
    cpu_matmul.route_linears(model)
    x = torch.randn(6, 24, requires_grad=True)
    model.train()
    assert type(model(x).grad_fn).__name__ != "_LoraLinearBackward"
    model.eval()
    fused = model(x)
    assert type(fused.grad_fn).__name__ == "_LoraLinearBackward"
    with model.proj.disable_adapter() if hasattr(model.proj, "disable_adapter") else _disabled(model.proj):
        plain = model(x)
    assert type(plain.grad_fn).__name__ == "_LinearBackward"  # the routed base layer alone
    close(plain, x.double() @ model.proj.base_layer.weight.double().t())


class _disabled:
    def __init__(self, layer):
        self.layer = layer

    def __enter__(self):
        self.layer.enable_adapters(False)

    def __exit__(self, *exc):
        self.layer.enable_adapters(True)


def test_flop_counter_counts_onednn_products(lib):
    """FlopCounterMode counts both overloads (2·M·K·N; the add post-op is no product)."""
    from torch.utils.flop_counter import FlopCounterMode

    lib("onednn")
    x, w, other = torch.randn(2, 5, 24), torch.randn(40, 24), torch.randn(10, 40)
    with FlopCounterMode(display=False) as counter:
        cpu_matmul.linear(x, w)
        cpu_matmul._add_product(x.reshape(10, 24), w, other)
    assert counter.get_total_flops() == 2 * (2 * 10 * 24 * 40)


def test_a_routed_output_may_change_in_place_and_empty_inputs_fall_back(lib):
    """Callers may add into a routed layer's output, as into F.linear's (PEFT's adapter_names
    path does); an input with no rows goes to torch (oneDNN builds no product with an empty
    side), with zero gradients; `mm` under autograd is torch's (oneDNN's op has no gradient)."""
    lib("onednn")
    x = torch.randn(3, 24, requires_grad=True)
    w = torch.randn(40, 24, requires_grad=True)
    y = cpu_matmul.linear(x, w)
    y.add_(1.0)
    y.sum().backward()
    close(x.grad, torch.ones(3, 40, dtype=torch.float64) @ w.detach().double())
    close(w.grad, torch.ones(40, 3, dtype=torch.float64) @ x.detach().double())
    empty = torch.randn(0, 24, requires_grad=True)
    out = cpu_matmul.linear(empty, w)
    assert out.shape == (0, 40) and type(out.grad_fn).__name__ != "_LinearBackward"
    model = _lora_block(8)
    cpu_matmul.route_linears(model)
    assert model(torch.randn(2, 0, 24)).shape == (2, 0, 40)
    a = torch.randn(4, 24, requires_grad=True)
    prod = cpu_matmul.mm(a, w.detach().t())
    assert prod.grad_fn is not None  # recorded by autograd: torch's product
    prod.sum().backward()
    close(a.grad, torch.ones(4, 40, dtype=torch.float64) @ w.detach().double())
    assert cpu_matmul.mm(torch.randn(0, 24), w.detach().t()).shape == (0, 40)


def test_peft_mixed_adapter_batches_train_through_routed_layers(lib):
    """PEFT's adapter_names path (its own forward, adding into the base's output in place)
    through routed factors: values and gradients equal the unrouted layer's to rounding."""
    import copy

    lib("onednn")
    model = _lora_block(8)
    ref = copy.deepcopy(model)
    cpu_matmul.route_linears(model)
    x = torch.randn(2, 3, 24)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    ys = [m.proj(xi, adapter_names=["default", "default"]) for m, xi in zip((model, ref), xs)]
    up = torch.randn(2, 3, 40)
    for y in ys:
        y.backward(up)
    close(ys[0], ys[1].double())
    close(xs[0].grad, xs[1].grad.double())
    close(model.proj.lora_A["default"].weight.grad, ref.proj.lora_A["default"].weight.grad.double())


@pytest.mark.parametrize("name", ["onednn", "mkl"])
def test_a_full_runs_reference_equals_its_policy_at_step_0_to_the_bit(lib, name, tmp_path):
    """finetune=full's reference model (TorchEngine.reference_module) goes through the same
    library as the policy, so their log-probs at step 0 are equal to the bit."""
    from types import SimpleNamespace

    from tunix_rt.models.catalog import get_preset
    from tunix_rt.models.tiny import build_tiny
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.torch_engine import TorchEngine

    lib(name)
    model_dir = build_tiny(get_preset("tiny-gemma3"), tmp_path / "tiny")
    cfg = TrainConfig(model=str(model_dir), dataset="x", finetune="full", batch_size=2, max_seq_len=32,
                      dtype="fp32", device="cpu", engine="torch")
    engine = TorchEngine(cfg)
    engine.devices()
    engine.setup(model_dir, SimpleNamespace(pad_id=0))
    t = _batch()
    with torch.no_grad():
        engine.module.eval()
        policy = engine.module(t, logprobs=True)
        reference = engine.reference_module()(t, logprobs=True)
    assert torch.equal(policy, reference)
