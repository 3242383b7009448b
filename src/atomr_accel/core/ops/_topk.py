"""Top-k selection: the ``k`` largest values of each row of a matrix, answered to the host;
and the scoring search that feeds it (host queries against a matrix on the device)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import (
    Op,
    is_int,
    require_buffer,
    require_len,
    require_numbers,
    require_same_dtype,
)
from atomr_accel.core._ref import GpuRef

__all__ = ["ScoreTopK", "TopK"]

_DTYPES = (DType.F16, DType.F32, DType.F64)


class _TopKOp(Op):
    """The top-k ops: their library and the checks they share (their sizes, the searched
    buffer, the keys of its ``n`` candidates)."""

    __slots__ = ()
    library: ClassVar[str] = "tensor"
    n: int
    keys: GpuRef | None

    def _check_sizes(self, *names: str) -> None:
        """The size fields ``names`` are ints >= 1."""
        for name in names:
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise InvalidArgument(f"{name} must be an int >= 1, got {value!r}")

    def _check_keys(self) -> None:
        """``keys``, where given, holds ``n`` i64 values."""
        if self.keys is not None:
            require_buffer(self.keys, (DType.I64,), self.n, "keys")


@dataclass(frozen=True, slots=True)
class TopK(_TopKOp):
    """Find the ``k`` largest values of each row of the row-major ``m x n`` matrix ``x``.

    Equal values are ordered by the smaller key: ``keys[j]`` (``n`` int64
    values on the device) for column ``j``, or ``j`` itself when ``keys`` is
    None. The handler answers two host arrays of shape ``m x min(k, n)``, best
    first: the columns (int64) and their values (float64). Only a few
    candidates a row (``k`` plus a few spares) leave the device; a row whose
    spares all tie its ``k``-th value takes a second, exact pass over that row.
    """

    x: GpuRef
    m: int
    n: int
    k: int
    keys: GpuRef | None = None

    def validate(self) -> None:
        self._check_sizes("m", "n", "k")
        require_buffer(self.x, _DTYPES, self.m * self.n, "x")
        self._check_keys()


@dataclass(frozen=True, slots=True)
class ScoreTopK(_TopKOp):
    """Score host ``queries`` against the first ``n`` rows of ``matrix`` and answer each
    query's ``k`` best rows, in one op.

    ``queries`` is a host array of ``m x dim`` values of the matrix's dtype;
    ``matrix`` holds ``n`` rows of ``dim`` values (row-major). The score of
    query ``i`` and row ``j`` is ``alpha * queries[i] . matrix[j] + bias[j]``
    (no bias when ``bias`` is None), computed on the device in the matrix's
    dtype (f16 products accumulate in f32) and never downloaded: the answer is
    ``TopK``'s, two host arrays ``m x min(k, n)`` (rows as int64, best first,
    ties by ``keys``; scores as float64).
    """

    queries: Any
    matrix: GpuRef
    n: int
    dim: int
    k: int
    keys: GpuRef | None = None
    bias: GpuRef | None = None
    alpha: float = 1.0

    def validate(self) -> None:
        self._check_sizes("n", "dim", "k")
        require_buffer(self.matrix, _DTYPES, self.n * self.dim, "matrix")
        q = self.queries  # (each message is made only once its check has failed)
        if not (isinstance(q, np.ndarray) and q.ndim == 2 and q.shape[0] >= 1
                and q.shape[1] == self.dim):
            raise InvalidArgument(
                f"queries must be a host array of shape (m, {self.dim}) with m >= 1, got "
                f"{getattr(q, 'shape', type(q).__name__)}")
        if q.dtype != self.matrix.dtype.numpy:
            raise InvalidArgument(f"queries have dtype {q.dtype} but the matrix holds "
                                  f"{self.matrix.dtype.value}")
        require_numbers(self.matrix.dtype, alpha=self.alpha)
        self._check_keys()
        if self.bias is not None:
            require_same_dtype(matrix=self.matrix, bias=self.bias)
            require_len(self.bias, self.n, "bias")
