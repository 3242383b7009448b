"""Realtime physics steps: particles, a mass-spring cloth, stable fluids and a uniform grid.

Each op works on buffers its simulation actor owns (``atomr_accel.realtime``)
and names them by ``GpuRef``; the CPU backend runs them in NumPy (the
reference) and the CUDA backend as NVRTC kernels. Positions and velocities
are float32 ``(x, y, z)`` triples, one after another (``3 * count`` numbers).
The fluid lives on a MAC grid in grid units (a cell is 1 x 1): ``u`` holds
``height x (width + 1)`` horizontal face velocities, ``v`` ``(height + 1) x
width`` vertical ones, the density and the pressure ``height x width`` cell
values, all row-major with row ``y`` and column ``x``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._catalogue import declare
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import require_nonneg, require_positive
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._realtime_checks import _RealtimeOp, require_buffer, require_finite

__all__ = [
    "ClothStep",
    "FluidAddSource",
    "FluidDivergence",
    "FluidStep",
    "GridBuild",
    "GridQuery",
    "ParticleCompact",
    "ParticleStep",
    "PRESSURE_TOLERANCE",
    "fluid_scratch",
    "pressure_levels",
]

declare("realtime", "Realtime",
        "Realtime simulation and frame kernels (particles, fluids, filters, ...): NVRTC on CUDA.",
        rank=13)

_F32 = (DType.F32,)
_I32 = (DType.I32,)


@dataclass(frozen=True, slots=True)
class ParticleStep(_RealtimeOp):
    """Advance ``count`` particles by ``dt`` seconds; answer how many are alive after it.

    Gravity ``gravity_y`` acts along y and linear drag ``drag`` (1/s) on every
    component; the update is the exact solution of ``dv/dt = g - drag * v``
    over the step (ballistic when ``drag`` is 0). A particle below the ground
    plane ``y = ground_y`` afterwards is reflected above it, its distance
    below and its downward speed scaled by ``bounce``. Each lifetime drops by
    ``dt``; a particle whose lifetime is not above 0 is dead (``ParticleCompact``
    drops the dead). The survivors are counted on the device into ``live[0]``
    and the handler answers that count (a host int, so it waits for its own
    stream, as a download does).
    """

    outputs: ClassVar[tuple[str, ...]] = ("positions", "velocities", "lifetimes", "live")
    positions: GpuRef
    velocities: GpuRef
    lifetimes: GpuRef
    live: GpuRef
    count: int
    dt: float
    gravity_y: float = -9.8
    drag: float = 0.0
    bounce: float = 0.5
    ground_y: float = 0.0

    def validate(self) -> None:
        require_nonneg(count=self.count)
        require_finite(dt=self.dt, gravity_y=self.gravity_y, drag=self.drag,
                       bounce=self.bounce, ground_y=self.ground_y)
        if self.dt < 0 or self.drag < 0 or self.bounce < 0:
            raise InvalidArgument(f"dt, drag and bounce must be >= 0, got {self.dt!r}, "
                                  f"{self.drag!r}, {self.bounce!r}")
        require_buffer(self.positions, _F32, 3 * self.count, "positions")
        require_buffer(self.velocities, _F32, 3 * self.count, "velocities")
        require_buffer(self.lifetimes, _F32, self.count, "lifetimes")
        require_buffer(self.live, _I32, 1, "live")


@dataclass(frozen=True, slots=True)
class ParticleCompact(_RealtimeOp):
    """Drop the dead particles (lifetime not above 0) of the first ``count``, keeping the
    order of the survivors, which then fill the first places of each buffer."""

    outputs: ClassVar[tuple[str, ...]] = ("positions", "velocities", "lifetimes")
    positions: GpuRef
    velocities: GpuRef
    lifetimes: GpuRef
    count: int

    def validate(self) -> None:
        require_nonneg(count=self.count)
        require_buffer(self.positions, _F32, 3 * self.count, "positions")
        require_buffer(self.velocities, _F32, 3 * self.count, "velocities")
        require_buffer(self.lifetimes, _F32, self.count, "lifetimes")


@dataclass(frozen=True, slots=True)
class ClothStep(_RealtimeOp):
    """One step of a ``width x height`` mass-spring cloth (vertex ``row * width + col``).

    Verlet integration ``x' = x + damping * (x - previous) + (g + wind) dt^2``
    for every vertex whose ``inverse_mass`` is not 0 (pinned vertices stay),
    then ``iterations`` passes over the springs: structural (to the next
    column and row, rest ``spacing``), shear (diagonals, ``spacing * sqrt 2``)
    and bending (two apart, ``2 * spacing``). Each spring moves its two ends
    along it by ``stiffness`` times its stretch, shared by inverse mass. The
    springs are taken in 12 sets of disjoint springs (Gauss-Seidel between
    sets, in a fixed order), so the result does not depend on thread order.
    """

    outputs: ClassVar[tuple[str, ...]] = ("positions", "previous")
    positions: GpuRef
    previous: GpuRef
    inverse_mass: GpuRef
    width: int
    height: int
    spacing: float
    stiffness: float
    iterations: int
    dt: float
    gravity_y: float = -9.8
    wind: tuple[float, float, float] = (0.0, 0.0, 0.0)
    damping: float = 0.99

    def validate(self) -> None:
        require_positive(width=self.width, height=self.height)
        require_nonneg(iterations=self.iterations)
        if not isinstance(self.wind, tuple) or len(self.wind) != 3:
            raise InvalidArgument(f"wind must be a tuple of 3 numbers, got {self.wind!r}")
        require_finite(spacing=self.spacing, stiffness=self.stiffness, dt=self.dt,
                       gravity_y=self.gravity_y, damping=self.damping, wind_x=self.wind[0],
                       wind_y=self.wind[1], wind_z=self.wind[2])
        if self.spacing <= 0 or self.dt < 0 or not 0 <= self.stiffness <= 1 \
                or not 0 <= self.damping <= 1:
            raise InvalidArgument("spacing must be > 0, dt >= 0, stiffness and damping in "
                                  f"[0, 1]; got {self.spacing!r}, {self.dt!r}, "
                                  f"{self.stiffness!r}, {self.damping!r}")
        n = self.width * self.height
        require_buffer(self.positions, _F32, 3 * n, "positions")
        require_buffer(self.previous, _F32, 3 * n, "previous")
        require_buffer(self.inverse_mass, _F32, n, "inverse_mass")


@dataclass(frozen=True, slots=True)
class FluidAddSource(_RealtimeOp):
    """Add ``amount`` to the density of cell ``(x, y)`` and ``(vx, vy)`` to its velocity
    (each of the cell's faces that is not a wall takes the component along it)."""

    outputs: ClassVar[tuple[str, ...]] = ("density", "u", "v")
    density: GpuRef
    u: GpuRef
    v: GpuRef
    width: int
    height: int
    x: int
    y: int
    amount: float = 0.0
    vx: float = 0.0
    vy: float = 0.0

    def validate(self) -> None:
        require_positive(width=self.width, height=self.height)
        require_nonneg(x=self.x, y=self.y)
        if self.x >= self.width or self.y >= self.height:
            raise InvalidArgument(f"cell ({self.x}, {self.y}) is outside the "
                                  f"{self.width} x {self.height} grid")
        require_finite(amount=self.amount, vx=self.vx, vy=self.vy)
        _fluid_fields(self.width, self.height, density=self.density, u=self.u, v=self.v)


def _fluid_fields(width: int, height: int, **refs: GpuRef) -> None:
    """Each named buffer must be float32 and hold its field of the grid."""
    sizes = {"u": height * (width + 1), "v": (height + 1) * width}
    for name, ref in refs.items():
        require_buffer(ref, _F32, sizes.get(name, width * height), name)


PRESSURE_TOLERANCE = 1e-4
"""The default tolerance of the pressure solve: it stops once the largest divergence left
is at most this fraction of the largest face velocity (per grid cell, before the
projection)."""

COARSEST_CELLS = 16
"""The multigrid preconditioner coarsens until a level has at most this many cells."""


def pressure_levels(width: int, height: int) -> tuple[tuple[int, int], ...]:
    """The grids of the pressure solve's multigrid preconditioner, finest first: each level
    merges 2 x 2 cells of the one above (a last odd row or column merges alone), down to
    at most ``COARSEST_CELLS`` cells."""
    levels = [(width, height)]
    while width * height > COARSEST_CELLS:
        width, height = (width + 1) // 2, (height + 1) // 2
        levels.append((width, height))
    return tuple(levels)


def fluid_scratch(width: int, height: int) -> int:
    """Elements of a ``FluidStep``'s scratch buffer: two u-fields, two v-fields, a density,
    the conjugate-gradient vectors (five fields) and three fields of each coarser
    multigrid level."""
    nu, nv, nc = height * (width + 1), (height + 1) * width, width * height
    coarse = sum(w * h for w, h in pressure_levels(width, height)[1:])
    return 2 * nu + 2 * nv + 6 * nc + 3 * coarse


@dataclass(frozen=True, slots=True)
class FluidStep(_RealtimeOp):
    """One stable-fluids step of ``dt`` seconds on the MAC grid (see the module docstring).

    In order: semi-Lagrangian advection of the velocity (bilinear, traced
    back along the velocity; walls are solid), implicit viscosity diffusion
    by ``diffusion_iterations`` Jacobi sweeps when ``viscosity`` > 0, the
    pressure projection, and advection of the density. The projection solves
    the Neumann Poisson equation for the pressure by conjugate gradients
    preconditioned with a multigrid V-cycle (``pressure_levels``), started
    from the previous ``pressure``, until the largest divergence left is at
    most ``pressure_tolerance`` times the largest face velocity (or after
    ``pressure_iterations`` iterations), then subtracts the pressure gradient.
    ``divergence`` receives the divergence the projection removed;
    ``scratch`` (``fluid_scratch(width, height)`` float32) is working space.
    ``graph=True`` lets the CUDA backend replay the step as one captured
    CUDA graph; False launches its kernels one by one.
    """

    outputs: ClassVar[tuple[str, ...]] = (
        "u", "v", "density", "pressure", "divergence", "scratch")
    u: GpuRef
    v: GpuRef
    density: GpuRef
    pressure: GpuRef
    divergence: GpuRef
    scratch: GpuRef
    width: int
    height: int
    dt: float
    viscosity: float = 0.0
    pressure_iterations: int = 40
    diffusion_iterations: int = 20
    graph: bool = True
    pressure_tolerance: float = PRESSURE_TOLERANCE

    def validate(self) -> None:
        require_positive(width=self.width, height=self.height)
        require_nonneg(pressure_iterations=self.pressure_iterations,
                       diffusion_iterations=self.diffusion_iterations)
        require_finite(dt=self.dt, viscosity=self.viscosity,
                       pressure_tolerance=self.pressure_tolerance)
        if not 0 < self.pressure_tolerance < 1:
            raise InvalidArgument("pressure_tolerance must be in (0, 1), got "
                                  f"{self.pressure_tolerance!r}")
        if self.dt < 0 or self.viscosity < 0:
            raise InvalidArgument(f"dt and viscosity must be >= 0, got {self.dt!r}, "
                                  f"{self.viscosity!r}")
        _fluid_fields(self.width, self.height, u=self.u, v=self.v, density=self.density,
                      pressure=self.pressure, divergence=self.divergence)
        require_buffer(self.scratch, _F32, fluid_scratch(self.width, self.height), "scratch")


@dataclass(frozen=True, slots=True)
class FluidDivergence(_RealtimeOp):
    """Write the discrete divergence of the face velocities into ``out``:
    ``u[y, x+1] - u[y, x] + v[y+1, x] - v[y, x]`` for each cell."""

    outputs: ClassVar[tuple[str, ...]] = ("out",)
    u: GpuRef
    v: GpuRef
    out: GpuRef
    width: int
    height: int

    def validate(self) -> None:
        require_positive(width=self.width, height=self.height)
        _fluid_fields(self.width, self.height, u=self.u, v=self.v, out=self.out)


@dataclass(frozen=True, slots=True)
class GridBuild(_RealtimeOp):
    """Sort ``count`` points (``3 * count`` float32) by the hash of their grid cell.

    A point's cell is ``floor(p / cell_size)`` per axis; the cell's slot is a
    hash of it modulo ``table_size``. ``order`` receives the point indices
    sorted by slot, ``cell_start[s]`` and ``cell_end[s]`` the range of
    ``order`` that slot ``s`` holds (``start == end`` when empty).
    """

    outputs: ClassVar[tuple[str, ...]] = ("order", "cell_start", "cell_end")
    points: GpuRef
    order: GpuRef
    cell_start: GpuRef
    cell_end: GpuRef
    count: int
    table_size: int
    cell_size: float

    def validate(self) -> None:
        require_nonneg(count=self.count)
        require_positive(table_size=self.table_size)
        _require_cell_size(self.cell_size)
        require_buffer(self.points, _F32, 3 * self.count, "points")
        require_buffer(self.order, _I32, self.count, "order")
        require_buffer(self.cell_start, _I32, self.table_size, "cell_start")
        require_buffer(self.cell_end, _I32, self.table_size, "cell_end")


def _require_cell_size(cell_size: object) -> None:
    require_finite(cell_size=cell_size)
    assert isinstance(cell_size, int | float)
    if cell_size <= 0:
        raise InvalidArgument(f"cell_size must be > 0, got {cell_size!r}")


@dataclass(frozen=True, slots=True)
class GridQuery(_RealtimeOp):
    """Find, for each of ``query_count`` query points, the indices of the points of a built
    grid (``GridBuild``) within ``radius`` of it (distance <= radius).

    Only the cells within ``radius`` of the query's cell are visited; a
    candidate counts only if it lies in the visited cell itself (hash
    collisions add no duplicates) and within the radius. Answers a host list
    of int64 arrays, one per query, each sorted ascending.
    """

    points: GpuRef
    order: GpuRef
    cell_start: GpuRef
    cell_end: GpuRef
    queries: GpuRef
    count: int
    table_size: int
    cell_size: float
    query_count: int
    radius: float

    def validate(self) -> None:
        require_nonneg(count=self.count, query_count=self.query_count)
        require_positive(table_size=self.table_size)
        _require_cell_size(self.cell_size)
        require_finite(radius=self.radius)
        if self.radius < 0:
            raise InvalidArgument(f"radius must be >= 0, got {self.radius!r}")
        if self.radius > 64 * self.cell_size:
            raise InvalidArgument(f"radius {self.radius!r} spans more than 64 cells of "
                                  f"{self.cell_size!r}; rebuild with a larger cell_size")
        require_buffer(self.points, _F32, 3 * self.count, "points")
        require_buffer(self.queries, _F32, 3 * self.query_count, "queries")
        require_buffer(self.order, _I32, self.count, "order")
        require_buffer(self.cell_start, _I32, self.table_size, "cell_start")
        require_buffer(self.cell_end, _I32, self.table_size, "cell_end")
