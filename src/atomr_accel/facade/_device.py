"""The facade ``Device``: allocate, copy, run ops, and get library handles."""

from __future__ import annotations

import enum
from typing import Any, TypeVar

import numpy as np

from atomr_accel.actor import ActorError, ActorRef
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import GpuRefStale, GpuRuntimeError, InvalidArgument, gpu_error_of
from atomr_accel.core._op import Op
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._faults import FaultKind, InjectFault
from atomr_accel.core.ops._memory import (
    Advice,
    Advise,
    Allocate,
    CopyBuffer,
    Download,
    Free,
    Location,
    MemoryInfo,
    Prefetch,
    Upload,
)
from atomr_accel.device import (
    MISS,
    DeviceConfig,
    DeviceState,
    DeviceStats,
    GetStats,
    Journal,
    MarkDurable,
)
from atomr_accel.facade._buffers import (
    GpuBuffer,
    GpuBufferF32,
    GpuBufferF64,
    GpuBufferI32,
    GpuBufferU8,
    GpuBufferU32,
    buffer_for,
)
from atomr_accel.facade._graphs import GraphRecorder
from atomr_accel.facade._kernels import Modules, Nvrtc
from atomr_accel.facade._libraries import Blas, Fft, RngGenerator, Solver, Sparse, Tensor
from atomr_accel.facade._portal import Portal, blocking, in_blocking_call

__all__ = ["Device", "host_array"]

BufferLike = GpuBuffer | GpuRef
E = TypeVar("E", bound=enum.Enum)


def host_array(data: Any) -> np.ndarray[Any, Any]:
    """A NumPy view of ``data``: NumPy, anything with ``__array__``, DLPack, or CuPy (copied)."""
    if isinstance(data, np.ndarray):
        return data
    if hasattr(data, "__cuda_array_interface__") and hasattr(data, "get"):
        return np.asarray(data.get())  # CuPy: copy to the host
    if hasattr(data, "__dlpack__") and not hasattr(data, "__array__"):
        return np.from_dlpack(data)
    return np.asarray(data)


def _enum(kind: type[E], value: E | str) -> E:
    """``value`` as a member of ``kind`` (``InvalidArgument`` naming the choices)."""
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in kind)
        message = f"{value!r} is not a valid {kind.__name__}; choose from {choices}"
        raise InvalidArgument(message) from None


class Device:
    """One device of a ``System``: its buffers, copies, ops and library handles.

    Every method has an awaitable ``*_async`` twin; the plain method blocks the
    calling thread (never call it inside a running event loop). Every error is a
    ``GpuRuntimeError`` of ``atomr_accel`` (``InvalidArgument``, ``GpuRefStale``,
    ``SystemClosed`` once its system is closed, ``AskTimeout``, ...).
    """

    def __init__(self, ref: ActorRef, config: DeviceConfig, state: DeviceState,
                 portal: Portal, op_timeout: float | None, system: str) -> None:
        self.ref = ref
        self.config = config
        self._state = state
        self._portal = portal
        self._op_timeout = op_timeout
        self._system = system

    async def _ask(self, message: Any, timeout: float | None, what: str) -> Any:
        """Ask the device actor; the actor runtime's errors become device errors."""
        try:
            return await self._portal.acall(self.ref.ask(message, timeout=timeout))
        except GpuRuntimeError:
            raise
        except ActorError as exc:
            raise gpu_error_of(exc, self._system, what) from exc

    @property
    def device_id(self) -> int:
        """The device's id."""
        return self.config.device_id

    @property
    def backend(self) -> str:
        """``"cpu"`` or ``"cuda"``."""
        return self.config.backend

    @property
    def isolation(self) -> str:
        """``"thread"`` or ``"process"``."""
        return self.config.isolation

    @property
    def generation(self) -> int:
        """The current context generation (goes up on every rebuild)."""
        return self._state.generation

    @property
    def journal(self) -> Journal | None:
        """The journal recording this device's ops (``spawn_device(journal=...)``), or None."""
        recorder = self._state.recorder
        return None if recorder is None else recorder.journal

    @property
    def journal_stream(self) -> str | None:
        """This device's stream in its journal (``ReplayHarness(journal, stream)``), or None."""
        recorder = self._state.recorder
        return None if recorder is None else recorder.stream

    # ---------------------------------------------------------------- core

    async def run_async(self, op: Op, timeout_secs: float | None = None) -> Any:
        """Run any op on this device and return its result.

        Takes the data plane while the device is ready (the op runs on this
        thread, or is awaited on this task's loop, without an actor hop); the
        actor path while its context is (re)built, where it waits in order.
        ``timeout_secs`` (default: the system's ``op_timeout``) bounds the wait:
        past it the call raises ``AskTimeout`` (the op may still run).
        """
        if not isinstance(op, Op):
            raise InvalidArgument(f"run() takes an op, got {op!r}")
        lane = self._state.lane
        timeout = self._op_timeout if timeout_secs is None else timeout_secs
        try:
            result = lane.call(op, timeout) if in_blocking_call() else await lane.run(op, timeout)
        except GpuRuntimeError:
            raise
        except ActorError as exc:  # the runtime's time-out of an op awaited on the data plane
            raise gpu_error_of(exc, self._system, "device call") from exc
        if result is not MISS:
            return result
        with lane.detour():
            return await self._ask(op, timeout, "device call")

    run = blocking(run_async)

    def ref_of(self, buffer: BufferLike, name: str = "buffer") -> GpuRef:
        """The ``GpuRef`` of a buffer of this device (``InvalidArgument`` otherwise)."""
        if isinstance(buffer, GpuBuffer):
            if buffer.device is not self:
                raise InvalidArgument(f"{name} belongs to another device: {buffer!r}")
            return buffer.ref
        if isinstance(buffer, GpuRef):
            return buffer
        raise InvalidArgument(f"{name} must be a GpuBuffer, got {type(buffer).__name__}")

    # -------------------------------------------------------------- memory

    async def allocate_async(self, length: int, dtype: DType | str = DType.F32, *,
                             managed: bool = False, durable: bool = False) -> GpuBuffer:
        """Allocate a zero-filled buffer of ``length`` elements of ``dtype``.

        ``managed=True`` gives CUDA managed memory (see ``prefetch`` and ``advise``).
        ``durable=True`` keeps it across context rebuilds (see ``mark_durable``).
        """
        while True:
            buffer = buffer_for(self, await self.run_async(
                Allocate(DType.of(dtype), length, managed)))
            if not durable:
                return buffer
            try:
                await self.mark_durable_async(buffer)
            except GpuRefStale:
                continue  # a rebuild came between the two asks and took the buffer: again
            return buffer

    allocate = blocking(allocate_async)

    async def prefetch_async(self, buffer: BufferLike,
                             location: Location | str = Location.DEVICE) -> None:
        """Migrate a managed buffer to ``"device"`` or ``"host"`` ahead of use."""
        await self.run_async(Prefetch(self.ref_of(buffer), _enum(Location, location)))

    prefetch = blocking(prefetch_async)

    async def advise_async(self, buffer: BufferLike, advice: Advice | str) -> None:
        """Give the driver a usage hint for a managed buffer (``"read_mostly"``, ...)."""
        await self.run_async(Advise(self.ref_of(buffer), _enum(Advice, advice)))

    advise = blocking(advise_async)

    async def allocate_f32_async(self, length: int, *, durable: bool = False) -> GpuBufferF32:
        """Allocate a zero-filled float32 buffer (``durable``: see ``allocate``)."""
        return await self.allocate_async(  # type: ignore[return-value]
            length, DType.F32, durable=durable)

    async def allocate_f64_async(self, length: int, *, durable: bool = False) -> GpuBufferF64:
        """Allocate a zero-filled float64 buffer (``durable``: see ``allocate``)."""
        return await self.allocate_async(  # type: ignore[return-value]
            length, DType.F64, durable=durable)

    async def allocate_i32_async(self, length: int, *, durable: bool = False) -> GpuBufferI32:
        """Allocate a zero-filled int32 buffer (``durable``: see ``allocate``)."""
        return await self.allocate_async(  # type: ignore[return-value]
            length, DType.I32, durable=durable)

    async def allocate_u32_async(self, length: int, *, durable: bool = False) -> GpuBufferU32:
        """Allocate a zero-filled uint32 buffer (``durable``: see ``allocate``)."""
        return await self.allocate_async(  # type: ignore[return-value]
            length, DType.U32, durable=durable)

    async def allocate_u8_async(self, length: int, *, durable: bool = False) -> GpuBufferU8:
        """Allocate a zero-filled uint8 buffer (``durable``: see ``allocate``)."""
        return await self.allocate_async(  # type: ignore[return-value]
            length, DType.U8, durable=durable)

    allocate_f32 = blocking(allocate_f32_async)
    allocate_f64 = blocking(allocate_f64_async)
    allocate_i32 = blocking(allocate_i32_async)
    allocate_u32 = blocking(allocate_u32_async)
    allocate_u8 = blocking(allocate_u8_async)

    async def mark_durable_async(self, buffer: BufferLike) -> None:
        """Keep ``buffer`` across context rebuilds: its contents come back from the journal.

        After a rebuild the device replays the journaled ops that produced the
        buffer before it runs anything else, and the handle is moved to the new
        context (``is_stale()`` stays False). Needs ``spawn_device(journal=...)``
        (``InvalidArgument`` otherwise); a freed or foreign buffer is an
        ``InvalidArgument``, one lost to an earlier rebuild a ``GpuRefStale``.
        """
        ref = self.ref_of(buffer)
        holder = buffer if isinstance(buffer, GpuBuffer) else None
        await self._ask(MarkDurable(ref, holder), self._op_timeout, "mark_durable")

    mark_durable = blocking(mark_durable_async)

    async def free_async(self, buffer: BufferLike) -> None:
        """Release a buffer; using it afterwards is an ``InvalidArgument``."""
        await self.run_async(Free(self.ref_of(buffer)))

    free = blocking(free_async)

    async def copy_from_numpy_async(
        self, buffer: BufferLike, array: Any, offset: int | None = None
    ) -> None:
        """Copy a host array (flattened in C order) into ``buffer``.

        The array's dtype must be the buffer's. Without ``offset`` it must have
        exactly ``len(buffer)`` elements; with ``offset`` it must fit after it.
        """
        ref = self.ref_of(buffer)
        data = host_array(array)
        if data.dtype != ref.dtype.numpy:
            raise InvalidArgument(
                f"array has dtype {data.dtype} but the buffer holds {ref.dtype.value}; "
                f"convert it with .astype(np.{ref.dtype.numpy.name})"
            )
        if offset is None and data.size != ref.length:
            raise InvalidArgument(
                f"array has {data.size} elements but the buffer holds {ref.length}; "
                "pass offset= to copy into part of it"
            )
        flat = np.ascontiguousarray(data).reshape(-1)
        await self.run_async(Upload(ref, flat, offset or 0))

    copy_from_numpy = blocking(copy_from_numpy_async)

    async def copy_to_numpy_async(
        self, buffer: BufferLike, offset: int = 0, length: int | None = None,
        shape: tuple[int, ...] | None = None,
    ) -> np.ndarray[Any, Any]:
        """Copy ``length`` elements (all by default) from ``offset`` into a new host array.

        ``shape`` reshapes it (C order); a shape of another size is an ``InvalidArgument``.
        """
        result: np.ndarray[Any, Any] = await self.run_async(
            Download(self.ref_of(buffer), offset, length))
        if shape is None:
            return result
        try:
            return result.reshape(shape)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(
                f"cannot shape the {result.size} elements copied as {shape!r}") from exc

    copy_to_numpy = blocking(copy_to_numpy_async)

    async def copy_async(
        self, src: BufferLike, dst: BufferLike, length: int | None = None,
        src_offset: int = 0, dst_offset: int = 0,
    ) -> None:
        """Copy elements between two buffers of this device."""
        src_ref, dst_ref = self.ref_of(src, "src"), self.ref_of(dst, "dst")
        count = min(src_ref.length - src_offset, dst_ref.length - dst_offset) \
            if length is None else length
        await self.run_async(CopyBuffer(src_ref, dst_ref, count, src_offset, dst_offset))

    copy = blocking(copy_async)

    # ------------------------------------------------------------- observe

    async def stats_async(self) -> DeviceStats:
        """A snapshot: status, generation, restarts, in-flight ops, queue depth, counters,
        bytes allocated and device memory.

        Answered at once by the device actor, never queued behind ops: the memory
        figures are the last ``memory_info()`` reading adjusted by the allocations
        and frees since (exact on the CPU backend); call ``memory_info()`` first
        for a fresh reading.
        """
        stats: DeviceStats = await self._ask(GetStats(), self._op_timeout, "stats")
        return stats

    stats = blocking(stats_async)

    async def memory_info_async(self) -> tuple[int, int]:
        """``(free_bytes, total_bytes)`` of the device, read now (``stats()`` caches it)."""
        info: tuple[int, int] = await self.run_async(MemoryInfo())
        return info

    memory_info = blocking(memory_info_async)

    async def inject_fault_async(self, kind: FaultKind | str, delay: float = 0.0) -> None:
        """Make the context fail on purpose (tests and demos); raises the fault's error."""
        await self.run_async(InjectFault(_enum(FaultKind, kind), delay))

    inject_fault = blocking(inject_fault_async)

    # ----------------------------------------------------------- libraries

    def blas(self) -> Blas:
        """Return the BLAS handle (gemm, gemv, axpy, ...)."""
        return Blas(self)

    def fft(self) -> Fft:
        """Return the FFT handle (c2c, r2c, c2r)."""
        return Fft(self)

    def rng(self, seed: int = 0) -> RngGenerator:
        """Return a new random generator on the stream named by ``seed``, at offset 0."""
        return RngGenerator(self, seed)

    def solver(self) -> Solver:
        """Return the dense solver handle (getrf, potrf, gesvd, syevd, ... and batched forms)."""
        return Solver(self)

    def sparse(self) -> Sparse:
        """Return the sparse handle (csr, spmv, spmm)."""
        return Sparse(self)

    def tensor(self) -> Tensor:
        """Return the tensor handle (contract, einsum)."""
        return Tensor(self)

    def nvrtc(self) -> Nvrtc:
        """Return the NVRTC handle: compile CUDA C into ``NvrtcKernel``s (CUDA devices)."""
        return Nvrtc(self)

    def modules(self) -> Modules:
        """Return the module handle: load PTX or cubin and get its kernels (CUDA devices)."""
        return Modules(self)

    def record_graph(self) -> GraphRecorder:
        """Start recording library calls into a ``Graph`` (``recorder.capture()`` ends it)."""
        return GraphRecorder(self)

    def __repr__(self) -> str:
        return (f"Device({self.device_id}, backend={self.backend!r}, "
                f"isolation={self.isolation!r}, generation={self.generation})")
