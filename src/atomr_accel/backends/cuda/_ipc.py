"""Sharing buffers between processes on CUDA: ``cudaIpcGetMemHandle`` / ``cudaIpcOpenMemHandle``.

* ``IpcGetHandle``: a handle names a whole allocation and opens at its base, and
  a buffer of CuPy's pool is a piece of a larger allocation (whose handle would
  share its neighbours too). So the first export moves the buffer into an
  allocation of its own (``cudaMalloc``, rounded up to whole 2 MiB pages as
  CUDA's programming guide advises), and the handle is that allocation's: a
  plain ``cudaIpcMemHandle_t`` that any CUDA program can open. A buffer that a
  recorded graph holds cannot move (the graph holds its address).
* ``IpcOpenHandle``: maps the handle in this process's context of the device
  (``cudaIpcOpenMemHandle`` with ``cudaIpcMemLazyEnablePeerAccess``; mappings
  are counted per process, see ``_peer.py``), checks the size against the
  mapped allocation (``cuMemGetAddressRange``) and wraps it as a buffer.
  Freeing that buffer waits for the work queued on it, then unmaps it.
* CUDA refuses to open a handle in the process that exported it. Such a handle
  (two devices of one process on thread hosts) is aliased directly: the alias
  keeps the exporter's allocation alive until it is freed too.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import cupy as cp

from atomr_accel.backends._handlers import cuda
from atomr_accel.backends.cpu._ipc import MAGIC as CPU_MAGIC
from atomr_accel.backends.cuda._graph import CapturedGraph
from atomr_accel.backends.cuda._peer import MAPPINGS, allocation_range, enable_peer_access
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._ipc import BufferAddress, IpcGetHandle, IpcOpenHandle

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

__all__ = ["forget", "forget_all"]

_PAGE = 2 << 20  # exported allocations span whole 2 MiB pages


class _Exports:
    """The allocations this process has exported, by handle, while their buffers live."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_handle: dict[bytes, Any] = {}

    def add(self, handle: bytes, memory: Any) -> None:
        """Remember that ``handle`` names ``memory`` (a ``cupy.cuda.Memory``)."""
        with self._lock:
            self._by_handle[handle] = memory

    def get(self, handle: bytes) -> Any | None:
        """The memory of a handle exported by this process, or None."""
        with self._lock:
            return self._by_handle.get(handle)

    def discard(self, memory: Any) -> None:
        """Forget ``memory``: its buffer was freed."""
        with self._lock:
            for handle in [h for h, m in self._by_handle.items() if m is memory]:
                del self._by_handle[handle]


_EXPORTS = _Exports()


@cuda.handles(BufferAddress)
def _address(backend: CudaBackend, op: BufferAddress) -> int:
    return backend.pointer(op.ref.buffer_id)


def _own_allocation(backend: CudaBackend, buffer_id: int) -> Any:
    """Move a buffer into an allocation of its own (see the module docstring); return it."""
    current = backend.array(buffer_id)
    if any(current is held for graph in backend.kept_all(CapturedGraph) for held in graph.arrays):
        raise InvalidArgument(
            "this buffer is recorded in a CUDA graph, which holds its address; its first IPC "
            "export moves it, so export it before recording the graph")
    memory = cp.cuda.memory.Memory(-(-current.nbytes // _PAGE) * _PAGE)
    moved = cp.ndarray(current.shape, current.dtype, cp.cuda.MemoryPointer(memory, 0))
    stream = cp.cuda.get_current_stream()
    cp.cuda.runtime.memcpyAsync(memory.ptr, current.data.ptr, current.nbytes,
                                cp.cuda.runtime.memcpyDefault, stream.ptr)
    stream.synchronize()  # the old memory returns to the pool: nothing may still read it
    backend.replace(buffer_id, moved)
    backend.exported[buffer_id] = memory
    return memory


@cuda.handles(IpcGetHandle)
def _export(backend: CudaBackend, op: IpcGetHandle) -> bytes:
    buffer_id = op.ref.buffer_id
    backend.array(buffer_id)
    if buffer_id in backend.opened:
        raise InvalidArgument(f"buffer {buffer_id} is an IPC mapping of another one; share the "
                              "handle it was opened from instead")
    memory = backend.exported.get(buffer_id)
    if memory is None:
        memory = _own_allocation(backend, buffer_id)
    handle = bytes(cp.cuda.runtime.ipcGetMemHandle(memory.ptr))
    _EXPORTS.add(handle, memory)
    return handle


def _wrap(backend: CudaBackend, op: IpcOpenHandle, pointer: int, owner: Any) -> Any:
    """A CuPy array of the opened buffer over ``pointer`` (kept alive by ``owner``)."""
    memory = cp.cuda.memory.UnownedMemory(pointer, op.nbytes, owner, backend.device_id)
    return cp.ndarray((op.length,), op.dtype.numpy, cp.cuda.MemoryPointer(memory, 0))


def _require_room(op: IpcOpenHandle, size: int) -> None:
    if op.nbytes > size:
        raise InvalidArgument(f"the handle shares {size} bytes; {op.length} elements of "
                              f"{op.dtype.value} ({op.nbytes} bytes) do not fit")


def _alias(backend: CudaBackend, op: IpcOpenHandle, memory: Any) -> int:
    """Open a handle exported by this process: alias its allocation."""
    _require_room(op, memory.size)
    if not enable_peer_access(backend.device_id, memory.device_id):
        raise InvalidArgument(f"CUDA device {backend.device_id} cannot reach the memory of "
                              f"device {memory.device_id} (no peer access)")
    return backend.map_in(_wrap(backend, op, memory.ptr, memory), None)


@cuda.handles(IpcOpenHandle)
def _open(backend: CudaBackend, op: IpcOpenHandle) -> int:
    handle = op.handle
    if handle.startswith(CPU_MAGIC):
        raise InvalidArgument("this IPC handle was made by a cpu device; open it on a cpu device")
    local = _EXPORTS.get(handle)
    if local is not None:
        return _alias(backend, op, local)
    device_id = backend.device_id
    base = MAPPINGS.open(handle, device_id)
    try:
        _, size = allocation_range(base)
        _require_room(op, size)
        array = _wrap(backend, op, base, None)
    except BaseException:
        MAPPINGS.close(handle, device_id)
        raise
    return backend.map_in(array, handle)


def forget(backend: CudaBackend, buffer_id: int) -> None:
    """Drop what IPC keeps for a buffer just freed: withdraw its export, or unmap it (the
    caller has waited for the work queued on it)."""
    memory = backend.exported.pop(buffer_id, None)
    if memory is not None:
        _EXPORTS.discard(memory)
    if buffer_id in backend.opened:
        handle = backend.opened.pop(buffer_id)
        if handle is not None:
            MAPPINGS.close(handle, backend.device_id)


def forget_all(backend: CudaBackend) -> None:
    """Drop what IPC keeps for every buffer (the context closes; its work has finished)."""
    for buffer_id in [*backend.exported, *backend.opened]:
        forget(backend, buffer_id)
