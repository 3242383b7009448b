"""Element types a device buffer can hold."""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import pickle_by_name

__all__ = ["DType"]


def _bfloat16() -> np.dtype[Any]:
    try:
        import ml_dtypes
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise InvalidArgument("bfloat16 needs the ml_dtypes package for host arrays") from exc
    dtype: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
    return dtype


class DType(enum.StrEnum):
    """An element type; ``value`` is its short name (``"f32"``), and it equals that name
    (``buf.dtype == "f32"``, as in the original package). Pickles by name."""

    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    F64 = "f64"
    I8 = "i8"
    I16 = "i16"
    I32 = "i32"
    I64 = "i64"
    U8 = "u8"
    U16 = "u16"
    U32 = "u32"
    U64 = "u64"
    C64 = "c64"
    C128 = "c128"

    __reduce_ex__ = pickle_by_name

    @property
    def itemsize(self) -> int:
        """Size of one element in bytes."""
        return _ITEMSIZE[self]

    @property
    def numpy(self) -> np.dtype[Any]:
        """The NumPy dtype (bf16 needs ``ml_dtypes``)."""
        if self is DType.BF16:
            return _bfloat16()
        return _NUMPY_DTYPE[self]

    @property
    def is_float(self) -> bool:
        """True for real floating-point types."""
        return self in _FLOATS

    @property
    def is_complex(self) -> bool:
        """True for complex types."""
        return self in _COMPLEXES

    @property
    def real(self) -> DType:
        """The real type of the same precision (f32 for c64); itself when already real."""
        return _REAL_OF.get(self, self)

    @property
    def complex(self) -> DType:
        """The complex type of the same precision (c64 for f32)."""
        try:
            return _COMPLEX_OF[self]
        except KeyError:
            raise InvalidArgument(f"{self.value} has no complex counterpart") from None

    @classmethod
    def of(cls, value: object) -> DType:
        """Return the DType for a DType, a short name (``"f32"``) or anything ``np.dtype`` takes."""
        if isinstance(value, DType):
            return value
        if isinstance(value, str) and value in _BY_NAME:
            return _BY_NAME[value]
        if value is None:  # NumPy reads None as float64: a dtype left out by mistake
            raise InvalidArgument("dtype is None; name one, like 'f32' or np.float32")
        try:
            dt = np.dtype(value)  # type: ignore[call-overload]
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"not a dtype: {value!r}") from exc
        if dt.name == "bfloat16":
            return DType.BF16
        try:
            return _BY_NUMPY[dt.name]
        except KeyError:
            raise InvalidArgument(f"unsupported dtype: {dt}") from None


_NUMPY_NAME = {
    DType.F16: "float16", DType.F32: "float32", DType.F64: "float64",
    DType.I8: "int8", DType.I16: "int16", DType.I32: "int32", DType.I64: "int64",
    DType.U8: "uint8", DType.U16: "uint16", DType.U32: "uint32", DType.U64: "uint64",
    DType.C64: "complex64", DType.C128: "complex128",
}
_NUMPY_DTYPE = {d: np.dtype(n) for d, n in _NUMPY_NAME.items()}
_ITEMSIZE = {d: dt.itemsize for d, dt in _NUMPY_DTYPE.items()} | {DType.BF16: 2}
_FLOATS = frozenset({DType.F16, DType.BF16, DType.F32, DType.F64})
_COMPLEXES = frozenset({DType.C64, DType.C128})
_REAL_OF = {DType.C64: DType.F32, DType.C128: DType.F64}
_COMPLEX_OF = {
    DType.F32: DType.C64, DType.F64: DType.C128, DType.C64: DType.C64, DType.C128: DType.C128,
}
_BY_NAME = {d.value: d for d in DType}
_BY_NUMPY = {n: d for d, n in _NUMPY_NAME.items()}
