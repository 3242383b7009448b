"""The original's ``atomr_accel.memory``: managed memory (``Memory``, ``ManagedBufferF32``)
and buffers shared between processes (``IpcMemHandle``, ``IpcOpenedMem`` and the
functions that export and open them).

Every method checks its arguments when called, the ``*_async`` twins too
(``InvalidArgument`` before anything is awaited), and has a blocking twin of the
same name without the suffix. Both backends are real: on the CPU backend
managed memory is host memory (prefetch and advice are accepted and change
nothing), and IPC shares memfd segments (see ``core/ops/_ipc.py``).

Raw addresses. The original named buffers by device pointer
(``ipc_get_mem_handle(dev_ptr)``); here a device's context may live in another
process, so an address means something only with the buffer it was asked of.
The addresses this module hands out (``ManagedBufferF32.device_ptr()``,
``IpcOpenedMem.dev_ptr()``, ``buffer_address(device, buffer)``) are remembered
with their buffer, in this process and while the buffer lives, and
``ipc_get_mem_handle`` looks a pointer up there (the buffer asked last wins).
The recommended API names buffers instead: ``ipc_handle(device, buffer)`` and
``open_ipc(device, handle, length, dtype)``. A buffer's first export moves it,
so addresses asked before it are void.
"""

from __future__ import annotations

import builtins
import threading
import weakref
from collections.abc import Coroutine, Mapping
from typing import Any, ClassVar, TypeVar

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import checked, is_int
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._ipc import IPC_HANDLE_BYTES, BufferAddress, IpcGetHandle, IpcOpenHandle
from atomr_accel.core.ops._memory import Advice, Advise, Allocate, Attach, Free, Location, Prefetch
from atomr_accel.facade._bound import DeviceBound, check_timeout
from atomr_accel.facade._buffers import GpuBuffer, GpuBufferF32, buffer_for
from atomr_accel.facade._device import Device
from atomr_accel.facade._portal import Portal, blocking

__all__ = [
    "IpcMemHandle",
    "IpcOpenedMem",
    "ManagedBufferF32",
    "Memory",
    "buffer_address",
    "buffer_address_async",
    "ipc_get_mem_handle",
    "ipc_get_mem_handle_async",
    "ipc_handle",
    "ipc_handle_async",
    "ipc_open_mem_handle",
    "ipc_open_mem_handle_async",
    "open_ipc",
    "open_ipc_async",
]

T = TypeVar("T")

_FLAGS = {"global": Attach.GLOBAL, "attach_global": Attach.GLOBAL,
          "host": Attach.HOST, "attach_host": Attach.HOST}
_TARGETS = {"cpu": Location.HOST, "host": Location.HOST,
            "device": Location.DEVICE, "gpu": Location.DEVICE}
_ADVICE: dict[str, tuple[Advice, Advice]] = {  # name -> (for the device, for the host)
    "set_read_mostly": (Advice.READ_MOSTLY, Advice.READ_MOSTLY),
    "unset_read_mostly": (Advice.UNSET_READ_MOSTLY, Advice.UNSET_READ_MOSTLY),
    "set_preferred_location": (Advice.PREFERRED_LOCATION_DEVICE, Advice.PREFERRED_LOCATION_HOST),
    "unset_preferred_location": (Advice.UNSET_PREFERRED_LOCATION,
                                 Advice.UNSET_PREFERRED_LOCATION),
    "set_accessed_by": (Advice.ACCESSED_BY_DEVICE, Advice.ACCESSED_BY_HOST),
    "unset_accessed_by": (Advice.UNSET_ACCESSED_BY_DEVICE, Advice.UNSET_ACCESSED_BY_HOST),
}


def _choice(value: object, choices: Mapping[str, T], what: str) -> T:
    """``choices[value]``, the name taken in any case (``InvalidArgument`` naming the choices)."""
    key = value.lower() if isinstance(value, str) else None
    if key is None or key not in choices:
        names = ", ".join(choices)
        raise InvalidArgument(f"{what} must be one of {names} (in any case), got {value!r}")
    return choices[key]


# ---------------------------------------------------------------- addresses


class _Addresses:
    """The addresses handed out in this process, each with the buffer it was asked of."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_address: dict[int, weakref.ref[GpuBuffer]] = {}

    def note(self, address: int, buffer: GpuBuffer) -> None:
        """Remember that ``buffer`` has ``address`` (until it is collected)."""
        def gone(entry: weakref.ref[GpuBuffer]) -> None:
            with self._lock:
                if self._by_address.get(address) is entry:
                    del self._by_address[address]

        with self._lock:
            self._by_address[address] = weakref.ref(buffer, gone)

    def buffer(self, address: object) -> GpuBuffer:
        """The live buffer last given ``address`` (``InvalidArgument`` if none is)."""
        if not is_int(address):
            raise InvalidArgument(f"dev_ptr must be an int address, got {address!r}")
        with self._lock:
            entry = self._by_address.get(int(address))
        buffer = None if entry is None else entry()
        if buffer is None or not buffer.device._state.holds(buffer.ref):
            raise InvalidArgument(
                f"no live buffer of this process has address {int(address):#x}; addresses "
                "come from device_ptr(), dev_ptr() or buffer_address(device, buffer)")
        return buffer


_ADDRESSES = _Addresses()


def buffer_address_async(device: Device, buffer: GpuBuffer,
                         timeout_secs: float | None = None) -> Coroutine[Any, Any, int]:
    """Answer the address of ``buffer`` (of ``device``) in its context's process.

    A CUDA device pointer, or the NumPy data's address on the CPU backend; valid
    in that process only (a worker's with ``isolation="process"``), until the
    buffer is freed or its first IPC export moves it. ``ipc_get_mem_handle``
    takes it. Raises ``InvalidArgument`` for a buffer of another device.
    """
    check_timeout(timeout_secs)
    if not isinstance(buffer, GpuBuffer):
        raise InvalidArgument(f"buffer must be a GpuBuffer, got {type(buffer).__name__}")
    op = checked(BufferAddress(device.ref_of(buffer)))
    return _address(device, buffer, op, timeout_secs)


async def _address(device: Device, buffer: GpuBuffer, op: BufferAddress,
                   timeout: float | None) -> int:
    address: int = await device.run_async(op, timeout)
    _ADDRESSES.note(address, buffer)
    return address


buffer_address = blocking(buffer_address_async)


# ------------------------------------------------------------------ managed


class ManagedBufferF32(GpuBufferF32):
    """A float32 buffer of managed (unified) memory, made by ``Memory.allocate_managed_f32``.

    A ``GpuBufferF32`` in every respect: pass it to any device op
    (``dev.blas().gemm_f32(...)``, copies, kernels). ``attach`` is the flag it
    was allocated with.
    """

    def __init__(self, device: Device, ref: GpuRef, attach: Attach) -> None:
        super().__init__(device, ref)
        self.attach = attach

    @property
    def _portal(self) -> Portal:
        return self._device._portal

    def is_valid(self) -> bool:
        """True while the buffer can be used: not freed, and its context not rebuilt since."""
        return self._device._state.holds(self.ref)

    def device_ptr_async(self, timeout_secs: float | None = None) -> Coroutine[Any, Any, int]:
        """Answer the buffer's address (see ``buffer_address``)."""
        return buffer_address_async(self._device, self, timeout_secs)

    device_ptr = blocking(device_ptr_async)

    def __repr__(self) -> str:
        state = "" if self.is_valid() else ", invalid"
        return (f"ManagedBufferF32(len={len(self)}, device={self.device_id}, "
                f"flags={self.attach.value}{state})")


class Memory(DeviceBound, prefix="memory"):
    """Managed memory of one device: allocate, prefetch, advise, and count what it holds.

    ``Memory.spawn(system)`` binds it to ``device`` if given, else the
    system's first device, else a new one (CUDA when a GPU is usable, the CPU
    backend otherwise). Targets are ``cpu``/``host`` or ``device``/``gpu``, in
    any case; ``device_id`` must be this memory's device (a context advises and
    migrates for its own device only).
    """

    _latest: ClassVar[weakref.ref[Memory] | None] = None

    def __init__(self, device: Device, name: str | None = None) -> None:
        super().__init__(device, name)
        self._buffers: weakref.WeakSet[ManagedBufferF32] = weakref.WeakSet()
        Memory._latest = weakref.ref(self)

    @classmethod
    def latest(cls) -> Memory | None:
        """The ``Memory`` made last in this process, if it is still referenced."""
        return None if cls._latest is None else cls._latest()

    def _location(self, target: object, device_id: object) -> Location:
        location = _choice(target, _TARGETS, "target")
        if not is_int(device_id) or device_id < 0:
            raise InvalidArgument(f"device_id must be an int >= 0, got {device_id!r}")
        if location is Location.DEVICE and device_id != self.device.device_id:
            raise InvalidArgument(f"this Memory's device is {self.device.device_id}; it cannot "
                                  f"act for device {device_id}")
        return location

    def _managed_ref(self, mem: object) -> GpuRef:
        if not isinstance(mem, GpuBuffer):
            raise InvalidArgument(f"mem must be a ManagedBufferF32, got {type(mem).__name__}")
        ref = self.device.ref_of(mem, "mem")
        if not ref.managed or ref.dtype is not DType.F32:
            raise InvalidArgument(f"mem must be a managed float32 buffer, got {mem!r}")
        return ref

    def allocate_managed_f32_async(
        self, len: int, flags: str = "global", timeout_secs: float | None = 10.0,
    ) -> Coroutine[Any, Any, ManagedBufferF32]:
        """Allocate ``len`` zero-filled float32 elements of managed memory.

        ``flags``: ``global``/``attach_global`` (any stream may use it) or
        ``host``/``attach_host`` (``cudaMemAttachHost``; see ``Attach``).
        """
        check_timeout(timeout_secs)
        op = checked(Allocate(DType.F32, len, True, _choice(flags, _FLAGS, "flags")))
        return self._allocate(op, timeout_secs)

    async def _allocate(self, op: Allocate, timeout: float | None) -> ManagedBufferF32:
        ref: GpuRef = await self.device.run_async(op, timeout)
        self.device._state.own(ref)  # freed once the buffer is collected
        buffer = ManagedBufferF32(self.device, ref, op.attach)
        self._buffers.add(buffer)
        return buffer

    def prefetch_f32_async(
        self, mem: ManagedBufferF32, target: str = "cpu", device_id: int = 0,
        timeout_secs: float | None = 10.0,
    ) -> Coroutine[Any, Any, None]:
        """Migrate ``mem`` to ``target`` ahead of use, in stream order."""
        check_timeout(timeout_secs)
        op = checked(Prefetch(self._managed_ref(mem), self._location(target, device_id)))
        return self._run(op, timeout_secs)

    def advise_f32_async(
        self, mem: ManagedBufferF32, advice: str, target: str | None = None,
        device_id: int = 0, timeout_secs: float | None = 10.0,
    ) -> Coroutine[Any, Any, None]:
        """Give the driver a usage hint for ``mem`` (``cudaMemAdvise``).

        ``advice``: ``set_read_mostly``, ``unset_read_mostly``,
        ``set_preferred_location`` (needs ``target``), ``unset_preferred_location``,
        ``set_accessed_by`` or ``unset_accessed_by`` (for ``target``, the device
        when None); the read-mostly advice applies to every processor.
        """
        check_timeout(timeout_secs)
        chosen = _choice(advice, _ADVICE, "advice")
        if target is None:
            if chosen == _ADVICE["set_preferred_location"]:
                raise InvalidArgument("set_preferred_location needs a target: cpu, host, "
                                      "device or gpu")
            location = self._location("device", self.device.device_id)
        else:
            location = self._location(target, device_id)
        for_device, for_host = chosen
        op = checked(Advise(self._managed_ref(mem),
                            for_host if location is Location.HOST else for_device))
        return self._run(op, timeout_secs)

    async def _run(self, op: Prefetch | Advise, timeout: float | None) -> None:
        await self.device.run_async(op, timeout)

    def stats_async(self, timeout_secs: float | None = 2.0) -> Coroutine[Any, Any, tuple[int, int]]:
        """Answer ``(allocations, bytes)`` of the buffers this memory allocated that are still
        valid (neither freed, nor collected, nor lost to a context rebuild).

        Counted in this process at once; ``timeout_secs`` is checked, for the
        original's signature.
        """
        check_timeout(timeout_secs)
        return self._stats()

    async def _stats(self) -> tuple[int, int]:
        live = [buffer for buffer in list(self._buffers) if buffer.is_valid()]
        return len(live), sum(buffer.nbytes for buffer in live)

    allocate_managed_f32 = blocking(allocate_managed_f32_async)
    prefetch_f32 = blocking(prefetch_f32_async)
    advise_f32 = blocking(advise_f32_async)
    stats = blocking(stats_async)

    def __repr__(self) -> str:
        return f"Memory(name={self.name!r}, device={self.device.device_id})"


# ---------------------------------------------------------------------- IPC


class IpcMemHandle:
    """The 64 bytes naming a shared buffer's memory: a ``cudaIpcMemHandle_t`` on CUDA, a
    memfd's whereabouts on the CPU backend (see ``core/ops/_ipc.py``). Send them to another
    process, which opens them with ``open_ipc`` or ``ipc_open_mem_handle``."""

    __slots__ = ("_data",)

    def __init__(self, data: builtins.bytes) -> None:
        self._data = data

    @staticmethod
    def from_bytes(data: builtins.bytes | bytearray | memoryview) -> IpcMemHandle:
        """The handle of 64 bytes (``InvalidArgument`` for anything else)."""
        if not isinstance(data, builtins.bytes | bytearray | memoryview):
            raise InvalidArgument(f"an IPC handle is made of bytes, got {type(data).__name__}")
        raw = builtins.bytes(data)
        if len(raw) != IPC_HANDLE_BYTES:
            raise InvalidArgument(f"an IPC handle is {IPC_HANDLE_BYTES} bytes, got {len(raw)}")
        return IpcMemHandle(raw)

    def bytes(self) -> builtins.bytes:
        """The 64 bytes."""
        return self._data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IpcMemHandle) and other._data == self._data

    def __hash__(self) -> int:
        return hash(self._data)

    def __repr__(self) -> str:
        return f"IpcMemHandle({self._data[:8].hex()}...)"


def ipc_handle_async(device: Device, buffer: GpuBuffer,
                     timeout_secs: float | None = None) -> Coroutine[Any, Any, IpcMemHandle]:
    """Export ``buffer`` (of ``device``) to other processes; answer its ``IpcMemHandle``.

    The first export moves the buffer into shareable memory (its address
    changes); later ones answer the same handle. Raises ``InvalidArgument`` for
    an empty, managed or opened buffer, and on CUDA for one a recorded graph
    holds.
    """
    check_timeout(timeout_secs)
    op = checked(IpcGetHandle(device.ref_of(buffer)))
    return _exported(device, op, timeout_secs)


async def _exported(device: Device, op: IpcGetHandle, timeout: float | None) -> IpcMemHandle:
    return IpcMemHandle(await device.run_async(op, timeout))


def open_ipc_async(device: Device, handle: IpcMemHandle, length: int,
                   dtype: DType | str = "f32",
                   timeout_secs: float | None = None) -> Coroutine[Any, Any, GpuBuffer]:
    """Open ``handle`` on ``device`` as a buffer of ``length`` elements of ``dtype`` that
    aliases the exported memory (no copy): writes on either side are seen on the other
    once they have finished.

    Freeing the buffer (or dropping it) unmaps it and leaves the exporter's
    memory alone. Raises ``InvalidArgument`` when ``length`` elements do not fit
    in what the handle shares, when its memory is gone, or for a handle of the
    other backend.
    """
    check_timeout(timeout_secs)
    if not isinstance(handle, IpcMemHandle):
        raise InvalidArgument(f"handle must be an IpcMemHandle, got {type(handle).__name__}")
    op = checked(IpcOpenHandle(handle.bytes(), DType.of(dtype), length))
    return _opened(device, op, timeout_secs)


async def _opened(device: Device, op: IpcOpenHandle, timeout: float | None) -> GpuBuffer:
    return buffer_for(device, await device.run_async(op, timeout))


ipc_handle = blocking(ipc_handle_async)
open_ipc = blocking(open_ipc_async)


class IpcOpenedMem:
    """Memory of another process opened by ``ipc_open_mem_handle``: ``buffer`` is a uint8
    buffer of ``bytes`` bytes over it, usable with any op of its device."""

    def __init__(self, buffer: GpuBuffer) -> None:
        self.buffer = buffer
        self._portal = buffer.device._portal

    @property
    def bytes(self) -> int:
        """Size in bytes."""
        return self.buffer.nbytes

    def dev_ptr_async(self, timeout_secs: float | None = None) -> Coroutine[Any, Any, int]:
        """Answer the mapping's address (see ``buffer_address``)."""
        return buffer_address_async(self.buffer.device, self.buffer, timeout_secs)

    def close_async(self, timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """Unmap the memory (the exporter's stays); closing again does nothing."""
        check_timeout(timeout_secs)
        return self._close(timeout_secs)

    async def _close(self, timeout: float | None) -> None:
        device, ref = self.buffer.device, self.buffer.ref
        if device._state.holds(ref):
            await device.run_async(Free(ref), timeout)

    dev_ptr = blocking(dev_ptr_async)
    close = blocking(close_async)

    def __repr__(self) -> str:
        return f"IpcOpenedMem(bytes={self.bytes}, device={self.buffer.device_id})"


def _opening_device(device: Device | None) -> Device:
    if device is not None:
        if not isinstance(device, Device):
            raise InvalidArgument(f"device must be a Device, got {type(device).__name__}")
        return device
    memory = Memory.latest()
    if memory is None:
        raise InvalidArgument("no device to open the handle on: pass device=, or make a "
                              "Memory first (Memory.spawn(system))")
    return memory.device


def ipc_get_mem_handle_async(dev_ptr: int, timeout_secs: float | None = 10.0,
                             ) -> Coroutine[Any, Any, IpcMemHandle]:
    """Export the buffer that address ``dev_ptr`` was handed out for (see the module
    docstring); answer its ``IpcMemHandle``. ``InvalidArgument`` if none is live."""
    buffer = _ADDRESSES.buffer(dev_ptr)
    return ipc_handle_async(buffer.device, buffer, timeout_secs)


def ipc_get_mem_handle(dev_ptr: int, timeout_secs: float | None = 10.0) -> IpcMemHandle:
    """Blocking twin of ``ipc_get_mem_handle_async``; do not call it inside a running event
    loop."""
    buffer = _ADDRESSES.buffer(dev_ptr)
    return buffer.device._portal.run_blocking(ipc_handle_async(buffer.device, buffer,
                                                               timeout_secs))


def ipc_open_mem_handle_async(handle: IpcMemHandle, bytes: int, device: Device | None = None,
                              timeout_secs: float | None = 10.0,
                              ) -> Coroutine[Any, Any, IpcOpenedMem]:
    """Open ``bytes`` bytes of the memory ``handle`` names, on ``device`` (default: the
    device of the ``Memory`` made last in this process); answer an ``IpcOpenedMem``."""
    opener = _opening_device(device)
    return _opened_mem(open_ipc_async(opener, handle, bytes, DType.U8, timeout_secs))


async def _opened_mem(opening: Coroutine[Any, Any, GpuBuffer]) -> IpcOpenedMem:
    return IpcOpenedMem(await opening)


def ipc_open_mem_handle(handle: IpcMemHandle, bytes: int, device: Device | None = None,
                        timeout_secs: float | None = 10.0) -> IpcOpenedMem:
    """Blocking twin of ``ipc_open_mem_handle_async``; do not call it inside a running event
    loop."""
    opener = _opening_device(device)
    return opener._portal.run_blocking(
        ipc_open_mem_handle_async(handle, bytes, opener, timeout_secs))
