"""Peer ops: which devices reach each other's memory, and copies between two devices.

A copy from a buffer of device A into a buffer of device B runs in two ops,
because each context only touches its own device: ``ExportBuffer`` on A
describes the source (its address, and a CUDA IPC handle when B's context lives
in another process) once every earlier write to it has finished, and
``ImportCopy`` on B copies from that description into the destination, ordered
like any other write to it. ``System.copy_between`` drives both; where a direct
copy is impossible it stages through the host (``Download`` on A, ``Upload``
on B) instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import PickleByFields
from atomr_accel.core._op import Op, require_len, require_nonneg
from atomr_accel.core._ref import GpuRef

__all__ = ["CanAccessPeer", "EnablePeerAccess", "ExportBuffer", "ImportCopy", "PeerSource"]


def _require_peers(peers: tuple[int, ...]) -> None:
    if not isinstance(peers, tuple):
        raise InvalidArgument(f"peers must be a tuple of device ids, got {peers!r}")
    for peer in peers:
        require_nonneg(peer=peer)


@dataclass(frozen=True, slots=True)
class CanAccessPeer(Op):
    """Ask whether this device can read and write the memory of each device in ``peers``.

    Answers a tuple of bools in the order of ``peers``; ``cudaDeviceCanAccessPeer``
    on CUDA (a device's own id answers True), all False on the CPU backend.
    """

    peers: tuple[int, ...]

    def validate(self) -> None:
        _require_peers(self.peers)


@dataclass(frozen=True, slots=True)
class EnablePeerAccess(Op):
    """Let this context reach the memory of each device in ``peers`` that it can.

    Runs in the device's own context, so on the process host it is the worker
    that enables access (peer access belongs to a context, hence to a process).
    Idempotent: access already enabled counts as enabled. Answers a tuple of
    bools in the order of ``peers``: True where access is now enabled.
    """

    peers: tuple[int, ...]

    def validate(self) -> None:
        _require_peers(self.peers)


@dataclass(frozen=True, slots=True)
class PeerSource(PickleByFields):
    """Where a buffer of another device lies; what ``ExportBuffer`` answers. Picklable.

    ``pointer`` is the buffer's device address in process ``pid`` (usable as is
    in that process only). ``ipc_handle`` is the CUDA IPC memory handle of the
    allocation holding the buffer (None when no other process needs it), and
    ``ipc_offset`` the buffer's byte offset in that allocation: a memory pool
    hands out pieces of larger allocations, and a handle always names a whole
    allocation.
    """

    pid: int
    device_id: int
    dtype: DType
    length: int
    pointer: int
    ipc_handle: bytes | None = None
    ipc_offset: int = 0


@dataclass(frozen=True, slots=True)
class ExportBuffer(Op):
    """Describe buffer ``ref`` for a copy by another device; answers a ``PeerSource``.

    The op reads ``ref``, so it is ordered after every earlier write to it, and
    its answer arrives once those writes have finished: a copy made from the
    answer sees their data. ``ipc`` asks for a CUDA IPC handle, needed when the
    destination's context lives in another process.
    """

    ref: GpuRef
    ipc: bool = False

    def validate(self) -> None:
        if not isinstance(self.ref, GpuRef):
            raise InvalidArgument(f"ref must be a GpuRef, got {self.ref!r}")
        if not isinstance(self.ipc, bool):
            raise InvalidArgument(f"ipc must be a bool, got {self.ipc!r}")


@dataclass(frozen=True, slots=True)
class ImportCopy(Op):
    """Copy ``length`` elements from ``source[src_offset:]`` into ``dst[dst_offset:]``.

    ``source`` is what ``ExportBuffer`` answered on the source device. The op
    writes ``dst``: it waits for earlier readers and writers of ``dst`` and later
    ops on ``dst`` wait for it. It answers when the copy has finished.
    """

    outputs: ClassVar[tuple[str, ...]] = ("dst",)
    source: PeerSource
    dst: GpuRef
    length: int
    src_offset: int = 0
    dst_offset: int = 0

    def validate(self) -> None:
        if not isinstance(self.source, PeerSource):
            raise InvalidArgument(
                f"source must be a PeerSource, got {type(self.source).__name__}"
            )
        if not isinstance(self.dst, GpuRef):
            raise InvalidArgument(f"dst must be a GpuRef, got {self.dst!r}")
        require_nonneg(length=self.length, src_offset=self.src_offset,
                       dst_offset=self.dst_offset)
        if self.source.dtype is not self.dst.dtype:
            raise InvalidArgument(
                f"dst has dtype {self.dst.dtype.value} but the source holds "
                f"{self.source.dtype.value}"
            )
        if not self.src_offset + self.length <= self.source.length:
            raise InvalidArgument(
                f"source needs {self.src_offset + self.length} elements but its buffer holds "
                f"{self.source.length}"
            )
        require_len(self.dst, self.dst_offset + self.length, "dst")
