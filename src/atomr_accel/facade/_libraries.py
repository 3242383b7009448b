"""Library handles: ``Blas``, ``Fft``, ``RngGenerator``, ``Solver``, ``Sparse``, ``Tensor``.

Each method builds an op from buffers and options and runs it on the device;
each has an ``*_async`` twin. Options not spelled out in a signature are the
fields of the op class of the same name (see ``atomr_accel.core.ops``).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from atomr_accel.core._api import choice
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import DTypeMismatch, GpuRuntimeError, InvalidArgument
from atomr_accel.core._op import Op, checked, is_int, validated
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._fft import Fft as FftOp
from atomr_accel.core.ops._fft import (
    FftKind,
    FftMany,
    r2c_output_len,
    r2c_output_len_2d,
    r2c_output_len_3d,
    r2c_output_len_many,
)
from atomr_accel.core.ops._rng import Generator, RngFill
from atomr_accel.core.ops._sparse import CsrMatrix
from atomr_accel.facade._api import BlasApi, FftApi, RngApi, SolverApi, SparseApi, TensorApi
from atomr_accel.facade._buffers import BufferLike, typed_ref
from atomr_accel.facade._generate import Generated
from atomr_accel.facade._host_arrays import host_array
from atomr_accel.facade._portal import blocking

if TYPE_CHECKING:
    from atomr_accel.facade._device import Device

__all__ = ["Blas", "Fft", "Library", "RngGenerator", "Solver", "Sparse", "Tensor", "handle_class"]

T = TypeVar("T")


async def ready(value: T) -> T:
    """An awaitable of a value computed already."""
    return value


_HANDLES: dict[str, type[Library]] = {}


def handle_class(name: str) -> type[Library]:
    """The handle class named ``name`` (a catalogued library's ``handle``, ``"Blas"``);
    ``InvalidArgument`` when no module defining it has been imported."""
    try:
        return _HANDLES[name]
    except KeyError:
        raise InvalidArgument(f"no handle class {name!r} is defined") from None


class Library:
    """Base of the handles: turns buffers into refs and runs ops on one device.

    Every subclass is found by its class name (``handle_class``), so a catalogued
    library's ``Device`` accessor builds it."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _HANDLES[cls.__name__] = cls

    def __init__(self, device: Device) -> None:
        self.device = device
        self._portal = device._portal
        self._run: Callable[..., Coroutine[Any, Any, Any]] = device.run_async
        """Run an op on the device (awaited: the device's own coroutine, no extra frame)."""

    def _ref(self, buffer: BufferLike, name: str, dtypes: Iterable[DType] | None = None) -> GpuRef:
        return typed_ref(self.device.ref_of(buffer, name), name, dtypes)

    def _submit(self, op: Op, timeout_secs: float | None) -> Coroutine[Any, Any, Any]:
        """Check ``op`` now (raises ``InvalidArgument``) and return the awaitable of its run."""
        return self._run(validated(op), timeout_secs, checked=True)

    def _call(self, op: Op, timeout_secs: float | None) -> Any:
        """Check ``op`` now and run it, waiting on this thread (the blocking methods)."""
        return self.device._call_now(validated(op), timeout_secs)


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


_DIRECTION = choice("direction", {"forward": False, "fwd": False, "f": False, "inverse": True,
                                  "inv": True, "backward": True, "i": True})
"""The original package's FFT directions (case-insensitive) as ``inverse``."""

_LANES = {  # the original's kind names per precision: (kind, real dtype, complex dtype)
    "f32": ({"r2c": FftKind.R2C, "c2r": FftKind.C2R, "c2c": FftKind.C2C}, DType.F32, DType.C64),
    "f64": ({"d2z": FftKind.R2C, "z2d": FftKind.C2R, "z2z": FftKind.C2C}, DType.F64, DType.C128),
}


def _lane_kind(lane: str, kind: object) -> FftKind:
    """The op's kind for one of the original's kind names on ``lane`` (any case)."""
    kinds = _LANES[lane][0]
    chosen = kinds.get(kind.lower()) if isinstance(kind, str) else None
    if chosen is None:
        raise InvalidArgument(f"kind must be one of {', '.join(kinds)} on the {lane} lane, "
                              f"got {kind!r}")
    return chosen


def _length(src: np.ndarray[Any, Any], n: int | None, batch: object) -> Any:
    """A 1-D one-shot transform's length: ``n``, or all of ``src`` shared by ``batch`` items
    (``_one_shot`` checks what this answers)."""
    if n is not None:
        return n
    return src.size // (batch if is_int(batch) and batch > 0 else 1)


class Fft(Library, FftApi):
    """FFTs on one device, cuFFT conventions: unnormalized inverse, contiguous C-order batches.

    ``shape`` (1 to 3 sizes; an int for 1-D) always names the logical size, the
    real side of R2C and C2R; their complex side holds ``shape[:-1] +
    (shape[-1] // 2 + 1,)`` values per item, as cuFFT and ``rfftn`` produce.
    The ``batch`` items lie end to end in each buffer, each row-major (C order),
    and the transform runs over every axis of ``shape``. Inverse transforms are
    unnormalized like cuFFT: ``inverse(forward(x)) == prod(shape) * x``. The two
    sides share one precision: f32 with c64, f64 with c128. ``plan_many`` takes
    cuFFT's advanced layout (strides, distances, embeddings).

    The original package's forms stand beside ours: one-shot transforms of host
    arrays (``forward_1d_r2c_f32``, ...), ``exec_typed_f32/f64`` and
    ``exec_plan_many_f32/f64`` with its kind names (r2c/c2r/c2c, d2z/z2d/z2z)
    and directions, and the ``r2c_output_len*`` helpers.
    """

    r2c_output_len = staticmethod(r2c_output_len)
    r2c_output_len_2d = staticmethod(r2c_output_len_2d)
    r2c_output_len_3d = staticmethod(r2c_output_len_3d)
    r2c_output_len_many = staticmethod(r2c_output_len_many)

    # ------------------------------------------------- the original's typed buffers

    def _sides(self, lane: str, kind: str, real_buf: BufferLike | None,
               complex_buf: BufferLike | None, complex_buf_out: BufferLike | None,
               direction: str) -> tuple[FftKind, GpuRef, GpuRef, bool]:
        """The op's kind, input, output and direction for the original's kind name, buffers
        and direction (``InvalidArgument`` for a kind of another lane or a missing buffer)."""
        chosen = _lane_kind(lane, kind)
        _, real, complex_ = _LANES[lane]
        needed = {FftKind.R2C: ("real_buf", "complex_buf"), FftKind.C2R: ("complex_buf",
                  "real_buf"), FftKind.C2C: ("complex_buf",)}[chosen]
        given = {"real_buf": real_buf, "complex_buf": complex_buf}
        for name in needed:
            if given[name] is None:
                raise InvalidArgument(f"a {kind} transform needs {name}")
        def ref(name: str, dtype: DType) -> GpuRef:
            buffer = given[name]
            assert buffer is not None
            return self._ref(buffer, name, (dtype,))
        if chosen is FftKind.R2C:
            return chosen, ref("real_buf", real), ref("complex_buf", complex_), False
        if chosen is FftKind.C2R:
            return chosen, ref("complex_buf", complex_), ref("real_buf", real), True
        out = complex_buf if complex_buf_out is None else complex_buf_out
        assert out is not None
        return (chosen, ref("complex_buf", complex_),
                self._ref(out, "complex_buf_out", (complex_,)), _DIRECTION(direction))

    def _exec_typed(self, lane: str, kind: str, real_buf: BufferLike | None,
                    complex_buf: BufferLike | None, complex_buf_out: BufferLike | None,
                    direction: str, nx: int | None, ny: int | None, nz: int | None, batch: int,
                    timeout_secs: float | None) -> Coroutine[Any, Any, None]:
        _lane_kind(lane, kind)  # the first check, as in the original
        if nx is None:
            raise InvalidArgument("nx is required")
        dims = tuple(d for d in (nx, ny, nz) if d is not None)
        for name, size in zip(("nx", "ny", "nz"), dims, strict=False):
            if not is_int(size) or size < 1:
                raise InvalidArgument(f"{name} must be >= 1, got {size!r}")
        if not is_int(batch) or batch < 1:
            raise InvalidArgument(f"batch must be >= 1, got {batch!r}")
        chosen, src, dst, inverse = self._sides(lane, kind, real_buf, complex_buf,
                                                complex_buf_out, direction)
        return self._submit(FftOp(src, dst, dims, chosen, inverse, batch), timeout_secs)

    def exec_typed_f32_async(
        self, kind: str, real_buf: BufferLike | None = None, complex_buf: BufferLike | None = None,
        complex_buf_out: BufferLike | None = None, direction: str = "forward",
        nx: int | None = None, ny: int | None = None, nz: int | None = None, batch: int = 1, *,
        timeout_secs: float | None = 10.0,
    ) -> Coroutine[Any, Any, None]:
        """The original's typed transform on f32/c64 buffers: ``kind`` r2c, c2r or c2c
        (``complex_buf_out`` defaults to ``complex_buf``: in place), sizes ``nx, ny, nz``."""
        return self._exec_typed("f32", kind, real_buf, complex_buf, complex_buf_out, direction,
                                nx, ny, nz, batch, timeout_secs)

    def exec_typed_f64_async(
        self, kind: str, real_buf: BufferLike | None = None, complex_buf: BufferLike | None = None,
        complex_buf_out: BufferLike | None = None, direction: str = "forward",
        nx: int | None = None, ny: int | None = None, nz: int | None = None, batch: int = 1, *,
        timeout_secs: float | None = 10.0,
    ) -> Coroutine[Any, Any, None]:
        """``exec_typed_f32`` on f64/c128 buffers, with kinds d2z, z2d and z2z."""
        return self._exec_typed("f64", kind, real_buf, complex_buf, complex_buf_out, direction,
                                nx, ny, nz, batch, timeout_secs)

    exec_typed_f32 = blocking(exec_typed_f32_async)
    exec_typed_f64 = blocking(exec_typed_f64_async)

    def _plan_many(self, lane: str, real_buf: BufferLike | None, complex_buf: BufferLike | None,
                   complex_buf_out: BufferLike | None, rank: int, n: Sequence[int],
                   inembed: Sequence[int] | None, istride: int, idist: int,
                   onembed: Sequence[int] | None, ostride: int, odist: int, batch: int,
                   kind: str, direction: str,
                   timeout_secs: float | None) -> Coroutine[Any, Any, None]:
        chosen, src, dst, inverse = self._sides(lane, kind, real_buf, complex_buf,
                                                complex_buf_out, direction)
        return self._submit(FftMany(
            src, dst, rank, tuple(n), chosen, inverse, batch,
            None if inembed is None else tuple(inembed), istride, idist,
            None if onembed is None else tuple(onembed), ostride, odist), timeout_secs)

    def exec_plan_many_f32_async(
        self, real_buf: BufferLike | None = None, complex_buf: BufferLike | None = None,
        complex_buf_out: BufferLike | None = None, rank: int = 1, n: Sequence[int] = (),
        inembed: Sequence[int] | None = None, istride: int = 1, idist: int = 0,
        onembed: Sequence[int] | None = None, ostride: int = 1, odist: int = 0, batch: int = 1,
        kind: str = "r2c", direction: str = "forward", *, timeout_secs: float | None = 10.0,
    ) -> Coroutine[Any, Any, None]:
        """The original's plan-many transform on f32/c64 buffers (``plan_many``'s layout)."""
        return self._plan_many("f32", real_buf, complex_buf, complex_buf_out, rank, n, inembed,
                               istride, idist, onembed, ostride, odist, batch, kind, direction,
                               timeout_secs)

    def exec_plan_many_f64_async(
        self, real_buf: BufferLike | None = None, complex_buf: BufferLike | None = None,
        complex_buf_out: BufferLike | None = None, rank: int = 1, n: Sequence[int] = (),
        inembed: Sequence[int] | None = None, istride: int = 1, idist: int = 0,
        onembed: Sequence[int] | None = None, ostride: int = 1, odist: int = 0, batch: int = 1,
        kind: str = "d2z", direction: str = "forward", *, timeout_secs: float | None = 10.0,
    ) -> Coroutine[Any, Any, None]:
        """``exec_plan_many_f32`` on f64/c128 buffers, with kinds d2z, z2d and z2z."""
        return self._plan_many("f64", real_buf, complex_buf, complex_buf_out, rank, n, inembed,
                               istride, idist, onembed, ostride, odist, batch, kind, direction,
                               timeout_secs)

    exec_plan_many_f32 = blocking(exec_plan_many_f32_async)
    exec_plan_many_f64 = blocking(exec_plan_many_f64_async)

    # ------------------------------------------------ the original's one-shot transforms

    def _one_shot(self, src: Any, dtype: DType, shape: tuple[int, ...], batch: int,
                  kind: FftKind, inverse: bool, timeout_secs: float | None,
                  ) -> Coroutine[Any, Any, np.ndarray[Any, Any]]:
        """Check a host array of ``batch`` items for the transform, then run it on copies.

        ``src`` is read by its logical indices in C order (its shape is the
        transform's, so a Fortran-ordered array means the same as its C copy)."""
        data = host_array(src, "src")
        if data.dtype != dtype.numpy:
            raise DTypeMismatch(f"src has dtype {data.dtype}; this transform takes {dtype.value}")
        if not is_int(batch) or batch < 1:
            raise InvalidArgument(f"batch must be >= 1, got {batch!r}")
        for size in shape:
            if not is_int(size) or size < 1:
                raise InvalidArgument(f"sizes must be >= 1, got {shape!r}")
        real = math.prod(shape)
        half = math.prod(shape[:-1]) * (shape[-1] // 2 + 1)
        needed, out_len, out_dtype = {
            FftKind.R2C: (real, half, dtype.complex), FftKind.C2R: (half, real, dtype.real),
            FftKind.C2C: (real, real, dtype)}[kind]
        if data.size != needed * batch:
            raise InvalidArgument(f"src holds {data.size} values; {batch} item(s) of this "
                                  f"transform need {needed * batch}")
        return self._transform(data.reshape(-1), out_dtype, out_len * batch, shape, batch, kind,
                               inverse, timeout_secs)

    async def _transform(self, data: np.ndarray[Any, Any], out_dtype: DType, out_len: int,
                         shape: tuple[int, ...], batch: int, kind: FftKind, inverse: bool,
                         timeout_secs: float | None) -> np.ndarray[Any, Any]:
        device = self.device
        src = await device.allocate_async(data.size, DType.of(data.dtype),
                                          timeout_secs=timeout_secs)
        try:
            dst = await device.allocate_async(out_len, out_dtype, timeout_secs=timeout_secs)
            try:
                await device.copy_from_numpy_async(src, data, timeout_secs=timeout_secs)
                await self._submit(FftOp(src.ref, dst.ref, shape, kind, inverse, batch),
                                   timeout_secs)
                return await device.copy_to_numpy_async(dst, timeout_secs=timeout_secs)
            finally:
                await device.free_async(dst)
        finally:
            await device.free_async(src)

    def forward_1d_r2c_f32_async(self, src: Any, n: int | None = None, batch: int = 1, *,
                                 timeout_secs: float | None = 10.0,
                                 ) -> Coroutine[Any, Any, np.ndarray[Any, Any]]:
        """The original's one-shot R2C of a float32 host array (``batch`` items of ``n``, all
        of it by default): the complex64 half spectra, ``batch * (n // 2 + 1)`` values."""
        data = host_array(src, "src")
        return self._one_shot(data, DType.F32, (_length(data, n, batch),), batch, FftKind.R2C,
                              False, timeout_secs)

    def inverse_1d_c2r_f32_async(self, src: Any, n: int, batch: int = 1, *,
                                 timeout_secs: float | None = 10.0,
                                 ) -> Coroutine[Any, Any, np.ndarray[Any, Any]]:
        """The original's one-shot C2R (unnormalized) of complex64 half spectra into
        ``batch * n`` float32 values."""
        return self._one_shot(src, DType.C64, (n,), batch, FftKind.C2R, True, timeout_secs)

    def exec_1d_c2c_f32_async(self, src: Any, direction: str = "forward", n: int | None = None,
                              batch: int = 1, *, timeout_secs: float | None = 10.0,
                              ) -> Coroutine[Any, Any, np.ndarray[Any, Any]]:
        """The original's one-shot C2C of a complex64 host array (``direction``: forward,
        fwd, f, inverse, inv, backward or i; the inverse is unnormalized)."""
        data = host_array(src, "src")
        return self._one_shot(data, DType.C64, (_length(data, n, batch),), batch, FftKind.C2C,
                              _DIRECTION(direction), timeout_secs)

    def forward_2d_r2c_f32_async(self, src: Any, nx: int, ny: int, *,
                                 timeout_secs: float | None = 10.0,
                                 ) -> Coroutine[Any, Any, np.ndarray[Any, Any]]:
        """The original's one-shot 2-D R2C of an ``nx x ny`` float32 host array (row-major):
        ``nx * (ny // 2 + 1)`` complex64 values."""
        return self._one_shot(src, DType.F32, (nx, ny), 1, FftKind.R2C, False, timeout_secs)

    forward_1d_r2c_f32 = blocking(forward_1d_r2c_f32_async)
    inverse_1d_c2r_f32 = blocking(inverse_1d_c2r_f32_async)
    exec_1d_c2c_f32 = blocking(exec_1d_c2c_f32_async)
    forward_2d_r2c_f32 = blocking(forward_2d_r2c_f32_async)


class RngGenerator(Library, RngApi):
    """Fill buffers with random numbers from one seeded stream that continues fill after fill.

    Fills are stateless ops keyed by ``(seed, offset)``: element ``i`` of a fill
    is element ``offset + i`` of the stream named by ``seed`` and the generator
    kind (``set_generator``: philox, xorwow, mrg32k3a, mtgp32, sobol32/64 and
    scrambled; ``Generator`` says what each backend draws). The handle keeps
    ``offset`` (elements drawn so far) and advances it by each fill's length,
    so two fills of ``n`` give exactly the numbers of one fill of ``2n`` from a
    fresh generator with the same seed (on the same backend).

    A fill reserves its range of the stream before it is sent, so fills awaited
    concurrently (from one event loop or several threads) never overlap; they
    take the stream in the order they were called. A fill the device refuses or
    fails (a ``GpuRuntimeError``) hands its range back when no later fill has
    reserved past it, so in sequential use a failed fill skips no numbers. Else
    the range stays used and the stream has a gap there; so it does when a fill
    times out or is cancelled, since that fill may still run.

    Ours (``uniform(out, low, high)``, ..., any float dtype) and the original
    package's forms (``uniform_f32(buf, lo, hi)``, ``exponential_f64(buf, lam)``
    with a rate, ``uniform_u32(buf)``, ``set_seed``, ``set_generator``) stand
    side by side.
    """

    def __init__(self, device: Device, seed: int) -> None:
        super().__init__(device)
        self.seed = _seed(seed)
        self.offset = 0
        self.generator = Generator.DEFAULT
        self._lock = threading.Lock()

    def set_seed_async(self, seed: int, timeout_secs: float | None = 10.0,
                       ) -> Coroutine[Any, Any, None]:
        """Name the stream by ``seed`` and start it again (offset 0)."""
        chosen = _seed(seed)
        with self._lock:
            self.seed, self.offset = chosen, 0
        return ready(None)

    def set_generator_async(self, kind: Generator | str, timeout_secs: float | None = 10.0,
                            ) -> Coroutine[Any, Any, None]:
        """Draw from generator ``kind`` (the original's names, any case: default,
        pseudo_default, philox, philox4_32_10, xorwow, mrg32k3a, mtgp32, sobol32,
        scrambled_sobol32, sobol64, scrambled_sobol64), from the start of its stream."""
        chosen = Generator.parse(kind)
        with self._lock:
            self.generator, self.offset = chosen, 0
        return ready(None)

    set_seed = blocking(set_seed_async)
    set_generator = blocking(set_generator_async)

    def _submit(self, op: Op, timeout_secs: float | None) -> Coroutine[Any, Any, Any]:
        """Reserve the fill's range of the stream and send it with this handle's seed and
        generator (``InvalidArgument`` before anything is reserved)."""
        assert isinstance(op, RngFill)
        with self._lock:
            start = self.offset
            op = validated(dataclasses.replace(op, seed=self.seed, offset=start,
                                               generator=self.generator))
            self.offset = start + op.count
        return self._fill(op, start, timeout_secs)

    _call = Generated._call  # through _submit, which reserves the fill's range

    async def _fill(self, op: RngFill, start: int, timeout_secs: float | None) -> None:
        """Run the fill; hand its range back if it failed and no later fill reserved past it."""
        try:
            await self._run(op, timeout_secs, checked=True)
        except GpuRuntimeError:
            with self._lock:
                if self.offset == start + op.count and self.seed == op.seed:
                    self.offset = start
            raise

    def __repr__(self) -> str:
        return (f"RngGenerator(seed={self.seed}, offset={self.offset}, "
                f"generator={self.generator.value!r})")


def _seed(seed: object) -> int:
    if not is_int(seed) or not 0 <= seed < 1 << 64:
        raise InvalidArgument(f"seed must be an int in [0, 2**64), got {seed!r}")
    return int(seed)


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
