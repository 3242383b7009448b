"""Peer-to-peer on CUDA (CuPy): topology, peer access, and copies between devices.

* Topology: ``cudaDeviceCanAccessPeer``; a device always reaches its own memory.
* ``EnablePeerAccess``: ``cudaDeviceEnablePeerAccess`` in this process's context
  of the device, for every peer it can reach; "already enabled" is success.
* ``ExportBuffer``: the buffer's address and, when asked, the CUDA IPC handle of
  the allocation holding it with the buffer's offset in it. CuPy's memory pool
  hands out pieces of larger ``cudaMalloc`` allocations and a handle always
  names (and opens at the base of) a whole allocation, so the allocation is
  looked up with the driver's ``cuMemGetAddressRange``.
* ``ImportCopy``: a source in this same process (both contexts on thread hosts)
  is copied with ``cudaMemcpyPeerAsync`` on the op's stream, after enabling
  peer access to the source's device once per process (as CuPy does before its
  own peer copies): without it the driver stages the copy through the host. A
  source in another
  process is mapped with ``cudaIpcOpenMemHandle`` (peer access enabled lazily),
  copied with ``cudaMemcpyAsync``, and unmapped once the copy has finished: the
  context thread waits for that copy, since CUDA must not unmap memory that
  queued work still reads. Mappings are counted per process: CUDA lets a
  context open a given handle only once, and one process may host two devices.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from typing import TYPE_CHECKING, Any

import cupy as cp

from atomr_accel.backends._handlers import cuda
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._peer import (
    CanAccessPeer,
    EnablePeerAccess,
    ExportBuffer,
    ImportCopy,
    PeerSource,
)

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

__all__ = ["MAPPINGS", "allocation_range", "can_access_peer", "enable_peer_access"]


_PEER_ACCESS_ALREADY_ENABLED = 704  # cudaErrorPeerAccessAlreadyEnabled (CuPy names no constant)


def can_access_peer(device: int, peer: int) -> bool:
    """True when ``device`` can read and write ``peer``'s memory directly."""
    return device == peer or bool(cp.cuda.runtime.deviceCanAccessPeer(device, peer))


def enable_peer_access(device: int, peer: int) -> bool:
    """Let this process's context of ``device`` reach ``peer``'s memory; False if it cannot."""
    if not can_access_peer(device, peer):
        return False
    if device != peer:
        with cp.cuda.Device(device):
            try:
                cp.cuda.runtime.deviceEnablePeerAccess(peer)
            except cp.cuda.runtime.CUDARuntimeError as exc:
                if exc.status != _PEER_ACCESS_ALREADY_ENABLED:
                    raise
    return True


@functools.cache
def _enable_once(device: int, peer: int) -> bool:
    return enable_peer_access(device, peer)


@functools.cache
def _address_range() -> Any:
    function = ctypes.CDLL("libcuda.so.1").cuMemGetAddressRange_v2
    function.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                         ctypes.c_uint64]
    function.restype = ctypes.c_int
    return function


def allocation_range(pointer: int) -> tuple[int, int]:
    """``(base, size)`` of the device allocation that holds ``pointer``.

    Runs on a thread whose current context owns the pointer (a context host's).
    """
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    status = _address_range()(ctypes.byref(base), ctypes.byref(size), pointer)
    if status != 0:
        raise cp.cuda.driver.CUDADriverError(status=status)
    return base.value, size.value


class _Mappings:
    """IPC memory handles opened in this process, per (handle, device), with a user count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[tuple[bytes, int], list[int]] = {}  # -> [base address, users]

    def open(self, handle: bytes, device_id: int) -> int:
        """Map ``handle`` into ``device_id``'s context (once) and return its base address."""
        with self._lock:
            entry = self._open.get((handle, device_id))
            if entry is None:
                with cp.cuda.Device(device_id):
                    base = cp.cuda.runtime.ipcOpenMemHandle(
                        handle, cp.cuda.runtime.cudaIpcMemLazyEnablePeerAccess)
                entry = self._open[handle, device_id] = [base, 0]
            entry[1] += 1
            return entry[0]

    def close(self, handle: bytes, device_id: int) -> None:
        """Drop one use of the mapping; unmap it when nobody uses it any more."""
        with self._lock:
            entry = self._open[handle, device_id]
            entry[1] -= 1
            if entry[1] == 0:
                del self._open[handle, device_id]
                with cp.cuda.Device(device_id):
                    cp.cuda.runtime.ipcCloseMemHandle(entry[0])


MAPPINGS = _Mappings()
"""This process's IPC mappings (``ImportCopy`` and ``IpcOpenHandle`` share them)."""


def _check_visible(peers: tuple[int, ...]) -> None:
    count = cp.cuda.runtime.getDeviceCount()
    for peer in peers:
        if peer >= count:
            raise InvalidArgument(f"no CUDA device {peer} (this machine has {count})")


@cuda.handles(CanAccessPeer)
def _can_access(backend: CudaBackend, op: CanAccessPeer) -> tuple[bool, ...]:
    _check_visible(op.peers)
    return tuple(can_access_peer(backend.device_id, peer) for peer in op.peers)


@cuda.handles(EnablePeerAccess)
def _enable(backend: CudaBackend, op: EnablePeerAccess) -> tuple[bool, ...]:
    _check_visible(op.peers)
    return tuple(enable_peer_access(backend.device_id, peer) for peer in op.peers)


@cuda.handles(ExportBuffer)
def _export(backend: CudaBackend, op: ExportBuffer) -> PeerSource:
    pointer = int(backend.array(op.ref.buffer_id).data.ptr)
    handle, offset = None, 0
    if op.ipc and op.ref.length:
        base, _ = allocation_range(pointer)
        handle, offset = cp.cuda.runtime.ipcGetMemHandle(base), pointer - base
    return PeerSource(os.getpid(), backend.device_id, op.ref.dtype, op.ref.length, pointer,
                      handle, offset)


@cuda.handles(ImportCopy)
def _import_copy(backend: CudaBackend, op: ImportCopy) -> None:
    source = op.source
    itemsize = source.dtype.itemsize
    nbytes = op.length * itemsize
    if nbytes == 0:
        return
    dst = int(backend.array(op.dst.buffer_id).data.ptr) + op.dst_offset * itemsize
    stream = cp.cuda.get_current_stream()
    if source.pid == os.getpid():  # same process: the address is valid here as it is
        src = source.pointer + op.src_offset * itemsize
        _enable_once(backend.device_id, source.device_id)
        cp.cuda.runtime.memcpyPeerAsync(dst, backend.device_id, src, source.device_id, nbytes,
                                        stream.ptr)
        return
    if source.ipc_handle is None:
        raise InvalidArgument(
            f"the source buffer lives in process {source.pid}, not this one ({os.getpid()}), "
            "and was exported without an IPC handle; export it with ipc=True"
        )
    base = MAPPINGS.open(source.ipc_handle, backend.device_id)
    try:
        src = base + source.ipc_offset + op.src_offset * itemsize
        cp.cuda.runtime.memcpyAsync(dst, src, nbytes, cp.cuda.runtime.memcpyDefault, stream.ptr)
        stream.synchronize()  # the mapping may close only once nothing reads through it
    finally:
        MAPPINGS.close(source.ipc_handle, backend.device_id)
