"""Peer-to-peer for the facade: topology, peer access, and copies between two devices.

``System`` exposes these as methods (``can_access``, ``peer_topology``,
``enable_peer_access``, ``copy_between``, each with an ``_async`` twin).

How ``copy_between`` keeps order: the source is exported by an op on its own
device that reads the buffer, so it runs after every earlier write to it and
answers only once those writes have finished; the copy is then an op on the
destination device that writes ``dst``, so it waits for earlier users of
``dst`` and later ones wait for it; and ``copy_between`` returns only when the
copy has finished. After it returns the source may be overwritten and ``dst``
holds the data. Work on either buffer that runs *while* a copy is in flight
(started from another task and not awaited first) is not ordered with it:
await the copy before writing the source or touching ``dst`` from elsewhere,
as with any two concurrent requests.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from atomr_accel.core._errors import GpuRefStale, InvalidArgument, SystemClosed
from atomr_accel.core._op import require_nonneg
from atomr_accel.core.ops._memory import CopyBuffer, Download, Upload
from atomr_accel.core.ops._peer import CanAccessPeer, EnablePeerAccess, ExportBuffer, ImportCopy
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.facade._device import Device

if TYPE_CHECKING:
    from atomr_accel.facade._system import System

__all__ = [
    "CopyPath",
    "PeerTopology",
    "can_access",
    "copy_between",
    "enable_peer_access",
    "peer_topology",
]


class CopyPath(enum.StrEnum):
    """How ``System.copy_between`` moved the data."""

    PEER = "peer"
    """Both contexts live in this process (thread hosts): ``cudaMemcpyPeerAsync`` on the
    destination's stream, direct when the GPUs can peer (access is enabled for the pair)."""
    IPC = "ipc"
    """The contexts live in different processes and the destination can reach the source's
    memory: the source is mapped into the destination's process with CUDA IPC."""
    STAGED = "staged"
    """Through the host: ``Download`` on the source device, ``Upload`` on the destination
    (CPU devices, mixed backends, pairs without peer access, and a destination with a
    journal, which records the ``Upload`` with its data so a replay can redo the copy)."""


@dataclass(frozen=True)
class PeerTopology:
    """Which CUDA devices reach each other's memory.

    ``devices`` are CUDA device ids; ``access`` holds ``(a, b)`` for every
    ordered pair of different devices where ``a`` can read and write ``b``'s
    memory directly. A system without CUDA devices has an empty topology.
    """

    devices: tuple[int, ...]
    access: frozenset[tuple[int, int]]

    def can_access(self, a: int, b: int) -> bool:
        """True when device ``a`` reaches ``b``'s memory (a device reaches its own)."""
        return (a == b and a in self.devices) or (a, b) in self.access

    def table(self) -> str:
        """A text table: row ``a``, column ``b`` reads ``Y`` where ``a`` reaches ``b``."""
        rows = ["     " + "".join(f"{b:>4}" for b in self.devices)]
        for a in self.devices:
            marks = "".join(f"{'Y' if self.can_access(a, b) else '.':>4}" for b in self.devices)
            rows.append(f"{a:>4} {marks}")
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.table()


def _require_open(system: System, what: str) -> None:
    if system.closed:
        raise SystemClosed(system.actors.name, what)


def _member(system: System, device: Any, name: str) -> Device:
    if not isinstance(device, Device):
        raise InvalidArgument(f"{name} must be a Device, got {type(device).__name__}")
    if not any(d is device for d in system.devices):
        raise InvalidArgument(f"{name} is not a device of this system: {device!r}")
    return device


def _cuda_devices(system: System) -> list[Device]:
    return [d for d in system.devices if d.config.capabilities.peer_access]


async def _can_access(a: Device, b: Device) -> bool:
    if a is b:
        return True
    if not (a.config.capabilities.peer_access and b.config.capabilities.peer_access):
        return False
    (answer,) = await a.run_async(CanAccessPeer((b.device_id,)))
    return bool(answer)


async def can_access(system: System, a: Device, b: Device) -> bool:
    """True when device ``a`` can read and write ``b``'s memory directly (CUDA peer access).

    A device reaches its own memory; CPU devices and mixed pairs never reach
    each other's.
    """
    _require_open(system, "can_access")
    return await _can_access(_member(system, a, "a"), _member(system, b, "b"))


async def peer_topology(system: System) -> PeerTopology:
    """Which of the system's CUDA devices reach each other's memory (asks each device)."""
    _require_open(system, "peer_topology")
    askers = {d.device_id: d for d in reversed(_cuda_devices(system))}  # first one per id
    ids = tuple(sorted(askers))
    access: set[tuple[int, int]] = set()
    for a in ids:
        answers = await askers[a].run_async(CanAccessPeer(ids))
        access.update((a, b) for b, ok in zip(ids, answers, strict=True) if ok and b != a)
    return PeerTopology(ids, frozenset(access))


async def enable_peer_access(system: System) -> PeerTopology:
    """Enable peer access between every pair of the system's CUDA devices that can have it.

    Each device enables it in its own context (on the process host, in its
    worker), toward every other CUDA device of the system; calling it again is
    harmless; a rebuilt context starts without it. Returns the pairs now
    enabled. Copies do not need it (they enable access for their pair
    themselves); kernels that read a peer's memory directly do.
    """
    _require_open(system, "enable_peer_access")
    devices = _cuda_devices(system)
    ids = tuple(sorted({d.device_id for d in devices}))
    enabled: set[tuple[int, int]] = set()
    for device in devices:
        answers = await device.run_async(EnablePeerAccess(ids))
        a = device.device_id
        enabled.update((a, b) for b, ok in zip(ids, answers, strict=True) if ok and b != a)
    return PeerTopology(ids, frozenset(enabled))


async def _path(src: GpuBuffer, b: Device) -> CopyPath:
    a = src.device
    if not (a.config.capabilities.peer_access and b.config.capabilities.peer_access):
        return CopyPath.STAGED
    if b.journal is not None:  # journal an Upload with its data: a replay cannot re-read a peer
        return CopyPath.STAGED
    pid = a._state.host_pid
    if pid is not None and pid == b._state.host_pid:
        return CopyPath.PEER
    if src.ref.managed:  # CUDA gives no IPC handle for managed memory
        return CopyPath.STAGED
    return CopyPath.IPC if await _can_access(b, a) else CopyPath.STAGED


async def copy_between(
    system: System, src: GpuBuffer, dst: GpuBuffer, length: int | None = None,
    src_offset: int = 0, dst_offset: int = 0,
) -> CopyPath:
    """Copy ``length`` elements from ``src[src_offset:]`` into ``dst[dst_offset:]``.

    ``src`` and ``dst`` are buffers of two different devices of ``system``, of
    one dtype; ``length`` defaults to as many as fit in both. Returns when the
    copy has finished, with the path it took. Raises ``InvalidArgument`` for
    bad buffers, dtypes or ranges (same device: use ``Device.copy``),
    ``GpuRefStale`` for a buffer of an older context generation and
    ``SystemClosed`` once the system is closed.
    """
    _require_open(system, "copy_between")
    for name, buffer in (("src", src), ("dst", dst)):
        if not isinstance(buffer, GpuBuffer):
            raise InvalidArgument(f"{name} must be a GpuBuffer, got {type(buffer).__name__}")
        _member(system, buffer.device, f"the device of {name}")
    a, b = src.device, dst.device
    if a is b:
        raise InvalidArgument(
            "src and dst are buffers of the same device; copy them with Device.copy")
    for name, buffer in (("src", src), ("dst", dst)):
        if buffer.is_stale():
            raise GpuRefStale(f"{name} {buffer.ref!r}", buffer.generation,
                              buffer.device.generation)
    require_nonneg(src_offset=src_offset, dst_offset=dst_offset)
    count = max(0, min(len(src) - src_offset, len(dst) - dst_offset)) if length is None \
        else length
    CopyBuffer(src.ref, dst.ref, count, src_offset, dst_offset).validate()
    path = await _path(src, b)
    if count == 0:
        return path
    if path is CopyPath.STAGED:
        data = await a.run_async(Download(src.ref, src_offset, count))
        await b.run_async(Upload(dst.ref, data, dst_offset))
    else:
        source = await a.run_async(ExportBuffer(src.ref, ipc=path is CopyPath.IPC))
        await b.run_async(ImportCopy(source, dst.ref, count, src_offset, dst_offset))
    return path
