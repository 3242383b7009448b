"""The CUDA backend: buffers are CuPy arrays, libraries are CuPy's CUDA bindings.

One instance owns one device context and is driven from one host thread.
Each op runs on the stream its kernel actor was given. A buffer remembers the
event of its last write and of the reads since; an op on another stream waits
on those first (read-after-write, and write-after-read for its outputs).
Completion is reported by a pluggable strategy (``completion=``; see
``_completion.py``), never by blocking an event loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import signal
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, ClassVar

import cupy as cp
import numpy as np

from atomr_accel.backends._base import (
    MEMORY_HANDLERS,
    Backend,
    Deferred,
    Done,
    Handler,
    More,
    Rank,
    buffer_entry,
)
from atomr_accel.backends._handlers import cuda, table
from atomr_accel.backends._lazy import lazy_module
from atomr_accel.backends._optional import unavailable
from atomr_accel.backends._spin import wait_until
from atomr_accel.backends._state import ByIdentity, Lru
from atomr_accel.backends.cuda import _collective as cuda_collective
from atomr_accel.backends.cuda import _direct as direct
from atomr_accel.backends.cuda import _ipc as cuda_ipc
from atomr_accel.backends.cuda import _kernels as cuda_kernels
from atomr_accel.backends.cuda import _prepared as prepared
from atomr_accel.backends.cuda import _rng as cuda_rng
from atomr_accel.backends.cuda import _staging as staging
from atomr_accel.backends.cuda._completion import Event, event_done, make_completion
from atomr_accel.backends.cuda._cuda_errors import (
    STICKY_ERRORS,
    STICKY_TEXTS,
    classified,
    translate_cuda_error,
)
from atomr_accel.backends.cuda._queued_read import queued as queued_read
from atomr_accel.backends.cuda._replay import replays_of
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import (
    ContextPoisoned,
    DeviceUnavailable,
    GpuRuntimeError,
    InvalidArgument,
    OutOfMemory,
    Unrecoverable,
    interrupt_in,
)
from atomr_accel.core._op import Op, kept
from atomr_accel.core.ops._faults import FaultKind, InjectFault
from atomr_accel.core.ops._graph import OpSequence
from atomr_accel.core.ops._memory import Advice, Attach, Download, Location, Upload
from atomr_accel.core.ops._rng import RngFill

__all__ = ["DEFAULT_COMPLETION", "STICKY_ERRORS", "CudaBackend", "translate_cuda_error"]

DEFAULT_COMPLETION = "inline"
"""The completion strategy a device uses unless told otherwise (see benchmarks/gpu_overhead.py)."""

_ADVICE = {  # Advice -> (cudaMemoryAdvise code, whether the location is the host)
    Advice.READ_MOSTLY: (1, False),
    Advice.UNSET_READ_MOSTLY: (2, False),
    Advice.PREFERRED_LOCATION_DEVICE: (3, False),
    Advice.PREFERRED_LOCATION_HOST: (3, True),
    Advice.UNSET_PREFERRED_LOCATION: (4, False),
    Advice.ACCESSED_BY_DEVICE: (5, False),
    Advice.UNSET_ACCESSED_BY_DEVICE: (6, False),
    Advice.ACCESSED_BY_HOST: (5, True),
    Advice.UNSET_ACCESSED_BY_HOST: (6, True),
}
_ATTACH_FLAGS = {Attach.GLOBAL: 1, Attach.HOST: 2}  # cudaMemAttachGlobal, cudaMemAttachHost

_KEPT_OPS = 1024
"""How many ops' buffer ids a backend keeps (past it, it forgets them all)."""
_MEMORY_TYPE_HOST = 1  # cudaMemoryTypeHost: page-locked host memory


def _is_pinned(data: Any) -> bool:
    """Whether a host array lies in page-locked memory (so a copy from it is asynchronous)."""
    if not isinstance(data, np.ndarray) or data.size == 0:
        return False
    try:
        attributes = cp.cuda.runtime.pointerGetAttributes(data.ctypes.data)
    except Exception:
        return False
    return bool(attributes.type == _MEMORY_TYPE_HOST)


class _ManagedMemory:
    """A ``cudaMallocManaged`` allocation with explicit flags (CuPy's takes none); freed once
    the last array over it is collected."""

    def __init__(self, nbytes: int, attach: Attach) -> None:
        self.ptr = int(cp.cuda.runtime.mallocManaged(nbytes, _ATTACH_FLAGS[attach]))

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # a poisoned context cannot free anything
            cp.cuda.runtime.free(self.ptr)


_POISON_SOURCE = r"""
extern "C" __global__ void atomr_poison(int* p) { p[threadIdx.x] = 42; }
"""


Queued = tuple[Any, int, Any, AbstractSet[int], AbstractSet[int]]
"""An op queued with no event recorded yet: (result, stream id, stream, buffers it touches,
buffers it writes)."""


class CudaBackend(Backend):
    """A context on one CUDA device; ``xp`` is CuPy, ``scipy_fft``/``scipy_sparse`` are cupyx's."""

    name: ClassVar[str] = "cuda"
    recoverable_in_process: ClassVar[bool] = False
    starts_ranks: ClassVar[bool] = True
    handlers: ClassVar[dict[type[Op], Handler]] = {}  # filled below the class

    def __init__(self, device_id: int = 0, completion: str = DEFAULT_COMPLETION,
                 kernel_cache_dir: str | None = None) -> None:
        super().__init__(device_id)
        self.xp = cp
        try:
            count = cp.cuda.runtime.getDeviceCount()
        except Exception as exc:
            raise DeviceUnavailable(f"CUDA is not usable here: {exc}") from exc
        if not 0 <= device_id < count:
            raise DeviceUnavailable(f"no CUDA device {device_id} (this machine has {count})")
        self._device = cp.cuda.Device(device_id)
        self._device.use()
        self.scipy_fft: Any = lazy_module("cupyx.scipy.fft")
        self.scipy_sparse: Any = lazy_module("cupyx.scipy.sparse")
        self._buffers: dict[int, Any] = {}
        self._pointers: dict[int, int] = {}
        self._last_write: dict[int, tuple[int, Any]] = {}  # buffer id -> (stream id, event)
        self._reads: dict[int, dict[int, Any]] = {}  # buffer id -> stream id -> event
        self._streams: dict[int, Any] = {}
        self._buffer_ids: ByIdentity[tuple[frozenset[int], frozenset[int]]] = \
            ByIdentity(_KEPT_OPS)
        """(buffers it touches, buffers it writes) of each op the memo holds."""
        self._next_id = 1
        self._registered: list[tuple[int, int]] = []  # page-locked regions: (address, end)
        self.exported: dict[int, Any] = {}
        """Buffer id -> the allocation of its own an IPC export moved it into (``_ipc.py``)."""
        self.opened: dict[int, bytes | None] = {}
        """Buffer id -> the IPC handle it maps (None: aliased from this same process)."""
        self.completion = make_completion(completion, device_id)
        self.compute_capability: str = self._device.compute_capability
        """Like ``"90"`` for an H100; NVRTC compiles for it by default."""
        self.kernel_cache = cuda_kernels.KernelCache(kernel_cache_dir)
        self.modules: dict[str, Any] = {}
        """Loaded modules by the SHA-256 of their image."""
        self.capturing = False
        """True while a graph capture records ops (see ``_graph.py``)."""
        self.replay_sequences = os.environ.get("ATOMR_ACCEL_GRAPH_REPLAY", "1") != "0"
        """Whether a repeated ``OpSequence`` is replayed as a CUDA graph (``_replay.py``);
        ``ATOMR_ACCEL_GRAPH_REPLAY=0`` turns it off."""
        self._torch_streams: dict[int, Any] = {}
        self.fft_plans: Lru[Any] = Lru(16)
        """cuFFT plans of ``FftMany`` transforms, by layout and stream (see ``_fft.py``)."""

    def library_available(self, library: str) -> bool:
        """False when a Python package that ``library`` needs here does not import."""
        return unavailable(library) is None

    # ----------------------------------------------------------------- streams

    def cuda_stream(self, stream: int) -> Any:
        """The CuPy stream behind a stream id (created on first use, non-blocking)."""
        s = self._streams.get(stream)
        if s is None:
            s = self._streams[stream] = cp.cuda.Stream(non_blocking=True)
        return s

    def _enqueue(self, op: Op, stream: int) -> tuple[Any, Any, Any]:
        """Queue ``op`` on ``stream`` behind the work it depends on; return (result, stream,
        event recorded after it). Host results (downloads, scalars) are already final."""
        queued = self.enqueue_unrecorded(op, stream)
        return queued[0], queued[2], self.record(queued)

    def enqueue_unrecorded(self, op: Op, stream: int) -> Queued:
        """Queue ``op`` on ``stream`` behind the work it depends on, recording no event yet
        (``record`` does, once what the handler left pending, an NCCL group, is launched)."""
        s = self._streams.get(stream) or self.cuda_stream(stream)
        touched, written = self._buffers_of(op)
        last_write, reads = self._last_write, self._reads
        for buffer_id in touched:  # read-after-write, and write-after-read for outputs
            last = last_write.get(buffer_id)
            if last is not None and last[0] != stream:
                s.wait_event(last[1])
            if buffer_id in written:
                for reader, event in reads.get(buffer_id, {}).items():
                    if reader != stream:
                        s.wait_event(event)
        with s:
            self.stream = stream
            result = self.run_handler(op)
        return result, stream, s, touched, written

    def _buffers_of(self, op: Op) -> tuple[AbstractSet[int], AbstractSet[int]]:
        """The ids of the buffers ``op`` touches and of those it writes; kept by op object for
        an op the memo holds (a repeated call hands the same object again)."""
        held = self._buffer_ids.held(op)
        if held is not None:
            return held
        touched = frozenset([ref.buffer_id for ref in op.refs()])
        written = frozenset([ref.buffer_id for ref in op.writes()])
        if kept(op):
            self._buffer_ids.keep(op, (touched, written))
        return touched, written

    def record(self, queued: Queued) -> Any:
        """Record the event behind a queued op (this device current); its buffers remember
        it; answers the event."""
        _, stream, s, touched, written = queued
        last_write, reads = self._last_write, self._reads
        event = Event(disable_timing=True)
        event.record(s)
        for buffer_id in touched:
            if buffer_id in written:
                last_write[buffer_id] = (stream, event)
                reads.pop(buffer_id, None)
            else:
                reads.setdefault(buffer_id, {})[stream] = event
        return event

    def launch(self, op: Op, stream: int, done: Done) -> None:
        """Queue ``op`` and let the completion strategy report when it has finished."""
        try:
            result, s, event = self._enqueue(op, stream)
        except BaseException as exc:
            done(None, classified(exc, op, probe=True))  # on the launching thread
            return

        def report(value: Any, error: BaseException | None) -> None:
            if isinstance(value, Deferred):
                value, error = _settle(value, error)
            done(value, None if error is None else classified(error, op))

        self.completion.watch(stream, s, event, result, report)

    def execute(self, op: Op, stream: int = 0) -> Any:
        """Run ``op`` and wait for it on this thread (direct use, tests)."""
        return self.wait(self.begin(op, stream), None)

    def begin(self, op: Op, stream: int) -> Any:
        """Queue ``op`` from any thread (this device made current for the call); return
        ``(op, result, event recorded after it)``."""
        try:
            if cp.cuda.runtime.getDevice() == self.device_id:
                result, _, event = self._enqueue(op, stream)
            else:
                with self._device:
                    result, _, event = self._enqueue(op, stream)
        except BaseException as exc:
            if interrupt_in(exc) is not None:  # this (calling) thread was interrupted: the caller's
                raise
            raise classified(exc, op, probe=True) from exc
        return op, result, event

    def finished(self, started: Any) -> bool:
        """Whether the event behind the op has completed (its CUDA error, classified)."""
        op, _, event = started
        try:
            return event_done(event)
        except BaseException as exc:
            if interrupt_in(exc) is not None:  # this (calling) thread was interrupted: the caller's
                raise
            raise classified(exc, op) from exc

    def wait(self, started: Any, deadline: float | None) -> Any:
        """Spin, then park, until the op's event has completed; return the op's result.

        Polls the event rather than blocking in ``cudaEventSynchronize``, which
        cannot time out.
        """
        wait_until(lambda: self.finished(started), deadline)
        return self.result(started)

    def result(self, started: Any) -> Any:
        """The op's result once its event has completed (a deferred one settled)."""
        result = started[1]
        if isinstance(result, Deferred):
            try:
                return result.settle()
            except BaseException as exc:
                if interrupt_in(exc) is not None:  # this (calling) thread was interrupted
                    raise
                raise classified(exc, started[0]) from exc
        return result

    def start_ranks(self, parts: Sequence[Rank], failed: Callable[[], object]) -> list[Any]:
        """Every rank's calls in one NCCL group from this thread (``_collective.py``); a
        rank's error classified as ``begin`` classifies it."""
        started = cuda_collective.start_ranks(parts, failed)
        for index, ((backend, op, _), entry) in enumerate(zip(parts, started, strict=True)):
            if isinstance(entry, BaseException) and interrupt_in(entry) is None:
                with cp.cuda.Device(backend.device_id):
                    started[index] = classified(entry, op, probe=True)
        return started

    def queues_only(self, op: Op) -> bool:
        """True for ops whose handlers only queue device work (no host sync, no compile: the
        op's ``queues_only`` trait); most RNG fills qualify (``_rng.queues_only``), an
        upload when its source is page-locked host memory, a download of at most
        ``QUEUED_READ_MAX`` bytes (``_queued_read.queued``), and an op that ran before
        whose first run built or compiled what it needs (``_prepared.Prepared``)."""
        if op.queues_only:
            return True
        kind = type(op)
        if kind is OpSequence:  # recorded as a graph (``_replay.py``), or queue-only ops
            sequence: OpSequence = op  # type: ignore[assignment]
            return replays_of(self).recorded(sequence) or all(map(self.queues_only, sequence.ops))
        if kind is RngFill:
            return cuda_rng.queues_only(op)  # type: ignore[arg-type]
        if kind is Upload:
            return _is_pinned(op.data)  # type: ignore[attr-defined]
        if kind is Download:
            return queued_read(op)  # type: ignore[arg-type]
        if kind in prepared.PREPARING:  # an op that ran before: what it builds is built
            return prepared.prepared_of(self).queues(op)
        return False

    # ------------------------------------------------------------------ memory

    def array(self, buffer_id: int) -> Any:
        """The live 1-D CuPy array behind a buffer id."""
        return buffer_entry(self._buffers, buffer_id)

    def pointer(self, buffer_id: int) -> int:
        """The device address of a buffer (kept: CuPy builds a new pointer object per ask)."""
        return buffer_entry(self._pointers, buffer_id)

    def allocate(self, dtype: DType, length: int, managed: bool = False,
                 attach: Attach = Attach.GLOBAL) -> int:
        """Allocate a zero-filled array: from CuPy's pool, or managed memory with ``attach``'s
        ``cudaMallocManaged`` flag. Out of memory, the graphs of replayed sequences are
        released (their pools return what they hold) and the allocation is tried again."""
        nbytes = length * dtype.itemsize
        try:
            arr = self._zeros(dtype, length, managed, attach)
        except cp.cuda.memory.OutOfMemoryError as exc:
            if not replays_of(self).release_all():
                free, _ = cp.cuda.runtime.memGetInfo()
                raise OutOfMemory(
                    f"cannot allocate {nbytes} bytes on CUDA device {self.device_id}",
                    requested=nbytes, available=free,
                ) from exc
            return self.allocate(dtype, length, managed, attach)
        return self._add(arr)

    def _zeros(self, dtype: DType, length: int, managed: bool, attach: Attach) -> Any:
        """A new zero-filled array (``allocate``)."""
        if not managed:
            return cp.zeros(length, dtype=dtype.numpy)
        nbytes = max(length * dtype.itemsize, 1)
        owner = _ManagedMemory(nbytes, attach)
        memory = cp.cuda.memory.UnownedMemory(owner.ptr, nbytes, owner, self.device_id)
        arr = cp.ndarray((length,), dtype=dtype.numpy, memptr=cp.cuda.MemoryPointer(memory, 0))
        arr.fill(0)
        return arr

    def _add(self, arr: Any) -> int:
        buffer_id = self._next_id
        self._next_id += 1
        self._buffers[buffer_id] = arr
        self._pointers[buffer_id] = int(arr.data.ptr)
        return buffer_id

    def adopt(self, array: Any) -> int:
        """Keep a CuPy array as a new buffer (a device function's result, ``keep=True``)."""
        return self._add(array)

    def torch_stream(self) -> Any:
        """torch's view of the stream of the op being executed (``ExternalStream``), made
        once per stream: device functions run with it current."""
        stream = self.cuda_stream(self.stream)
        kept = self._torch_streams.get(self.stream)
        if kept is None:
            import torch

            kept = self._torch_streams[self.stream] = torch.cuda.ExternalStream(
                stream.ptr, device=torch.device("cuda", self.device_id))
        return kept

    def user_error(self, exc: BaseException) -> GpuRuntimeError | None:
        """A sticky CUDA error raised through CuPy or torch is ``ContextPoisoned``; CuPy's
        and torch's out-of-memory errors are ``OutOfMemory``."""
        kind = type(exc)
        if isinstance(exc, cp.cuda.memory.OutOfMemoryError) or (
                kind.__name__ == "OutOfMemoryError" and kind.__module__.startswith("torch")):
            return OutOfMemory(f"user code ran out of device memory: {exc}")
        if kind.__name__ in ("CUDARuntimeError", "CUDADriverError"):
            error = translate_cuda_error(exc, Op())
            return error if isinstance(error, ContextPoisoned | OutOfMemory) else None
        text = str(exc)
        if isinstance(exc, RuntimeError) and "CUDA error" in text:
            if any(sticky in text for sticky in STICKY_TEXTS):
                return ContextPoisoned(f"a sticky CUDA error in user code: {text}")
            if "out of memory" in text:
                return OutOfMemory(f"user code ran out of device memory: {text}")
        return super().user_error(exc)

    def replace(self, buffer_id: int, arr: Any) -> None:
        """Keep a buffer in ``arr`` from now on (it holds the buffer's contents already)."""
        self.array(buffer_id)
        self._buffers[buffer_id] = arr
        self._pointers[buffer_id] = int(arr.data.ptr)

    def map_in(self, arr: Any, handle: bytes | None) -> int:
        """Add a buffer over memory mapped by IPC ``handle`` (None: aliased); return its id."""
        buffer_id = self._add(arr)
        self.opened[buffer_id] = handle
        return buffer_id

    def _settle(self, buffer_id: int) -> None:
        """Wait on this thread for the work queued so far that writes or reads a buffer."""
        last = self._last_write.get(buffer_id)
        if last is not None:
            last[1].synchronize()
        for event in self._reads.get(buffer_id, {}).values():
            event.synchronize()

    def free(self, buffer_id: int) -> None:
        """Release a buffer; an IPC mapping is unmapped once the work queued on it is done."""
        self.array(buffer_id)
        if buffer_id in self.opened:
            self._settle(buffer_id)
        del self._buffers[buffer_id], self._pointers[buffer_id]
        self._last_write.pop(buffer_id, None)
        self._reads.pop(buffer_id, None)
        cuda_ipc.forget(self, buffer_id)

    def write(self, buffer_id: int, data: Any, offset: int) -> None:
        """Copy ``data`` (1-D, contiguous, validated) in on the current stream: one
        ``cudaMemcpyAsync`` from page-locked memory or a small array, a large pageable one
        through the context's page-locked slots (``_staging``)."""
        target = self.array(buffer_id)
        if offset < 0 or offset + data.size > target.size:
            raise InvalidArgument(f"{data.size} elements at {offset} do not fit buffer "
                                  f"{buffer_id} of {target.size}")
        destination = self.pointer(buffer_id) + offset * target.itemsize
        if data.nbytes >= staging.STAGE_MIN and not _is_pinned(data):
            staging.stage_upload(self, destination, data)
        elif data.nbytes:
            cp.cuda.runtime.memcpyAsync(destination, data.ctypes.data, data.nbytes,
                                        staging.HOST_TO_DEVICE, cp.cuda.get_current_stream().ptr)

    def copy_in(self, data: np.ndarray[Any, Any]) -> Any:
        """From a region this context page-locked (a process host's shared arena), one
        asynchronous ``cudaMemcpyAsync`` with no staging copy on the host; else CuPy's."""
        if not self._registered or not (data.flags.c_contiguous or data.flags.f_contiguous):
            return cp.array(data, copy=True)
        start = data.ctypes.data
        if not any(low <= start and start + data.nbytes <= high for low, high in self._registered):
            return cp.array(data, copy=True)
        order = "C" if data.flags.c_contiguous else "F"
        out = cp.empty(data.shape, data.dtype, order=order)
        cp.cuda.runtime.memcpyAsync(out.data.ptr, data.ctypes.data, data.nbytes,
                                    staging.HOST_TO_DEVICE, cp.cuda.get_current_stream().ptr)
        return out

    def read(self, buffer_id: int, offset: int, length: int) -> Any:
        source = self.array(buffer_id)
        if offset or length != source.size:
            source = source[offset : offset + length]
        return source.get(stream=cp.cuda.get_current_stream())

    def copy(self, src: int, dst: int, length: int, src_offset: int, dst_offset: int) -> None:
        source = self.array(src)[src_offset : src_offset + length]
        self.array(dst)[dst_offset : dst_offset + length] = source

    def prefetch(self, buffer_id: int, location: Location) -> None:
        """Migrate a managed buffer to this device or the host, on the current stream."""
        arr = self.array(buffer_id)
        if arr.nbytes:
            target = self.device_id if location is Location.DEVICE else None
            direct.prefetch(arr.data.ptr, arr.nbytes, target, cp.cuda.get_current_stream().ptr)

    def advise(self, buffer_id: int, advice: Advice) -> None:
        """``cuMemAdvise`` for this device (or the host, for a host preferred location)."""
        arr = self.array(buffer_id)
        if arr.nbytes:
            code, on_host = _ADVICE[advice]
            direct.advise(arr.data.ptr, arr.nbytes, code, None if on_host else self.device_id)

    def memory_info(self) -> tuple[int, int]:
        free, total = cp.cuda.runtime.memGetInfo()
        return int(free), int(total)

    def register_host_memory(self, region: mmap.mmap) -> None:
        """Page-lock a shared-memory region so copies from it are DMA (process host)."""
        address = ctypes.addressof(ctypes.c_char.from_buffer(region))
        cp.cuda.runtime.hostRegister(address, len(region), 0)
        self._registered.append((address, address + len(region)))

    def synchronize(self) -> None:
        self._device.synchronize()

    def warm(self) -> None:
        """Make the memory pool's first block, the cuBLAS handle and a cuFFT plan (which
        loads cuFFT; about 75 and 175 ms on an H100): a rebuilt context then answers its
        first ops without holding them that long, while faults of other work may end it.
        A library that cannot load here fails its first op instead, as before."""
        with contextlib.suppress(Exception):
            cp.zeros(1)
            cp.cuda.device.get_cublas_handle()
            cp.cuda.cufft.Plan1d(8, cp.cuda.cufft.CUFFT_Z2Z, 1)
            self._device.synchronize()

    def flush(self, more: More | None = None) -> None:
        self.completion.flush(more)

    def close(self) -> None:
        """Wait for the work queued (by any thread), then release every buffer and handle."""
        with contextlib.suppress(Exception):  # a poisoned context cannot synchronize
            self._device.synchronize()
        self.completion.close()
        self.residents.clear()
        self._torch_streams.clear()
        self.fft_plans.clear()
        self._handles.clear()
        self.managed.clear()
        self.modules.clear()
        self._buffers.clear()
        with contextlib.suppress(Exception):  # a poisoned context cannot unmap anything
            cuda_ipc.forget_all(self)
        self._pointers.clear()
        self._last_write.clear()
        self._reads.clear()
        try:
            for address, _ in self._registered:
                cp.cuda.runtime.hostUnregister(address)
            cp.get_default_memory_pool().free_all_blocks()
        except Exception:
            pass  # a poisoned context cannot free anything; its process is about to go
        self._registered.clear()


def _settle(deferred: Deferred, error: BaseException | None
            ) -> tuple[Any, BaseException | None]:
    """``deferred``'s outcome as ``(result, error)``; the work's own ``error`` comes first
    (it is settled all the same, so that it lets go of what it holds)."""
    try:
        result = deferred.settle()
    except BaseException as exc:
        return None, error or exc
    return (None, error) if error is not None else (result, None)


@cuda.handles(InjectFault)
def _inject_fault(backend: CudaBackend, op: InjectFault) -> None:
    if op.kind is FaultKind.POISON:  # a real sticky fault: write to an illegal address
        kernel = cp.RawKernel(_POISON_SOURCE, "atomr_poison")
        kernel((1,), (1,), (cp.uint64(16),))
        cp.cuda.get_current_stream().synchronize()
        raise ContextPoisoned("the poison kernel did not fault")  # pragma: no cover
    if op.kind is FaultKind.OOM:  # a real failed allocation
        cp.empty(1 << 52, dtype=cp.uint8)
        raise OutOfMemory("the oversized allocation succeeded")  # pragma: no cover
    if op.kind is FaultKind.UNRECOVERABLE:
        raise Unrecoverable(f"injected unrecoverable fault on CUDA device {backend.device_id}")
    os.kill(os.getpid(), signal.SIGKILL)


CudaBackend.handlers = table(cuda, "atomr_accel.backends.cuda", MEMORY_HANDLERS)
"""Every handler registered for the CUDA backend (``backends._handlers``)."""
