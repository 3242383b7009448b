"""CUDA solver handlers: cuSOLVER (and cuBLAS's batched LU) called on the buffers in place.

The ops' layout is LAPACK's own (column-major matrices with a leading
dimension, batches ``stride`` elements apart, 1-based ``i32`` pivots), so each
routine gets pointers straight into the buffers, and padding rows of a larger
leading dimension stay untouched. Copies are made only where a routine needs
them (noted below). The routines:

* ``Getrf``: ``cusolverDn<t>getrf``; ``GetrfBatched``: ``cublas<t>getrfBatched``.
* ``Getrs``: ``cusolverDn<t>getrs``; ``GetrsBatched``: ``cublas<t>getrsBatched``.
  Both first check on the device that every pivot lies in ``1..n``
  (``InvalidArgument`` otherwise, as on the CPU): the libraries index with them.
* ``Potrf``: ``cusolverDn<t>potrf``; ``PotrfBatched``: ``cusolverDn<t>potrfBatched``,
  which (cuSOLVER 12.0, upper) also writes the other triangle: it is saved and restored.
* ``Potrs``: ``cusolverDn<t>potrs``; ``PotrsBatched``: ``cusolverDn<t>potrsBatched``
  once per column of B, since it solves one right-hand side per call. It writes into
  the factors it is given (mirrors them into the other triangle), so it gets a copy.
* ``Geqrf``: ``<t>geqrf``; ``Orgqr``: ``<t>orgqr`` (``<t>ungqr`` for complex).
* ``Gesvd`` and ``GesvdBatched``: ``<t>gesvd`` per matrix. cuSOLVER's gesvd needs
  ``m >= n``, so a wide A is decomposed as ``A.H = U' S VT'`` in scratch and
  written back as ``U = VT'.H``, ``VT = U'.H``.
* ``Syevd`` and ``SyevdBatched``: ``<t>syevd`` (``<t>heevd`` for complex) per matrix.
* ``GesvdjBatched``: ``<t>gesvdjBatched`` when ``m, n <= 32``, else ``<t>gesvdj``
  (``econ = 1``) per matrix, sharing one ``gesvdjInfo``. Both overwrite A, so they
  run on a packed copy of it; gesvdjBatched writes full U and V, of which the
  first ``min(m, n)`` columns are kept. U and V are made in scratch and copied
  into the op's (strided, padded) layout.

Each call leaves its ``info`` in device memory; once its calls are queued the
handler reads them all at once (so it waits for them on the host) and raises
``LibraryError("solver", info, ...)`` for the first failing matrix, exactly
as the CPU backend does (``raise_first``). A batched op given an ``info``
buffer has the routines write the statuses straight into it instead, and
neither waits nor raises. Batched ops without a batched routine here (gesvd,
syevd) queue one call per matrix.
"""

from __future__ import annotations

from typing import Any

import cupy as cp
import numpy as np
from cupy.cuda import cublas, cusolver

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cuda
from atomr_accel.backends.cpu._blas import matrix_views, vector_view
from atomr_accel.backends.cpu._solver import raise_first
from atomr_accel.core._op import require
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._linalg import Matrix
from atomr_accel.core.ops._solver import (
    Geqrf,
    Gesvd,
    GesvdBatched,
    GesvdjBatched,
    Getrf,
    GetrfBatched,
    Getrs,
    GetrsBatched,
    Orgqr,
    Potrf,
    PotrfBatched,
    Potrs,
    PotrsBatched,
    Syevd,
    SyevdBatched,
)

__all__ = [
    "geqrf", "gesvd", "gesvdj", "getrf", "getrs", "orgqr", "potrf", "potrs", "syevd",
]

_PREFIX = {"float32": "s", "float64": "d", "complex64": "c", "complex128": "z"}
_ALL = ord("A")  # gesvd's jobu/jobvt: every column of U / row of VT
_NONE = ord("N")
_JACOBI_BATCH_MAX = 32  # gesvdjBatched takes m, n <= 32


def _routine(library: Any, name: str, dtype: Any) -> Any:
    """Return ``library``'s routine ``name`` for ``dtype`` (``dgetrf`` for f64)."""
    return getattr(library, _PREFIX[dtype.name] + name)


def _stream() -> Any:
    return cp.cuda.get_current_stream()


def _solver_handle() -> int:
    """CuPy's cuSOLVER handle of this device, bound to the current stream."""
    handle: int = cp.cuda.device.get_cusolver_handle()
    cusolver.setStream(handle, _stream().ptr)
    return handle


def _blas_handle() -> int:
    """CuPy's cuBLAS handle of this device, bound to the current stream."""
    handle: int = cp.cuda.device.get_cublas_handle()
    cublas.setStream(handle, _stream().ptr)
    return handle


def _uplo(upper: bool) -> int:
    return int(cublas.CUBLAS_FILL_MODE_UPPER if upper else cublas.CUBLAS_FILL_MODE_LOWER)


def _trans(trans: bool, conj: bool, dtype: Any) -> int:
    """The cuBLAS operation for op(A); a conjugate transpose of real data is a transpose."""
    if not trans:
        return int(cublas.CUBLAS_OP_N)
    return int(cublas.CUBLAS_OP_C if conj and dtype.kind == "c" else cublas.CUBLAS_OP_T)


def _to_device(host: np.ndarray[Any, Any]) -> Any:
    """Copy a host array to the device on the current stream."""
    out = cp.empty(host.shape, dtype=host.dtype)
    out.set(host, stream=_stream())
    return out


class _Operand:
    """Pointers to the matrices of one operand, checked against its buffer."""

    def __init__(self, backend: ArrayBackend, spec: Matrix) -> None:
        self.views: Any = matrix_views(backend, spec)  # (batch, rows, cols), in the buffer
        self.dtype: Any = self.views.dtype
        self.ld = spec.ld
        self._base = int(self.views.data.ptr)
        self._column = spec.ld * int(self.dtype.itemsize)
        self._step = spec.stride * int(self.dtype.itemsize)

    def ptr(self, index: int) -> int:
        """Device address of matrix ``index``."""
        return self._base + index * self._step

    def pointers(self, batch: int, columns: int = 1) -> Any:
        """Device array ``[column, index]`` of the addresses of each matrix's columns."""
        return _addresses(self._base, self._step, batch, self._column, columns)


def _addresses(base: int, step: int, count: int, column: int = 0, columns: int = 1) -> Any:
    """Device array ``[j, i]`` of ``base + i * step + j * column`` (byte addresses)."""
    cols = np.arange(columns, dtype=np.uint64)[:, None] * np.uint64(column)
    items = np.arange(count, dtype=np.uint64)[None, :] * np.uint64(step)
    return _to_device(np.uint64(base) + cols + items)


def _slots(buffer: Any, index: int, size: int) -> int:
    """Device address of the ``index``-th packed slice of ``size`` elements of ``buffer``."""
    return int(buffer.data.ptr) + index * size * int(buffer.itemsize)


def _workspace(lwork: int, dtype: Any) -> Any:
    return cp.empty(max(lwork, 1), dtype=dtype)


def _check(routine: str, infos: Any, batched: bool) -> None:
    """Wait for the queued calls, then raise for the first non-zero ``info``."""
    raise_first(routine, infos.get(stream=_stream()).tolist(), batched)


def _statuses(backend: ArrayBackend, info: GpuRef | None, batch: int) -> Any:
    """Zeroed device array the calls write each matrix's ``info`` into: the op's ``info``
    buffer where it has one, else scratch for ``_finish`` to read."""
    if info is None:
        return cp.zeros(batch, dtype=cp.int32)
    statuses = backend.array(info.buffer_id)[:batch]
    statuses.fill(0)
    return statuses


def _finish(routine: str, statuses: Any, info: GpuRef | None, batched: bool) -> None:
    """Raise for the first failing matrix, unless the op's ``info`` buffer took the statuses."""
    if info is None:
        _check(routine, statuses, batched)


def _require_pivots(pivots: Any, n: int) -> None:
    bad = bool(cp.any((pivots < 1) | (pivots > n)))
    require(not bad, f"ipiv holds pivots outside 1..{n}; pass the pivots getrf wrote")


@cuda.handles(Getrf, GetrfBatched)
def getrf(backend: ArrayBackend, op: Getrf | GetrfBatched) -> None:
    """Factor ``A = P @ L @ U`` per matrix in place, writing 1-based pivots."""
    (spec,) = op.operands()
    m, n, batch = spec.rows, spec.cols, spec.batch
    info = op.info if isinstance(op, GetrfBatched) else None
    infos = _statuses(backend, info, batch)
    if min(m, n, batch) == 0:
        return
    a = _Operand(backend, spec)
    ipiv = backend.array(op.ipiv.buffer_id)
    if isinstance(op, GetrfBatched):
        pointers = a.pointers(batch)
        _routine(cublas, "getrfBatched", a.dtype)(
            _blas_handle(), n, pointers.data.ptr, a.ld, ipiv.data.ptr, infos.data.ptr, batch)
    else:
        handle = _solver_handle()
        lwork = _routine(cusolver, "getrf_bufferSize", a.dtype)(handle, m, n, a.ptr(0), a.ld)
        work = _workspace(lwork, a.dtype)
        _routine(cusolver, "getrf", a.dtype)(
            handle, m, n, a.ptr(0), a.ld, work.data.ptr, ipiv.data.ptr, infos.data.ptr)
    _finish("getrf", infos, info, isinstance(op, GetrfBatched))


@cuda.handles(Getrs, GetrsBatched)
def getrs(backend: ArrayBackend, op: Getrs | GetrsBatched) -> None:
    """Solve ``op(A) @ X = B`` per matrix from getrf's factors, in place into B."""
    a_spec, b_spec = op.operands()
    n, nrhs, batch = a_spec.rows, b_spec.cols, b_spec.batch
    if min(n, nrhs, batch) == 0:
        return
    a, b = _Operand(backend, a_spec), _Operand(backend, b_spec)
    ipiv = backend.array(op.ipiv.buffer_id)
    _require_pivots(ipiv[: batch * n], n)
    trans = _trans(op.trans, op.conj, a.dtype)
    if isinstance(op, GetrsBatched):
        info = np.zeros(1, dtype=np.int32)  # cuBLAS reports argument errors on the host
        a_ptrs, b_ptrs = a.pointers(batch), b.pointers(batch)
        _routine(cublas, "getrsBatched", a.dtype)(
            _blas_handle(), trans, n, nrhs, a_ptrs.data.ptr, a.ld, ipiv.data.ptr,
            b_ptrs.data.ptr, b.ld, info.ctypes.data, batch)
        raise_first("getrs", [int(info[0])], False)
    else:
        infos = cp.zeros(1, dtype=cp.int32)
        _routine(cusolver, "getrs", a.dtype)(
            _solver_handle(), trans, n, nrhs, a.ptr(0), a.ld, ipiv.data.ptr, b.ptr(0), b.ld,
            infos.data.ptr)
        _check("getrs", infos, False)


@cuda.handles(Potrf, PotrfBatched)
def potrf(backend: ArrayBackend, op: Potrf | PotrfBatched) -> None:
    """Factor each Hermitian positive definite matrix in its chosen triangle (Cholesky)."""
    (spec,) = op.operands()
    n, batch = spec.rows, spec.batch
    info = op.info if isinstance(op, PotrfBatched) else None
    infos = _statuses(backend, info, batch)
    if min(n, batch) == 0:
        return
    a = _Operand(backend, spec)
    uplo = _uplo(op.upper)
    handle = _solver_handle()
    if isinstance(op, PotrfBatched):
        # potrfBatched may overwrite the triangle LAPACK leaves alone: keep it, put it back.
        other = cp.tril(cp.ones((n, n), dtype=bool), -1) if op.upper else cp.triu(
            cp.ones((n, n), dtype=bool), 1)
        kept = a.views.copy()
        pointers = a.pointers(batch)
        _routine(cusolver, "potrfBatched", a.dtype)(
            handle, uplo, n, pointers.data.ptr, a.ld, infos.data.ptr, batch)
        a.views[...] = cp.where(other, kept, a.views)
    else:
        lwork = _routine(cusolver, "potrf_bufferSize", a.dtype)(handle, uplo, n, a.ptr(0), a.ld)
        work = _workspace(lwork, a.dtype)
        _routine(cusolver, "potrf", a.dtype)(
            handle, uplo, n, a.ptr(0), a.ld, work.data.ptr, lwork, infos.data.ptr)
    _finish("potrf", infos, info, isinstance(op, PotrfBatched))


@cuda.handles(Potrs, PotrsBatched)
def potrs(backend: ArrayBackend, op: Potrs | PotrsBatched) -> None:
    """Solve ``A @ X = B`` per matrix from potrf's factor, in place into B."""
    a_spec, b_spec = op.operands()
    n, nrhs, batch = a_spec.rows, b_spec.cols, b_spec.batch
    if min(n, nrhs, batch) == 0:
        return
    a, b = _Operand(backend, a_spec), _Operand(backend, b_spec)
    uplo = _uplo(op.upper)
    infos = cp.zeros(1, dtype=cp.int32)
    handle = _solver_handle()
    if isinstance(op, PotrsBatched):
        # potrsBatched writes into the factors it is given; A is read-only here: pass a copy.
        factors = cp.ascontiguousarray(a.views.transpose(0, 2, 1))  # column-major, ld = n
        a_ptrs = _addresses(int(factors.data.ptr), n * n * int(a.dtype.itemsize), batch)
        b_ptrs = b.pointers(batch, nrhs)
        solve = _routine(cusolver, "potrsBatched", a.dtype)
        for column in range(nrhs):  # potrsBatched takes one right-hand side
            solve(handle, uplo, n, 1, a_ptrs.data.ptr, n, b_ptrs[column].data.ptr, b.ld,
                  infos.data.ptr, batch)
    else:
        _routine(cusolver, "potrs", a.dtype)(
            handle, uplo, n, nrhs, a.ptr(0), a.ld, b.ptr(0), b.ld, infos.data.ptr)
    _check("potrs", infos, False)


@cuda.handles(Geqrf)
def geqrf(backend: ArrayBackend, op: Geqrf) -> None:
    """Factor ``A = Q @ R`` in place in Householder form, scalars into tau."""
    a_spec, tau_spec = op.operands()
    m, n = a_spec.rows, a_spec.cols
    if min(m, n) == 0:
        return
    a = _Operand(backend, a_spec)
    tau = vector_view(backend, tau_spec)
    handle = _solver_handle()
    lwork = _routine(cusolver, "geqrf_bufferSize", a.dtype)(handle, m, n, a.ptr(0), a.ld)
    work = _workspace(lwork, a.dtype)
    infos = cp.zeros(1, dtype=cp.int32)
    _routine(cusolver, "geqrf", a.dtype)(
        handle, m, n, a.ptr(0), a.ld, tau.data.ptr, work.data.ptr, lwork, infos.data.ptr)
    _check("geqrf", infos, False)


@cuda.handles(Orgqr)
def orgqr(backend: ArrayBackend, op: Orgqr) -> None:
    """Overwrite A with the first ``n`` columns of Q built from ``k`` reflectors."""
    a_spec, tau_spec = op.operands()
    m, n, k = a_spec.rows, a_spec.cols, op.k
    if min(m, n) == 0:
        return
    a = _Operand(backend, a_spec)
    if k == 0:  # no reflectors: Q is the identity
        a.views[0][...] = cp.eye(m, n, dtype=a.dtype)
        return
    tau = vector_view(backend, tau_spec)
    name = "ungqr" if a.dtype.kind == "c" else "orgqr"
    handle = _solver_handle()
    lwork = _routine(cusolver, name + "_bufferSize", a.dtype)(
        handle, m, n, k, a.ptr(0), a.ld, tau.data.ptr)
    work = _workspace(lwork, a.dtype)
    infos = cp.zeros(1, dtype=cp.int32)
    _routine(cusolver, name, a.dtype)(
        handle, m, n, k, a.ptr(0), a.ld, tau.data.ptr, work.data.ptr, lwork, infos.data.ptr)
    _check(name, infos, False)


class _Svd:
    """One cuSOLVER gesvd setup for ``rows x cols`` matrices (``rows >= cols``)."""

    def __init__(self, handle: int, rows: int, cols: int, dtype: Any) -> None:
        self.handle, self.rows, self.cols, self.dtype = handle, rows, cols, dtype
        lwork = _routine(cusolver, "gesvd_bufferSize", dtype)(handle, rows, cols)
        self.lwork = max(lwork, 1)
        self.work = _workspace(lwork, dtype)
        self.rwork = cp.empty(max(cols, 1), dtype=np.finfo(dtype).dtype)  # real, min(m, n) - 1

    def __call__(self, a: int, lda: int, s: int, u: tuple[int, int] | None,
                 vt: tuple[int, int] | None, info: int) -> None:
        """Decompose the matrix at ``a``; ``u``/``vt`` are (address, ld) or None to skip."""
        u_ptr, ldu = u or (0, self.rows)
        vt_ptr, ldvt = vt or (0, self.cols)
        _routine(cusolver, "gesvd", self.dtype)(
            self.handle, _NONE if u is None else _ALL, _NONE if vt is None else _ALL,
            self.rows, self.cols, a, lda, s, u_ptr, ldu, vt_ptr, ldvt, self.work.data.ptr,
            self.lwork, self.rwork.data.ptr, info)


@cuda.handles(Gesvd, GesvdBatched)
def gesvd(backend: ArrayBackend, op: Gesvd | GesvdBatched) -> None:
    """Decompose each matrix as ``U @ diag(s) @ VT``, full U and VT where asked for."""
    specs = iter(op.operands())
    a_spec = next(specs)
    m, n, batch = a_spec.rows, a_spec.cols, a_spec.batch
    u = None if op.u is None else _Operand(backend, next(specs))
    vt = None if op.vt is None else _Operand(backend, next(specs))
    if min(m, n, batch) == 0:
        return
    a = _Operand(backend, a_spec)
    k = min(m, n)
    s = backend.array(op.s.buffer_id)
    infos = cp.zeros(batch, dtype=cp.int32)
    svd = _Svd(_solver_handle(), max(m, n), k, a.dtype)
    if m >= n:
        for i in range(batch):
            svd(a.ptr(i), a.ld, _slots(s, i, k), None if u is None else (u.ptr(i), u.ld),
                None if vt is None else (vt.ptr(i), vt.ld), _slots(infos, i, 1))
    else:  # A.H = U' S VT' (n x m, tall), so A = VT'.H S U'.H
        u_t = None if vt is None else cp.empty((n, n), dtype=a.dtype, order="F")
        vt_t = None if u is None else cp.empty((m, m), dtype=a.dtype, order="F")
        for i in range(batch):
            a_h = cp.asfortranarray(a.views[i].T.conj())
            svd(a_h.data.ptr, n, _slots(s, i, k),
                None if u_t is None else (u_t.data.ptr, n),
                None if vt_t is None else (vt_t.data.ptr, m), _slots(infos, i, 1))
            if vt is not None and u_t is not None:
                vt.views[i][...] = u_t.T.conj()
            if u is not None and vt_t is not None:
                u.views[i][...] = vt_t.T.conj()
    _check("gesvd", infos, isinstance(op, GesvdBatched))


def _gesvdj_batched(handle: int, params: int, jobz: int, a: Any, s: Any, infos: Any
                    ) -> tuple[Any, Any]:
    """gesvdjBatched on ``a`` ((batch, n, m): packed column-major m x n); return full U and V
    as (batch, m, m) and (batch, n, n) arrays, each matrix column-major."""
    batch, n, m = a.shape
    u = cp.empty((batch, m, m), dtype=a.dtype)
    v = cp.empty((batch, n, n), dtype=a.dtype)
    cusolver.xgesvdjSetSortEig(params, 1)  # descending singular values (the default, made sure)
    args = (handle, jobz, m, n, a.data.ptr, m, s.data.ptr, u.data.ptr, m, v.data.ptr, n)
    lwork = _routine(cusolver, "gesvdjBatched_bufferSize", a.dtype)(*args, params, batch)
    work = _workspace(lwork, a.dtype)
    _routine(cusolver, "gesvdjBatched", a.dtype)(
        *args, work.data.ptr, lwork, infos.data.ptr, params, batch)
    return u, v


def _gesvdj_each(handle: int, params: int, jobz: int, a: Any, s: Any, infos: Any
                 ) -> tuple[Any, Any]:
    """gesvdj (econ) per matrix of ``a`` ((batch, n, m): packed column-major m x n); return
    U and V as (batch, k, m) and (batch, k, n) arrays, each matrix column-major."""
    batch, n, m = a.shape
    k = min(m, n)
    u = cp.empty((batch, k, m), dtype=a.dtype)
    v = cp.empty((batch, k, n), dtype=a.dtype)
    lwork = _routine(cusolver, "gesvdj_bufferSize", a.dtype)(
        handle, jobz, 1, m, n, a.data.ptr, m, s.data.ptr, u.data.ptr, m, v.data.ptr, n, params)
    work = _workspace(lwork, a.dtype)
    solve = _routine(cusolver, "gesvdj", a.dtype)
    for i in range(batch):
        solve(handle, jobz, 1, m, n, _slots(a, i, m * n), m, _slots(s, i, k),
              _slots(u, i, m * k), m, _slots(v, i, n * k), n, work.data.ptr, lwork,
              _slots(infos, i, 1), params)
    return u, v


@cuda.handles(GesvdjBatched)
def gesvdj(backend: ArrayBackend, op: GesvdjBatched) -> None:
    """Decompose each matrix as ``U @ diag(s) @ V.H`` by Jacobi, economy U and V where asked."""
    specs = iter(op.operands())
    a_spec = next(specs)
    m, n, batch = a_spec.rows, a_spec.cols, a_spec.batch
    u = None if op.u is None else matrix_views(backend, next(specs))
    v = None if op.v is None else matrix_views(backend, next(specs))
    infos = _statuses(backend, op.info, batch)
    k = min(m, n)
    if min(k, batch) == 0:
        return
    views = matrix_views(backend, a_spec)
    packed = cp.empty((batch, n, m), dtype=views.dtype)  # the routines overwrite A: a copy
    packed.transpose(0, 2, 1)[...] = views
    s = backend.array(op.s.buffer_id)
    vectors = u is not None or v is not None
    mode = cusolver.CUSOLVER_EIG_MODE_VECTOR if vectors else cusolver.CUSOLVER_EIG_MODE_NOVECTOR
    handle = _solver_handle()
    params = cusolver.createGesvdjInfo()
    try:
        solve = _gesvdj_batched if max(m, n) <= _JACOBI_BATCH_MAX else _gesvdj_each
        u_all, v_all = solve(handle, params, int(mode), packed, s, infos)
        if u is not None:
            u[...] = u_all.transpose(0, 2, 1)[:, :, :k]
        if v is not None:
            v[...] = v_all.transpose(0, 2, 1)[:, :, :k]
        _finish("gesvdj", infos, op.info, True)  # waits for the calls unless info takes them
    finally:
        cusolver.destroyGesvdjInfo(params)


@cuda.handles(Syevd, SyevdBatched)
def syevd(backend: ArrayBackend, op: Syevd | SyevdBatched) -> None:
    """Find ascending eigenvalues into w and, with ``vectors``, eigenvectors over A."""
    (spec,) = op.operands()
    n, batch = spec.rows, spec.batch
    if min(n, batch) == 0:
        return
    a = _Operand(backend, spec)
    w = backend.array(op.w.buffer_id)
    name = "heevd" if a.dtype.kind == "c" else "syevd"
    jobz = int(cusolver.CUSOLVER_EIG_MODE_VECTOR if op.vectors
               else cusolver.CUSOLVER_EIG_MODE_NOVECTOR)
    uplo = _uplo(op.upper)
    handle = _solver_handle()
    lwork = _routine(cusolver, name + "_bufferSize", a.dtype)(
        handle, jobz, uplo, n, a.ptr(0), a.ld, w.data.ptr)
    work = _workspace(lwork, a.dtype)
    infos = cp.zeros(batch, dtype=cp.int32)
    solve = _routine(cusolver, name, a.dtype)
    for i in range(batch):
        solve(handle, jobz, uplo, n, a.ptr(i), a.ld, _slots(w, i, n), work.data.ptr, lwork,
              _slots(infos, i, 1))
    _check("syevd", infos, isinstance(op, SyevdBatched))
