"""ClothSimulationActor: a mass-spring cloth (Verlet integration, constraint relaxation)
stepped on a device."""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr_accel.agents._client import TIMEOUT, blocking_twin, require_timeout
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._realtime_physics import ClothStep
from atomr_accel.facade import Device, System
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.patterns._base import require_positive_int
from atomr_accel.realtime._simulation import (
    F32Array,
    SimulationActor,
    SimulationClient,
    as_vector,
    require_dt,
    require_number,
)

__all__ = ["ClothSimulationActor"]


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


@dataclass(frozen=True, slots=True)
class _Pin:
    indices: np.ndarray[Any, np.dtype[np.int64]]
    pinned: bool


@dataclass(frozen=True, slots=True)
class _Step:
    dt: float


@dataclass(frozen=True, slots=True)
class _Wind:
    wind: tuple[float, float, float]


class _Positions:
    __slots__ = ()


class _ClothActor(SimulationActor):
    """Holds positions, previous positions and inverse masses (0 = pinned) on the device."""

    def __init__(self, system: System, device: Device | None, settings: _Settings) -> None:
        n = settings.width * settings.height
        super().__init__(system, device, 28 * n)
        self.s = settings
        self.wind = settings.wind
        self.inverse_mass = np.ones(n, dtype=np.float32)
        self.positions: GpuBuffer | None = None
        self.previous: GpuBuffer | None = None
        self.masses: GpuBuffer | None = None

    async def pre_start(self) -> None:
        """Place the cloth, then lay it out: vertex ``(row, col)`` at
        ``(col * spacing, -row * spacing, 0)``, at rest."""
        await super().pre_start()
        s = self.s
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

    async def handle(self, message: Any) -> Any:
        cls = type(message)
        assert self.positions is not None and self.previous is not None
        assert self.masses is not None
        dev = self.device
        if cls is _Step:
            s = self.s
            await dev.run_async(ClothStep(
                dev.ref_of(self.positions), dev.ref_of(self.previous), dev.ref_of(self.masses),
                s.width, s.height, s.spacing, s.stiffness, s.iterations, message.dt,
                s.gravity_y, self.wind, s.damping))
            return None
        if cls is _Positions:
            n = self.s.width * self.s.height
            return await dev.copy_to_numpy_async(self.positions, shape=(n, 3))
        if cls is _Pin:
            self.inverse_mass[message.indices] = 0.0 if message.pinned else 1.0
            await dev.copy_from_numpy_async(self.masses, self.inverse_mass)
            return None
        if cls is _Wind:
            self.wind = message.wind
            return None
        return await super().handle(message)


class ClothSimulationActor(SimulationClient):
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
        if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 0:
            raise InvalidArgument(f"iterations must be an int >= 0, got {iterations!r}")
        stiff = require_number("stiffness", stiffness, least=0.0)
        damp = require_number("damping", damping, least=0.0)
        if stiff > 1 or damp > 1:
            raise InvalidArgument(f"stiffness and damping must be in [0, 1], got "
                                  f"{stiffness!r}, {damping!r}")
        settings = _Settings(width, height, require_number("spacing", spacing, above=0.0),
                             stiff, iterations, require_number("gravity_y", gravity_y),
                             as_vector(wind, "wind"), damp)
        client = cls._spawn(system, _ClothActor, (settings,), name, device)
        client.width, client.height = width, height
        return client

    width = 0
    height = 0

    def _indices(self, indices: Any) -> np.ndarray[Any, np.dtype[np.int64]]:
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
        return self._call(_Pin(self._indices(indices), True), require_timeout(timeout_secs),
                          "pin")

    def unpin_async(self, indices: Any, timeout_secs: float = TIMEOUT,
                    ) -> Coroutine[Any, Any, None]:
        """Let the vertices ``indices`` move again."""
        return self._call(_Pin(self._indices(indices), False), require_timeout(timeout_secs),
                          "unpin")

    def set_wind_async(self, wind: Any, timeout_secs: float = TIMEOUT,
                       ) -> Coroutine[Any, Any, None]:
        """Set the wind: a constant acceleration ``(x, y, z)`` on every free vertex."""
        return self._call(_Wind(as_vector(wind, "wind")), require_timeout(timeout_secs),
                          "set_wind")

    def step_async(self, dt: float, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, None]:
        """Advance the cloth by ``dt`` seconds."""
        return self._call(_Step(require_dt(dt)), require_timeout(timeout_secs), "step")

    def positions_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, F32Array]:
        """Every vertex's position, ``(width * height, 3)`` float32, row by row."""
        return self._call(_Positions(), require_timeout(timeout_secs), "positions")

    pin = blocking_twin(pin_async)
    unpin = blocking_twin(unpin_async)
    set_wind = blocking_twin(set_wind_async)
    step = blocking_twin(step_async)
    positions = blocking_twin(positions_async)
