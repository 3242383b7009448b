"""The CUDA C source of the realtime physics kernels (``_realtime_physics`` compiles it
with NVRTC): particles, cloth, the fluid's stages and the uniform grid, operation for
operation as the CPU reference computes them, hashing cells as it does (``HASH``)."""

from __future__ import annotations

from atomr_accel.backends.cpu._realtime_physics import HASH

__all__ = ["SOURCE"]

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
"""The kernels' source, with the CPU reference's cell-hash constants filled in."""
