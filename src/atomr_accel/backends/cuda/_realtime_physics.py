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
from atomr_accel.backends.cpu._realtime_physics import HASH
from atomr_accel.backends.cuda import _fluid_pressure as pressure
from atomr_accel.backends.cuda._realtime_nvrtc import Source, launch
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

SOURCE = r"""
typedef long long i64;
typedef unsigned long long u64;

extern "C" __global__ void particle_step(
    float* pos, float* vel, float* life, int* live, i64 n, float dt, int drag,
    float term_y, float decay_over_k, float keep, float half_g_dt2, float g_dt,
    float bounce, float ground)
{
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    int alive_after = 0;
    if (i < n) {
        float l = life[i];
        if (l > 0.0f) {
            float px = pos[3 * i], py = pos[3 * i + 1], pz = pos[3 * i + 2];
            float vx = vel[3 * i], vy = vel[3 * i + 1], vz = vel[3 * i + 2];
            if (drag) {
                float ry = vy - term_y;
                px = (px + 0.0f * dt) + vx * decay_over_k;
                py = (py + term_y * dt) + ry * decay_over_k;
                pz = (pz + 0.0f * dt) + vz * decay_over_k;
                vx = 0.0f + vx * keep;
                vy = term_y + ry * keep;
                vz = 0.0f + vz * keep;
            } else {
                px = (px + vx * dt) + 0.0f;
                py = (py + vy * dt) + half_g_dt2;
                pz = (pz + vz * dt) + 0.0f;
                vy = vy + g_dt;
            }
            if (py < ground) {
                py = ground + (ground - py) * bounce;
                if (vy < 0.0f) vy = -vy * bounce;
            }
            pos[3 * i] = px; pos[3 * i + 1] = py; pos[3 * i + 2] = pz;
            vel[3 * i] = vx; vel[3 * i + 1] = vy; vel[3 * i + 2] = vz;
            l = l - dt;
            life[i] = l;
            alive_after = l > 0.0f;
        }
    }
    int block_live = __syncthreads_count(alive_after);
    if (threadIdx.x == 0 && block_live) atomicAdd(live, block_live);
}

extern "C" __global__ void particle_scatter(
    const float* pos_in, const float* vel_in, const float* life_in, const int* slot,
    float* pos, float* vel, float* life, i64 n)
{
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !(life_in[i] > 0.0f)) return;
    i64 j = slot[i] - 1;
    for (int c = 0; c < 3; ++c) {
        pos[3 * j + c] = pos_in[3 * i + c];
        vel[3 * j + c] = vel_in[3 * i + c];
    }
    life[j] = life_in[i];
}

__device__ void relax(float* pos, const float* inv, int i, int j, float rest, float stiffness)
{
    float wa = inv[i], wb = inv[j];
    float ax = pos[3 * i], ay = pos[3 * i + 1], az = pos[3 * i + 2];
    float bx = pos[3 * j], by = pos[3 * j + 1], bz = pos[3 * j + 2];
    float dx = bx - ax, dy = by - ay, dz = bz - az;
    float len = sqrtf((dx * dx + dy * dy) + dz * dz);
    float w = wa + wb;
    if (!(len > 1e-12f) || !(w > 0.0f)) return;
    float scale = (stiffness * (len - rest)) / (len * w);
    float sa = scale * wa, sb = scale * wb;
    pos[3 * i] = ax + dx * sa; pos[3 * i + 1] = ay + dy * sa; pos[3 * i + 2] = az + dz * sa;
    pos[3 * j] = bx - dx * sb; pos[3 * j + 1] = by - dy * sb; pos[3 * j + 2] = bz - dz * sb;
}

extern "C" __global__ void cloth_step(
    float* pos, float* prev, const float* inv, int w, int h, float damping,
    float adt2_x, float adt2_y, float adt2_z, float rest0, float rest1, float rest2,
    float stiffness, int iterations)
{
    const int n = w * h;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float px = pos[3 * i], py = pos[3 * i + 1], pz = pos[3 * i + 2];
        if (inv[i] > 0.0f) {
            pos[3 * i] = (px + (px - prev[3 * i]) * damping) + adt2_x;
            pos[3 * i + 1] = (py + (py - prev[3 * i + 1]) * damping) + adt2_y;
            pos[3 * i + 2] = (pz + (pz - prev[3 * i + 2]) * damping) + adt2_z;
        }
        prev[3 * i] = px; prev[3 * i + 1] = py; prev[3 * i + 2] = pz;
    }
    __syncthreads();
    const int dr[6] = {0, 1, 1, 1, 0, 2};
    const int dc[6] = {1, 0, 1, -1, 2, 0};
    const float rest[6] = {rest0, rest0, rest1, rest1, rest2, rest2};
    for (int it = 0; it < iterations; ++it) {
        for (int set = 0; set < 12; ++set) {
            const int d = set >> 1, k = set & 1;
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const int r = i / w, c = i - r * w;
                int colour;
                switch (d) {
                    case 0: colour = c & 1; break;
                    case 4: colour = (c >> 1) & 1; break;
                    case 5: colour = (r >> 1) & 1; break;
                    default: colour = r & 1;
                }
                const int r2 = r + dr[d], c2 = c + dc[d];
                if (colour == k && r2 < h && c2 >= 0 && c2 < w)
                    relax(pos, inv, i, r2 * w + c2, rest[d], stiffness);
            }
            __syncthreads();
        }
    }
}

__device__ float sample(const float* g, float fx, float fy, int nx, int ny)
{
    fx = fminf(fmaxf(fx, 0.0f), (float)(nx - 1));
    fy = fminf(fmaxf(fy, 0.0f), (float)(ny - 1));
    int i0 = max(min((int)floorf(fx), nx - 2), 0);
    int j0 = max(min((int)floorf(fy), ny - 2), 0);
    int i1 = min(i0 + 1, nx - 1), j1 = min(j0 + 1, ny - 1);
    float tx = fx - (float)i0, ty = fy - (float)j0;
    float a = g[j0 * nx + i0], b = g[j0 * nx + i1], c = g[j1 * nx + i0], d = g[j1 * nx + i1];
    float top = a + tx * (b - a);
    float bottom = c + tx * (d - c);
    return top + ty * (bottom - top);
}

extern "C" __global__ void set_params(float* params, float dt, float a)
{
    params[0] = dt;
    params[1] = a;
}

extern "C" __global__ void advect_u(const float* u, const float* v, float* out, int w, int h,
                                    const float* params)
{
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= h * (w + 1)) return;
    int j = idx / (w + 1), i = idx - j * (w + 1);
    if (i == 0 || i == w) { out[idx] = 0.0f; return; }
    float dt = params[0];
    int l = min(max(i - 1, 0), w - 1), r = min(max(i, 0), w - 1);
    float vy = 0.25f * (((v[j * w + l] + v[j * w + r]) + v[(j + 1) * w + l]) + v[(j + 1) * w + r]);
    float fx = (float)i - dt * u[idx];
    float fy = ((float)j + 0.5f) - dt * vy;
    out[idx] = sample(u, fx, fy - 0.5f, w + 1, h);
}

extern "C" __global__ void advect_v(const float* u, const float* v, float* out, int w, int h,
                                    const float* params)
{
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (h + 1) * w) return;
    int j = idx / w, i = idx - j * w;
    if (j == 0 || j == h) { out[idx] = 0.0f; return; }
    float dt = params[0];
    int b = min(max(j - 1, 0), h - 1), a = min(max(j, 0), h - 1);
    int w1 = w + 1;
    float ux = 0.25f * (((u[b * w1 + i] + u[b * w1 + i + 1]) + u[a * w1 + i]) + u[a * w1 + i + 1]);
    float fx = ((float)i + 0.5f) - dt * ux;
    float fy = (float)j - dt * v[idx];
    out[idx] = sample(v, fx - 0.5f, fy, w, h + 1);
}

extern "C" __global__ void advect_density(const float* d, const float* u, const float* v,
                                          float* out, int w, int h, const float* params)
{
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= h * w) return;
    int j = idx / w, i = idx - j * w;
    float dt = params[0];
    float ux = 0.5f * (u[j * (w + 1) + i] + u[j * (w + 1) + i + 1]);
    float vy = 0.5f * (v[j * w + i] + v[(j + 1) * w + i]);
    float fx = ((float)i + 0.5f) - dt * ux;
    float fy = ((float)j + 0.5f) - dt * vy;
    out[idx] = sample(d, fx - 0.5f, fy - 0.5f, w, h);
}

__device__ float neighbour_sum(const float* x, int i, int j, int nx, int ny, float* count)
{
    float total = 0.0f, n = 0.0f;
    if (i > 0) { total = total + x[j * nx + i - 1]; n += 1.0f; }
    if (i < nx - 1) { total = total + x[j * nx + i + 1]; n += 1.0f; }
    if (j > 0) { total = total + x[(j - 1) * nx + i]; n += 1.0f; }
    if (j < ny - 1) { total = total + x[(j + 1) * nx + i]; n += 1.0f; }
    *count = n;
    return total;
}

extern "C" __global__ void diffuse(const float* x, const float* b, float* out, int nx, int ny,
                                   int walls_are_columns, const float* params)
{
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= nx * ny) return;
    int j = idx / nx, i = idx - j * nx;
    int wall = walls_are_columns ? (i == 0 || i == nx - 1) : (j == 0 || j == ny - 1);
    if (wall) { out[idx] = 0.0f; return; }
    float a = params[1], count;
    float total = neighbour_sum(x, i, j, nx, ny, &count);
    out[idx] = (b[idx] + a * total) / (1.0f + a * count);
}

extern "C" __global__ void divergence(const float* u, const float* v, float* out, int w, int h)
{
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= h * w) return;
    int j = idx / w, i = idx - j * w;
    out[idx] = (u[j * (w + 1) + i + 1] - u[j * (w + 1) + i]) + (v[(j + 1) * w + i] - v[j * w + i]);
}

extern "C" __global__ void subtract_gradient(float* u, float* v, const float* p, int w, int h)
{
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    int nu = h * (w + 1);
    if (idx < nu) {
        int j = idx / (w + 1), i = idx - j * (w + 1);
        if (i > 0 && i < w) u[idx] -= p[j * w + i] - p[j * w + i - 1];
    }
    int k = idx - nu;
    if (k >= 0 && k < (h + 1) * w) {
        int j = k / w, i = k - j * w;
        if (j > 0 && j < h) v[k] -= p[j * w + i] - p[(j - 1) * w + i];
    }
}

extern "C" __global__ void add_source(float* d, float* u, float* v, int w, int h, int x, int y,
                                      float amount, float vx, float vy)
{
    d[y * w + x] += amount;
    if (x > 0) u[y * (w + 1) + x] += vx;
    if (x + 1 < w) u[y * (w + 1) + x + 1] += vx;
    if (y > 0) v[y * w + x] += vy;
    if (y + 1 < h) v[(y + 1) * w + x] += vy;
}

__device__ void cell_of(const float* p, float cell, i64* c)
{
    c[0] = (i64)floorf(p[0] / cell);
    c[1] = (i64)floorf(p[1] / cell);
    c[2] = (i64)floorf(p[2] / cell);
}

__device__ int slot_of(const i64* c, int table)
{
    u64 mixed = ((u64)c[0] * HASH_X) ^ ((u64)c[1] * HASH_Y) ^ ((u64)c[2] * HASH_Z);
    return (int)(mixed % (u64)table);
}

extern "C" __global__ void grid_count(const float* points, int* slots, int* counts, i64 n,
                                      float cell, int table)
{
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    i64 c[3];
    cell_of(points + 3 * i, cell, c);
    int s = slot_of(c, table);
    slots[i] = s;
    atomicAdd(counts + s, 1);
}

extern "C" __global__ void grid_scatter(const int* slots, int* cursor, int* order, i64 n)
{
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    order[atomicAdd(cursor + slots[i], 1)] = (int)i;
}

extern "C" __global__ void grid_query(
    const float* points, const int* order, const int* start, const int* end,
    const float* queries, i64 q, float cell, int table, int reach, float r2,
    const i64* offsets, i64* counts, i64* out)
{
    i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= q) return;
    const float* query = queries + 3 * k;
    i64 qc[3];
    cell_of(query, cell, qc);
    i64 found = 0, base = offsets ? offsets[k] : 0;
    for (int dx = -reach; dx <= reach; ++dx)
    for (int dy = -reach; dy <= reach; ++dy)
    for (int dz = -reach; dz <= reach; ++dz) {
        i64 visit[3] = {qc[0] + dx, qc[1] + dy, qc[2] + dz};
        int s = slot_of(visit, table);
        for (int m = start[s]; m < end[s]; ++m) {
            int idx = order[m];
            const float* p = points + 3 * (i64)idx;
            i64 pc[3];
            cell_of(p, cell, pc);
            if (pc[0] != visit[0] || pc[1] != visit[1] || pc[2] != visit[2]) continue;
            float ex = p[0] - query[0], ey = p[1] - query[1], ez = p[2] - query[2];
            if ((ex * ex + ey * ey) + ez * ez <= r2) {
                if (out) out[base + found] = idx;
                ++found;
            }
        }
    }
    if (!out) counts[k] = found;
}
""".replace("HASH_X", f"{HASH[0]}ULL").replace("HASH_Y", f"{HASH[1]}ULL").replace(
    "HASH_Z", f"{HASH[2]}ULL")


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
