"""The facade ``Device``: allocate, copy, run ops, and get library handles."""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from atomr_accel.actor import ActorError, ActorRef
from atomr_accel.core._catalogue import LibraryInfo, catalogue
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import (
    DTypeMismatch,
    GpuRefStale,
    GpuRuntimeError,
    InvalidArgument,
    gpu_error_of,
)
from atomr_accel.core._op import Op, validated
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._memory import (
    Advice,
    Advise,
    Allocate,
    Download,
    Location,
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
    Status,
)
from atomr_accel.facade._api import DeviceApi
from atomr_accel.facade._buffers import (
    BufferLike,
    GpuBuffer,
    buffer_for,
    typed_ref,
)
from atomr_accel.facade._graphs import GraphRecorder
from atomr_accel.facade._host_arrays import flat_elements, host_array
from atomr_accel.facade._kernels import Modules, Nvrtc, NvrtcKernel, compile_kernel_async
from atomr_accel.facade._libraries import RngGenerator, handle_class
from atomr_accel.facade._portal import (
    Portal,
    blocking,
    in_blocking_call,
    in_worker_thread,
    on_asyncio,
    wait_here,
)
from atomr_accel.facade._typed_methods import typed_allocate, typed_download, typed_upload

if TYPE_CHECKING:
    from atomr_accel.device import FunctionsStats
    from atomr_accel.facade._functions import DeviceFunction, Resident
    from atomr_accel.facade._memory import IpcMemHandle

__all__ = ["ACCESSORS", "Device"]

E = TypeVar("E", bound=enum.Enum)


def _enum(kind: type[E], value: E | str) -> E:
    """``value`` as a member of ``kind`` (``InvalidArgument`` naming the choices)."""
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in kind)
        message = f"{value!r} is not a valid {kind.__name__}; choose from {choices}"
        raise InvalidArgument(message) from None


_ORIGINAL_LIBRARIES = {"blas": "blas", "cudnn": "cudnn", "cufft": "fft", "curand": "rng",
                       "cusolver": "solver", "nvrtc": "nvrtc"}
"""The original package's ``libraries_ready`` keys and our library names."""

async def _reshaped(download: Coroutine[Any, Any, np.ndarray[Any, Any]],
                    shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """The downloaded array in ``shape`` (``InvalidArgument`` for another size)."""
    result = await download
    try:
        return result.reshape(shape)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(
            f"cannot shape the {result.size} elements copied as {shape!r}") from exc


class Device(DeviceApi):
    """One device of a ``System``: its buffers, copies, ops and library handles.

    Every method has an awaitable ``*_async`` twin, which checks its arguments
    when called; the plain method blocks the calling thread (any thread but the
    system's own event loop). Every call takes ``timeout_secs`` (None: the
    system's ``op_timeout``). Every error is a ``GpuRuntimeError`` of
    ``atomr_accel`` (``InvalidArgument``, ``GpuRefStale``, ``SystemClosed`` once
    its system is closed, ``AskTimeout``, ...).
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
        """``"thread"``, ``"process"`` or ``"ray"``."""
        return self.config.isolation

    @property
    def node(self) -> str | None:
        """The Ray node id the current context runs on (``isolation="ray"``), else None."""
        return self._state.host_node

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

    async def run_async(self, op: Op, timeout_secs: float | None = None, *,
                        checked: bool = False) -> Any:
        """Run any op on this device and return its result.

        Takes the data plane while the device is ready (the op runs on this
        thread, or is awaited on this task's loop, without an actor hop); the
        actor path while its context is (re)built, where it waits in order.
        ``timeout_secs`` (default: the system's ``op_timeout``) bounds the wait:
        past it the call raises ``AskTimeout`` (the op may still run).
        ``checked=True`` says ``op`` is what ``validated`` returned (not checked again).
        """
        if not isinstance(op, Op):
            raise InvalidArgument(f"run() takes an op, got {op!r}")
        lane = self._state.lane
        timeout = self._op_timeout if timeout_secs is None else timeout_secs
        try:
            if in_blocking_call():
                result = lane.call(op, timeout, checked)
            elif on_asyncio():
                result = await lane.run(op, timeout, checked)
            else:  # a trio task: the op runs and is waited for on a worker thread
                result = await in_worker_thread(functools.partial(
                    lane.call, op, timeout, checked))
        except GpuRuntimeError:
            raise
        except ActorError as exc:  # the runtime's time-out of an op awaited on the data plane
            raise gpu_error_of(exc, self._system, "device call") from exc
        if result is not MISS:
            return result
        with lane.detour():
            return await self._ask(op, timeout, "device call")

    def run(self, op: Op, timeout_secs: float | None = None, *, checked: bool = False) -> Any:
        """Blocking twin of ``run_async``: the op's result, waited for on this thread (never
        call it on the system's own event loop)."""
        if not isinstance(op, Op):
            raise InvalidArgument(f"run() takes an op, got {op!r}")
        return self._call_now(op, timeout_secs, checked=checked)

    def _call_now(self, op: Op, timeout_secs: float | None, *, checked: bool = True) -> Any:
        """Run ``op`` (checked already, unless ``checked=False``) and wait for it on this
        thread: straight on the data plane while it is open (no coroutine), else as
        ``run_async`` does."""
        self._portal.check_blocking()
        try:
            result = self._state.lane.call(
                op, self._op_timeout if timeout_secs is None else timeout_secs, checked)
        except GpuRuntimeError:
            raise
        except ActorError as exc:
            raise gpu_error_of(exc, self._system, "device call") from exc
        if result is not MISS:
            return result
        return wait_here(self._portal, self.run_async(op, timeout_secs, checked=checked))

    def _ref(self, buffer: BufferLike, name: str, dtypes: Iterable[DType] | None = None) -> GpuRef:
        return typed_ref(self.ref_of(buffer, name), name, dtypes)

    def _in_process_only(self, op: str) -> None:
        """Refuse an op that holds this process's objects (``Op.in_process``) where the
        context lives elsewhere; the device's entry refuses one that writes buffers of a
        device with a journal (``device._lane.prepare``)."""
        if self.isolation != "thread":
            raise InvalidArgument(f"{op} runs only on a thread-host device, not on "
                                  f"isolation={self.isolation!r}, whose buffers reach this "
                                  "process's libraries as copies (copy_from_numpy their "
                                  "results instead)")

    def _submit(self, op: Op, timeout_secs: float | None) -> Coroutine[Any, Any, Any]:
        """Check ``op`` now (raises ``InvalidArgument``) and return the awaitable of its run."""
        return self.run_async(validated(op), timeout_secs, checked=True)

    def _call(self, op: Op, timeout_secs: float | None) -> Any:
        """Check ``op`` now and run it, waiting on this thread (the blocking methods)."""
        return self._call_now(validated(op), timeout_secs)

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

    def allocate_async(self, length: int, dtype: DType | str = DType.F32, *,
                       managed: bool = False, durable: bool = False,
                       timeout_secs: float | None = None) -> Coroutine[Any, Any, GpuBuffer]:
        """Allocate a zero-filled buffer of ``length`` elements of ``dtype``.

        ``managed=True`` gives CUDA managed memory (see ``prefetch`` and ``advise``).
        ``durable=True`` keeps it across context rebuilds (see ``mark_durable``).
        """
        op = validated(Allocate(DType.of(dtype), length, managed))
        return self._allocate(op, durable, timeout_secs)

    async def _allocate(self, op: Allocate, durable: bool,
                        timeout_secs: float | None) -> GpuBuffer:
        while True:
            buffer = buffer_for(self, await self.run_async(op, timeout_secs))
            if not durable:
                return buffer
            try:
                await self.mark_durable_async(buffer, timeout_secs=timeout_secs)
            except GpuRefStale:
                continue  # a rebuild came between the two asks and took the buffer: again
            return buffer

    allocate = blocking(allocate_async)

    allocate_f32_async, allocate_f32 = typed_allocate(DType.F32)
    allocate_f64_async, allocate_f64 = typed_allocate(DType.F64)
    allocate_i32_async, allocate_i32 = typed_allocate(DType.I32)
    allocate_u32_async, allocate_u32 = typed_allocate(DType.U32)
    allocate_u8_async, allocate_u8 = typed_allocate(DType.U8)
    allocate_complex64_async, allocate_complex64 = typed_allocate(DType.C64)
    allocate_complex128_async, allocate_complex128 = typed_allocate(DType.C128)

    def prefetch_async(self, buffer: BufferLike, location: Location | str = Location.DEVICE, *,
                       timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """Migrate a managed buffer to ``"device"`` or ``"host"`` ahead of use."""
        return self._submit(Prefetch(self.ref_of(buffer), _enum(Location, location)),
                            timeout_secs)

    prefetch = blocking(prefetch_async)

    def advise_async(self, buffer: BufferLike, advice: Advice | str, *,
                     timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """Give the driver a usage hint for a managed buffer (``"read_mostly"``, ...)."""
        return self._submit(Advise(self.ref_of(buffer), _enum(Advice, advice)), timeout_secs)

    advise = blocking(advise_async)

    def mark_durable_async(self, buffer: BufferLike, *,
                           timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """Keep ``buffer`` across context rebuilds: its contents come back from the journal.

        After a rebuild the device replays the journaled ops that produced the
        buffer before it runs anything else, and the handle is moved to the new
        context (``is_stale()`` stays False). Needs ``spawn_device(journal=...)``
        (``InvalidArgument`` otherwise); a freed or foreign buffer is an
        ``InvalidArgument``, one lost to an earlier rebuild a ``GpuRefStale``.
        """
        ref = self.ref_of(buffer)
        holder = buffer if isinstance(buffer, GpuBuffer) else None
        timeout = self._op_timeout if timeout_secs is None else timeout_secs
        return self._ask(MarkDurable(ref, holder), timeout, "mark_durable")

    mark_durable = blocking(mark_durable_async)

    def copy_from_numpy_async(
        self, buffer: BufferLike, array: Any, offset: int | None = None, *,
        timeout_secs: float | None = None,
    ) -> Coroutine[Any, Any, None]:
        """Copy a host array (flattened in C order) into ``buffer``.

        ``array`` is a NumPy array, a torch tensor (any device, ``requires_grad``
        too), a CuPy array, a DLPack producer or capsule, or anything NumPy reads
        (see "Interop" in docs/devices.md). Its elements are copied by their
        logical indices in C (row-major) order, whatever the strides; an n-D
        Fortran-ordered array is an ``InvalidArgument`` (flatten it with
        ``a.ravel(order="F")`` for column-major). The array's dtype must be the
        buffer's (``DTypeMismatch``, also a ``TypeError``, otherwise). Without
        ``offset`` it must have exactly ``len(buffer)`` elements; with ``offset``
        it must fit after it.
        """
        ref = self.ref_of(buffer)
        data = host_array(array)
        if data.dtype != ref.dtype.numpy:
            raise DTypeMismatch(
                f"array has dtype {data.dtype} but the buffer holds {ref.dtype.value}; "
                f"convert it with .astype(np.{ref.dtype.numpy.name})"
            )
        if offset is None and data.size != ref.length:
            raise InvalidArgument(
                f"array has {data.size} elements but the buffer holds {ref.length}; "
                "pass offset= to copy into part of it"
            )
        flat = flat_elements(data)
        return self._submit(Upload(ref, flat, offset or 0), timeout_secs)

    copy_from_numpy = blocking(copy_from_numpy_async)

    copy_from_numpy_f64_async, copy_from_numpy_f64 = typed_upload(DType.F64)
    copy_from_numpy_i32_async, copy_from_numpy_i32 = typed_upload(DType.I32)
    copy_from_numpy_u32_async, copy_from_numpy_u32 = typed_upload(DType.U32)
    copy_from_numpy_u8_async, copy_from_numpy_u8 = typed_upload(DType.U8)
    copy_from_numpy_complex64_async, copy_from_numpy_complex64 = typed_upload(DType.C64)
    copy_from_numpy_complex128_async, copy_from_numpy_complex128 = typed_upload(DType.C128)

    def copy_to_numpy_async(
        self, buffer: BufferLike, offset: int = 0, length: int | None = None,
        shape: tuple[int, ...] | None = None, *, timeout_secs: float | None = None,
    ) -> Coroutine[Any, Any, np.ndarray[Any, Any]]:
        """Copy ``length`` elements (all by default) from ``offset`` into a new host array.

        ``shape`` reshapes it (C order); a shape of another size is an ``InvalidArgument``.
        """
        download = self._submit(Download(self.ref_of(buffer), offset, length), timeout_secs)
        return download if shape is None else _reshaped(download, shape)

    copy_to_numpy = blocking(copy_to_numpy_async)

    copy_to_numpy_f64_async, copy_to_numpy_f64 = typed_download(DType.F64)
    copy_to_numpy_i32_async, copy_to_numpy_i32 = typed_download(DType.I32)
    copy_to_numpy_u32_async, copy_to_numpy_u32 = typed_download(DType.U32)
    copy_to_numpy_u8_async, copy_to_numpy_u8 = typed_download(DType.U8)
    copy_to_numpy_complex64_async, copy_to_numpy_complex64 = typed_download(DType.C64)
    copy_to_numpy_complex128_async, copy_to_numpy_complex128 = typed_download(DType.C128)

    # ------------------------------------------------------------- observe

    def stats_async(self, *, timeout_secs: float | None = None) -> Coroutine[Any, Any, DeviceStats]:
        """A snapshot (a ``DeviceStats``, which is the original package's ``DeviceLoad``):
        status, generation, restarts, in-flight ops, queue depth, counters, bytes
        allocated, device memory and compute capability.

        Answered at once by the device actor, never queued behind ops: the memory
        figures are the last ``memory_info()`` reading adjusted by the allocations
        and frees since (exact on the CPU backend); call ``memory_info()`` first
        for a fresh reading.
        """
        timeout = self._op_timeout if timeout_secs is None else timeout_secs
        return self._ask(GetStats(), timeout, "stats")

    stats = blocking(stats_async)

    def libraries_ready_async(self, *, timeout_secs: float | None = 2.0
                              ) -> Coroutine[Any, Any, dict[str, Any]]:
        """Which libraries the device runs, in the original package's keys: ``blas``,
        ``cudnn``, ``cufft``, ``curand``, ``cusolver``, ``nvrtc`` (bools), ``extras``
        (how many other libraries: sparse, tensor, ...) and ``ready`` (the context is up)."""
        return self._libraries_ready(self.stats_async(timeout_secs=timeout_secs))

    async def _libraries_ready(self, stats: Coroutine[Any, Any, DeviceStats]) -> dict[str, Any]:
        ready = (await stats).status is Status.READY
        enabled = set(self.config.libraries)
        if not self.config.capabilities.compiles_kernels:
            enabled.discard("nvrtc")
        named = {key: library in enabled for key, library in _ORIGINAL_LIBRARIES.items()}
        extras = len(enabled - set(_ORIGINAL_LIBRARIES.values()) - {"memory"})
        return {**named, "extras": extras, "ready": ready}

    libraries_ready = blocking(libraries_ready_async)

    # ----------------------------------------------------------- libraries

    def _library(self, name: str) -> None:
        """Refuse a handle of a library this device was spawned without."""
        if name not in self.config.libraries:
            enabled = ", ".join(self.config.libraries)
            raise InvalidArgument(f"the {name} library is not enabled on this device "
                                  f"(spawn_device(libraries=...) has {enabled})")

    def rng(self, seed: int = 0, timeout_secs: float | None = None) -> RngGenerator:
        """Return a new random generator on the stream named by ``seed``, at offset 0."""
        self._library("rng")
        return RngGenerator(self, seed)

    def compile_kernel_async(self, name: str, src: str, timeout_secs: float | None = 60.0,
                             ) -> Coroutine[Any, Any, NvrtcKernel]:
        """Compile CUDA C ``src`` with NVRTC and load its ``extern "C"`` kernel ``name`` (the
        original package's form of ``nvrtc().compile``; CUDA devices)."""
        return compile_kernel_async(self, name, src, timeout_secs)

    compile_kernel = blocking(compile_kernel_async)

    def ipc_handle_async(self, buffer: GpuBuffer, timeout_secs: float | None = None,
                         ) -> Coroutine[Any, Any, IpcMemHandle]:
        """Export ``buffer`` to other processes: its ``IpcMemHandle`` (64 bytes), which
        ``open_ipc`` opens there (see ``atomr_accel.memory``)."""
        from atomr_accel.facade._memory import ipc_handle_async

        return ipc_handle_async(self, buffer, timeout_secs)

    ipc_handle = blocking(ipc_handle_async)

    def open_ipc_async(self, handle: IpcMemHandle, length: int, dtype: DType | str = "f32",
                       timeout_secs: float | None = None) -> Coroutine[Any, Any, GpuBuffer]:
        """Open another process's exported buffer as a buffer of this device that aliases it
        (no copy); freeing it unmaps it."""
        from atomr_accel.facade._memory import open_ipc_async

        return open_ipc_async(self, handle, length, dtype, timeout_secs)

    open_ipc = blocking(open_ipc_async)

    def buffer_address_async(self, buffer: GpuBuffer, timeout_secs: float | None = None,
                             ) -> Coroutine[Any, Any, int]:
        """The address of ``buffer`` in its context's process (a CUDA device pointer, or the
        NumPy data's address on the CPU), as ``ipc_get_mem_handle`` takes it."""
        from atomr_accel.facade._memory import buffer_address_async

        return buffer_address_async(self, buffer, timeout_secs)

    buffer_address = blocking(buffer_address_async)

    # ---------------------------------------------------------- user code

    def function(self, fn: Callable[..., Any], *, pure: bool = False, arrays: str = "auto",
                 keep: bool = False, name: str | None = None) -> DeviceFunction:
        """Bind ``fn`` to this device: calling the ``DeviceFunction`` runs it inside the
        device's context (this process on the thread host, the worker on the process host,
        the Ray actor on the Ray host). ``arrays`` picks what buffers arrive as
        (``"auto"``: NumPy on the CPU, CuPy on CUDA; ``"numpy"``, ``"cupy"``, ``"torch"``),
        ``keep`` leaves returned device arrays on the device as buffers, ``pure`` lets a
        call run again on a new context after its own died under it. ``fn`` is pickled
        here, once, unless it runs in this process. See ``docs/functions.md``."""
        from atomr_accel.facade._functions import make_function

        return make_function(self, fn, pure=pure, arrays=arrays, keep=keep, name=name)

    def resident_async(self, factory: Callable[..., Any], *args: Any, name: str | None = None,
                       timeout_secs: float | None = None,
                       **kwargs: Any) -> Coroutine[Any, Any, Resident]:
        """Run ``factory(*args, **kwargs)`` inside the context and keep its result there as
        a ``Resident`` (built again on every new context); ``FunctionFailed`` if it raised."""
        from atomr_accel.facade._functions import make_resident

        return make_resident(self, factory, args, kwargs, name, timeout_secs)

    resident = blocking(resident_async)

    def functions_stats(self) -> FunctionsStats:
        """This device's residents (name, the generation each was built on) and device
        functions (calls, failures, latency percentiles); never waits."""
        return self._state.functions.snapshot()

    def nvrtc(self) -> Nvrtc:
        """Return the NVRTC handle: compile CUDA C into ``NvrtcKernel``s (CUDA devices)."""
        return Nvrtc(self)

    def modules(self) -> Modules:
        """Return the module handle: load PTX or cubin and get its kernels (CUDA devices)."""
        return Modules(self)

    def record_graph(self) -> GraphRecorder:
        """Start recording library calls into a ``Graph`` (``recorder.capture()`` ends it)."""
        return GraphRecorder(self)

    def from_dlpack_async(self, data: Any, *, timeout_secs: float | None = None,
                          ) -> Coroutine[Any, Any, GpuBuffer]:
        """A buffer of ``data``'s elements (a torch tensor, CuPy or NumPy array, or any
        DLPack producer), in C order.

        On the thread host, a C-contiguous array in this device's memory (host
        memory on the CPU backend, this GPU on CUDA) is adopted without a copy:
        the buffer and the array share their memory, the buffer keeps the array
        alive, and freeing the buffer leaves the memory to the array. Anything
        else (another device's memory, a strided or conjugate view, a device with
        a journal) and every array on the process and Ray hosts is copied into a
        new buffer through the worker. Adopted or not, the buffer is generation
        checked like any other. Raises what ``copy_from_numpy`` raises for data it
        cannot read.
        """
        from atomr_accel.facade._dlpack import from_dlpack_async

        return from_dlpack_async(self, data, timeout_secs)

    from_dlpack = blocking(from_dlpack_async)

    def __repr__(self) -> str:
        return (f"Device(id={self.device_id}, backend={self.backend!r}, "
                f"isolation={self.isolation!r}, generation={self.generation})")


def _accessor(info: LibraryInfo) -> Callable[..., Any]:
    """``Device.<library>()``: the handle of a catalogued library, refused when the device
    was spawned without it."""
    name, handle = info.name, info.handle
    assert handle is not None

    def accessor(self: Device, timeout_secs: float | None = None) -> Any:
        self._library(name)
        return handle_class(handle)(self)

    accessor.__name__ = name
    accessor.__qualname__ = f"Device.{name}"
    accessor.__doc__ = f"Return the ``{handle}`` handle: {info.summary}"
    return accessor


ACCESSORS: tuple[LibraryInfo, ...] = tuple(
    info for info in catalogue() if info.handle is not None and info.name not in vars(Device))
"""The catalogued libraries whose ``Device`` accessor is made here (not written in ``Device``)."""
for _info in ACCESSORS:
    setattr(Device, _info.name, _accessor(_info))

