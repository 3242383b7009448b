"""Every public name reports a public module that exports it (``__module__``), and
pickles by that name."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pickle
import typing
from types import FunctionType

import pytest

import atomr_accel
from atomr_accel import Blas, GpuRef, errors
from atomr_accel._public import is_public

PUBLIC = [
    "atomr_accel",
    "atomr_accel.errors",
    "atomr_accel.actor",
    "atomr_accel.actor.testkit",
    "atomr_accel.agents",
    "atomr_accel.cli",
    "atomr_accel.core",
    "atomr_accel.device",
    "atomr_accel.facade",
    "atomr_accel.hosts",
    "atomr_accel.patterns",
    "atomr_accel.realtime",
    "atomr_accel.streams",
    "atomr_accel.telemetry",
    "atomr_accel.train",
    "atomr_accel.original",
    "atomr_accel._native",
    "atomr_accel.blas",
    "atomr_accel.blaslt",
    "atomr_accel.collective",
    "atomr_accel.cub",
    "atomr_accel.cudnn",
    "atomr_accel.cutlass",
    "atomr_accel.fft",
    "atomr_accel.graph",
    "atomr_accel.memory",
    "atomr_accel.nvrtc",
    "atomr_accel.rng",
    "atomr_accel.solver",
    "atomr_accel.system",
]


def _exported(package: str) -> list[tuple[str, type | FunctionType]]:
    module = importlib.import_module(package)
    return [(name, obj) for name in module.__all__
            if isinstance(obj := getattr(module, name), type | FunctionType)
            and obj.__module__.startswith("atomr_accel")]


def _home_exports(obj: type | FunctionType) -> bool:
    home = importlib.import_module(obj.__module__)
    return obj.__name__ in getattr(home, "__all__", ()) and getattr(home, obj.__name__) is obj


@pytest.mark.parametrize("package", PUBLIC)
def test_every_exported_name_reports_a_public_module_that_exports_it(package: str) -> None:
    for name, obj in _exported(package):
        assert is_public(obj.__module__), f"{package}.{name} reports {obj.__module__}"
        assert _home_exports(obj), f"{obj.__module__} does not export {package}.{name}"


@pytest.mark.parametrize("package", PUBLIC)
def test_every_exported_name_pickles_by_reference(package: str) -> None:
    for _, obj in _exported(package):
        assert pickle.loads(pickle.dumps(obj)) is obj


@pytest.mark.parametrize("package", PUBLIC)
def test_methods_of_exported_classes_report_a_public_module(package: str) -> None:
    for name, obj in _exported(package):
        if not isinstance(obj, type):
            continue
        for member_name, member in inspect.getmembers(obj, inspect.isfunction):
            # the methods a user calls, written in a class (not a helper shared by several)
            if (not member_name.startswith("_") and "." in member.__qualname__
                    and member.__module__.startswith("atomr_accel")):
                assert is_public(member.__module__), \
                    f"{package}.{name}.{member_name} reports {member.__module__}"


def test_generated_methods_read_as_the_handles_own() -> None:
    for method in (Blas.gemm_f32, Blas.gemm_f32_async):
        assert method.__module__ == "atomr_accel"
        assert method.__qualname__ == f"Blas.{method.__name__}"
    assert repr(Blas) == "<class 'atomr_accel.Blas'>"


def test_exported_classes_and_their_subclasses_keep_their_type_hints() -> None:
    from atomr_accel.core.ops._memory import MemoryInfo  # an op: a subclass of core.Op

    typing.get_type_hints(MemoryInfo)
    for package in PUBLIC:
        for _, obj in _exported(package):
            if dataclasses.is_dataclass(obj) or (isinstance(obj, type) and obj.__module__ in (
                    "atomr_accel.core", "atomr_accel.device")):
                typing.get_type_hints(obj)


def test_public_objects_pickle_by_their_public_names() -> None:
    from atomr_accel.core.ops._blas import Axpy
    from atomr_accel.cub import ReduceKind

    ref = GpuRef(device_id=0, generation=1, buffer_id=7, length=16, dtype=atomr_accel.DType.F32)
    op = Axpy(alpha=2.0, x=ref, y=dataclasses.replace(ref, buffer_id=8), n=16)
    for value in (ref, op, ReduceKind.SUM, atomr_accel.DType.F64,
                  errors.OutOfMemory("no room", requested=1, available=0)):
        data = pickle.dumps(value)
        copy = pickle.loads(data)
        assert type(copy) is type(value)
        assert copy == value or (isinstance(value, Exception) and vars(copy) == vars(value))
    assert b"atomr_accel.core._ref" not in pickle.dumps(ref)
