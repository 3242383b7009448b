"""The catalogue of libraries: what derives from it, and a library declared in a test.

A library is declared once, in its op module; the list of libraries, the kernel
actors, the handles' method sets and ``Device`` accessors derive from it, and a
backend's handlers register where they are written. So a toy library declared
here (one op, one CPU handler, nothing added to a shared list) runs end to end
on the CPU backend through a ``Device``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest

from atomr_accel import InvalidArgument, System
from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cpu
from atomr_accel.core._catalogue import catalogue, declare, library
from atomr_accel.core._op import Op, require
from atomr_accel.core._ref import GpuRef
from atomr_accel.device import ALL_LIBRARIES, KERNEL_ACTORS, BlasActor
from atomr_accel.facade import Device

TOY = declare("toy", "Toy", "A library of one op, declared by a test.", rank=10_000)


@dataclass(frozen=True, slots=True)
class Double(Op):
    """Double every element of ``x`` in place."""

    library: ClassVar[str] = TOY
    outputs: ClassVar[tuple[str, ...]] = ("x",)
    x: GpuRef

    def validate(self) -> None:
        require(isinstance(self.x, GpuRef), f"x must be a buffer, got {self.x!r}")


@cpu.handles(Double)
def double(backend: ArrayBackend, op: Double) -> None:
    """Double ``x`` on the CPU backend."""
    backend.array(op.x.buffer_id)[:] *= 2


@pytest.fixture(scope="module")
def system() -> Iterator[Any]:
    with System.open("catalogue") as system:
        yield system


def test_the_library_list_is_the_catalogue_in_rank_order() -> None:
    declared = [info.name for info in catalogue() if info.name != TOY]
    assert list(ALL_LIBRARIES) == declared
    ranks = [info.rank for info in catalogue()]
    assert ranks == sorted(ranks)
    assert KERNEL_ACTORS["blas"] is BlasActor
    assert BlasActor.library == "blas" and BlasActor.__doc__ == library("blas").summary


def test_each_library_with_a_handle_has_an_accessor() -> None:
    for info in catalogue():
        if info.handle is not None:
            accessor = getattr(Device, info.name)
            assert accessor.__doc__, info.name


def test_a_name_or_rank_is_declared_once() -> None:
    with pytest.raises(InvalidArgument, match="declared twice"):
        declare("blas", "Blas", "another summary", rank=1)
    with pytest.raises(InvalidArgument, match="rank 1"):
        declare("toy2", "Toy2", "a second toy", rank=1)
    with pytest.raises(InvalidArgument, match="unknown library 'nope'"):
        library("nope")


def test_a_library_declared_here_runs_on_a_device(system: Any) -> None:
    dev = system.spawn_device(mock=True, libraries=(*ALL_LIBRARIES, TOY))
    buf = dev.allocate(4, "f32")
    dev.copy_from_numpy(buf, np.arange(4, dtype=np.float32))
    dev.run(Double(buf.ref))
    assert dev.copy_to_numpy(buf).tolist() == [0.0, 2.0, 4.0, 6.0]
    dev.free(buf)


def test_a_device_without_the_library_refuses_its_op(system: Any) -> None:
    dev = system.spawn_device(mock=True)
    buf = dev.allocate(4, "f32")
    with pytest.raises(InvalidArgument, match="toy"):
        dev.run(Double(buf.ref))
    dev.free(buf)
