"""The fluid's pressure solve on CUDA: multigrid-preconditioned conjugate gradients as NVRTC
kernels, the algorithm of ``backends.cpu._fluid_pressure`` (see there) step for step.

Everything stays on the device. The iteration's scalars (``r . z`` and ``d . q`` per
iteration, float64, summed by one atomic per block) and its control words live in two
small device arrays the fluid's plan owns: ``ctl[0]`` counts the iterations done,
``ctl[1]`` holds ``max|u, v|`` and ``ctl[2 + k]`` the largest residual after ``k``
iterations (float bits, merged with ``atomicMax``). Every kernel of an iteration first
reads whether the solve has stopped (converged or out of budget) and returns at once if
so; the one-thread ``pcg_advance`` counts an iteration that ran. So a run of iterations
can be queued (or replayed as one graph) without looking, and the host reads ``ctl`` only
between runs of ``CHECK_EVERY`` iterations: one synchronization per run, none per
iteration.
"""

from __future__ import annotations

from typing import Any

import cupy as cp
import numpy as np

from atomr_accel.backends.cpu._fluid_pressure import COARSE_SCALE, COARSE_SWEEPS, OMEGA
from atomr_accel.backends.cuda._realtime_nvrtc import Source
from atomr_accel.core.ops._realtime_physics import COARSEST_CELLS, pressure_levels

__all__ = ["CHECK_EVERY", "Solve", "begin", "iterations", "stopped"]

CHECK_EVERY = 4
"""Iterations queued between two reads of the solve's state by the host."""
BLOCK = 256
MAX_BLOCKS = 1024
"""Grid-stride kernels run at most this many blocks (one atomic each for a reduction)."""

_SOURCE = r"""
__device__ __forceinline__ bool stopped(const int* ctl, float tol, int budget)
{
    int k = ctl[0];
    return k >= budget || __int_as_float(ctl[2 + k]) <= tol * __int_as_float(ctl[1]);
}

__device__ __forceinline__ float max_nan(float a, float b) { return (a > b || a != a) ? a : b; }

__device__ float block_max(float v)  // the block's maximum, in thread 0
{
    __shared__ float part[32];
    __syncthreads();
    for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_down_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
    if (threadIdx.x < 32)
        for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}

__device__ double block_sum(double v)  // the block's sum, in thread 0
{
    __shared__ double part[32];
    __syncthreads();
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0;
    if (threadIdx.x < 32)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ void merge_max(int* slot, float v)
{
    v = block_max(v);
    if (threadIdx.x == 0) atomicMax(slot, __float_as_int(v));
}

__device__ __forceinline__ void merge_sum(double* slot, double v)
{
    v = block_sum(v);
    if (threadIdx.x == 0) atomicAdd(slot, v);
}

struct Level { int w, h, span, w0, h0; };

#define LEVEL int lw, int lh, int span, int w0, int h0
#define MAKE_LEVEL Level l = {lw, lh, span, w0, h0}

// The weight of cell (i, j)'s horizontal faces (the finest rows its block spans) and of
// its vertical ones (the finest columns), and its diagonal: the weights of its faces, 1 for
// a cell with none.
__device__ __forceinline__ float row_weight(int j, Level l)
{
    return (float)min(l.span, l.h0 - j * l.span);
}

__device__ __forceinline__ float column_weight(int i, Level l)
{
    return (float)min(l.span, l.w0 - i * l.span);
}

__device__ __forceinline__ float diag_at(int i, int j, Level l)
{
    float rw = row_weight(j, l), cw = column_weight(i, l), d = 0.0f;
    if (i > 0) d += rw;
    if (i < l.w - 1) d += rw;
    if (j > 0) d += cw;
    if (j < l.h - 1) d += cw;
    return d == 0.0f ? 1.0f : d;
}

// A x at cell (i, j) of a level, from the values get(ii, jj): the diagonal times x, less
// each weighted neighbour, in the order of the NumPy reference; *diag receives the diagonal.
template <typename Get>
__device__ __forceinline__ float apply_at(Get get, int i, int j, Level l, float* diag)
{
    float rw = row_weight(j, l), cw = column_weight(i, l), d = diag_at(i, j, l);
    float y = d * get(i, j);
    if (i > 0) y -= rw * get(i - 1, j);
    if (i < l.w - 1) y -= rw * get(i + 1, j);
    if (j > 0) y -= cw * get(i, j - 1);
    if (j < l.h - 1) y -= cw * get(i, j + 1);
    *diag = d;
    return y;
}

extern "C" __global__ void uv_max(const float* u, const float* v, int* ctl, int nu, int nv)
{
    float m = 0.0f;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < nu + nv;
         idx += gridDim.x * blockDim.x)
        m = max_nan(m, fabsf(idx < nu ? u[idx] : v[idx - nu]));
    merge_max(ctl + 1, m);
}

extern "C" __global__ void pcg_begin(const float* p, const float* div, float* r, int* ctl,
                                     int w, int h)
{
    Level l = {w, h, 1, w, h};
    auto get = [&](int i, int j) { return p[j * w + i]; };
    float m = 0.0f, d;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < w * h;
         idx += gridDim.x * blockDim.x) {
        int j = idx / w, i = idx - j * w;
        float value = -div[idx] - apply_at(get, i, j, l, &d);
        r[idx] = value;
        m = max_nan(m, fabsf(value));
    }
    merge_max(ctl + 2, m);
}

extern "C" __global__ void mg_smooth(const float* b, float* x, LEVEL, const int* ctl,
                                     float tol, int budget)
{
    MAKE_LEVEL;
    if (stopped(ctl, tol, budget)) return;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < l.w * l.h;
         idx += gridDim.x * blockDim.x) {
        int j = idx / l.w, i = idx - j * l.w;
        x[idx] = OMEGA * b[idx] / diag_at(i, j, l);
    }
}

extern "C" __global__ void mg_restrict(const float* b, const float* x, float* bc, LEVEL,
                                       const int* ctl, float tol, int budget)
{
    MAKE_LEVEL;
    if (stopped(ctl, tol, budget)) return;
    int cw = (l.w + 1) / 2, ch = (l.h + 1) / 2;
    auto get = [&](int i, int j) { return x[j * l.w + i]; };
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < cw * ch;
         idx += gridDim.x * blockDim.x) {
        int cj = idx / cw, ci = idx - cj * cw;
        float total = 0.0f, d;
        const int di[4] = {0, 0, 1, 1}, dj[4] = {0, 1, 0, 1};
        for (int c = 0; c < 4; ++c) {
            int i = 2 * ci + di[c], j = 2 * cj + dj[c];
            if (i < l.w && j < l.h) total += b[j * l.w + i] - apply_at(get, i, j, l, &d);
        }
        bc[idx] = total;
    }
}

extern "C" __global__ void mg_coarse(const float* b, float* x, LEVEL, double* acc,
                                     int accumulate, const int* ctl, float tol, int budget)
{
    MAKE_LEVEL;
    if (stopped(ctl, tol, budget)) return;
    __shared__ float xs[COARSEST];
    int n = l.w * l.h, t = threadIdx.x;
    if (t < n) xs[t] = 0.0f;
    __syncthreads();
    auto get = [&](int i, int j) { return xs[j * l.w + i]; };
    for (int s = 0; s < SWEEPS; ++s) {
        float next = 0.0f, d;
        if (t < n) {
            int j = t / l.w, i = t - j * l.w;
            float ax = apply_at(get, i, j, l, &d);
            next = xs[t] + OMEGA * (b[t] - ax) / d;
        }
        __syncthreads();
        if (t < n) xs[t] = next;
        __syncthreads();
    }
    if (t < n) x[t] = xs[t];
    if (accumulate && t == 0) {
        double total = 0.0;
        for (int c = 0; c < n; ++c) total += (double)b[c] * (double)xs[c];
        acc[2 * ctl[0]] = total;
    }
}

extern "C" __global__ void mg_correct(const float* b, const float* x, const float* ec,
                                      float* out, LEVEL, double* acc, int accumulate,
                                      const int* ctl, float tol, int budget)
{
    MAKE_LEVEL;
    if (stopped(ctl, tol, budget)) return;
    int cw = (l.w + 1) / 2;
    auto get = [&](int i, int j) {
        return x[j * l.w + i] + SCALE * ec[(j >> 1) * cw + (i >> 1)];
    };
    double dot = 0.0;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < l.w * l.h;
         idx += gridDim.x * blockDim.x) {
        int j = idx / l.w, i = idx - j * l.w;
        float d;
        float ay = apply_at(get, i, j, l, &d);
        float value = get(i, j) + OMEGA * (b[idx] - ay) / d;
        out[idx] = value;
        dot += (double)b[idx] * (double)value;
    }
    if (accumulate) merge_sum(acc + 2 * ctl[0], dot);
}

extern "C" __global__ void pcg_direction(const float* z, float* dir, float* q, double* acc,
                                         int w, int h, const int* ctl, float tol, int budget)
{
    if (stopped(ctl, tol, budget)) return;
    int k = ctl[0];
    double rz = acc[2 * k], old = k > 0 ? acc[2 * k - 2] : 0.0;
    float beta = (k > 0 && old != 0.0) ? (float)(rz / old) : 0.0f;
    Level l = {w, h, 1, w, h};
    auto get = [&](int i, int j) { return z[j * w + i]; };
    double dot = 0.0;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < w * h;
         idx += gridDim.x * blockDim.x) {
        int j = idx / w, i = idx - j * w;
        float d;
        float az = apply_at(get, i, j, l, &d);
        float dv = k > 0 ? z[idx] + beta * dir[idx] : z[idx];
        float qv = k > 0 ? az + beta * q[idx] : az;
        dir[idx] = dv;
        q[idx] = qv;
        dot += (double)dv * (double)qv;
    }
    merge_sum(acc + 2 * k + 1, dot);
}

extern "C" __global__ void pcg_update(float* p, float* r, const float* dir, const float* q,
                                      const double* acc, int* ctl, int n, float tol, int budget)
{
    if (stopped(ctl, tol, budget)) return;
    int k = ctl[0];
    double pq = acc[2 * k + 1];
    float alpha = pq != 0.0 ? (float)(acc[2 * k] / pq) : 0.0f;
    float m = 0.0f;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += gridDim.x * blockDim.x) {
        p[idx] = p[idx] + alpha * dir[idx];
        float value = r[idx] - alpha * q[idx];
        r[idx] = value;
        m = max_nan(m, fabsf(value));
    }
    merge_max(ctl + 3 + k, m);
}

extern "C" __global__ void pcg_advance(int* ctl, float tol, int budget)
{
    if (!stopped(ctl, tol, budget)) ctl[0] += 1;
}
"""

_KERNELS = Source(
    _SOURCE.replace("OMEGA", f"{OMEGA!r}f").replace("SCALE", f"{COARSE_SCALE!r}f")
    .replace("SWEEPS", str(COARSE_SWEEPS)).replace("COARSEST", str(COARSEST_CELLS)),
    ("--std=c++17", "--fmad=false"))

def _launch(name: str, n: int, *args: Any) -> None:
    """``name`` over ``n`` elements, grid-stride, at most ``MAX_BLOCKS`` blocks."""
    blocks = max(1, min((n + BLOCK - 1) // BLOCK, MAX_BLOCKS))
    _KERNELS.kernel(name)((blocks,), (BLOCK,), args, stream=cp.cuda.get_current_stream())


class Solve:
    """One fluid's solve: its device arrays (``ctl``, ``acc``), its levels and their
    vectors in the step's scratch, and the tolerance and budget its kernels take."""

    def __init__(self, width: int, height: int, tolerance: float, budget: int,
                 scratch: Any) -> None:
        nc = width * height
        self.levels = pressure_levels(width, height)
        self.tolerance, self.budget = np.float32(tolerance), np.int32(budget)
        self.ctl = cp.zeros(budget + 3, dtype=cp.int32)
        self.acc = cp.zeros(2 * (budget + 1), dtype=cp.float64)
        self.r, t0, self.z = scratch[:nc], scratch[nc:2 * nc], scratch[2 * nc:3 * nc]
        self.dir, self.q = scratch[3 * nc:4 * nc], scratch[4 * nc:5 * nc]
        coarse = len(self.levels) > 1
        self.vectors = [(self.r, t0 if coarse else self.z, self.z)]
        at = 5 * nc
        for w, h in self.levels[1:]:
            n = w * h
            self.vectors.append((scratch[at:at + n], scratch[at + n:at + 2 * n],
                                 scratch[at + 2 * n:at + 3 * n]))
            at += 3 * n
        self.structs = [tuple(np.int32(x) for x in (w, h, 1 << i, width, height))
                        for i, (w, h) in enumerate(self.levels)]

    def guard(self) -> tuple[Any, ...]:
        """The arguments every iteration kernel ends with."""
        return (self.ctl, self.tolerance, self.budget)


def begin(solve: Solve, u: Any, v: Any, p: Any, div: Any) -> None:
    """Queue the start: clear the scalars, ``max|u, v|``, the first residual."""
    stream = cp.cuda.get_current_stream().ptr
    cp.cuda.runtime.memsetAsync(solve.ctl.data.ptr, 0, solve.ctl.nbytes, stream)
    cp.cuda.runtime.memsetAsync(solve.acc.data.ptr, 0, solve.acc.nbytes, stream)
    _launch("uv_max", u.size + v.size, u, v, solve.ctl, np.int32(u.size), np.int32(v.size))
    w, h = solve.levels[0]
    _launch("pcg_begin", w * h, p, div, solve.r, solve.ctl, np.int32(w), np.int32(h))


def _vcycle(solve: Solve) -> None:
    """Queue one V-cycle of ``r`` into ``z``, and ``r . z``."""
    last = len(solve.levels) - 1
    for i in range(last):
        b, x, _ = solve.vectors[i]
        n = solve.levels[i][0] * solve.levels[i][1]
        _launch("mg_smooth", n, b, x, *solve.structs[i], *solve.guard())
        nxt = solve.vectors[i + 1][0]
        _launch("mg_restrict", nxt.size, b, x, nxt, *solve.structs[i], *solve.guard())
    b, x, _ = solve.vectors[last]
    _KERNELS.kernel("mg_coarse")((1,), (32,), (
        b, x, *solve.structs[last], solve.acc, np.int32(last == 0), *solve.guard()),
        stream=cp.cuda.get_current_stream())
    for i in reversed(range(last)):
        b, x, out = solve.vectors[i]
        below = solve.vectors[i + 1]
        ec = below[1] if i + 1 == last else below[2]
        n = solve.levels[i][0] * solve.levels[i][1]
        _launch("mg_correct", n, b, x, ec, out, *solve.structs[i], solve.acc, np.int32(i == 0),
                *solve.guard())


def iterations(solve: Solve, p: Any, count: int) -> None:
    """Queue ``count`` iterations (each a no-op once the solve has stopped)."""
    w, h = solve.levels[0]
    n = w * h
    for _ in range(count):
        _vcycle(solve)
        _launch("pcg_direction", n, solve.z, solve.dir, solve.q, solve.acc, np.int32(w),
                np.int32(h), *solve.guard())
        _launch("pcg_update", n, p, solve.r, solve.dir, solve.q, solve.acc, solve.ctl,
                np.int32(n), solve.tolerance, solve.budget)
        _KERNELS.kernel("pcg_advance")((1,), (1,), (solve.ctl, solve.tolerance, solve.budget),
                                       stream=cp.cuda.get_current_stream())


def stopped(solve: Solve) -> bool:
    """Read the solve's state (waits for the stream): converged or out of budget."""
    ctl = solve.ctl.get()
    k = int(ctl[0])
    if k >= solve.budget:
        return True
    floats = ctl.view(np.float32)
    return bool(floats[2 + k] <= solve.tolerance * floats[1])
