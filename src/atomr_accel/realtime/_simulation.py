"""What the physics actors share: placement on a device, owned buffers, argument checks.

A simulation actor is bound to one ``Device`` (given, or picked by the
system's placement when it starts), allocates its buffers there and runs
its steps as ``realtime`` ops with ``Device.run_async``, so stream
ordering, generations and recovery work as for any op. It frees its
buffers when it stops. When the device's context is rebuilt (a poisoned
context), its buffers are gone: the call that finds out fails with
``GpuRefStale`` and the actor restarts from its initial state.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any, Self

import numpy as np

from atomr_accel.actor import Props
from atomr_accel.agents._client import AgentActor, AgentClient, require_system
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import GpuRefStale, GpuRuntimeError, InvalidArgument
from atomr_accel.facade import Device, System
from atomr_accel.facade._buffers import GpuBuffer

__all__ = [
    "SimulationActor",
    "SimulationClient",
    "as_points",
    "as_vector",
    "require_dt",
    "require_number",
]

F32Array = np.ndarray[Any, np.dtype[np.float32]]


class SimulationActor(AgentActor):
    """Base of the physics actors: its device (placed in ``pre_start`` when None) and the
    buffers it allocates there, freed when it stops."""

    def __init__(self, system: System, device: Device | None, bytes_needed: int) -> None:
        self._system = system
        self._device = device
        self._bytes_needed = bytes_needed
        self._owned: list[GpuBuffer] = []

    async def receive(self, message: Any) -> Any:
        """Answer ``message`` as ``AgentActor`` does, except that a ``GpuRefStale`` (the
        device's context was rebuilt, and the buffers went with it) fails the call and
        restarts the actor: it starts again from its initial state on the new context."""
        try:
            return await self.handle(message)
        except GpuRefStale:
            raise
        except GpuRuntimeError as exc:
            self.context.defer_reply().set_exception(exc)
            return None

    async def pre_start(self) -> None:
        """Take the device the system's placement picks when none was given."""
        if self._device is None:
            self._device = await self._system.place_async(self._bytes_needed)

    @property
    def device(self) -> Device:
        """The device this simulation runs on."""
        assert self._device is not None, "placed in pre_start"
        return self._device

    async def allocate(self, length: int, dtype: DType = DType.F32) -> GpuBuffer:
        """A zero-filled buffer on the device, freed when the actor stops."""
        buffer = await self.device.allocate_async(max(length, 1), dtype)
        self._owned.append(buffer)
        return buffer

    async def release(self, buffer: GpuBuffer) -> None:
        """Free an owned buffer now."""
        self._owned.remove(buffer)
        await self.device.free_async(buffer)

    async def post_stop(self) -> None:
        """Free every owned buffer (nothing to free once the device itself has gone)."""
        for buffer in self._owned:
            with contextlib.suppress(GpuRuntimeError):
                await self.device.free_async(buffer)
        self._owned.clear()


class SimulationClient(AgentClient):
    """Base of the physics clients: ``spawn`` in a facade ``System`` on a given or placed
    device."""

    @classmethod
    def _spawn(cls, system: Any, actor: type[SimulationActor], args: tuple[Any, ...],
               name: str | None, device: Device | None) -> Self:
        """Start ``actor(system, device, *args)`` and wrap it; checks system and device."""
        facade = require_system(system)
        if device is not None and not isinstance(device, Device):
            raise InvalidArgument(f"device must be a Device (system.spawn_device) or None, "
                                  f"got {type(device).__name__}")
        return cls._start_in(facade, Props(actor, facade, device, *args), name)


def require_number(name: str, value: object, *, least: float | None = None,
                   above: float | None = None) -> float:
    """``value`` as a float: a finite real number (not a bool), at least ``least`` or above
    ``above`` when given; ``InvalidArgument`` otherwise."""
    if (not isinstance(value, int | float | np.floating | np.integer) or isinstance(value, bool)
            or not math.isfinite(float(value))):
        raise InvalidArgument(f"{name} must be a finite number, got {value!r}")
    number = float(value)
    if least is not None and number < least:
        raise InvalidArgument(f"{name} must be >= {least}, got {value!r}")
    if above is not None and number <= above:
        raise InvalidArgument(f"{name} must be > {above}, got {value!r}")
    return number


def require_dt(dt: object) -> float:
    """A time step: a finite number of seconds >= 0."""
    return require_number("dt", dt, least=0.0)


def as_points(value: Any, name: str) -> F32Array:
    """``value`` as an ``(n, 3)`` float32 array of finite numbers (one ``(3,)`` point is
    taken as ``n = 1``); ``InvalidArgument`` otherwise."""
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{name} must be numbers of shape (n, 3): {exc}") from None
    if array.ndim == 1 and array.shape[0] == 3:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] != 3:
        raise InvalidArgument(f"{name} must have shape (n, 3), got {array.shape}")
    if not np.isfinite(array).all():
        raise InvalidArgument(f"{name} holds a non-finite number")
    return np.ascontiguousarray(array, dtype=np.float32)


def as_vector(value: Sequence[float] | Any, name: str) -> tuple[float, float, float]:
    """Three finite numbers as a tuple of floats; ``InvalidArgument`` otherwise."""
    points = as_points(value, name)
    if len(points) != 1:
        raise InvalidArgument(f"{name} must be 3 numbers, got {len(points)} rows")
    x, y, z = (float(c) for c in np.asarray(value, dtype=np.float64).reshape(3))
    return x, y, z
