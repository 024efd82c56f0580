"""One device vocabulary (tunix_rt.devices): the names a config and every --device flag
accept, and what each means per engine; the engines, eval and the config use it."""

from __future__ import annotations

import pytest
import torch

from tunix_rt import devices, jax_devices
from tunix_rt.errors import BadInput
from tunix_rt.eval import runner
from tunix_rt.models import hf
from tunix_rt.train import engines
from tunix_rt.train import torch_engine as te
from tunix_rt.train.config import TrainConfig


def test_every_place_speaks_the_one_vocabulary():
    assert devices.NAMES == ("auto", "cpu", "cuda", "gpu", "tpu")
    assert engines.DEVICES == devices.NAMES and engines.JAX_ONLY_DEVICES == devices.JAX_ONLY
    assert jax_devices.PLATFORMS == devices.JAX_PLATFORM and set(devices.JAX_PLATFORM) == set(devices.NAMES)
    assert hf.DEVICES == devices.TORCH
    assert set(devices.TORCH) | set(devices.JAX_ONLY) | {"auto"} == set(devices.NAMES)
    assert devices.HELP == "auto | cpu | cuda (torch) | gpu | tpu (jax)"
    for name in devices.NAMES:
        assert TrainConfig(dataset="x", device=name).device == name
    with pytest.raises(BadInput, match=r"config: device must be one of auto\|cpu\|cuda\|gpu\|tpu, got 'mps'"):
        TrainConfig(dataset="x", device="mps")


def test_one_resolution_per_engine():
    assert runner.resolve_device is devices.resolve_device  # the eval runner's is this one
    here = "cuda" if torch.cuda.is_available() else "cpu"
    assert devices.resolve_device("torch", "auto") == here
    assert devices.resolve_device("jax", "tpu") == "tpu" and devices.resolve_device("torch", "cpu") == "cpu"
    assert devices.torch_device("cpu") == torch.device("cpu")
    assert devices.torch_device("auto").type == here
    for name in devices.JAX_ONLY:
        with pytest.raises(BadInput, match=rf"device '{name}' is a JAX device name; the torch engine runs on "
                                           r"cpu or cuda \(available here: cpu"):
            devices.torch_device(name)
    if not torch.cuda.is_available():
        with pytest.raises(BadInput, match=r"device 'cuda' was asked.*available here: cpu$"):
            devices.torch_device("cuda")


def test_the_torch_engine_resolves_through_it():
    engine = te.TorchEngine(TrainConfig(dataset="x", device="cpu"))
    engine.devices()
    assert engine.device == devices.torch_device("cpu")
    with pytest.raises(BadInput, match="JAX device name"):
        te.TorchEngine(TrainConfig(dataset="x", device="gpu")).devices()
