"""fp8 values as bits: the host side of the fp8 GEMM (``atomr_accel.cutlass.to_fp8``).

There is no fp8 ``DType``: fp8 operands travel as the bytes of their values in
``u8`` buffers, as cuBLASLt and CUTLASS take them. ``to_fp8`` encodes an array
(``ml_dtypes``' ``float8_e4m3fn`` or ``float8_e5m2``, round to nearest even,
one rounding from the input's own precision) and ``from_fp8`` decodes bytes to
f32, exactly.

Out of range: with ``saturate=True`` (the default) finite values beyond the
format's largest magnitude, and infinities, become that magnitude with their
sign (448 for e4m3, 57344 for e5m2), as CUDA's ``satfinite`` conversions and
the usual fp8 scaling recipes do. With ``saturate=False`` the cast is the plain
one of ``ml_dtypes`` and of ``torch.Tensor.to(torch.float8_e4m3fn)``: e4m3,
which has no infinity, turns them into NaN; e5m2 into +-inf. NaN stays NaN
either way.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from atomr_accel.core._errors import DTypeMismatch, InvalidArgument

__all__ = ["FP8_MAX", "fp8_dtype", "from_fp8", "to_fp8"]

_DTYPES: dict[str, np.dtype[Any]] = {"e4m3": np.dtype(ml_dtypes.float8_e4m3fn),
                                      "e5m2": np.dtype(ml_dtypes.float8_e5m2)}
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
"""The largest finite magnitude of each fp8 format."""


def fp8_dtype(fmt: str) -> np.dtype[Any]:
    """The ``ml_dtypes`` NumPy dtype of the fp8 format ``fmt`` (``e4m3`` or ``e5m2``)."""
    if not isinstance(fmt, str) or fmt not in _DTYPES:
        raise InvalidArgument(f"an fp8 format is 'e4m3' or 'e5m2', got {fmt!r}")
    return _DTYPES[fmt]


def _is_real_float(dtype: np.dtype[Any]) -> bool:
    if dtype.kind != "V":
        return dtype.kind == "f"
    try:  # ml_dtypes' own floats (bfloat16, the fp8 formats) are kind "V"
        ml_dtypes.finfo(dtype)  # type: ignore[no-untyped-call]
    except (TypeError, ValueError):
        return False
    return True


def to_fp8(array: Any, format: str = "e4m3", *, saturate: bool = True,
           ) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """The fp8 bits (``uint8``, same shape) of the real values of ``array`` in ``format``
    (``e4m3``: ``float8_e4m3fn``; ``e5m2``), rounded to nearest even. ``saturate``: clamp
    finite values beyond the format's range and infinities to +-max (else e4m3 makes them
    NaN, e5m2 +-inf, as ``torch``'s ``.to()`` does); NaN stays NaN."""
    target = fp8_dtype(format)
    values = np.asarray(array)
    if values.dtype.kind in "biu":
        values = values.astype(np.float64)
    elif not _is_real_float(values.dtype):
        raise DTypeMismatch(f"to_fp8 takes real numbers, got dtype {values.dtype}")
    if saturate:
        top = FP8_MAX[format]
        values = np.clip(values, -top, top)
    return np.ascontiguousarray(values.astype(target)).view(np.uint8)


def from_fp8(bits: Any, format: str = "e4m3") -> np.ndarray[Any, np.dtype[np.float32]]:
    """The values (f32, exact) of the fp8 ``bits`` (a ``uint8`` array) in ``format``."""
    target = fp8_dtype(format)
    raw = np.asarray(bits)
    if raw.dtype != np.uint8:
        raise DTypeMismatch(f"from_fp8 takes uint8 bits, got dtype {raw.dtype}")
    return np.ascontiguousarray(raw).view(target).astype(np.float32)
