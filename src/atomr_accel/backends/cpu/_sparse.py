"""Sparse CSR products over the live buffers; runs on NumPy/SciPy or CuPy/cupyx.

The handlers wrap the buffers in ``backend.scipy_sparse.csr_matrix``:
``scipy.sparse`` on CPU, ``cupyx.scipy.sparse`` on CUDA, whose products with
dense vectors and matrices run cuSPARSE. ``csr_matrix`` (not ``csr_array``) is
used because both libraries provide it, and ``@`` is the matrix product on it
in both. Dense matrices are column-major strided views into their buffers.
"""

from __future__ import annotations

from typing import Any

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import shared
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._sparse import CsrMatrix, CsrSpMM, CsrSpMV

__all__ = ["csr_spmm", "csr_spmv"]

Array = Any  # a NumPy or CuPy array, whichever ``backend.xp`` makes


def _scalar(value: complex, complex_data: bool) -> complex:
    """Return ``value`` in the data's field: its real part for real data (results stay real)."""
    return value if complex_data else complex(value).real


def _csr(backend: ArrayBackend, a: CsrMatrix) -> Any:
    """Wrap ``a``'s buffers in a ``csr_matrix`` after checking the index contents.

    Each check reduces on the device and reads back one Python bool, so on
    CUDA it costs a synchronization, not a copy of the indices.
    """
    xp = backend.xp
    indptr = backend.array(a.indptr.buffer_id)[: a.rows + 1]
    indices = backend.array(a.indices.buffer_id)[: a.nnz]
    values = backend.array(a.values.buffer_id)[: a.nnz]
    if bool((indptr[0] != 0) | (indptr[-1] != a.nnz) | xp.any(xp.diff(indptr) < 0)):
        raise InvalidArgument(
            f"indptr must rise from 0 to nnz ({a.nnz}) without decreasing"
        )
    if a.nnz and bool((indices.min() < 0) | (indices.max() >= a.cols)):
        raise InvalidArgument(f"column indices must lie in [0, {a.cols})")
    return backend.scipy_sparse.csr_matrix((values, indices, indptr), shape=(a.rows, a.cols))


def _column_major(xp: Any, arr: Array, rows: int, cols: int, ld: int) -> Array:
    """View ``arr`` as a column-major ``rows`` x ``cols`` matrix with leading dimension ``ld``."""
    item = arr.itemsize
    return xp.lib.stride_tricks.as_strided(arr, shape=(rows, cols), strides=(item, ld * item))


@shared.handles(CsrSpMV)
def csr_spmv(backend: ArrayBackend, op: CsrSpMV) -> None:
    """Write ``alpha * op(A) @ x + beta * y`` into ``y`` (``y`` unread when ``beta == 0``)."""
    a = _csr(backend, op.a)
    n_x, n_y = (op.a.rows, op.a.cols) if op.trans else (op.a.cols, op.a.rows)
    x = backend.array(op.x.buffer_id)[:n_x]
    y = backend.array(op.y.buffer_id)[:n_y]
    product = (a.T if op.trans else a) @ x
    alpha = _scalar(op.alpha, op.y.dtype.is_complex)
    beta = _scalar(op.beta, op.y.dtype.is_complex)
    y[:] = alpha * product if beta == 0 else alpha * product + beta * y


@shared.handles(CsrSpMM)
def csr_spmm(backend: ArrayBackend, op: CsrSpMM) -> None:
    """Write ``alpha * A @ B + beta * C`` into column-major ``C`` (unread when ``beta == 0``)."""
    xp = backend.xp
    a = _csr(backend, op.a)
    b = _column_major(xp, backend.array(op.b.buffer_id), op.a.cols, op.n, op.ld_b)
    c = _column_major(xp, backend.array(op.c.buffer_id), op.a.rows, op.n, op.ld_c)
    product = a @ b
    alpha = _scalar(op.alpha, op.c.dtype.is_complex)
    beta = _scalar(op.beta, op.c.dtype.is_complex)
    c[...] = alpha * product if beta == 0 else alpha * product + beta * c
