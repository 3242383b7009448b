"""ClothSimulationActor: a mass-spring cloth (Verlet integration, constraint relaxation)
stepped on a device."""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr_accel.blueprint import TIMEOUT, require_positive_int, twin
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._realtime_physics import ClothStep
from atomr_accel.facade import Device, System
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.realtime._actor import Placement, RealtimeActor, RealtimeClient
from atomr_accel.realtime._checks import (
    F32Array,
    as_vector,
    require_count,
    require_dt,
    require_number,
)

__all__ = ["ClothSimulationActor"]

Indices = np.ndarray[Any, np.dtype[np.int64]]


@dataclass(frozen=True, slots=True)
class _Settings:
    width: int
    height: int
    spacing: float
    stiffness: float
    iterations: int
    gravity_y: float
    wind: tuple[float, float, float]
    damping: float


def _bytes(settings: _Settings) -> int:
    """A cloth's device bytes: positions, previous positions (3 floats each) and masses;
    its start takes about twice as much on the host."""
    return 28 * settings.width * settings.height


class _ClothActor(RealtimeActor):
    """Holds positions, previous positions and inverse masses (0 = pinned) on the device."""

    def __init__(self, system: System, placement: Placement, settings: _Settings) -> None:
        super().__init__(system, placement, _bytes(settings))
        self.s = settings
        self.wind = settings.wind
        self.inverse_mass = np.ones(0, dtype=np.float32)
        self.positions: GpuBuffer | None = None
        self.previous: GpuBuffer | None = None
        self.masses: GpuBuffer | None = None

    async def start(self) -> None:
        """Lay the cloth out: vertex ``(row, col)`` at
        ``(col * spacing, -row * spacing, 0)``, at rest."""
        s = self.s
        self.inverse_mass = np.ones(s.width * s.height, dtype=np.float32)
        rows, cols = np.meshgrid(np.arange(s.height), np.arange(s.width), indexing="ij")
        grid = np.stack([cols * s.spacing, -rows * s.spacing, np.zeros(rows.shape)], axis=-1)
        start = grid.astype(np.float32).ravel()
        dev = self.device
        self.positions = await self.allocate(start.size)
        self.previous = await self.allocate(start.size)
        self.masses = await self.allocate(s.width * s.height)
        await dev.copy_from_numpy_async(self.positions, start)
        await dev.copy_from_numpy_async(self.previous, start)
        await dev.copy_from_numpy_async(self.masses, self.inverse_mass)

    def _fields(self) -> tuple[GpuBuffer, GpuBuffer, GpuBuffer]:
        assert self.positions is not None and self.previous is not None
        assert self.masses is not None
        return self.positions, self.previous, self.masses

    async def on_step(self, dt: float) -> None:
        dev, s = self.device, self.s
        positions, previous, masses = self._fields()
        await dev.run_async(ClothStep(
            dev.ref_of(positions), dev.ref_of(previous), dev.ref_of(masses), s.width,
            s.height, s.spacing, s.stiffness, s.iterations, dt, s.gravity_y, self.wind,
            s.damping))

    async def on_positions(self) -> F32Array:
        n = self.s.width * self.s.height
        return await self.device.copy_to_numpy_async(self._fields()[0], shape=(n, 3))

    async def _set_inverse_mass(self, indices: Indices, value: float) -> None:
        self.inverse_mass[indices] = value
        await self.device.copy_from_numpy_async(self._fields()[2], self.inverse_mass)

    async def on_pin(self, indices: Indices) -> None:
        await self._set_inverse_mass(indices, 0.0)

    async def on_unpin(self, indices: Indices) -> None:
        await self._set_inverse_mass(indices, 1.0)

    async def on_set_wind(self, wind: tuple[float, float, float]) -> None:
        self.wind = wind


class ClothSimulationActor(RealtimeClient):
    """A ``width x height`` mass-spring cloth on a device: vertex ``row * width + col``
    starts at ``(col * spacing, -row * spacing, 0)`` (a sheet hanging in the x-y plane).

    Each step integrates by Verlet (``x' = x + damping (x - x_prev) + (g + wind)
    dt^2``, gravity ``gravity_y`` along y, ``wind`` a constant acceleration)
    and then relaxes the structural, shear and bending springs ``iterations``
    times, each spring pulling its ends toward its rest length by ``stiffness``
    of its stretch (see ``ClothStep``). Pinned vertices do not move. Every
    method has an ``_async`` twin; bad input raises ``InvalidArgument``.
    """

    @classmethod
    def spawn(cls, system: Any, width: int = 16, height: int = 16, spacing: float = 0.1,
              stiffness: float = 0.5, iterations: int = 4, name: str | None = None, *,
              device: Device | None = None, gravity_y: float = -9.8,
              wind: Any = (0.0, 0.0, 0.0), damping: float = 0.99) -> ClothSimulationActor:
        """Start a cloth at rest on ``device`` (None: the system's placement picks one)."""
        require_positive_int("width", width)
        require_positive_int("height", height)
        require_count("iterations", iterations)
        stiff = require_number("stiffness", stiffness, least=0.0)
        damp = require_number("damping", damping, least=0.0)
        if stiff > 1 or damp > 1:
            raise InvalidArgument(f"stiffness and damping must be in [0, 1], got "
                                  f"{stiffness!r}, {damping!r}")
        settings = _Settings(width, height, require_number("spacing", spacing, above=0.0),
                             stiff, iterations, require_number("gravity_y", gravity_y),
                             as_vector(wind, "wind"), damp)
        client = cls._spawn(system, _ClothActor, (settings,), name, device, _bytes(settings))
        client.width, client.height = width, height
        return client

    width = 0
    height = 0

    def _indices(self, indices: Any) -> Indices:
        try:
            array = np.asarray(indices)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"indices must be vertex numbers: {exc}") from None
        if array.size == 0:
            return np.zeros(0, dtype=np.int64)
        if array.dtype.kind not in "iu" or array.ndim > 1:
            raise InvalidArgument(f"indices must be ints, got {array.dtype} of shape "
                                  f"{array.shape}")
        array = array.astype(np.int64).reshape(-1)
        if array.min() < 0 or array.max() >= self.width * self.height:
            raise InvalidArgument(f"indices must lie in [0, {self.width * self.height})")
        return array

    def pin_async(self, indices: Any, timeout_secs: float = TIMEOUT,
                  ) -> Coroutine[Any, Any, None]:
        """Pin the vertices ``indices`` (``row * width + col``) where they are now."""
        return self._run("pin", (self._indices(indices),), timeout_secs)

    pin = twin(pin_async)

    def unpin_async(self, indices: Any, timeout_secs: float = TIMEOUT,
                    ) -> Coroutine[Any, Any, None]:
        """Let the vertices ``indices`` move again."""
        return self._run("unpin", (self._indices(indices),), timeout_secs)

    unpin = twin(unpin_async)

    def set_wind_async(self, wind: Any, timeout_secs: float = TIMEOUT,
                       ) -> Coroutine[Any, Any, None]:
        """Set the wind: a constant acceleration ``(x, y, z)`` on every free vertex."""
        return self._run("set_wind", (as_vector(wind, "wind"),), timeout_secs)

    set_wind = twin(set_wind_async)

    def step_async(self, dt: float, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, None]:
        """Advance the cloth by ``dt`` seconds."""
        return self._run("step", (require_dt(dt),), timeout_secs)

    step = twin(step_async)

    def positions_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, F32Array]:
        """Every vertex's position, ``(width * height, 3)`` float32, row by row."""
        return self._run("positions", (), timeout_secs)

    positions = twin(positions_async)
