"""Backends by name: their capabilities, asked without importing them, and their classes."""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys

import pytest

from atomr_accel import DeviceUnavailable, InvalidArgument, System
from atomr_accel.backends import BACKENDS, backend_class, capabilities
from atomr_accel.device import DeviceConfig


def importable(name: str) -> bool:
    return name != "cuda" or importlib.util.find_spec("cupy") is not None


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_each_backend_class_matches_its_declared_capabilities(name: str) -> None:
    if not importable(name):
        pytest.skip("the CUDA backend needs CuPy")
    cls = backend_class(name)
    caps = capabilities(name)
    assert cls.name == name
    assert ("completion" in inspect.signature(cls).parameters) == caps.completion_strategies
    assert cls.xp.__name__ == caps.array_module


def test_an_unknown_backend_is_typed() -> None:
    with pytest.raises(DeviceUnavailable, match="unknown backend 'tpu'"):
        capabilities("tpu")
    with pytest.raises(DeviceUnavailable, match="unknown backend 'tpu'"):
        backend_class("tpu")
    with System.open("t") as system, pytest.raises(InvalidArgument, match="backend must be"):
        system.spawn_device(backend="tpu")


def test_asking_capabilities_imports_no_backend() -> None:
    code = ("import sys; from atomr_accel.backends import capabilities; "
            "assert capabilities('cuda').needs_gpu and not capabilities('cpu').needs_gpu; "
            "print(sorted(m for m in sys.modules if m.startswith('atomr_accel.backends.c')"
            " or m == 'cupy'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_a_device_config_answers_its_backend_capabilities() -> None:
    assert DeviceConfig(backend="cpu").capabilities == capabilities("cpu")
    with pytest.raises(InvalidArgument, match="completion strategies"):
        DeviceConfig(backend="cpu", completion="spin")
