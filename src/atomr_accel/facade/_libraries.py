"""Library handles: ``Blas``, ``Fft``, ``RngGenerator``, ``Solver``, ``Sparse``, ``Tensor``.

Each method builds an op from buffers and options and runs it on the device;
each has an ``*_async`` twin. Options not spelled out in a signature are the
fields of the op class of the same name (see ``atomr_accel.core.ops``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import DTypeMismatch, GpuRuntimeError, InvalidArgument
from atomr_accel.core._op import Op, checked, is_int, validated
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._fft import Fft as FftOp
from atomr_accel.core.ops._fft import FftKind
from atomr_accel.core.ops._rng import Distribution, RngFill
from atomr_accel.core.ops._sparse import CsrMatrix
from atomr_accel.facade._api import BlasApi, SolverApi, SparseApi, TensorApi
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.facade._portal import blocking

if TYPE_CHECKING:
    from atomr_accel.facade._device import Device

__all__ = ["Blas", "Fft", "Library", "RngGenerator", "Solver", "Sparse", "Tensor"]

BufferLike = GpuBuffer | GpuRef
T = TypeVar("T")


async def ready(value: T) -> T:
    """An awaitable of a value computed already."""
    return value


class Library:
    """Base of the handles: turns buffers into refs and runs ops on one device."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self._portal = device._portal
        self._run: Callable[..., Coroutine[Any, Any, Any]] = device.run_async
        """Run an op on the device (awaited: the device's own coroutine, no extra frame)."""

    def _ref(self, buffer: BufferLike, name: str, dtypes: Iterable[DType] | None = None) -> GpuRef:
        ref = self.device.ref_of(buffer, name)
        if dtypes is not None and ref.dtype not in (allowed := tuple(dtypes)):
            names = "/".join(d.value for d in allowed)
            raise DTypeMismatch(f"{name} holds {ref.dtype.value}; this call needs {names}")
        return ref

    def _submit(self, op: Op, timeout_secs: float | None) -> Coroutine[Any, Any, Any]:
        """Check ``op`` now (raises ``InvalidArgument``) and return the awaitable of its run."""
        return self._run(validated(op), timeout_secs)


_F32 = (DType.F32,)
_F64 = (DType.F64,)


class Blas(Library, BlasApi):
    """BLAS on one device, cuBLAS conventions: column-major, ``lda/ldb/ldc``, 1-based ``iamax``.

    Each op's methods come from its declaration (``atomr_accel.core.ops``): ours
    (``gemm(a, b, c, m, n, k, *, alpha=..., trans_a=False, ...)``, any dtype) and the
    original package's ``_f32`` / ``_f64`` forms (``gemm_f32(..., trans_a="N")``).
    ``matmul`` is a row-major convenience over ``gemm``.
    """

    def matmul_async(
        self, a: BufferLike, b: BufferLike, c: BufferLike, m: int, n: int, k: int, *,
        alpha: complex = 1.0, beta: complex = 0.0, timeout_secs: float | None = None,
    ) -> Coroutine[Any, Any, None]:
        """Row-major C (m x n) = alpha * A (m x k) @ B (k x n) + beta * C, as NumPy stores them."""
        # Row-major X is column-major X^T, and C^T = B^T A^T.
        return self.gemm_async(b, a, c, n, m, k, alpha=alpha, beta=beta,
                               timeout_secs=timeout_secs)

    matmul = blocking(matmul_async)


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


class Solver(Library, SolverApi):
    """Dense solvers on one device, LAPACK conventions: column-major, in place, 1-based pivots.

    Options are the op's remaining fields: leading dimensions (``lda``, ...),
    ``upper``, ``trans``/``conj``, ``vectors``, and ``stride*`` for the batched
    calls, whose small outputs (pivots, singular values, eigenvalues) are packed
    tightly. A failed factorization (singular, not positive definite, no
    convergence) raises ``LibraryError``. The original package's forms
    (``lu_f32``, ``cholesky_f64(a, n, uplo="U")``, ...) stand beside ours.
    """


class Sparse(Library, SparseApi):
    """Sparse products on one device, cuSPARSE conventions: CSR matrices, dense column-major.

    ``csr`` names a CSR matrix held in three buffers of this device (zero-based
    i32 ``indptr`` and ``indices``, and ``values``); ``spmv`` and ``spmm`` take
    it with the options of ``CsrSpMV`` and ``CsrSpMM`` (``alpha``, ``beta``,
    ``trans``, ``ldb``, ``ldc``).
    """

    def csr(self, indptr: BufferLike, indices: BufferLike, values: BufferLike, rows: int,
            cols: int, nnz: int | None = None) -> CsrMatrix:
        """Return the ``rows`` x ``cols`` CSR matrix of three buffers (nnz: ``len(values)``)."""
        values_ref = self._ref(values, "values")
        return checked(CsrMatrix(self._ref(indptr, "indptr"), self._ref(indices, "indices"),
                                 values_ref, rows, cols, values_ref.length if nnz is None else nnz))

    def csr_async(self, indptr: BufferLike, indices: BufferLike, values: BufferLike, rows: int,
                  cols: int, nnz: int | None = None) -> Coroutine[Any, Any, CsrMatrix]:
        """``csr`` as an awaitable (it needs no device work: checked at once)."""
        return ready(self.csr(indptr, indices, values, rows, cols, nnz))


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


class Tensor(Library, TensorApi):
    """Tensor contractions on one device: dense row-major tensors with one-letter mode labels.

    Options are ``alpha`` and ``beta`` (``C = alpha * contract(A, B) + beta * C``);
    each call returns the name of the implementation that ran.
    """

    def einsum_async(
        self, subscripts: str, a: BufferLike, a_shape: Sequence[int], b: BufferLike,
        b_shape: Sequence[int], c: BufferLike, c_shape: Sequence[int], *,
        alpha: complex = 1.0, beta: complex = 0.0, timeout_secs: float | None = None,
    ) -> Coroutine[Any, Any, str]:
        """Contract as ``subscripts`` says (``"ab,bc->ac"``); return the implementation's name."""
        a_modes, b_modes, c_modes = _einsum_modes(subscripts)
        return self.contract_async(a, a_modes, a_shape, b, b_modes, b_shape, c, c_modes, c_shape,
                                   alpha=alpha, beta=beta, timeout_secs=timeout_secs)

    einsum = blocking(einsum_async)
