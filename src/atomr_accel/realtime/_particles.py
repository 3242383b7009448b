"""ParticleSystemActor: particles under gravity and drag that bounce on the ground and die
when their lifetime runs out, stepped on a device."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import numpy as np

from atomr_accel.blueprint import TIMEOUT, twin
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._realtime_physics import ParticleCompact, ParticleStep
from atomr_accel.facade import Device, System
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.realtime._actor import Placement, RealtimeActor, RealtimeClient
from atomr_accel.realtime._checks import F32Array, as_points, require_dt, require_number

__all__ = ["ParticleSystemActor"]

_MIN_CAPACITY = 1024


class _ParticleActor(RealtimeActor):
    """Holds the particles in device buffers (positions, velocities, lifetimes, a live
    counter), growing them by doubling."""

    def __init__(self, system: System, placement: Placement, gravity_y: float, drag: float,
                 bounce: float, ground_y: float) -> None:
        super().__init__(system, placement)
        self.gravity_y, self.drag, self.bounce, self.ground_y = gravity_y, drag, bounce, ground_y
        self.count = 0
        self.capacity = 0
        self.arrays: dict[str, GpuBuffer] = {}

    async def _reserve(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        size = max(needed, 2 * self.capacity, _MIN_CAPACITY)
        fresh = {"positions": await self.allocate(3 * size),
                 "velocities": await self.allocate(3 * size),
                 "lifetimes": await self.allocate(size)}
        dev = self.device
        for key, width in (("positions", 3), ("velocities", 3), ("lifetimes", 1)):
            old = self.arrays.get(key)
            if old is not None:
                if self.count:
                    await dev.copy_async(old, fresh[key], width * self.count)
                await self.release(old)
        if "live" not in self.arrays:
            fresh["live"] = await self.allocate(1, DType.I32)
        self.arrays.update(fresh)
        self.capacity = size

    async def on_emit(self, positions: F32Array, velocities: F32Array,
                      lifetimes: F32Array) -> int:
        n = len(positions)
        if n == 0:
            return self.count
        await self._reserve(self.count + n)
        dev, first = self.device, self.count
        await dev.copy_from_numpy_async(self.arrays["positions"], positions.ravel(), 3 * first)
        await dev.copy_from_numpy_async(self.arrays["velocities"], velocities.ravel(),
                                        3 * first)
        await dev.copy_from_numpy_async(self.arrays["lifetimes"], lifetimes, first)
        self.count += n
        return self.count

    async def on_step(self, dt: float) -> int:
        if self.count == 0:
            return 0
        dev, b = self.device, self.arrays
        pos, vel, life = (dev.ref_of(b[key]) for key in ("positions", "velocities", "lifetimes"))
        live: int = await dev.run_async(ParticleStep(
            pos, vel, life, dev.ref_of(b["live"]), self.count, dt, self.gravity_y, self.drag,
            self.bounce, self.ground_y))
        if live < self.count:
            await dev.run_async(ParticleCompact(pos, vel, life, self.count))
            self.count = live
        return live

    async def _read(self, what: str) -> F32Array:
        if self.count == 0:
            return np.zeros((0, 3) if what != "lifetimes" else (0,), dtype=np.float32)
        width = 1 if what == "lifetimes" else 3
        data = await self.device.copy_to_numpy_async(self.arrays[what], 0, width * self.count)
        return data.reshape(self.count, 3) if width == 3 else data

    async def on_positions(self) -> F32Array:
        return await self._read("positions")

    async def on_velocities(self) -> F32Array:
        return await self._read("velocities")

    async def on_lifetimes(self) -> F32Array:
        return await self._read("lifetimes")

    async def on_live_count(self) -> int:
        return self.count


class ParticleSystemActor(RealtimeClient):
    """Particles under gravity (``gravity_y``, along y) and linear drag (``drag``, 1/s),
    bouncing on the ground plane ``y = ground_y`` with restitution ``bounce``, each living
    for its lifetime (seconds), stepped on a device.

    The update over a step is exact for constant gravity and linear drag (no
    integration error in flight); a particle that ends a step below the ground
    is reflected above it, its distance below and its downward speed scaled by
    ``bounce``. Particles whose lifetime has run out are removed at the end of
    the step that ends it; the survivors keep their emission order. Every
    method has an ``_async`` twin; bad input raises ``InvalidArgument``.
    """

    @classmethod
    def spawn(cls, system: Any, gravity_y: float = -9.8, drag: float = 0.0,
              bounce: float = 0.5, name: str | None = None, *, device: Device | None = None,
              ground_y: float = 0.0) -> ParticleSystemActor:
        """Start an empty particle system on ``device`` (None: the system's placement
        picks one); ``name`` names its actor."""
        args = (require_number("gravity_y", gravity_y), require_number("drag", drag, least=0),
                require_number("bounce", bounce, least=0), require_number("ground_y", ground_y))
        return cls._spawn(system, _ParticleActor, args, name, device)

    def emit_async(self, positions: Any, velocities: Any, lifetimes: Any = None,
                   timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, int]:
        """Add particles: ``positions`` and ``velocities`` of shape ``(n, 3)`` and
        ``lifetimes`` (``n`` seconds > 0, one number for all, or None: forever); answers
        how many particles there are now."""
        p = as_points(positions, "positions")
        v = as_points(velocities, "velocities")
        if len(p) != len(v):
            raise InvalidArgument(f"{len(p)} positions but {len(v)} velocities")
        life = _lifetimes(lifetimes, len(p))
        return self._run("emit", (p, v, life), timeout_secs)

    emit = twin(emit_async)

    def step_async(self, dt: float, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, int]:
        """Advance every particle by ``dt`` seconds; answers how many are alive after it
        (0 when empty)."""
        return self._run("step", (require_dt(dt),), timeout_secs)

    step = twin(step_async)

    def positions_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, F32Array]:
        """The live particles' positions, ``(n, 3)`` float32, in emission order."""
        return self._run("positions", (), timeout_secs)

    positions = twin(positions_async)

    def velocities_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, F32Array]:
        """The live particles' velocities, ``(n, 3)`` float32, in emission order."""
        return self._run("velocities", (), timeout_secs)

    velocities = twin(velocities_async)

    def lifetimes_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, F32Array]:
        """The live particles' remaining lifetimes (seconds, ``inf`` for forever)."""
        return self._run("lifetimes", (), timeout_secs)

    lifetimes = twin(lifetimes_async)

    async def live_count_async(self, timeout_secs: float = TIMEOUT) -> int:
        """How many particles are alive."""
        return int(await self._run("live_count", (), timeout_secs))

    live_count = twin(live_count_async)

def _lifetimes(value: Any, n: int) -> F32Array:
    """Lifetimes for ``n`` particles: None (forever), one number or ``n`` numbers > 0."""
    if value is None:
        return np.full(n, np.inf, dtype=np.float32)
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"lifetimes must be numbers: {exc}") from None
    if array.ndim == 0:
        array = np.full(n, float(array))
    if array.shape != (n,):
        raise InvalidArgument(f"lifetimes must hold {n} numbers, got shape {array.shape}")
    if np.isnan(array).any() or (array <= 0).any():
        raise InvalidArgument("lifetimes must be > 0 (inf for forever)")
    return array.astype(np.float32)
