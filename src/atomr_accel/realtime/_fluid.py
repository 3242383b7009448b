"""FluidSimulationActor: stable fluids (advection, viscosity, pressure projection) on a
MAC grid, stepped on a device."""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr_accel.blueprint import TIMEOUT, require_positive_int, twin
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._realtime_physics import (
    PRESSURE_TOLERANCE,
    FluidAddSource,
    FluidDivergence,
    FluidStep,
    fluid_scratch,
)
from atomr_accel.facade import Device, System
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.realtime._actor import Placement, RealtimeActor, RealtimeClient
from atomr_accel.realtime._checks import F32Array, require_count, require_dt, require_number

__all__ = ["FluidSimulationActor"]

_FIELDS = ("u", "v", "density", "pressure", "divergence", "scratch")


@dataclass(frozen=True, slots=True)
class _Settings:
    width: int
    height: int
    viscosity: float
    pressure_iterations: int
    diffusion_iterations: int
    use_graph: bool
    pressure_tolerance: float


def _sizes(w: int, h: int) -> dict[str, int]:
    """The float32 elements of each field of a ``w x h`` fluid."""
    return {"u": h * (w + 1), "v": (h + 1) * w, "density": w * h, "pressure": w * h,
            "divergence": w * h, "scratch": fluid_scratch(w, h)}


class _FluidActor(RealtimeActor):
    """Holds the face velocities, density, pressure, divergence and scratch on the device."""

    def __init__(self, system: System, placement: Placement, settings: _Settings) -> None:
        self.sizes = _sizes(settings.width, settings.height)
        super().__init__(system, placement, 4 * sum(self.sizes.values()))
        self.s = settings
        self.fields: dict[str, GpuBuffer] = {}

    async def start(self) -> None:
        """Allocate the fluid's fields (all zero: still and empty)."""
        for key in _FIELDS:
            self.fields[key] = await self.allocate(self.sizes[key])

    def _ref(self, key: str) -> GpuRef:
        return self.device.ref_of(self.fields[key])

    async def on_step(self, dt: float) -> None:
        s = self.s
        await self.device.run_async(FluidStep(
            self._ref("u"), self._ref("v"), self._ref("density"), self._ref("pressure"),
            self._ref("divergence"), self._ref("scratch"), s.width, s.height, dt,
            s.viscosity, s.pressure_iterations, s.diffusion_iterations, s.use_graph,
            s.pressure_tolerance))

    async def _add_source(self, x: int, y: int, amount: float, vx: float, vy: float) -> None:
        s = self.s
        await self.device.run_async(FluidAddSource(
            self._ref("density"), self._ref("u"), self._ref("v"), s.width, s.height, x, y,
            amount, vx, vy))

    async def on_add_density(self, x: int, y: int, amount: float) -> None:
        await self._add_source(x, y, amount, 0.0, 0.0)

    async def on_add_velocity(self, x: int, y: int, vx: float, vy: float) -> None:
        await self._add_source(x, y, 0.0, vx, vy)

    async def _faces(self) -> tuple[F32Array, F32Array]:
        w, h, dev = self.s.width, self.s.height, self.device
        u = await dev.copy_to_numpy_async(self.fields["u"], shape=(h, w + 1))
        v = await dev.copy_to_numpy_async(self.fields["v"], shape=(h + 1, w))
        return u, v

    async def on_face_velocities(self) -> tuple[F32Array, F32Array]:
        return await self._faces()

    async def on_velocity(self) -> F32Array:
        u, v = await self._faces()
        centred = np.stack([(u[:, :-1] + u[:, 1:]) * 0.5, (v[:-1, :] + v[1:, :]) * 0.5],
                           axis=-1)
        return centred.astype(np.float32)

    async def on_density(self) -> F32Array:
        w, h = self.s.width, self.s.height
        return await self.device.copy_to_numpy_async(self.fields["density"], shape=(h, w))

    async def on_divergence(self) -> F32Array:
        w, h, dev = self.s.width, self.s.height, self.device
        await dev.run_async(FluidDivergence(self._ref("u"), self._ref("v"),
                                            self._ref("divergence"), w, h))
        return await dev.copy_to_numpy_async(self.fields["divergence"], shape=(h, w))


class FluidSimulationActor(RealtimeClient):
    """Stable fluids on a ``width x height`` grid in a closed box, on a device.

    The grid is a MAC grid in grid units (a cell is 1 x 1, velocities in
    cells per second): horizontal velocities live on the vertical faces,
    vertical ones on the horizontal faces, density in the cells. Each step
    advects the velocity (semi-Lagrangian), diffuses it by ``viscosity``
    (implicit, Jacobi sweeps), projects it onto divergence-free fields and
    advects the density. The projection solves the pressure Poisson equation
    by conjugate gradients preconditioned with a multigrid V-cycle,
    warm-started from the last step's pressure, until the largest divergence
    left is at most ``pressure_tolerance`` times the largest face velocity
    (default 1e-4), or after ``pressure_iterations`` iterations (the budget;
    about 10 reach the default on any grid). On CUDA a step is a few captured
    CUDA graphs, the solve's convergence read back every few iterations
    (``use_graph=False`` launches the kernels one by one). Every method has
    an ``_async`` twin; bad input raises ``InvalidArgument``.
    """

    width = 0
    height = 0

    @classmethod
    def spawn(cls, system: Any, width: int = 32, height: int = 32, viscosity: float = 0.0,
              name: str | None = None, *, device: Device | None = None,
              pressure_iterations: int = 40, diffusion_iterations: int = 20,
              use_graph: bool = True, pressure_tolerance: float = PRESSURE_TOLERANCE,
              ) -> FluidSimulationActor:
        """Start a still, empty fluid on ``device`` (None: the system's placement picks one).

        ``pressure_tolerance`` (in (0, 1)) and ``pressure_iterations`` (the most
        conjugate-gradient iterations a step may take, >= 0) set the pressure solve."""
        require_positive_int("width", width)
        require_positive_int("height", height)
        for label, count in (("pressure_iterations", pressure_iterations),
                             ("diffusion_iterations", diffusion_iterations)):
            require_count(label, count)
        if not isinstance(use_graph, bool):
            raise InvalidArgument(f"use_graph must be True or False, got {use_graph!r}")
        tolerance = require_number("pressure_tolerance", pressure_tolerance, above=0.0)
        if tolerance >= 1:
            raise InvalidArgument(f"pressure_tolerance must be < 1, got {pressure_tolerance!r}")
        settings = _Settings(width, height, require_number("viscosity", viscosity, least=0.0),
                             pressure_iterations, diffusion_iterations, use_graph, tolerance)
        nbytes = 4 * sum(_sizes(width, height).values())
        client = cls._spawn(system, _FluidActor, (settings,), name, device, nbytes)
        client.width, client.height = width, height
        return client

    def _cell(self, x: Any, y: Any) -> tuple[int, int]:
        for label, value, size in (("x", x, self.width), ("y", y, self.height)):
            if not isinstance(value, int | np.integer) or isinstance(value, bool) \
                    or not 0 <= value < size:
                raise InvalidArgument(f"{label} must be an int in [0, {size}), got {value!r}")
        return int(x), int(y)

    def add_density_async(self, x: int, y: int, amount: float,
                          timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, None]:
        """Add ``amount`` of density to cell ``(x, y)``."""
        cx, cy = self._cell(x, y)
        return self._run("add_density", (cx, cy, require_number("amount", amount)),
                         timeout_secs)

    add_density = twin(add_density_async)

    def add_velocity_async(self, x: int, y: int, vx: float, vy: float,
                           timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, None]:
        """Add ``(vx, vy)`` (cells per second) to the velocity of cell ``(x, y)``: to each
        of its faces that is not a wall."""
        cx, cy = self._cell(x, y)
        return self._run("add_velocity",
                         (cx, cy, require_number("vx", vx), require_number("vy", vy)),
                         timeout_secs)

    add_velocity = twin(add_velocity_async)

    def step_async(self, dt: float, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, None]:
        """Advance the fluid by ``dt`` seconds."""
        return self._run("step", (require_dt(dt),), timeout_secs)

    step = twin(step_async)

    def density_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, F32Array]:
        """The density of each cell, ``(height, width)`` float32."""
        return self._run("density", (), timeout_secs)

    density = twin(density_async)

    def velocity_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, F32Array]:
        """Each cell's velocity (the mean of its faces), ``(height, width, 2)`` float32,
        ``[..., 0]`` along x."""
        return self._run("velocity", (), timeout_secs)

    velocity = twin(velocity_async)

    def face_velocities_async(self, timeout_secs: float = TIMEOUT,
                              ) -> Coroutine[Any, Any, tuple[F32Array, F32Array]]:
        """The face velocities ``(u, v)``: ``u`` of shape ``(height, width + 1)`` on the
        vertical faces, ``v`` of shape ``(height + 1, width)`` on the horizontal ones."""
        return self._run("face_velocities", (), timeout_secs)

    face_velocities = twin(face_velocities_async)

    def divergence_async(self, timeout_secs: float = TIMEOUT,
                         ) -> Coroutine[Any, Any, F32Array]:
        """The divergence of each cell now (net outflow of its faces), ``(height, width)``."""
        return self._run("divergence", (), timeout_secs)

    divergence = twin(divergence_async)
