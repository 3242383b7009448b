"""Top-k selection: the ``k`` largest values of each row of a matrix, answered to the host."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import Op, is_int, require_dtype, require_len
from atomr_accel.core._ref import GpuRef

__all__ = ["TopK"]

_DTYPES = (DType.F16, DType.F32, DType.F64)


@dataclass(frozen=True, slots=True)
class TopK(Op):
    """Find the ``k`` largest values of each row of the row-major ``m x n`` matrix ``x``.

    Equal values are ordered by the smaller key: ``keys[j]`` (``n`` int64
    values on the device) for column ``j``, or ``j`` itself when ``keys`` is
    None. The handler answers two host arrays of shape ``m x min(k, n)``, best
    first: the columns (int64) and their values (float64). Only a few
    candidates a row (``k`` plus a few spares) leave the device; a row whose
    spares all tie its ``k``-th value takes a second, exact pass over that row.
    """

    library: ClassVar[str] = "tensor"
    x: GpuRef
    m: int
    n: int
    k: int
    keys: GpuRef | None = None

    def validate(self) -> None:
        for name in ("m", "n", "k"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise InvalidArgument(f"{name} must be an int >= 1, got {value!r}")
        require_dtype(self.x, _DTYPES, "x")
        require_len(self.x, self.m * self.n, "x")
        if self.keys is not None:
            require_dtype(self.keys, (DType.I64,), "keys")
            require_len(self.keys, self.n, "keys")
