"""CPU sparse products with ``scipy.sparse.csr_array`` over the live buffers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse
from numpy.lib.stride_tricks import as_strided

from atomr_accel.backends._base import Handler
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import Op
from atomr_accel.core.ops._sparse import CsrMatrix, CsrSpMM, CsrSpMV

if TYPE_CHECKING:
    from atomr_accel.backends.cpu._backend import CpuBackend

__all__ = ["HANDLERS", "csr_spmm", "csr_spmv"]


def _scalar(value: complex, complex_data: bool) -> complex:
    """Return ``value`` in the data's field: its real part for real data (results stay real)."""
    return value if complex_data else complex(value).real


def _csr(backend: CpuBackend, a: CsrMatrix) -> Any:
    """Wrap ``a``'s buffers in a ``csr_array`` after checking the index contents."""
    indptr = backend.array(a.indptr.buffer_id)[: a.rows + 1]
    indices = backend.array(a.indices.buffer_id)[: a.nnz]
    values = backend.array(a.values.buffer_id)[: a.nnz]
    if indptr[0] != 0 or indptr[-1] != a.nnz or np.any(np.diff(indptr) < 0):
        raise InvalidArgument(
            f"indptr must rise from 0 to nnz ({a.nnz}) without decreasing"
        )
    if a.nnz and (indices.min() < 0 or indices.max() >= a.cols):
        raise InvalidArgument(f"column indices must lie in [0, {a.cols})")
    return scipy.sparse.csr_array((values, indices, indptr), shape=(a.rows, a.cols))


def _column_major(
    arr: np.ndarray[Any, Any], rows: int, cols: int, ld: int
) -> np.ndarray[Any, Any]:
    """View ``arr`` as a column-major ``rows`` x ``cols`` matrix with leading dimension ``ld``."""
    item = arr.itemsize
    return as_strided(arr, shape=(rows, cols), strides=(item, ld * item))


def csr_spmv(backend: CpuBackend, op: CsrSpMV) -> None:
    """Write ``alpha * op(A) @ x + beta * y`` into ``y`` (``y`` unread when ``beta == 0``)."""
    a = _csr(backend, op.a)
    n_x, n_y = (op.a.rows, op.a.cols) if op.trans else (op.a.cols, op.a.rows)
    x = backend.array(op.x.buffer_id)[:n_x]
    y = backend.array(op.y.buffer_id)[:n_y]
    product = (a.T if op.trans else a) @ x
    alpha = _scalar(op.alpha, op.y.dtype.is_complex)
    beta = _scalar(op.beta, op.y.dtype.is_complex)
    y[:] = alpha * product if beta == 0 else alpha * product + beta * y


def csr_spmm(backend: CpuBackend, op: CsrSpMM) -> None:
    """Write ``alpha * A @ B + beta * C`` into column-major ``C`` (unread when ``beta == 0``)."""
    a = _csr(backend, op.a)
    b = _column_major(backend.array(op.b.buffer_id), op.a.cols, op.n, op.ld_b)
    c = _column_major(backend.array(op.c.buffer_id), op.a.rows, op.n, op.ld_c)
    product = a @ b
    alpha = _scalar(op.alpha, op.c.dtype.is_complex)
    beta = _scalar(op.beta, op.c.dtype.is_complex)
    c[...] = alpha * product if beta == 0 else alpha * product + beta * c


HANDLERS: dict[type[Op], Handler] = {CsrSpMV: csr_spmv, CsrSpMM: csr_spmm}
