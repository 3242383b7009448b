"""Library handles: ``Blas``, ``Fft``, ``RngGenerator``, ``Solver``, ``Sparse``, ``Tensor``.

Each method builds an op from buffers and options and runs it on the device;
each has an ``*_async`` twin. Options not spelled out in a signature are the
fields of the op class of the same name (see ``atomr_accel.core.ops``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import Op
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
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.facade._portal import blocking

if TYPE_CHECKING:
    from atomr_accel.facade._device import Device

__all__ = ["Blas", "Library"]

BufferLike = GpuBuffer | GpuRef


class Library:
    """Base of the handles: turns buffers into refs and runs ops on one device."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self._portal = device._portal

    def _ref(self, buffer: BufferLike, name: str, dtypes: Iterable[DType] | None = None) -> GpuRef:
        ref = self.device.ref_of(buffer, name)
        if dtypes is not None and ref.dtype not in (allowed := tuple(dtypes)):
            names = "/".join(d.value for d in allowed)
            raise InvalidArgument(f"{name} holds {ref.dtype.value}; this call needs {names}")
        return ref

    async def _run(self, op: Op) -> Any:
        return await self.device.run_async(op)


_F32 = (DType.F32,)
_F64 = (DType.F64,)


class Blas(Library):
    """BLAS on one device, cuBLAS conventions: column-major, ``lda/ldb/ldc``, 1-based ``iamax``.

    ``matmul`` is a row-major convenience over ``gemm``.
    """

    async def gemm_async(
        self, a: BufferLike, b: BufferLike, c: BufferLike, m: int, n: int, k: int, *,
        alpha: complex = 1.0, beta: complex = 0.0, trans_a: bool = False,
        trans_b: bool = False, lda: int | None = None, ldb: int | None = None,
        ldc: int | None = None, dtypes: Iterable[DType] | None = None, **options: Any,
    ) -> None:
        """C = alpha * op(A) @ op(B) + beta * C, column-major; op(A) is m x k, op(B) k x n."""
        await self._run(Gemm(
            self._ref(a, "a", dtypes), self._ref(b, "b", dtypes), self._ref(c, "c", dtypes),
            m, n, k, alpha, beta, trans_a, trans_b, lda, ldb, ldc, **options,
        ))

    async def gemm_f32_async(
        self, a: BufferLike, b: BufferLike, c: BufferLike, m: int, n: int, k: int,
        **options: Any,
    ) -> None:
        """``gemm`` on float32 buffers (``InvalidArgument`` for any other dtype)."""
        await self.gemm_async(a, b, c, m, n, k, dtypes=_F32, **options)

    async def gemm_f64_async(
        self, a: BufferLike, b: BufferLike, c: BufferLike, m: int, n: int, k: int,
        **options: Any,
    ) -> None:
        """``gemm`` on float64 buffers (``InvalidArgument`` for any other dtype)."""
        await self.gemm_async(a, b, c, m, n, k, dtypes=_F64, **options)

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
        await self._run(GemmStridedBatched(
            self._ref(a, "a"), self._ref(b, "b"), self._ref(c, "c"), m, n, k, batch, **options))

    async def axpy_async(self, n: int, alpha: complex, x: BufferLike, y: BufferLike,
                         **options: Any) -> None:
        """y = alpha * x + y over ``n`` elements (``incx``/``incy`` options)."""
        await self._run(Axpy(n, alpha, self._ref(x, "x"), self._ref(y, "y"), **options))

    async def dot_async(self, n: int, x: BufferLike, y: BufferLike, **options: Any) -> Any:
        """Return x . y (``conjugate=True`` for dotc)."""
        return await self._run(Dot(n, self._ref(x, "x"), self._ref(y, "y"), **options))

    async def nrm2_async(self, n: int, x: BufferLike, **options: Any) -> float:
        """Return the Euclidean norm of x."""
        result: float = await self._run(Nrm2(n, self._ref(x, "x"), **options))
        return result

    async def scal_async(self, n: int, alpha: complex, x: BufferLike, **options: Any) -> None:
        """x = alpha * x."""
        await self._run(Scal(n, alpha, self._ref(x, "x"), **options))

    async def asum_async(self, n: int, x: BufferLike, **options: Any) -> float:
        """Return sum |x_i| (|re| + |im| for complex, as BLAS)."""
        result: float = await self._run(Asum(n, self._ref(x, "x"), **options))
        return result

    async def iamax_async(self, n: int, x: BufferLike, **options: Any) -> int:
        """Return the 1-based index of the largest |x_i| (0 when n is 0)."""
        result: int = await self._run(Iamax(n, self._ref(x, "x"), **options))
        return result

    async def gemv_async(self, m: int, n: int, a: BufferLike, x: BufferLike, y: BufferLike,
                         **options: Any) -> None:
        """y = alpha * op(A) x + beta * y with A m x n column-major."""
        await self._run(Gemv(m, n, self._ref(a, "a"), self._ref(x, "x"), self._ref(y, "y"),
                             **options))

    async def ger_async(self, m: int, n: int, x: BufferLike, y: BufferLike, a: BufferLike,
                        **options: Any) -> None:
        """A = alpha * x y^T + A (``conjugate=True`` for gerc)."""
        await self._run(Ger(m, n, self._ref(x, "x"), self._ref(y, "y"), self._ref(a, "a"),
                            **options))

    async def geam_async(self, m: int, n: int, a: BufferLike, b: BufferLike, c: BufferLike,
                         **options: Any) -> None:
        """C = alpha * op(A) + beta * op(B), m x n column-major."""
        await self._run(Geam(m, n, self._ref(a, "a"), self._ref(b, "b"), self._ref(c, "c"),
                             **options))

    async def syrk_async(self, n: int, k: int, a: BufferLike, c: BufferLike,
                         **options: Any) -> None:
        """C = alpha * A A^T + beta * C on one triangle of C (``upper``, ``trans`` options)."""
        await self._run(Syrk(n, k, self._ref(a, "a"), self._ref(c, "c"), **options))

    async def trsm_async(self, m: int, n: int, a: BufferLike, b: BufferLike,
                         **options: Any) -> None:
        """Solve op(A) X = alpha B (or X op(A) = alpha B) in place into B."""
        await self._run(Trsm(m, n, self._ref(a, "a"), self._ref(b, "b"), **options))

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
