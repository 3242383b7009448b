"""The original's ``KernelArg``: a kernel argument whose C type is fixed when it is made.

``NvrtcKernel.launch(grid, block, [KernelArg, ...])`` takes a list of them: a
buffer of a checked dtype passes its device pointer, a scalar passes its value
with the exact width of its NumPy type (``scalar_i32`` an ``int``, ``usize`` a
``size_t``). Values out of the type's range are refused when the argument is
made (``InvalidArgument``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import is_int
from atomr_accel.core.ops._tensor_map import TensorMap
from atomr_accel.facade._buffers import GpuBuffer

__all__ = ["KernelArg", "launch_values"]


def _buffer(tag: str, dtype: DType, buf: object) -> KernelArg:
    if not isinstance(buf, GpuBuffer) or buf.dtype is not dtype:
        raise InvalidArgument(f"KernelArg.{tag} takes a buffer of {dtype.value}, got {buf!r}")
    return KernelArg(tag, buf)


def _integer(tag: str, kind: type[np.integer[Any]], value: object) -> KernelArg:
    info = np.iinfo(kind)
    if not is_int(value) or not info.min <= int(value) <= info.max:
        raise InvalidArgument(f"KernelArg.{tag} takes an int in [{info.min}, {info.max}], "
                              f"got {value!r}")
    return KernelArg(tag, kind(int(value)))


def _real(tag: str, kind: type[np.floating[Any]], value: object) -> KernelArg:
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer
                                                              | np.floating):
        raise InvalidArgument(f"KernelArg.{tag} takes a real number, got {value!r}")
    largest = float(np.finfo(kind).max)
    if isinstance(value, float | np.floating):  # infinities and NaN pass as they are
        fits = not np.isfinite(value) or abs(float(value)) <= largest
    else:
        fits = abs(int(value)) <= largest  # int against float compares exactly
    if not fits:
        raise InvalidArgument(f"KernelArg.{tag}: {value!r} is out of range (|x| <= {largest})")
    return KernelArg(tag, kind(value))


class KernelArg:
    """One typed kernel argument; make it with a static constructor.

    ``value`` is the buffer, or the scalar as a NumPy scalar of the exact C
    width; ``tag`` names the constructor (``"scalar_f32"``).
    """

    __slots__ = ("tag", "value")

    def __init__(self, tag: str, value: GpuBuffer | np.generic | TensorMap) -> None:
        self.tag = tag
        self.value = value

    @staticmethod
    def buffer_f32(buf: GpuBuffer) -> KernelArg:
        """A float32 buffer, passed as ``float*``."""
        return _buffer("buffer_f32", DType.F32, buf)

    @staticmethod
    def buffer_f64(buf: GpuBuffer) -> KernelArg:
        """A float64 buffer, passed as ``double*``."""
        return _buffer("buffer_f64", DType.F64, buf)

    @staticmethod
    def buffer_i32(buf: GpuBuffer) -> KernelArg:
        """An int32 buffer, passed as ``int*``."""
        return _buffer("buffer_i32", DType.I32, buf)

    @staticmethod
    def buffer_u32(buf: GpuBuffer) -> KernelArg:
        """A uint32 buffer, passed as ``unsigned int*``."""
        return _buffer("buffer_u32", DType.U32, buf)

    @staticmethod
    def buffer_u8(buf: GpuBuffer) -> KernelArg:
        """A uint8 buffer, passed as ``unsigned char*``."""
        return _buffer("buffer_u8", DType.U8, buf)

    @staticmethod
    def scalar_i32(v: int) -> KernelArg:
        """An ``int`` (32 bits)."""
        return _integer("scalar_i32", np.int32, v)

    @staticmethod
    def scalar_i64(v: int) -> KernelArg:
        """A ``long long`` (64 bits)."""
        return _integer("scalar_i64", np.int64, v)

    @staticmethod
    def scalar_u32(v: int) -> KernelArg:
        """An ``unsigned int`` (32 bits)."""
        return _integer("scalar_u32", np.uint32, v)

    @staticmethod
    def scalar_u64(v: int) -> KernelArg:
        """An ``unsigned long long`` (64 bits)."""
        return _integer("scalar_u64", np.uint64, v)

    @staticmethod
    def usize(v: int) -> KernelArg:
        """A ``size_t`` (64 bits)."""
        return _integer("usize", np.uint64, v)

    @staticmethod
    def scalar_f32(v: float) -> KernelArg:
        """A ``float``; a finite value beyond float32's range is refused."""
        return _real("scalar_f32", np.float32, v)

    @staticmethod
    def scalar_f64(v: float) -> KernelArg:
        """A ``double``."""
        return _real("scalar_f64", np.float64, v)

    @staticmethod
    def tensor_map(view: TensorMap) -> KernelArg:
        """A tensor-map (TMA) descriptor, passed by value as ``const __grid_constant__
        CUtensorMap`` (compute capability 9.0+); see ``TensorMap.tiled``."""
        if not isinstance(view, TensorMap):
            raise InvalidArgument(f"KernelArg.tensor_map takes a TensorMap, got {view!r}")
        return KernelArg("tensor_map", view)

    def __repr__(self) -> str:
        shown = self.value if isinstance(self.value, GpuBuffer | TensorMap) \
            else self.value.item()
        return f"KernelArg.{self.tag}({shown!r})"


def launch_values(args: list[Any]) -> tuple[GpuBuffer | np.generic | TensorMap, ...]:
    """The values of a list of ``KernelArg`` (``InvalidArgument`` for anything else)."""
    for i, arg in enumerate(args):
        if not isinstance(arg, KernelArg):
            raise InvalidArgument(f"kernel argument {i} must be a KernelArg in this form of "
                                  f"launch, got {type(arg).__name__}")
    return tuple(arg.value for arg in args)
