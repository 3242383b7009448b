"""What the CUB-shaped ops share: their base (``_CubOp``, which names their library once),
the dtypes they take, the reduction and scan kinds, their identities, and the checks and
parameters of counts, buffers, bits and offsets."""

from __future__ import annotations

import enum
from typing import Any, ClassVar

import numpy as np

from atomr_accel.core._api import Param
from atomr_accel.core._dtype import DType
from atomr_accel.core._fields import pickle_by_name
from atomr_accel.core._op import (
    Op,
    require,
    require_buffer,
    require_len,
    require_nonneg,
    require_same_dtype,
)
from atomr_accel.core._ref import GpuRef, same_buffer

__all__ = [
    "ARITHMETIC",
    "COUNTS",
    "INTEGERS",
    "OFFSETS",
    "ReduceKind",
    "SORTABLE",
    "ScanKind",
    "identity_of",
]


INTEGERS = (DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U16, DType.U32,
            DType.U64)


ARITHMETIC = (*INTEGERS, DType.F16, DType.F32, DType.F64)
"""The dtypes reductions, scans, histograms and selections take."""


SORTABLE = (*ARITHMETIC, DType.BF16)
"""The key dtypes of the sorts: every integer and float dtype."""


COUNTS = (DType.I32, DType.I64, DType.U32, DType.U64)
"""The dtypes of count and histogram buffers."""


OFFSETS = (DType.I32, DType.I64)


class _CubOp(Op):
    """Base class of the cub library's ops."""

    __slots__ = ()
    library: ClassVar[str] = "cub"


class ReduceKind(enum.Enum):
    """The operator of a reduction: ``sum``, ``min``, ``max``, ``argmin``, ``argmax`` or
    ``custom`` (a C expression)."""

    SUM = "sum"
    MIN = "min"
    MAX = "max"
    ARGMIN = "argmin"
    ARGMAX = "argmax"
    CUSTOM = "custom"

    __reduce_ex__ = pickle_by_name


class ScanKind(enum.Enum):
    """The operator of a scan: ``sum``, ``min`` or ``max``."""

    SUM = "sum"
    MIN = "min"
    MAX = "max"

    __reduce_ex__ = pickle_by_name


def identity_of(kind: ReduceKind | ScanKind, dtype: np.dtype[Any]) -> Any:
    """The value an empty reduction (or an exclusive scan's first element) holds: 0 for a
    sum, the dtype's largest value (``inf`` for floats) for a min, its lowest for a max."""
    if kind.value == "sum":
        return dtype.type(0)
    high = kind.value == "min"
    if dtype.kind == "f":
        return dtype.type(np.inf if high else -np.inf)
    info = np.iinfo(dtype)
    return dtype.type(info.max if high else info.min)


def _count(n: int | None, ref: GpuRef, name: str) -> int:
    """``n`` checked against ``ref`` (None: the whole buffer)."""
    if n is None:
        return ref.length
    require_nonneg(n=n)
    require_len(ref, n, name)
    return n


def _distinct(a: GpuRef, b: GpuRef, names: str) -> None:
    require(not same_buffer(a, b), f"{names} must be different buffers")


_N = Param("n", None, annotation="int | None")


_VALUES_IN = Param("values_in", annotation="BufferLike")


_VALUES_OUT = Param("values_out", annotation="BufferLike")


_EXPR = Param("expr", annotation="str")


_PREDICATE = Param("predicate", annotation="str")


_NO_CUSTOM = {"expr": "", "init": 0.0}


def _require_bits(begin_bit: int, end_bit: int | None, keys: GpuRef) -> None:
    width = keys.dtype.itemsize * 8
    end = width if end_bit is None else end_bit
    require_nonneg(begin_bit=begin_bit, end_bit=end)
    require(begin_bit < end <= width,
            f"the bit range [{begin_bit}, {end}) must be non-empty and within the "
            f"{width} bits of a {keys.dtype.value} key")


def _require_values(values_in: GpuRef | None, values_out: GpuRef | None, n: int) -> None:
    require((values_in is None) == (values_out is None),
            "values_in and values_out go together: pass both or neither")
    if values_in is not None and values_out is not None:
        require_same_dtype(values_in=values_in, values_out=values_out)
        require_len(values_in, n, "values_in")
        require_len(values_out, n, "values_out")


def _require_offsets(offsets: GpuRef, num_segments: int) -> None:
    require_nonneg(num_segments=num_segments)
    require_buffer(offsets, OFFSETS, num_segments + 1, "offsets")
