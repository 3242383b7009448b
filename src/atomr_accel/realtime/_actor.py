"""The base of every realtime actor and client: a device fixed when the actor starts, the
device buffers it owns, method-named calls, and the restart rule of a rebuilt context.

A realtime actor is bound to one ``Device`` of its system: the one ``spawn``
names (it must belong to that system), else the one the system's placement
picks (``System.place_async``) when the actor first starts (when that fails,
the first request answers why and tries again). The device is then fixed for
the actor's life, restarts included, and the client's ``device()`` answers it.
The actor runs its work as ops with ``Device.run_async`` (stream ordering,
generations and recovery as for any op) on buffers it owns: named ones that
grow on demand (``buffer``, ``upload``) and plain ones (``allocate``), all
freed when it stops. A client's call ``_run(m, args)`` is answered by the
actor's ``on_<m>(*args)``.

When the device's context is rebuilt (a poisoned context) the actor's buffers
are gone: the call that finds out fails with ``GpuRefStale`` and the actor
restarts from its initial state (as ``spawn`` made it) on the new context, on
the same device. Any other ``GpuRuntimeError`` fails only its call and leaves
the actor and its state as they were.
"""

from __future__ import annotations

import contextlib
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from atomr_accel.actor import Props
from atomr_accel.blueprint import (
    TIMEOUT,
    BlueprintClient,
    TurnActor,
    Turns,
    require_system,
    twin,
)
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import GpuRefStale, GpuRuntimeError, InvalidArgument, OutOfMemory
from atomr_accel.facade import Device, System
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.realtime._checks import require_room

__all__ = ["Buffers", "Placement", "RealtimeActor", "RealtimeClient"]


@dataclass(frozen=True, slots=True)
class _Call:
    """Ask the actor to run its ``on_<method>(*args)``."""

    method: str
    args: tuple[Any, ...]


class Placement:
    """What the incarnations of one actor share: its device (None until the system places
    the actor at its first start, then fixed) and its ``Turns`` with blocking callers."""

    __slots__ = ("device", "turns")

    def __init__(self, device: Device | None) -> None:
        self.device = device
        self.turns: Turns[RealtimeActor] = Turns()


class Buffers:
    """The device buffers one actor owns: named ones, grown (at least doubling) on demand,
    and plain ones it allocates and releases itself."""

    def __init__(self) -> None:
        self.held: dict[str, GpuBuffer] = {}
        self.plain: list[GpuBuffer] = []

    async def get(self, device: Device, name: str, length: int, dtype: DType) -> GpuBuffer:
        """The buffer ``name`` holding at least ``length`` (>= 1) elements of ``dtype``; a
        smaller one (or one of another dtype) is freed and replaced, its contents lost."""
        buffer = self.held.get(name)
        if buffer is not None and len(buffer) >= length and buffer.dtype is dtype:
            return buffer
        size = max(length, 1)
        if buffer is not None:
            if buffer.dtype is dtype:
                size = max(size, 2 * len(buffer))
            del self.held[name]
            await device.free_async(buffer)
        self.held[name] = buffer = await device.allocate_async(size, dtype)
        return buffer

    async def allocate(self, device: Device, length: int, dtype: DType) -> GpuBuffer:
        """A new zero-filled buffer of ``length`` (>= 1) elements, held until released."""
        buffer = await device.allocate_async(max(length, 1), dtype)
        self.plain.append(buffer)
        return buffer

    async def release(self, device: Device, buffer: GpuBuffer) -> None:
        """Free a buffer ``allocate`` gave."""
        self.plain.remove(buffer)
        await device.free_async(buffer)

    async def drop(self, device: Device, *names: str) -> None:
        """Free the named buffers ``names`` (those held)."""
        for name in names:
            buffer = self.held.pop(name, None)
            if buffer is not None:
                await device.free_async(buffer)

    async def close(self, device: Device) -> None:
        """Free every buffer; errors of a device or context that has gone are ignored."""
        held = [*self.held.values(), *self.plain]
        self.held, self.plain = {}, []
        for buffer in held:
            with contextlib.suppress(GpuRuntimeError):
                await device.free_async(buffer)


class RealtimeActor(TurnActor):
    """Base of the realtime actors (see the module): its device, fixed at its first start,
    the buffers it owns there, and calls ``_Call(m, a)`` answered by ``on_<m>(*a)``.

    ``bytes_needed`` is what the system's placement must find free on a device
    when it picks one.
    """

    def __init__(self, system: System, placement: Placement, bytes_needed: int = 0) -> None:
        super().__init__(placement.turns)
        self._system = system
        self._placement = placement
        self._bytes_needed = bytes_needed
        self._started = False
        self.buffers = Buffers()

    def call_error(self, exc: Exception) -> Exception | None:
        """A ``GpuRefStale`` (the device's context was rebuilt, and the buffers went with
        it) restarts the actor from its initial state (None), as does an error that is
        not typed; another typed error fails the call only, as does a host
        ``MemoryError`` (answered as ``OutOfMemory``)."""
        if isinstance(exc, GpuRefStale):
            return None
        if isinstance(exc, GpuRuntimeError):
            return exc
        if isinstance(exc, MemoryError):  # a host array of the state or of this call
            error = OutOfMemory(f"{type(self).__name__}: the host has no room for the "
                                f"arrays this needs ({exc or 'MemoryError'})")
            error.__cause__ = exc
            return error
        return None

    async def pre_start(self) -> None:
        """Place the actor (``System.place_async``, unless spawn named its device) and set
        it up (``start``). A typed error here (no device serving, no room) is answered to
        the first request instead, which tries again."""
        with contextlib.suppress(GpuRuntimeError):
            await self._ready()

    async def _ready(self) -> None:
        if self._started:
            return
        if self._placement.device is None:  # once: a restarted actor keeps its device
            self._placement.device = await self._system.place_async(self._bytes_needed)
        await self.start()
        self._started = True
        self.publish_turns()

    async def start(self) -> None:
        """Set up the initial state on the device (subclasses: buffers laid out at start);
        runs once an incarnation, after placement."""

    @property
    def device(self) -> Device:
        """The device this actor works on."""
        device = self._placement.device
        assert device is not None, "placed before any request"
        return device

    async def buffer(self, name: str, length: int, dtype: DType = DType.F32) -> GpuBuffer:
        """The owned buffer ``name`` with room for ``length`` elements (``Buffers.get``)."""
        return await self.buffers.get(self.device, name, length, dtype)

    async def upload(self, name: str, data: np.ndarray[Any, Any], dtype: DType) -> GpuBuffer:
        """The owned buffer ``name`` (``buffer``) holding ``data`` (of ``dtype``, flattened)
        from its first element on."""
        buffer = await self.buffer(name, data.size, dtype)
        if data.size:
            await self.device.copy_from_numpy_async(buffer, data.reshape(-1), 0)
        return buffer

    async def allocate(self, length: int, dtype: DType = DType.F32) -> GpuBuffer:
        """A new zero-filled owned buffer (``Buffers.allocate``)."""
        return await self.buffers.allocate(self.device, length, dtype)

    async def release(self, buffer: GpuBuffer) -> None:
        """Free an owned buffer ``allocate`` gave, now."""
        await self.buffers.release(self.device, buffer)

    async def handle(self, message: Any) -> Any:
        """Run ``on_<method>`` of a ``_Call``, once the actor is placed and started."""
        await self._ready()
        if type(message) is _Call:
            return await getattr(self, f"on_{message.method}")(*message.args)
        return await super().handle(message)

    async def on_device(self) -> Device:
        """Answer the device (the ``device`` call of every client)."""
        return self.device

    async def post_stop(self) -> None:
        """Free every owned buffer, once a blocking caller's turn under way has ended."""
        await super().post_stop()
        if self._placement.device is not None:
            await self.buffers.close(self._placement.device)


class RealtimeClient(BlueprintClient):
    """Base of the realtime clients: spawn an actor on a device, call its methods (a
    blocking call on the calling thread when the actor is idle: ``Turns``)."""

    @classmethod
    def _spawn(cls, system: Any, actor: type[RealtimeActor], args: tuple[Any, ...],
               name: str | None, device: Any, nbytes: int = 0) -> Self:
        """Start ``actor(system, placement, *args)`` in the facade ``system``; ``device``
        must be one of its devices, or None (the system places the actor as it starts).
        ``nbytes`` is what its state takes from its start on (``require_room``)."""
        require_room(actor.__name__.lstrip("_"), nbytes)
        facade = require_system(system)
        if device is not None and (not isinstance(device, Device)
                                   or all(d is not device for d in facade.devices)):
            raise InvalidArgument(f"device must be a Device of this system (spawn_device) or "
                                  f"None, got {device!r}")
        placement = Placement(device)
        return cls._start(facade, Props(actor, facade, placement, *args), name, placement.turns)

    def _run(self, method: str, args: tuple[Any, ...], timeout_secs: object,
             ) -> Coroutine[Any, Any, Any]:
        """The coroutine running the actor's ``on_<method>(*args)``: on the calling thread
        when a blocking call finds the actor idle (``Turns``), else asking the actor;
        ``timeout_secs`` is checked now (``require_timeout``)."""
        return self._on_turn(_Call(method, args), timeout_secs, method)

    def device_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, Device]:
        """The device this actor works on (the one the system placed it on if spawn named
        none)."""
        return self._run("device", (), timeout_secs)

    device = twin(device_async)
