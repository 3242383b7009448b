"""Realtime physics on the CPU backend, in NumPy float32: the reference of the CUDA kernels.

Every step computes in float32 in the order the CUDA kernels do (see
``core.ops._realtime_physics`` for the models), so the two backends agree to
float32 rounding. The fluid's stages are shared with nothing else and kept
here as small functions: advection and diffusion (the pressure solve is
``_fluid_pressure``).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from atomr_accel.backends._handlers import cpu
from atomr_accel.backends.cpu._fluid_pressure import solve_pressure
from atomr_accel.core.ops._realtime_physics import (
    ClothStep,
    FluidAddSource,
    FluidDivergence,
    FluidStep,
    GridBuild,
    GridQuery,
    ParticleCompact,
    ParticleStep,
)

__all__ = [
    "cell_slots",
    "cloth_sets",
    "divergence_of",
]

F32 = np.float32
Array = np.ndarray[Any, Any]
HASH = (73856093, 19349663, 83492791)
"""The multipliers of the grid-cell hash (x, y, z)."""


# --------------------------------------------------------------------- particles


@cpu.handles(ParticleStep)
def particle_step(backend: Any, op: ParticleStep) -> int:
    """Advance the particles in place (exact constant-gravity and linear-drag update);
    answer the live count."""
    n = op.count
    live = backend.array(op.live.buffer_id)
    if n == 0:
        live[0] = 0
        return 0
    pos = backend.array(op.positions.buffer_id)[: 3 * n].reshape(n, 3)
    vel = backend.array(op.velocities.buffer_id)[: 3 * n].reshape(n, 3)
    life = backend.array(op.lifetimes.buffer_id)[:n]
    alive = life > 0
    dt, k = F32(op.dt), F32(op.drag)
    accel = np.array([0.0, op.gravity_y, 0.0], dtype=F32)
    p, v = pos[alive], vel[alive]
    if k > 0:
        decay = -np.expm1(-k * dt)  # 1 - exp(-k dt)
        terminal = accel / k
        rel = v - terminal
        p = p + terminal * dt + rel * (decay / k)
        v = terminal + rel * (F32(1) - decay)
    else:
        p = p + v * dt + F32(0.5) * accel * (dt * dt)
        v = v + accel * dt
    ground, bounce = F32(op.ground_y), F32(op.bounce)
    below = p[:, 1] < ground
    p[below, 1] = ground + (ground - p[below, 1]) * bounce
    falling = below & (v[:, 1] < 0)
    v[falling, 1] = -v[falling, 1] * bounce
    pos[alive], vel[alive] = p, v
    life[alive] -= dt
    live[0] = int(np.count_nonzero(life > 0))
    return int(live[0])


@cpu.handles(ParticleCompact)
def particle_compact(backend: Any, op: ParticleCompact) -> None:
    """Move the survivors to the front, in order."""
    n = op.count
    life = backend.array(op.lifetimes.buffer_id)[:n]
    keep = life > 0
    kept = int(np.count_nonzero(keep))
    for ref, width in ((op.positions, 3), (op.velocities, 3), (op.lifetimes, 1)):
        data = backend.array(ref.buffer_id)[: width * n].reshape(n, width)
        data[:kept] = data[keep]


# ------------------------------------------------------------------------ cloth


@functools.cache
def cloth_sets(width: int, height: int) -> tuple[tuple[Array, Array, int], ...]:
    """The 12 sets of disjoint springs, in the order both backends relax them: each as
    ``(first vertices, second vertices, kind)`` where kind 0 is structural, 1 shear, 2
    bending. Within a kind and direction, set ``k`` holds the springs whose first vertex
    has ``row % 2 == k`` (``col % 2`` along rows; ``(col // 2) % 2`` or ``(row // 2) % 2``
    for bending)."""
    grid_rows, grid_cols = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    rows, cols = grid_rows.ravel(), grid_cols.ravel()
    # (row step, col step, kind, the colour of the first vertex)
    directions = (
        (0, 1, 0, cols % 2), (1, 0, 0, rows % 2), (1, 1, 1, rows % 2), (1, -1, 1, rows % 2),
        (0, 2, 2, (cols // 2) % 2), (2, 0, 2, (rows // 2) % 2),
    )
    sets = []
    for dr, dc, kind, colour in directions:
        r2, c2 = rows + dr, cols + dc
        inside = (r2 < height) & (c2 >= 0) & (c2 < width)
        for k in (0, 1):
            chosen = inside & (colour == k)
            first = (rows * width + cols)[chosen]
            second = (r2 * width + c2)[chosen]
            sets.append((first, second, kind))
    return tuple(sets)


@cpu.handles(ClothStep)
def cloth_step(backend: Any, op: ClothStep) -> None:
    """Verlet, then ``iterations`` Gauss-Seidel passes over the 12 spring sets."""
    n = op.width * op.height
    pos = backend.array(op.positions.buffer_id)[: 3 * n].reshape(n, 3)
    prev = backend.array(op.previous.buffer_id)[: 3 * n].reshape(n, 3)
    inv = backend.array(op.inverse_mass.buffer_id)[:n]
    free = inv > 0
    dt2 = F32(op.dt * op.dt)
    accel = np.array([op.wind[0], op.gravity_y + op.wind[1], op.wind[2]], dtype=F32)
    current = pos[free]
    moved = current + (current - prev[free]) * F32(op.damping) + accel * dt2
    prev[:] = pos
    pos[free] = moved
    spacing = F32(op.spacing)
    rests = (spacing, spacing * F32(np.sqrt(2.0)), spacing * F32(2))
    stiffness = F32(op.stiffness)
    sets = cloth_sets(op.width, op.height)
    for _ in range(op.iterations):
        for first, second, kind in sets:
            if first.size:
                _relax(pos, inv, first, second, rests[kind], stiffness)


def _relax(pos: Array, inv: Array, first: Array, second: Array, rest: Any,
           stiffness: Any) -> None:
    """Move the ends of disjoint springs along them by ``stiffness`` times their stretch."""
    a, b = pos[first], pos[second]
    wa, wb = inv[first], inv[second]
    d = b - a
    length = np.sqrt(d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1] + d[:, 2] * d[:, 2])
    w = wa + wb
    active = (length > F32(1e-12)) & (w > 0)
    scale = np.zeros_like(length)
    scale[active] = stiffness * (length[active] - rest) / (length[active] * w[active])
    pos[first] = a + d * (scale * wa)[:, None]
    pos[second] = b - d * (scale * wb)[:, None]


# ------------------------------------------------------------------------ fluid


def _sample(grid: Array, fx: Array, fy: Array) -> Array:
    """Bilinear sample of ``grid`` (rows y, columns x) at fractional indices, clamped."""
    ny, nx = grid.shape
    fx = np.clip(fx, F32(0), F32(nx - 1))
    fy = np.clip(fy, F32(0), F32(ny - 1))
    i0 = np.maximum(np.minimum(np.floor(fx).astype(np.int64), nx - 2), 0)
    j0 = np.maximum(np.minimum(np.floor(fy).astype(np.int64), ny - 2), 0)
    i1, j1 = np.minimum(i0 + 1, nx - 1), np.minimum(j0 + 1, ny - 1)
    tx, ty = fx - i0.astype(F32), fy - j0.astype(F32)
    top = grid[j0, i0] + tx * (grid[j0, i1] - grid[j0, i0])
    bottom = grid[j1, i0] + tx * (grid[j1, i1] - grid[j1, i0])
    out: Array = top + ty * (bottom - top)
    return out


def _advect_velocity(u: Array, v: Array, dt: Any) -> tuple[Array, Array]:
    """Semi-Lagrangian advection of both face fields; wall faces come out 0."""
    h, w1 = u.shape
    w = w1 - 1
    jj, ii = np.meshgrid(np.arange(h), np.arange(w1), indexing="ij")
    left, right = np.clip(ii - 1, 0, w - 1), np.clip(ii, 0, w - 1)
    vy = F32(0.25) * (v[jj, left] + v[jj, right] + v[jj + 1, left] + v[jj + 1, right])
    fx = ii.astype(F32) - dt * u
    fy = (jj.astype(F32) + F32(0.5)) - dt * vy
    new_u = _sample(u, fx, fy - F32(0.5))
    new_u[:, 0] = 0
    new_u[:, w] = 0
    jj, ii = np.meshgrid(np.arange(h + 1), np.arange(w), indexing="ij")
    below, above = np.clip(jj - 1, 0, h - 1), np.clip(jj, 0, h - 1)
    ux = F32(0.25) * (u[below, ii] + u[below, ii + 1] + u[above, ii] + u[above, ii + 1])
    fx = (ii.astype(F32) + F32(0.5)) - dt * ux
    fy = jj.astype(F32) - dt * v
    new_v = _sample(v, fx - F32(0.5), fy)
    new_v[0, :] = 0
    new_v[h, :] = 0
    return new_u.astype(F32), new_v.astype(F32)


def _advect_density(d: Array, u: Array, v: Array, dt: Any) -> Array:
    h, w = d.shape
    jj, ii = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    ux = F32(0.5) * (u[:, :w] + u[:, 1:])
    vy = F32(0.5) * (v[:h, :] + v[1:, :])
    fx = (ii.astype(F32) + F32(0.5)) - dt * ux
    fy = (jj.astype(F32) + F32(0.5)) - dt * vy
    return _sample(d, fx - F32(0.5), fy - F32(0.5)).astype(F32)


def _neighbour_sum(x: Array) -> tuple[Array, Array]:
    """The sum of each entry's in-grid 4-neighbours, and how many it has."""
    total = np.zeros_like(x)
    count = np.zeros(x.shape, dtype=F32)
    total[:, 1:] += x[:, :-1]
    total[:, :-1] += x[:, 1:]
    total[1:, :] += x[:-1, :]
    total[:-1, :] += x[1:, :]
    count[:, 1:] += 1
    count[:, :-1] += 1
    count[1:, :] += 1
    count[:-1, :] += 1
    return total, count


def _diffuse(b: Array, a: Any, iterations: int, walls: str) -> Array:
    """Jacobi sweeps of ``(1 - a L) x = b``; the wall faces (columns for ``u``, rows for
    ``v``) stay 0 and count as 0-valued neighbours."""
    x = b
    for _ in range(iterations):
        total, count = _neighbour_sum(x)
        x = ((b + a * total) / (F32(1) + a * count)).astype(F32)
        if walls == "u":
            x[:, 0] = 0
            x[:, -1] = 0
        else:
            x[0, :] = 0
            x[-1, :] = 0
    return x


def divergence_of(u: Array, v: Array) -> Array:
    """The divergence of each cell: the net outflow through its four faces."""
    out: Array = (u[:, 1:] - u[:, :-1]) + (v[1:, :] - v[:-1, :])
    return out


@cpu.handles(FluidStep)
def fluid_step(backend: Any, op: FluidStep) -> None:
    """Advect, diffuse, project, advect the density (see ``FluidStep``)."""
    w, h = op.width, op.height
    u = backend.array(op.u.buffer_id)[: h * (w + 1)].reshape(h, w + 1)
    v = backend.array(op.v.buffer_id)[: (h + 1) * w].reshape(h + 1, w)
    d = backend.array(op.density.buffer_id)[: h * w].reshape(h, w)
    p = backend.array(op.pressure.buffer_id)[: h * w].reshape(h, w)
    div_out = backend.array(op.divergence.buffer_id)[: h * w].reshape(h, w)
    dt = F32(op.dt)
    new_u, new_v = _advect_velocity(u, v, dt)
    if op.viscosity > 0 and op.diffusion_iterations > 0:
        a = F32(op.viscosity * op.dt)
        new_u = _diffuse(new_u, a, op.diffusion_iterations, "u")
        new_v = _diffuse(new_v, a, op.diffusion_iterations, "v")
    div = divergence_of(new_u, new_v).astype(F32)
    div_out[:] = div
    scale = max(float(np.abs(new_u).max()), float(np.abs(new_v).max()))
    pressure, _ = solve_pressure(p, div, scale, op.pressure_tolerance, op.pressure_iterations)
    p[:] = pressure
    new_u[:, 1:w] -= pressure[:, 1:] - pressure[:, :-1]
    new_v[1:h, :] -= pressure[1:, :] - pressure[:-1, :]
    u[:] = new_u
    v[:] = new_v
    d[:] = _advect_density(d, u, v, dt)


@cpu.handles(FluidAddSource)
def fluid_add_source(backend: Any, op: FluidAddSource) -> None:
    """Add density and velocity at one cell (its non-wall faces)."""
    w, h, x, y = op.width, op.height, op.x, op.y
    backend.array(op.density.buffer_id)[y * w + x] += F32(op.amount)
    u = backend.array(op.u.buffer_id)
    v = backend.array(op.v.buffer_id)
    for face in (x, x + 1):
        if 0 < face < w:
            u[y * (w + 1) + face] += F32(op.vx)
    for face in (y, y + 1):
        if 0 < face < h:
            v[face * w + x] += F32(op.vy)


@cpu.handles(FluidDivergence)
def fluid_divergence(backend: Any, op: FluidDivergence) -> None:
    """Write the divergence of the face velocities."""
    w, h = op.width, op.height
    u = backend.array(op.u.buffer_id)[: h * (w + 1)].reshape(h, w + 1)
    v = backend.array(op.v.buffer_id)[: (h + 1) * w].reshape(h + 1, w)
    backend.array(op.out.buffer_id)[: h * w] = divergence_of(u, v).ravel()


# ------------------------------------------------------------------ spatial grid


def cell_slots(cells: Array, table_size: int) -> Array:
    """The hash slot of integer cells (an ``(n, 3)`` int64 array), as int64."""
    mixed = np.zeros(len(cells), dtype=np.uint64)
    for axis, multiplier in enumerate(HASH):
        mixed ^= cells[:, axis].astype(np.uint64) * np.uint64(multiplier)
    out: Array = (mixed % np.uint64(table_size)).astype(np.int64)
    return out


def _cells(points: Array, cell_size: Any) -> Array:
    out: Array = np.floor(points / F32(cell_size)).astype(np.int64)
    return out


@cpu.handles(GridBuild)
def grid_build(backend: Any, op: GridBuild) -> None:
    """Sort the points by slot and mark each slot's range."""
    n = op.count
    points = backend.array(op.points.buffer_id)[: 3 * n].reshape(n, 3)
    slots = cell_slots(_cells(points, op.cell_size), op.table_size)
    order = np.argsort(slots, kind="stable")
    backend.array(op.order.buffer_id)[:n] = order
    sorted_slots = slots[order]
    table = np.arange(op.table_size)
    backend.array(op.cell_start.buffer_id)[: op.table_size] = np.searchsorted(
        sorted_slots, table, "left")
    backend.array(op.cell_end.buffer_id)[: op.table_size] = np.searchsorted(
        sorted_slots, table, "right")


@cpu.handles(GridQuery)
def grid_query(backend: Any, op: GridQuery) -> list[Array]:
    """For each query, the sorted indices of the points within the radius."""
    n, q = op.count, op.query_count
    points = backend.array(op.points.buffer_id)[: 3 * n].reshape(n, 3)
    queries = backend.array(op.queries.buffer_id)[: 3 * q].reshape(q, 3)
    order = backend.array(op.order.buffer_id)[:n]
    start = backend.array(op.cell_start.buffer_id)
    end = backend.array(op.cell_end.buffer_id)
    reach = int(np.ceil(op.radius / op.cell_size))
    offsets = np.stack(np.meshgrid(*([np.arange(-reach, reach + 1)] * 3), indexing="ij"),
                       axis=-1).reshape(-1, 3)
    r2 = F32(op.radius) * F32(op.radius)
    point_cells = _cells(points, op.cell_size)
    results = []
    for query, cell in zip(queries, _cells(queries, op.cell_size), strict=True):
        visited = cell + offsets
        found = []
        for visit, slot in zip(visited, cell_slots(visited, op.table_size), strict=True):
            members = order[start[slot]:end[slot]]
            members = members[(point_cells[members] == visit).all(axis=1)]
            d = points[members] - query
            close = (d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1] + d[:, 2] * d[:, 2]) <= r2
            found.append(members[close])
        results.append(np.sort(np.concatenate(found)).astype(np.int64) if found
                       else np.zeros(0, np.int64))
    return results
