"""CPU solver handlers: SciPy's LAPACK wrappers on column-major views of the flat buffers.

Every op, batched or not, runs one LAPACK call per matrix (a plain op is a
batch of one). All matrices are processed; then the first non-zero ``info``
raises ``LibraryError("solver", info, ...)``, naming the matrix for batched ops,
unless the op was given an ``info`` buffer, which then takes every matrix's status.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from atomr_accel.backends._handlers import cpu
from atomr_accel.backends._lazy import lazy_module
from atomr_accel.backends.cpu._blas import matrix_views, vector_view
from atomr_accel.core._errors import LibraryError
from atomr_accel.core._op import require
from atomr_accel.core._ref import GpuRef
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

if TYPE_CHECKING:
    from atomr_accel.backends.cpu._backend import CpuBackend

lapack = lazy_module("scipy.linalg.lapack")

__all__ = [
    "geqrf",
    "gesvd",
    "gesvdj",
    "getrf",
    "getrs",
    "orgqr",
    "potrf",
    "potrs",
    "raise_first",
    "report",
    "syevd",
]

Array = np.ndarray[Any, Any]


def _lapack(name: str, like: Array) -> Any:
    """Return the LAPACK routine ``name`` for ``like``'s dtype (``dgetrf`` for f64)."""
    return lapack.get_lapack_funcs(name, (like,))


_FAILURES: dict[str, Callable[[int], str]] = {
    "getrf": lambda i: f"U({i},{i}) is exactly zero, so the matrix is singular",
    "potrf": lambda i: f"the leading minor of order {i} is not positive definite",
    "gesvd": lambda i: f"{i} superdiagonals of the bidiagonal form did not converge",
    "syevd": lambda i: f"the eigensolver did not converge (info {i})",
    "gesvdj": lambda i: f"the Jacobi method did not converge (info {i})",
}


def raise_first(routine: str, infos: Sequence[int], batched: bool) -> None:
    """Raise ``LibraryError("solver", info, ...)`` for the first non-zero ``info``, if any.

    A negative ``info`` names an illegal argument; a positive one is explained as
    LAPACK (and cuSOLVER) explain it for ``routine``. A batched op names the matrix.
    """
    for index, info in enumerate(infos):
        if info != 0:
            if info < 0:
                what = f"argument {-info} had an illegal value"
            elif routine in _FAILURES:
                what = _FAILURES[routine](info)
            else:
                what = f"unexpected info {info}"
            where = f"matrix {index} of the batch: " if batched else ""
            raise LibraryError("solver", info, f"{routine}: {where}{what}")


def report(
    backend: CpuBackend, routine: str, infos: Sequence[int], info: GpuRef | None, batched: bool
) -> None:
    """Write each matrix's status into the op's ``info`` buffer, or without one ``raise_first``."""
    if info is None:
        raise_first(routine, infos, batched)
    else:
        backend.array(info.buffer_id)[: len(infos)] = infos


def _getrf_one(a: Array, ipiv: Array) -> int:
    if a.size == 0:
        return 0
    lu, piv, info = _lapack("getrf", a)(a)
    a[...] = lu
    ipiv[...] = piv + 1
    return int(info)


@cpu.handles(Getrf, GetrfBatched)
def getrf(backend: CpuBackend, op: Getrf | GetrfBatched) -> None:
    """Factor ``A = P @ L @ U`` per matrix, writing 1-based pivots."""
    (spec,) = op.operands()
    mats = matrix_views(backend, spec)
    k = min(spec.rows, spec.cols)
    ipiv = backend.array(op.ipiv.buffer_id)
    infos = [_getrf_one(mats[i], ipiv[i * k : (i + 1) * k]) for i in range(spec.batch)]
    info = op.info if isinstance(op, GetrfBatched) else None
    report(backend, "getrf", infos, info, isinstance(op, GetrfBatched))


def _getrs_one(lu: Array, ipiv: Array, b: Array, trans: int) -> int:
    n = lu.shape[0]
    if b.size == 0:
        return 0
    require(
        bool(np.all((ipiv >= 1) & (ipiv <= n))),
        f"ipiv holds pivots outside 1..{n}; pass the pivots getrf wrote",
    )
    x, info = _lapack("getrs", lu)(lu, ipiv - 1, b, trans=trans)
    b[...] = x
    return int(info)


@cpu.handles(Getrs, GetrsBatched)
def getrs(backend: CpuBackend, op: Getrs | GetrsBatched) -> None:
    """Solve ``op(A) @ X = B`` per matrix from getrf's factors, in place into B."""
    a_spec, b_spec = op.operands()
    lus = matrix_views(backend, a_spec)
    bs = matrix_views(backend, b_spec)
    n = a_spec.rows
    ipiv = backend.array(op.ipiv.buffer_id)
    trans = (2 if op.conj else 1) if op.trans else 0
    infos = [
        _getrs_one(lus[i], ipiv[i * n : (i + 1) * n], bs[i], trans) for i in range(b_spec.batch)
    ]
    raise_first("getrs", infos, isinstance(op, GetrsBatched))


def _potrf_one(a: Array, upper: bool) -> int:
    if a.size == 0:
        return 0
    c, info = _lapack("potrf", a)(a, lower=0 if upper else 1, clean=0)
    a[...] = c
    return int(info)


@cpu.handles(Potrf, PotrfBatched)
def potrf(backend: CpuBackend, op: Potrf | PotrfBatched) -> None:
    """Factor each Hermitian positive definite matrix in its chosen triangle (Cholesky)."""
    (spec,) = op.operands()
    mats = matrix_views(backend, spec)
    infos = [_potrf_one(mats[i], op.upper) for i in range(spec.batch)]
    info = op.info if isinstance(op, PotrfBatched) else None
    report(backend, "potrf", infos, info, isinstance(op, PotrfBatched))


def _potrs_one(c: Array, b: Array, upper: bool) -> int:
    if b.size == 0:
        return 0
    x, info = _lapack("potrs", c)(c, b, lower=0 if upper else 1)
    b[...] = x
    return int(info)


@cpu.handles(Potrs, PotrsBatched)
def potrs(backend: CpuBackend, op: Potrs | PotrsBatched) -> None:
    """Solve ``A @ X = B`` per matrix from potrf's factor, in place into B."""
    a_spec, b_spec = op.operands()
    cs = matrix_views(backend, a_spec)
    bs = matrix_views(backend, b_spec)
    infos = [_potrs_one(cs[i], bs[i], op.upper) for i in range(b_spec.batch)]
    raise_first("potrs", infos, isinstance(op, PotrsBatched))


@cpu.handles(Geqrf)
def geqrf(backend: CpuBackend, op: Geqrf) -> None:
    """Factor ``A = Q @ R`` in place in Householder form, scalars into tau."""
    a_spec, tau_spec = op.operands()
    a = matrix_views(backend, a_spec)[0]
    if a.size == 0:
        return
    qr, tau, _work, info = _lapack("geqrf", a)(a)
    a[...] = qr
    vector_view(backend, tau_spec)[...] = tau
    raise_first("geqrf", [int(info)], False)


@cpu.handles(Orgqr)
def orgqr(backend: CpuBackend, op: Orgqr) -> None:
    """Overwrite A with the first ``n`` columns of Q built from ``k`` reflectors."""
    a_spec, tau_spec = op.operands()
    a = matrix_views(backend, a_spec)[0]
    if a.size == 0:
        return
    tau = vector_view(backend, tau_spec)
    name = "ungqr" if np.iscomplexobj(a) else "orgqr"
    q, _work, info = _lapack(name, a)(a, tau)
    a[...] = q
    raise_first(name, [int(info)], False)


def _gesvd_one(a: Array, s: Array, u: Array | None, vt: Array | None) -> int:
    if a.size == 0:
        return 0
    want = u is not None or vt is not None
    u_full, values, vt_full, info = _lapack("gesvd", a)(a, compute_uv=int(want), full_matrices=1)
    s[...] = values
    if u is not None:
        u[...] = u_full
    if vt is not None:
        vt[...] = vt_full
    return int(info)


def _each_svd(backend: CpuBackend, op: Gesvd | GesvdBatched | GesvdjBatched,
              right: GpuRef | None,
              one: Callable[[Array, Array, Array | None, Array | None], int]) -> list[int]:
    """Run ``one(a, s, u, right)`` on each matrix of a (batched) SVD op; each one's status.
    ``right`` is the op's optional right factor (VT, or V), after the optional U."""
    specs = iter(op.operands())
    a_spec = next(specs)
    mats = matrix_views(backend, a_spec)
    us = None if op.u is None else matrix_views(backend, next(specs))
    rights = None if right is None else matrix_views(backend, next(specs))
    k = min(a_spec.rows, a_spec.cols)
    s = backend.array(op.s.buffer_id)
    return [
        one(mats[i], s[i * k : (i + 1) * k], None if us is None else us[i],
            None if rights is None else rights[i])
        for i in range(a_spec.batch)
    ]


@cpu.handles(Gesvd, GesvdBatched)
def gesvd(backend: CpuBackend, op: Gesvd | GesvdBatched) -> None:
    """Decompose each matrix as ``U @ diag(s) @ VT``, full U and VT where asked for."""
    infos = _each_svd(backend, op, op.vt, _gesvd_one)
    raise_first("gesvd", infos, isinstance(op, GesvdBatched))


def _gesvdj_one(a: Array, s: Array, u: Array | None, v: Array | None) -> int:
    """Economy SVD of one matrix into s, U and V; ``min(m, n) + 1`` if it does not converge."""
    if a.size == 0:
        return 0
    try:
        if u is None and v is None:
            s[...] = np.linalg.svd(a, compute_uv=False)
            return 0
        u_thin, values, vh = np.linalg.svd(a, full_matrices=False)
    except np.linalg.LinAlgError:
        return len(s) + 1  # s holds min(m, n) entries
    s[...] = values
    if u is not None:
        u[...] = u_thin
    if v is not None:
        v[...] = vh.conj().T
    return 0


@cpu.handles(GesvdjBatched)
def gesvdj(backend: CpuBackend, op: GesvdjBatched) -> None:
    """Decompose each matrix as ``U @ diag(s) @ V.H`` (economy U and V) with NumPy's SVD."""
    report(backend, "gesvdj", _each_svd(backend, op, op.v, _gesvdj_one), op.info, True)


def _syevd_one(a: Array, w: Array, upper: bool, vectors: bool) -> int:
    if a.size == 0:
        return 0
    name = "heevd" if np.iscomplexobj(a) else "syevd"
    values, v, info = _lapack(name, a)(a, compute_v=int(vectors), lower=0 if upper else 1)
    w[...] = values
    if vectors:
        a[...] = v
    return int(info)


@cpu.handles(Syevd, SyevdBatched)
def syevd(backend: CpuBackend, op: Syevd | SyevdBatched) -> None:
    """Find ascending eigenvalues into w and, with ``vectors``, eigenvectors over A."""
    (spec,) = op.operands()
    mats = matrix_views(backend, spec)
    n = spec.rows
    w = backend.array(op.w.buffer_id)
    infos = [
        _syevd_one(mats[i], w[i * n : (i + 1) * n], op.upper, op.vectors)
        for i in range(spec.batch)
    ]
    raise_first("syevd", infos, isinstance(op, SyevdBatched))
