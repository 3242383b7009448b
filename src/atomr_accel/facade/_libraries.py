"""Library handles: ``Blas``, ``Fft``, ``RngGenerator``, ``Solver``, ``Sparse``, ``Tensor``.

Each method builds an op from buffers and options and runs it on the device;
each has an ``*_async`` twin. Options not spelled out in a signature are the
fields of the op class of the same name (see ``atomr_accel.core.ops``).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument
from atomr_accel.core._op import Op, checked, is_int
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._blas import (
    Asum,
    Axpy,
    Dot,
    Geam,
    Gemm,
    GemmStridedBatched,
    Gemv,
    Ger,
    Iamax,
    Nrm2,
    Scal,
    Syrk,
    Trsm,
)
from atomr_accel.core.ops._fft import Fft as FftOp
from atomr_accel.core.ops._fft import FftKind
from atomr_accel.core.ops._rng import Distribution, RngFill
from atomr_accel.core.ops._solver import (
    Geqrf,
    Gesvd,
    GesvdBatched,
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
from atomr_accel.core.ops._sparse import CsrMatrix, CsrSpMM, CsrSpMV
from atomr_accel.core.ops._tensor import Contract
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.facade._portal import blocking

if TYPE_CHECKING:
    from atomr_accel.facade._device import Device

__all__ = ["Blas", "Fft", "Library", "RngGenerator", "Solver", "Sparse", "Tensor"]

BufferLike = GpuBuffer | GpuRef
OpT = TypeVar("OpT", bound=Op)


def _make(op_class: type[OpT], *args: Any, **options: Any) -> OpT:
    """Build ``op_class(*args, **options)``; an option it does not take is an
    ``InvalidArgument`` naming the options it does take."""
    try:
        return op_class(*args, **options)
    except TypeError as exc:
        fields = [f.name for f in dataclasses.fields(op_class)]  # type: ignore[arg-type]
        unknown = [name for name in options if name not in fields] or list(options)
        choices = ", ".join(fields[len(args):])
        raise InvalidArgument(
            f"{op_class.__name__} takes no option {unknown[0]!r}; its options are {choices}"
        ) from exc


class Library:
    """Base of the handles: turns buffers into refs and runs ops on one device."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self._portal = device._portal
        self._run: Callable[[Op], Coroutine[Any, Any, Any]] = device.run_async
        """Run an op on the device (awaited: the device's own coroutine, no extra frame)."""

    def _ref(self, buffer: BufferLike, name: str, dtypes: Iterable[DType] | None = None) -> GpuRef:
        ref = self.device.ref_of(buffer, name)
        if dtypes is not None and ref.dtype not in (allowed := tuple(dtypes)):
            names = "/".join(d.value for d in allowed)
            raise InvalidArgument(f"{name} holds {ref.dtype.value}; this call needs {names}")
        return ref


_F32 = (DType.F32,)
_F64 = (DType.F64,)


class Blas(Library):
    """BLAS on one device, cuBLAS conventions: column-major, ``lda/ldb/ldc``, 1-based ``iamax``.

    ``matmul`` is a row-major convenience over ``gemm``.
    """

    def _gemm(self, a: BufferLike, b: BufferLike, c: BufferLike, m: int, n: int, k: int,
              dtypes: Iterable[DType] | None, options: dict[str, Any]) -> Gemm:
        return _make(Gemm, self._ref(a, "a", dtypes), self._ref(b, "b", dtypes),
                    self._ref(c, "c", dtypes), m, n, k, **options)

    async def gemm_async(
        self, a: BufferLike, b: BufferLike, c: BufferLike, m: int, n: int, k: int, *,
        alpha: complex = 1.0, beta: complex = 0.0, trans_a: bool = False,
        trans_b: bool = False, lda: int | None = None, ldb: int | None = None,
        ldc: int | None = None, dtypes: Iterable[DType] | None = None, **options: Any,
    ) -> None:
        """C = alpha * op(A) @ op(B) + beta * C, column-major; op(A) is m x k, op(B) k x n."""
        await self._run(self._gemm(a, b, c, m, n, k, dtypes, dict(
            options, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, lda=lda,
            ldb=ldb, ldc=ldc)))

    async def gemm_f32_async(
        self, a: BufferLike, b: BufferLike, c: BufferLike, m: int, n: int, k: int,
        **options: Any,
    ) -> None:
        """``gemm`` on float32 buffers (``InvalidArgument`` for any other dtype)."""
        await self._run(self._gemm(a, b, c, m, n, k, _F32, options))

    async def gemm_f64_async(
        self, a: BufferLike, b: BufferLike, c: BufferLike, m: int, n: int, k: int,
        **options: Any,
    ) -> None:
        """``gemm`` on float64 buffers (``InvalidArgument`` for any other dtype)."""
        await self._run(self._gemm(a, b, c, m, n, k, _F64, options))

    async def matmul_async(
        self, a: BufferLike, b: BufferLike, c: BufferLike, m: int, n: int, k: int, *,
        alpha: complex = 1.0, beta: complex = 0.0,
    ) -> None:
        """Row-major C (m x n) = alpha * A (m x k) @ B (k x n) + beta * C, as NumPy stores them."""
        # Row-major X is column-major X^T, and C^T = B^T A^T.
        await self.gemm_async(b, a, c, n, m, k, alpha=alpha, beta=beta)

    async def gemm_strided_batched_async(
        self, a: BufferLike, b: BufferLike, c: BufferLike, m: int, n: int, k: int,
        batch: int, **options: Any,
    ) -> None:
        """``batch`` gemms over matrices ``stride_*`` elements apart (tight by default)."""
        await self._run(_make(GemmStridedBatched,
            self._ref(a, "a"), self._ref(b, "b"), self._ref(c, "c"), m, n, k, batch, **options))

    async def axpy_async(self, n: int, alpha: complex, x: BufferLike, y: BufferLike,
                         **options: Any) -> None:
        """y = alpha * x + y over ``n`` elements (``incx``/``incy`` options)."""
        await self._run(_make(Axpy, n, alpha, self._ref(x, "x"), self._ref(y, "y"), **options))

    async def dot_async(self, n: int, x: BufferLike, y: BufferLike, **options: Any) -> Any:
        """Return x . y (``conjugate=True`` for dotc)."""
        return await self._run(_make(Dot, n, self._ref(x, "x"), self._ref(y, "y"), **options))

    async def nrm2_async(self, n: int, x: BufferLike, **options: Any) -> float:
        """Return the Euclidean norm of x."""
        result: float = await self._run(_make(Nrm2, n, self._ref(x, "x"), **options))
        return result

    async def scal_async(self, n: int, alpha: complex, x: BufferLike, **options: Any) -> None:
        """x = alpha * x."""
        await self._run(_make(Scal, n, alpha, self._ref(x, "x"), **options))

    async def asum_async(self, n: int, x: BufferLike, **options: Any) -> float:
        """Return sum |x_i| (|re| + |im| for complex, as BLAS)."""
        result: float = await self._run(_make(Asum, n, self._ref(x, "x"), **options))
        return result

    async def iamax_async(self, n: int, x: BufferLike, **options: Any) -> int:
        """Return the 1-based index of the largest |x_i| (0 when n is 0)."""
        result: int = await self._run(_make(Iamax, n, self._ref(x, "x"), **options))
        return result

    async def gemv_async(self, m: int, n: int, a: BufferLike, x: BufferLike, y: BufferLike,
                         **options: Any) -> None:
        """y = alpha * op(A) x + beta * y with A m x n column-major."""
        await self._run(_make(Gemv, m, n, self._ref(a, "a"), self._ref(x, "x"), self._ref(y, "y"),
                             **options))

    async def ger_async(self, m: int, n: int, x: BufferLike, y: BufferLike, a: BufferLike,
                        **options: Any) -> None:
        """A = alpha * x y^T + A (``conjugate=True`` for gerc)."""
        await self._run(_make(Ger, m, n, self._ref(x, "x"), self._ref(y, "y"), self._ref(a, "a"),
                            **options))

    async def geam_async(self, m: int, n: int, a: BufferLike, b: BufferLike, c: BufferLike,
                         **options: Any) -> None:
        """C = alpha * op(A) + beta * op(B), m x n column-major."""
        await self._run(_make(Geam, m, n, self._ref(a, "a"), self._ref(b, "b"), self._ref(c, "c"),
                             **options))

    async def syrk_async(self, n: int, k: int, a: BufferLike, c: BufferLike,
                         **options: Any) -> None:
        """C = alpha * A A^T + beta * C on one triangle of C (``upper``, ``trans`` options)."""
        await self._run(_make(Syrk, n, k, self._ref(a, "a"), self._ref(c, "c"), **options))

    async def trsm_async(self, m: int, n: int, a: BufferLike, b: BufferLike,
                         **options: Any) -> None:
        """Solve op(A) X = alpha B (or X op(A) = alpha B) in place into B."""
        await self._run(_make(Trsm, m, n, self._ref(a, "a"), self._ref(b, "b"), **options))

    gemm = blocking(gemm_async)
    gemm_f32 = blocking(gemm_f32_async)
    gemm_f64 = blocking(gemm_f64_async)
    matmul = blocking(matmul_async)
    gemm_strided_batched = blocking(gemm_strided_batched_async)
    axpy = blocking(axpy_async)
    dot = blocking(dot_async)
    nrm2 = blocking(nrm2_async)
    scal = blocking(scal_async)
    asum = blocking(asum_async)
    iamax = blocking(iamax_async)
    gemv = blocking(gemv_async)
    ger = blocking(ger_async)
    geam = blocking(geam_async)
    syrk = blocking(syrk_async)
    trsm = blocking(trsm_async)


def _shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    """Return ``shape`` as a tuple; an integer is a 1-D shape (``InvalidArgument`` for neither)."""
    if is_int(shape):
        return (shape,)
    if isinstance(shape, Iterable):
        return tuple(shape)
    raise InvalidArgument(f"shape must be a size or a sequence of sizes, got {shape!r}")


class Fft(Library):
    """FFTs on one device, cuFFT conventions: unnormalized inverse, contiguous C-order batches.

    ``shape`` (1 to 3 sizes; an int for 1-D) always names the logical size, the
    real side of R2C and C2R; their complex side holds ``shape[:-1] +
    (shape[-1] // 2 + 1,)`` values per item, as cuFFT and ``rfftn`` produce.
    The ``batch`` items lie end to end in each buffer, each row-major (C order),
    and the transform runs over every axis of ``shape``. Inverse transforms are
    unnormalized like cuFFT: ``inverse(forward(x)) == prod(shape) * x``. The two
    sides share one precision: f32 with c64, f64 with c128.
    """

    async def c2c_async(
        self, input: BufferLike, output: BufferLike, shape: int | Sequence[int], *,
        inverse: bool = False, batch: int = 1,
    ) -> None:
        """Transform complex ``input`` into ``output``, in place allowed (inverse unnormalized)."""
        await self._run(FftOp(self._ref(input, "input"), self._ref(output, "output"),
                              _shape(shape), FftKind.C2C, inverse, batch))

    async def r2c_async(
        self, input: BufferLike, output: BufferLike, shape: int | Sequence[int], *,
        batch: int = 1,
    ) -> None:
        """Transform real ``input`` of ``shape`` forward into its half spectrum in ``output``."""
        await self._run(FftOp(self._ref(input, "input"), self._ref(output, "output"),
                              _shape(shape), FftKind.R2C, False, batch))

    async def c2r_async(
        self, input: BufferLike, output: BufferLike, shape: int | Sequence[int], *,
        batch: int = 1,
    ) -> None:
        """Transform a half spectrum in ``input`` back (unnormalized) into real ``output``."""
        await self._run(FftOp(self._ref(input, "input"), self._ref(output, "output"),
                              _shape(shape), FftKind.C2R, True, batch))

    c2c = blocking(c2c_async)
    r2c = blocking(r2c_async)
    c2r = blocking(c2r_async)


class RngGenerator(Library):
    """Fill buffers with random numbers from one seeded stream that continues fill after fill.

    Fills are stateless ops keyed by ``(seed, offset)``: element ``i`` of a fill
    is element ``offset + i`` of the stream named by ``seed``. The generator
    keeps ``offset`` (elements drawn so far) and advances it by each fill's
    length, so two fills of ``n`` give exactly the numbers of one fill of
    ``2n`` from a fresh generator with the same seed (on the same backend).

    A fill reserves its range of the stream before it is sent, so fills awaited
    concurrently (from one event loop or several threads) never overlap; they
    take the stream in the order they were called. A fill the device refuses or
    fails (a ``GpuRuntimeError``) hands its range back when no later fill has
    reserved past it, so in sequential use a failed fill skips no numbers. Else
    the range stays used and the stream has a gap there; so it does when a fill
    times out or is cancelled, since that fill may still run.
    """

    def __init__(self, device: Device, seed: int) -> None:
        super().__init__(device)
        if not is_int(seed) or not 0 <= seed < 1 << 64:
            raise InvalidArgument(f"seed must be an int in [0, 2**64), got {seed!r}")
        self.seed = int(seed)
        self.offset = 0
        self._lock = threading.Lock()

    async def _fill(self, out: BufferLike, distribution: Distribution,
                    params: tuple[float, ...], length: int | None) -> None:
        """Reserve ``length`` elements of the stream, fill them, and hand them back on failure."""
        ref = self._ref(out, "out")
        if length is not None and (not is_int(length) or length < 0):
            raise InvalidArgument(f"length must be a non-negative int, got {length!r}")
        count = ref.length if length is None else int(length)
        with self._lock:
            start = self.offset
            self.offset = start + count
        try:
            await self._run(RngFill(ref, distribution, self.seed, start, params, length))
        except GpuRuntimeError:
            with self._lock:
                if self.offset == start + count:  # no later fill has reserved past this one
                    self.offset = start
            raise

    async def uniform_async(self, out: BufferLike, low: float = 0.0, high: float = 1.0, *,
                            length: int | None = None) -> None:
        """Fill ``out`` (f32/f64) uniformly in ``[low, high)`` (``(low, high]`` on cuRAND)."""
        await self._fill(out, Distribution.UNIFORM, (low, high), length)

    async def normal_async(self, out: BufferLike, mean: float = 0.0, stddev: float = 1.0, *,
                           length: int | None = None) -> None:
        """Fill ``out`` (f32/f64) from a normal distribution."""
        await self._fill(out, Distribution.NORMAL, (mean, stddev), length)

    async def log_normal_async(self, out: BufferLike, mean: float = 0.0, stddev: float = 1.0,
                               *, length: int | None = None) -> None:
        """Fill ``out`` (f32/f64) with ``exp`` of normal draws of ``mean`` and ``stddev``."""
        await self._fill(out, Distribution.LOG_NORMAL, (mean, stddev), length)

    async def poisson_async(self, out: BufferLike, lam: float, *,
                            length: int | None = None) -> None:
        """Fill ``out`` (i32/u32) from a Poisson distribution of mean ``lam``."""
        await self._fill(out, Distribution.POISSON, (lam,), length)

    async def exponential_async(self, out: BufferLike, scale: float = 1.0, *,
                                length: int | None = None) -> None:
        """Fill ``out`` (f32/f64) from an exponential distribution of mean ``scale``."""
        await self._fill(out, Distribution.EXPONENTIAL, (scale,), length)

    async def bits_async(self, out: BufferLike, *, length: int | None = None) -> None:
        """Fill ``out`` (u32) with raw 32-bit words, like ``curandGenerate``."""
        await self._fill(out, Distribution.BITS, (), length)

    uniform = blocking(uniform_async)
    normal = blocking(normal_async)
    log_normal = blocking(log_normal_async)
    poisson = blocking(poisson_async)
    exponential = blocking(exponential_async)
    bits = blocking(bits_async)

    def __repr__(self) -> str:
        return f"RngGenerator(seed={self.seed}, offset={self.offset})"


class Solver(Library):
    """Dense solvers on one device, LAPACK conventions: column-major, in place, 1-based pivots.

    Options are the op's remaining fields: leading dimensions (``lda``, ...),
    ``upper``, ``trans``/``conj``, ``vectors``, and ``stride*`` for the batched
    calls, whose small outputs (pivots, singular values, eigenvalues) are packed
    tightly. A failed factorization (singular, not positive definite, no
    convergence) raises ``LibraryError``.
    """

    async def getrf_async(self, a: BufferLike, ipiv: BufferLike, m: int, n: int,
                          **options: Any) -> None:
        """Factor the m x n A = P L U in place; ``ipiv`` (i32, ``min(m, n)``) gets the pivots."""
        await self._run(_make(Getrf, self._ref(a, "a"), self._ref(ipiv, "ipiv"), m, n, **options))

    async def getrs_async(self, a: BufferLike, ipiv: BufferLike, b: BufferLike, n: int,
                          nrhs: int, **options: Any) -> None:
        """Solve op(A) X = B in place into B (n x nrhs) from ``getrf``'s factors and pivots."""
        await self._run(_make(Getrs, self._ref(a, "a"), self._ref(ipiv, "ipiv"), self._ref(b, "b"),
                              n, nrhs, **options))

    async def potrf_async(self, a: BufferLike, n: int, **options: Any) -> None:
        """Factor the Hermitian positive definite n x n A in place (Cholesky, lower by default)."""
        await self._run(_make(Potrf, self._ref(a, "a"), n, **options))

    async def potrs_async(self, a: BufferLike, b: BufferLike, n: int, nrhs: int,
                          **options: Any) -> None:
        """Solve A X = B in place into B (n x nrhs) from ``potrf``'s factor."""
        await self._run(_make(Potrs, self._ref(a, "a"), self._ref(b, "b"), n, nrhs, **options))

    async def geqrf_async(self, a: BufferLike, tau: BufferLike, m: int, n: int,
                          **options: Any) -> None:
        """Factor the m x n A = Q R in place, Householder scalars into ``tau``."""
        await self._run(_make(Geqrf, self._ref(a, "a"), self._ref(tau, "tau"), m, n, **options))

    async def orgqr_async(self, a: BufferLike, tau: BufferLike, m: int, n: int, k: int,
                          **options: Any) -> None:
        """Form the first n columns of Q in place from ``geqrf``'s k reflectors."""
        await self._run(_make(Orgqr, self._ref(a, "a"), self._ref(tau, "tau"), m, n, k, **options))

    async def gesvd_async(self, a: BufferLike, s: BufferLike, u: BufferLike | None,
                          vt: BufferLike | None, m: int, n: int, **options: Any) -> None:
        """Decompose the m x n A = U diag(s) VT (full U and VT; pass None to skip either)."""
        await self._run(_make(Gesvd,
            self._ref(a, "a"), self._ref(s, "s"), None if u is None else self._ref(u, "u"),
            None if vt is None else self._ref(vt, "vt"), m, n, **options))

    async def syevd_async(self, a: BufferLike, w: BufferLike, n: int, **options: Any) -> None:
        """Put the eigenvalues of Hermitian A in ``w`` (ascending), eigenvectors into A."""
        await self._run(_make(Syevd, self._ref(a, "a"), self._ref(w, "w"), n, **options))

    async def getrf_batched_async(self, a: BufferLike, ipiv: BufferLike, n: int, batch: int,
                                  **options: Any) -> None:
        """Factor ``batch`` n x n matrices in place as ``getrf``; n pivots per matrix."""
        await self._run(_make(GetrfBatched, self._ref(a, "a"), self._ref(ipiv, "ipiv"), n, batch,
                                     **options))

    async def getrs_batched_async(self, a: BufferLike, ipiv: BufferLike, b: BufferLike, n: int,
                                  nrhs: int, batch: int, **options: Any) -> None:
        """Solve ``batch`` systems in place as ``getrs`` from ``getrf_batched``'s output."""
        await self._run(_make(GetrsBatched, self._ref(a, "a"), self._ref(ipiv, "ipiv"),
                                     self._ref(b, "b"), n, nrhs, batch, **options))

    async def potrf_batched_async(self, a: BufferLike, n: int, batch: int,
                                  **options: Any) -> None:
        """Factor ``batch`` Hermitian positive definite matrices in place as ``potrf``."""
        await self._run(_make(PotrfBatched, self._ref(a, "a"), n, batch, **options))

    async def potrs_batched_async(self, a: BufferLike, b: BufferLike, n: int, nrhs: int,
                                  batch: int, **options: Any) -> None:
        """Solve ``batch`` systems in place as ``potrs`` from ``potrf_batched``'s factors."""
        await self._run(_make(PotrsBatched, self._ref(a, "a"), self._ref(b, "b"), n, nrhs, batch,
                                     **options))

    async def syevd_batched_async(self, a: BufferLike, w: BufferLike, n: int, batch: int,
                                  **options: Any) -> None:
        """Find the eigenpairs of ``batch`` Hermitian matrices as ``syevd``; n values each."""
        await self._run(_make(SyevdBatched, self._ref(a, "a"), self._ref(w, "w"), n, batch,
                                     **options))

    async def gesvd_batched_async(self, a: BufferLike, s: BufferLike, u: BufferLike | None,
                                  vt: BufferLike | None, m: int, n: int, batch: int,
                                  **options: Any) -> None:
        """Decompose ``batch`` matrices of at most 32 x 32 as ``gesvd``."""
        await self._run(_make(GesvdBatched,
            self._ref(a, "a"), self._ref(s, "s"), None if u is None else self._ref(u, "u"),
            None if vt is None else self._ref(vt, "vt"), m, n, batch, **options))

    getrf = blocking(getrf_async)
    getrs = blocking(getrs_async)
    potrf = blocking(potrf_async)
    potrs = blocking(potrs_async)
    geqrf = blocking(geqrf_async)
    orgqr = blocking(orgqr_async)
    gesvd = blocking(gesvd_async)
    syevd = blocking(syevd_async)
    getrf_batched = blocking(getrf_batched_async)
    getrs_batched = blocking(getrs_batched_async)
    potrf_batched = blocking(potrf_batched_async)
    potrs_batched = blocking(potrs_batched_async)
    syevd_batched = blocking(syevd_batched_async)
    gesvd_batched = blocking(gesvd_batched_async)


class Sparse(Library):
    """Sparse products on one device, cuSPARSE conventions: CSR matrices, dense column-major.

    ``csr`` names a CSR matrix held in three buffers of this device (zero-based
    i32 ``indptr`` and ``indices``, and ``values``); ``spmv`` and ``spmm`` take
    it with the options of ``CsrSpMV`` and ``CsrSpMM`` (``alpha``, ``beta``,
    ``trans``, ``ldb``, ``ldc``).
    """

    async def csr_async(self, indptr: BufferLike, indices: BufferLike, values: BufferLike,
                        rows: int, cols: int, nnz: int | None = None) -> CsrMatrix:
        """Return the ``rows`` x ``cols`` CSR matrix of three buffers (nnz: ``len(values)``)."""
        values_ref = self._ref(values, "values")
        return checked(CsrMatrix(self._ref(indptr, "indptr"), self._ref(indices, "indices"),
                                 values_ref, rows, cols, values_ref.length if nnz is None else nnz))

    async def spmv_async(self, a: CsrMatrix, x: BufferLike, y: BufferLike,
                         **options: Any) -> None:
        """y = alpha * op(A) x + beta * y for a CSR A (``trans=True`` for A^T)."""
        await self._run(_make(CsrSpMV, a, self._ref(x, "x"), self._ref(y, "y"), **options))

    async def spmm_async(self, a: CsrMatrix, b: BufferLike, c: BufferLike, n: int,
                         **options: Any) -> None:
        """C = alpha * A B + beta * C for a CSR A, with B (cols x n) and C column-major."""
        await self._run(_make(CsrSpMM, a, self._ref(b, "b"), self._ref(c, "c"), n, **options))

    csr = blocking(csr_async)
    spmv = blocking(spmv_async)
    spmm = blocking(spmm_async)


def _einsum_modes(subscripts: str) -> tuple[str, str, str]:
    """Split ``"ab,bc->ac"`` into its three mode strings (whitespace is ignored)."""
    inputs, arrow, output = "".join(subscripts.split()).partition("->")
    operands = inputs.split(",")
    if not arrow or len(operands) != 2:
        raise InvalidArgument(
            f"einsum takes two inputs and an explicit output, like 'ab,bc->ac'; "
            f"got {subscripts!r}"
        )
    return operands[0], operands[1], output


class Tensor(Library):
    """Tensor contractions on one device: dense row-major tensors with one-letter mode labels.

    Options are ``alpha`` and ``beta`` (``C = alpha * contract(A, B) + beta * C``);
    each call returns the name of the implementation that ran.
    """

    async def contract_async(
        self, a: BufferLike, a_modes: str, a_shape: Sequence[int],
        b: BufferLike, b_modes: str, b_shape: Sequence[int],
        c: BufferLike, c_modes: str, c_shape: Sequence[int], **options: Any,
    ) -> str:
        """Contract A and B into C over their mode labels; return the implementation's name."""
        result: str = await self._run(_make(Contract,
            self._ref(a, "a"), a_modes, tuple(a_shape), self._ref(b, "b"), b_modes,
            tuple(b_shape), self._ref(c, "c"), c_modes, tuple(c_shape), **options))
        return result

    async def einsum_async(
        self, subscripts: str, a: BufferLike, a_shape: Sequence[int], b: BufferLike,
        b_shape: Sequence[int], c: BufferLike, c_shape: Sequence[int], **options: Any,
    ) -> str:
        """Contract as ``subscripts`` says (``"ab,bc->ac"``); return the implementation's name."""
        a_modes, b_modes, c_modes = _einsum_modes(subscripts)
        return await self.contract_async(a, a_modes, a_shape, b, b_modes, b_shape,
                                         c, c_modes, c_shape, **options)

    contract = blocking(contract_async)
    einsum = blocking(einsum_async)
