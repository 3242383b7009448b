"""Realtime physics on CUDA: NVRTC kernels, compiled once per process and device, run on
the op's stream.

The kernels follow the CPU reference (``backends.cpu._realtime_physics``)
operation for operation, compiled with ``--fmad=false`` so that no multiply-add
is fused and float32 results agree with NumPy's to rounding. Scalars the
reference computes once per step (the drag decay, ``0.5 g dt^2``) are computed
on the host the same way and passed in.

A fluid step runs in three stages: the advection, diffusion and divergence
with the pressure solve's start; runs of ``CHECK_EVERY`` iterations of the
solve (``backends.cuda._fluid_pressure``), as many as it takes; and the
gradient's subtraction with the density's advection. With ``graph=True``
each stage is captured as a CUDA graph once per fluid (its buffers, grid,
tolerance and iteration budget) on its second use and replayed from then on:
``dt`` and the viscosity reach the kernels through a small device array that a
one-thread kernel sets before each replay, so one graph serves every ``dt``.
The fluid step reads the solve's state after each run of iterations (a few
bytes, which waits for its stream); no other handler synchronizes the device
but ``ParticleStep`` and ``GridQuery``, whose answers are host data and which wait
for their own stream (as a download does).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cupy as cp
import numpy as np

from atomr_accel.backends._handlers import cuda
from atomr_accel.backends._state import Lru, per_backend
from atomr_accel.backends.cuda import _fluid_pressure as pressure
from atomr_accel.backends.cuda._realtime_nvrtc import Source, launch
from atomr_accel.backends.cuda._realtime_physics_source import SOURCE
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

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

__all__ = ["SOURCE", "kernels"]

F32 = np.float32
BLOCK = 256


_KERNELS = Source(SOURCE, ("--std=c++17", "--fmad=false"))


def kernels(name: str) -> Any:
    """The compiled kernel ``name`` of ``SOURCE`` on the current device (compiled once per
    process and device)."""
    return _KERNELS.kernel(name)


def _launch(name: str, n: int, *args: Any) -> None:
    """Launch ``name`` over ``n`` threads on the current stream."""
    launch(kernels(name), n, BLOCK, *args)


def _i64(value: int) -> Any:
    return np.int64(value)


def _i32(value: int) -> Any:
    return np.int32(value)


def _memset(array: Any, nbytes: int) -> None:
    cp.cuda.runtime.memsetAsync(array.data.ptr, 0, nbytes, cp.cuda.get_current_stream().ptr)


def _memcpy(dst: Any, src: Any) -> None:
    cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, 3,  # device to device
                                cp.cuda.get_current_stream().ptr)


# --------------------------------------------------------------------- particles


@cuda.handles(ParticleStep)
def particle_step(backend: CudaBackend, op: ParticleStep) -> int:
    """One thread a particle; each block adds its survivors to ``live[0]``, which is
    downloaded (waiting for this stream) as the answer."""
    live = backend.array(op.live.buffer_id)
    _memset(live, 4)
    dt, k, g = F32(op.dt), F32(op.drag), F32(op.gravity_y)
    if k > 0:
        decay = -np.expm1(-k * dt)
        term_y, decay_over_k, keep = g / k, decay / k, F32(1) - decay
    else:
        term_y = decay_over_k = keep = F32(0)
    half_g_dt2 = (F32(0.5) * g) * (dt * dt)
    _launch("particle_step", op.count, backend.array(op.positions.buffer_id),
            backend.array(op.velocities.buffer_id), backend.array(op.lifetimes.buffer_id),
            live, _i64(op.count), dt, _i32(1 if k > 0 else 0), F32(term_y), F32(decay_over_k),
            F32(keep), F32(half_g_dt2), F32(g * dt), F32(op.bounce), F32(op.ground_y))
    return int(live.get(stream=cp.cuda.get_current_stream())[0])


@cuda.handles(ParticleCompact)
def particle_compact(backend: CudaBackend, op: ParticleCompact) -> None:
    """A scan of the survivors gives each its place; they are scattered there from copies."""
    n = op.count
    if n == 0:
        return
    pos = backend.array(op.positions.buffer_id)[: 3 * n]
    vel = backend.array(op.velocities.buffer_id)[: 3 * n]
    life = backend.array(op.lifetimes.buffer_id)[:n]
    slot = cp.cumsum(life > 0, dtype=cp.int32)
    _launch("particle_scatter", n, pos.copy(), vel.copy(), life.copy(), slot, pos, vel, life,
            _i64(n))


# ------------------------------------------------------------------------ cloth


@cuda.handles(ClothStep)
def cloth_step(backend: CudaBackend, op: ClothStep) -> None:
    """One block runs the whole step: Verlet, then the 12 spring sets per iteration with a
    barrier between sets."""
    n = op.width * op.height
    dt2 = F32(op.dt * op.dt)
    accel = np.array([op.wind[0], op.gravity_y + op.wind[1], op.wind[2]], dtype=F32) * dt2
    spacing = F32(op.spacing)
    threads = min(1024, (n + 31) // 32 * 32)
    kernels("cloth_step")((1,), (threads,), (
        backend.array(op.positions.buffer_id), backend.array(op.previous.buffer_id),
        backend.array(op.inverse_mass.buffer_id), _i32(op.width), _i32(op.height),
        F32(op.damping), F32(accel[0]), F32(accel[1]), F32(accel[2]), spacing,
        spacing * F32(np.sqrt(2.0)), spacing * F32(2), F32(op.stiffness),
        _i32(op.iterations)))


# ------------------------------------------------------------------------ fluid


_STAGES = ("before", "iterations", "after")


@dataclass
class _FluidPlan:
    """One fluid's step parameters (``dt``, ``viscosity * dt``), its pressure solve, and
    the graph of each stage once captured (a stage runs eagerly on its first use, which
    also loads its kernels before a capture needs them)."""

    params: Any
    solve: pressure.Solve
    ran: set[str] = field(default_factory=set)
    graphs: dict[str, Any] = field(default_factory=dict)
    arrays: tuple[Any, ...] = ()


_plans_of: Callable[[Any], Lru[_FluidPlan]] = per_backend(lambda: Lru(16))


def _fluid_key(op: FluidStep) -> Hashable:
    return (op.u.buffer_id, op.v.buffer_id, op.density.buffer_id, op.pressure.buffer_id,
            op.divergence.buffer_id, op.scratch.buffer_id, op.width, op.height,
            op.pressure_iterations, op.pressure_tolerance,
            op.diffusion_iterations if op.viscosity > 0 else 0)


class _Fields:
    """A step's fields and its scratch, cut into the working fields (see ``fluid_scratch``)."""

    def __init__(self, backend: CudaBackend, op: FluidStep) -> None:
        w, h = op.width, op.height
        nu, nv, nc = h * (w + 1), (h + 1) * w, w * h
        self.u = backend.array(op.u.buffer_id)[:nu]
        self.v = backend.array(op.v.buffer_id)[:nv]
        self.d = backend.array(op.density.buffer_id)[:nc]
        self.p = backend.array(op.pressure.buffer_id)[:nc]
        self.div = backend.array(op.divergence.buffer_id)[:nc]
        scratch = backend.array(op.scratch.buffer_id)
        self.su, self.tu = scratch[:nu], scratch[nu:2 * nu]
        self.sv, self.tv = scratch[2 * nu:2 * nu + nv], scratch[2 * nu + nv:2 * nu + 2 * nv]
        self.sd = scratch[2 * nu + 2 * nv:2 * nu + 2 * nv + nc]
        self.solve_scratch = scratch[2 * nu + 2 * nv + nc:]


def _before(op: FluidStep, f: _Fields, plan: _FluidPlan) -> None:
    """Queue the advection, the diffusion, the divergence and the solve's start."""
    w, h = op.width, op.height
    nu, nv, nc = h * (w + 1), (h + 1) * w, w * h
    wi, hi, params = _i32(w), _i32(h), plan.params
    _launch("advect_u", nu, f.u, f.v, f.su, wi, hi, params)
    _launch("advect_v", nv, f.u, f.v, f.sv, wi, hi, params)
    sweeps = op.diffusion_iterations if op.viscosity > 0 else 0
    for b, x, t, nx, ny, columns in ((f.su, f.u, f.tu, w + 1, h, 1),
                                     (f.sv, f.v, f.tv, w, h + 1, 0)):
        if sweeps == 0:
            _memcpy(x, b)
            continue
        src = b
        for k in range(sweeps):
            dst = x if (sweeps - 1 - k) % 2 == 0 else t
            _launch("diffuse", nx * ny, src, b, dst, _i32(nx), _i32(ny), _i32(columns), params)
            src = dst
    _launch("divergence", nc, f.u, f.v, f.div, wi, hi)
    pressure.begin(plan.solve, f.u, f.v, f.p, f.div)


def _after(op: FluidStep, f: _Fields, plan: _FluidPlan) -> None:
    """Queue the pressure gradient's subtraction and the density's advection."""
    w, h = op.width, op.height
    nu, nv, nc = h * (w + 1), (h + 1) * w, w * h
    _launch("subtract_gradient", nu + nv, f.u, f.v, f.p, _i32(w), _i32(h))
    _launch("advect_density", nc, f.d, f.u, f.v, f.sd, _i32(w), _i32(h), plan.params)
    _memcpy(f.d, f.sd)


def _stage(backend: CudaBackend, op: FluidStep, plan: _FluidPlan, name: str,
           queue: Callable[[], None]) -> None:
    """Run one stage: replay its graph (captured on its second use) or queue its kernels."""
    if not op.graph or name not in plan.ran:
        queue()
        plan.ran.add(name)
        return
    stream = cp.cuda.get_current_stream()
    if name not in plan.graphs:
        mode = getattr(cp.cuda.runtime, "streamCaptureModeThreadLocal", 1)
        stream.begin_capture(mode)
        try:
            queue()
        finally:
            graph = stream.end_capture()
        plan.graphs[name] = graph
        plan.arrays = tuple(backend.array(ref.buffer_id) for ref in op.refs())
    plan.graphs[name].launch(stream=stream)


@cuda.handles(FluidStep)
def fluid_step(backend: CudaBackend, op: FluidStep) -> None:
    """Set ``dt`` and ``viscosity * dt`` on the device; run the stage before the solve,
    runs of ``CHECK_EVERY`` solve iterations until the solve stops (the host reads its
    state after each run), and the stage after it."""
    fields = functools.cache(lambda: _Fields(backend, op))  # cut only to queue kernels
    plans = _plans_of(backend)
    plan = plans.get(_fluid_key(op), lambda: _FluidPlan(
        cp.zeros(2, dtype=cp.float32), pressure.Solve(
            op.width, op.height, op.pressure_tolerance, op.pressure_iterations,
            fields().solve_scratch)))
    kernels("set_params")((1,), (1,), (plan.params, F32(op.dt), F32(op.viscosity * op.dt)))
    _stage(backend, op, plan, "before", lambda: _before(op, fields(), plan))
    queued = 0
    while queued < op.pressure_iterations:
        _stage(backend, op, plan, "iterations",
               lambda: pressure.iterations(plan.solve, fields().p, pressure.CHECK_EVERY))
        queued += pressure.CHECK_EVERY
        if pressure.stopped(plan.solve):
            break
    _stage(backend, op, plan, "after", lambda: _after(op, fields(), plan))


@cuda.handles(FluidAddSource)
def fluid_add_source(backend: CudaBackend, op: FluidAddSource) -> None:
    """One thread adds the density and the face velocities."""
    kernels("add_source")((1,), (1,), (
        backend.array(op.density.buffer_id), backend.array(op.u.buffer_id),
        backend.array(op.v.buffer_id), _i32(op.width), _i32(op.height), _i32(op.x),
        _i32(op.y), F32(op.amount), F32(op.vx), F32(op.vy)))


@cuda.handles(FluidDivergence)
def fluid_divergence(backend: CudaBackend, op: FluidDivergence) -> None:
    """The divergence kernel of the step, on its own."""
    _launch("divergence", op.width * op.height, backend.array(op.u.buffer_id),
            backend.array(op.v.buffer_id), backend.array(op.out.buffer_id), _i32(op.width),
            _i32(op.height))


# ------------------------------------------------------------------ spatial grid


@cuda.handles(GridBuild)
def grid_build(backend: CudaBackend, op: GridBuild) -> None:
    """A counting sort by slot: count per slot, scan for the starts, scatter."""
    n, table = op.count, op.table_size
    start = backend.array(op.cell_start.buffer_id)[:table]
    end = backend.array(op.cell_end.buffer_id)[:table]
    _memset(end, 4 * table)
    slots = cp.empty(max(n, 1), dtype=cp.int32)
    _launch("grid_count", n, backend.array(op.points.buffer_id), slots, end, _i64(n),
            F32(op.cell_size), _i32(table))
    cp.subtract(cp.cumsum(end, dtype=cp.int32), end, out=start)
    cursor = start.copy()
    _launch("grid_scatter", n, slots, cursor, backend.array(op.order.buffer_id), _i64(n))
    cp.add(end, start, out=end)


@cuda.handles(GridQuery)
def grid_query(backend: CudaBackend, op: GridQuery) -> list[np.ndarray[Any, Any]]:
    """Count each query's hits, scan, write them, download; each query's list is sorted on
    the host. Waits for its stream: the answer is host data."""
    q = op.query_count
    if q == 0 or op.count == 0:
        return [np.zeros(0, np.int64) for _ in range(q)]
    reach = int(np.ceil(op.radius / op.cell_size))
    r2 = F32(op.radius) * F32(op.radius)
    args = (backend.array(op.points.buffer_id), backend.array(op.order.buffer_id),
            backend.array(op.cell_start.buffer_id), backend.array(op.cell_end.buffer_id),
            backend.array(op.queries.buffer_id), _i64(q), F32(op.cell_size),
            _i32(op.table_size), _i32(reach), r2)
    counts = cp.empty(q, dtype=cp.int64)
    null = np.uint64(0)  # no offsets and no output: the counting pass
    _launch("grid_query", q, *args, null, counts, null)
    offsets = cp.cumsum(counts) - counts
    total = int((offsets[-1] + counts[-1]).get(stream=cp.cuda.get_current_stream()))
    out = cp.empty(max(total, 1), dtype=cp.int64)
    _launch("grid_query", q, *args, offsets, counts, out)
    stream = cp.cuda.get_current_stream()
    hits = out[:total].get(stream=stream)
    starts = offsets.get(stream=stream)
    return [np.sort(part) for part in np.split(hits, starts[1:])]
