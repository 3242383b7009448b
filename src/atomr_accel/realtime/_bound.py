"""What the realtime data and frame actors share: a client spawned on a device (placed by the
system when none is given), an actor that answers method-named calls, and the device
buffers it owns and frees when it stops."""

from __future__ import annotations

import contextlib
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Self

from atomr_accel.actor import Props
from atomr_accel.agents._client import (
    AgentActor,
    AgentClient,
    blocking_twin,
    require_system,
    require_timeout,
)
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument
from atomr_accel.facade import Device, System
from atomr_accel.facade._buffers import GpuBuffer

__all__ = ["BoundActor", "BoundClient", "Buffers"]


@dataclass(frozen=True, slots=True)
class _Call:
    """Ask the actor to run its ``on_<method>(*args)``."""

    method: str
    args: tuple[Any, ...]


class Buffers:
    """Named device buffers of one actor, grown (at least doubling) on demand."""

    def __init__(self) -> None:
        self.held: dict[str, GpuBuffer] = {}

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

    async def drop(self, device: Device, *names: str) -> None:
        """Free the buffers ``names`` (those held)."""
        for name in names:
            buffer = self.held.pop(name, None)
            if buffer is not None:
                await device.free_async(buffer)

    async def close(self, device: Device) -> None:
        """Free every buffer; errors of a device that has gone are ignored."""
        held, self.held = list(self.held.values()), {}
        for buffer in held:
            with contextlib.suppress(GpuRuntimeError):
                await device.free_async(buffer)


class BoundActor(AgentActor):
    """An actor working on one device: ``device`` when given, else the one the system
    places it on at its first request (``System.place_async``). A request ``_Call(m, a)``
    runs ``await self.on_<m>(*a)``."""

    def __init__(self, system: System, device: Device | None) -> None:
        self._system = system
        self._device = device
        self.buffers = Buffers()

    async def device(self) -> Device:
        """The device this actor works on (placed on first use)."""
        if self._device is None:
            self._device = await self._system.place_async()
        return self._device

    async def buffer(self, name: str, length: int, dtype: DType) -> GpuBuffer:
        """The owned buffer ``name`` with room for ``length`` elements (``Buffers.get``)."""
        return await self.buffers.get(await self.device(), name, length, dtype)

    async def on_device(self) -> Device:
        """Answer the device (the ``device`` call of every client)."""
        return await self.device()

    async def handle(self, message: Any) -> Any:
        """Run ``on_<method>`` of a ``_Call``."""
        if type(message) is _Call:
            return await getattr(self, f"on_{message.method}")(*message.args)
        return await super().handle(message)

    async def post_stop(self) -> None:
        """Free the owned buffers."""
        if self._device is not None:
            await self.buffers.close(self._device)


class BoundClient(AgentClient):
    """Base of the realtime data and frame clients: spawn on a device, call the actor."""

    @classmethod
    def _spawn_bound(cls, system: Any, actor: type[BoundActor], args: tuple[Any, ...],
                     name: str | None, device: Any) -> Self:
        """Start ``actor(system, device, *args)`` in the facade ``system``; ``device`` must be
        one of its devices or None (placed by the system at the first request)."""
        facade = require_system(system)
        if device is not None and (not isinstance(device, Device)
                                   or all(d is not device for d in facade.devices)):
            raise InvalidArgument(f"device must be a Device of this system (spawn_device) or "
                                  f"None, got {device!r}")
        return cls._start_in(facade, Props(actor, facade, device, *args), name)

    def _run(self, method: str, args: tuple[Any, ...], timeout_secs: float,
             ) -> Coroutine[Any, Any, Any]:
        """The coroutine asking the actor to run ``on_<method>(*args)``."""
        return self._call(_Call(method, args), timeout_secs, method)

    def device_async(self, timeout_secs: float = 5.0) -> Coroutine[Any, Any, Device]:
        """The device this actor works on (placed by the system if spawn named none)."""
        coro: Coroutine[Any, Any, Device] = self._run("device", (), require_timeout(timeout_secs))
        return coro

    device = blocking_twin(device_async)
