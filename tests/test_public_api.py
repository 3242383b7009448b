"""Every public name is exported, importable and documented."""

from __future__ import annotations

import importlib
import inspect

import pytest

PACKAGES = [
    "atomr_accel",
    "atomr_accel._native",
    "atomr_accel.actor",
    "atomr_accel.actor.testkit",
    "atomr_accel.agents",
    "atomr_accel.blueprint",
    "atomr_accel.blaslt",
    "atomr_accel.cli",
    "atomr_accel.collective",
    "atomr_accel.core",
    "atomr_accel.cub",
    "atomr_accel.device",
    "atomr_accel.facade",
    "atomr_accel.hosts",
    "atomr_accel.realtime",
    "atomr_accel.streams",
    "atomr_accel.telemetry",
    "atomr_accel.train",
    "atomr_accel.errors",
    "atomr_accel.original",
    "atomr_accel.patterns",
    "atomr_accel.blas",
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


def public_members(obj: object) -> list[tuple[str, object]]:
    return [
        (name, member)
        for name, member in inspect.getmembers(obj)
        if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))
    ]


@pytest.mark.parametrize("package", PACKAGES)
def test_exports_exist_and_are_documented(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__doc__, f"{package} has no docstring"
    exported = module.__all__
    assert len(exported) == len(set(exported))
    for name in exported:
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"{package}.{name} has no docstring"
        if inspect.isclass(obj):
            for member_name, member in public_members(obj):
                assert inspect.getdoc(member), f"{package}.{name}.{member_name} has no docstring"
