"""Hopper launch features on a CUDA device of compute capability 9.0+: thread-block
clusters and tensor-map (TMA) descriptors, through NVRTC kernels.

``cluster_ranks`` writes each block's ``%cluster_ctarank``, ``%cluster_nctarank`` and
``%clusterid`` so the test checks that the cluster shape really applied.
``tma_pairs`` runs 2-block clusters: each block copies its tile of a matrix into
shared memory with ``cp.async.bulk.tensor`` (completing on an mbarrier), then reads
its partner's tile through distributed shared memory (``mapa`` + ``ld.shared::cluster``)
and writes ``own + 2 * partner`` for its tile; the test checks that against NumPy on
random data, edge tiles included (the copy engine fills what lies outside the matrix
with zeros, or NaN with ``oob_fill="nan"``). The kernels use inline PTX only, so NVRTC
needs no include path. Run on a GPU machine: ``PYTHONPATH=src python3 -m pytest -m gpu``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import System, TensorMap
from atomr_accel.nvrtc import KernelArg, cuda_include_options

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

SOURCE = r"""
struct alignas(64) TmaDesc { unsigned long long opaque[16]; };

__device__ __forceinline__ unsigned smem(const void* p) {
    unsigned long long a;
    asm volatile("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (unsigned)a;
}

__device__ __forceinline__ unsigned sreg_rank() {
    unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r;
}

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

extern "C" __global__ void cluster_ranks(int* out) {
    unsigned rank, size, cx, cy, cz;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(cx));
    asm volatile("mov.u32 %0, %%clusterid.y;" : "=r"(cy));
    asm volatile("mov.u32 %0, %%clusterid.z;" : "=r"(cz));
    if (threadIdx.x == 0) {
        int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        out[5 * b + 0] = (int)rank;
        out[5 * b + 1] = (int)size;
        out[5 * b + 2] = (int)cx;
        out[5 * b + 3] = (int)cy;
        out[5 * b + 4] = (int)cz;
    }
}

extern "C" __global__ void __cluster_dims__(2, 2, 1) fixed_ranks(int* out) {
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    if (threadIdx.x == 0) out[blockIdx.x + gridDim.x * blockIdx.y] = (int)rank;
}

// One block per BR x BC tile; blocks pair up along x in clusters of (2, 1, 1).
extern "C" __global__ void tma_pairs(const __grid_constant__ TmaDesc map, float* out,
                                     int rows, int cols, int pitch) {
    __shared__ alignas(128) float tile[BR * BC];
    __shared__ alignas(8) unsigned long long bar;
    const unsigned tile_s = smem(tile), bar_s = smem(&bar);
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar_s) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    const int x0 = blockIdx.x * BC, y0 = blockIdx.y * BR;
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     :: "r"(bar_s), "r"((unsigned)(BR * BC * 4)) : "memory");
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
            " [%0], [%1, {%2, %3}], [%4];"
            :: "r"(tile_s), "l"(reinterpret_cast<unsigned long long>(&map)),
               "r"(x0), "r"(y0), "r"(bar_s) : "memory");
    }
    unsigned done = 0;
    while (!done) {
        asm volatile("{\n .reg .pred p;\n"
                     " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n"
                     " selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done) : "r"(bar_s) : "memory");
    }
    cluster_sync();  // both tiles have landed
    unsigned partner;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(partner) : "r"(tile_s), "r"(sreg_rank() ^ 1u));
    for (int i = threadIdx.x; i < BR * BC; i += blockDim.x) {
        const int r = y0 + i / BC, c = x0 + i % BC;
        float theirs;
        asm volatile("ld.shared::cluster.f32 %0, [%1];"
                     : "=f"(theirs) : "r"(partner + 4u * (unsigned)i) : "memory");
        if (r < rows && c < cols) out[(unsigned long long)r * pitch + c] = tile[i] + 2.0f * theirs;
    }
    cluster_sync();  // the partner has read this block's tile before it exits
}
"""

COOPERATIVE = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

// Each block writes its cluster rank, and its partner's rank read from the partner's
// shared memory through cluster.map_shared_rank.
extern "C" __global__ void cg_ranks(int* out) {
    __shared__ int mine;
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) mine = (int)cluster.block_rank();
    cluster.sync();
    unsigned partner = cluster.block_rank() ^ 1u;
    int* theirs = cluster.map_shared_rank(&mine, partner);
    if (threadIdx.x == 0) {
        out[2 * blockIdx.x] = mine;
        out[2 * blockIdx.x + 1] = *theirs;
    }
    cluster.sync();
}
"""

TILES = [(16, 32), (8, 64)]
SHAPES = [(64, 128), (37, 100), (5, 12), (30, 50)]
"""(rows, cols); (30, 50) lies in rows of a 64-float pitch, so its strides are given."""


@pytest.fixture(scope="module")
def anyio_backend() -> tuple[str, dict[str, bool]]:
    """One event loop for the module's shared device."""
    return ("asyncio", {"debug": False})


@pytest.fixture(scope="module")
async def device() -> AsyncIterator[Any]:
    async with await System.open_async("hopper-gpu") as system:
        dev = await system.spawn_device_async(mock=False)
        major = (await dev.stats_async()).compute_capability[0]
        if major < 9:
            pytest.skip(f"needs compute capability 9.0, the device has {major}.x")
        yield dev


def pairs_reference(a: np.ndarray[Any, Any], br: int, bc: int, fill: float,
                    tiles_x: int) -> np.ndarray[Any, Any]:
    """``own + 2 * partner`` per tile, the partner being the other tile of its x pair."""
    rows, cols = a.shape
    tiles_y = -(-rows // br)
    padded = np.full((tiles_y * br, tiles_x * bc), fill, np.float64)
    padded[:rows, :cols] = a
    swapped = padded.reshape(tiles_y, br, tiles_x // 2, 2, bc)[:, :, :, ::-1, :]
    out = padded + 2 * swapped.reshape(padded.shape)
    return out[:rows, :cols]


@pytest.mark.parametrize(("br", "bc"), TILES)
@pytest.mark.parametrize(("rows", "cols"), SHAPES)
@pytest.mark.parametrize("fill", ["zero", "nan"])
async def test_tma_tiles_and_distributed_shared_memory_match_numpy(
        device: Any, br: int, bc: int, rows: int, cols: int, fill: str) -> None:
    rng = np.random.default_rng(rows * cols + br)
    pitch = 64 if (rows, cols) == (30, 50) else cols
    a = rng.standard_normal((rows, pitch)).astype(np.float32)
    src = await device.allocate_f32_async(rows * pitch)
    out = await device.allocate_f32_async(rows * pitch)
    await device.copy_from_numpy_async(src, a.ravel())
    view = TensorMap.tiled(src, "f32", (rows, cols), (br, bc), strides=(4 * pitch, 4),
                           oob_fill=fill)
    kernel = await device.nvrtc().compile_async(
        SOURCE, "tma_pairs", defines={"BR": str(br), "BC": str(bc)})
    tiles_x = -(-cols // bc)
    tiles_x += tiles_x % 2  # clusters pair tiles along x; an extra tile lies outside
    grid = (tiles_x, -(-rows // br), 1)
    await kernel.launch_async(grid, 128, view, out, np.int32(rows), np.int32(cols),
                              np.int32(pitch), cluster=(2, 1, 1), writes=[1])
    got = (await device.copy_to_numpy_async(out)).reshape(rows, pitch)[:, :cols]
    expected = pairs_reference(a[:, :cols].astype(np.float64), br, bc,
                               0.0 if fill == "zero" else np.nan, tiles_x)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert np.isnan(got).any() == np.isnan(expected).any()


CLUSTERS = [((8, 2, 1), (2, 1, 1), False), ((4, 4, 2), (2, 2, 1), False),
            ((6, 2, 4), (3, 1, 2), False), ((16, 1, 1), (8, 1, 1), False),
            ((32, 2, 1), (16, 1, 1), True)]


@pytest.mark.parametrize(("grid", "cluster", "non_portable"), CLUSTERS)
async def test_cluster_launches_apply_the_cluster_shape(
        device: Any, grid: tuple[int, int, int], cluster: tuple[int, int, int],
        non_portable: bool) -> None:
    blocks = grid[0] * grid[1] * grid[2]
    out = await device.allocate_i32_async(5 * blocks)
    kernel = await device.nvrtc().compile_async(SOURCE, "cluster_ranks", arch="sm_90a",
                                                defines={"BR": "1", "BC": "1"})
    await kernel.launch_async(grid, 32, [KernelArg.buffer_i32(out)], cluster=cluster,
                              non_portable_cluster=non_portable)
    got = (await device.copy_to_numpy_async(out)).reshape(grid[2], grid[1], grid[0], 5)
    z, y, x = np.meshgrid(*(np.arange(g) for g in grid[::-1]), indexing="ij")
    cx, cy, cz = cluster
    rank = (x % cx) + cx * ((y % cy) + cy * (z % cz))
    np.testing.assert_array_equal(got[..., 0], rank)
    np.testing.assert_array_equal(got[..., 1], cx * cy * cz)
    np.testing.assert_array_equal(got[..., 2], x // cx)
    np.testing.assert_array_equal(got[..., 3], y // cy)
    np.testing.assert_array_equal(got[..., 4], z // cz)


async def test_a_kernel_with_compiled_cluster_dims_needs_no_cluster_argument(
        device: Any) -> None:
    out = await device.allocate_i32_async(4 * 4)
    kernel = await device.nvrtc().compile_async(SOURCE, "fixed_ranks",
                                                defines={"BR": "1", "BC": "1"})
    await kernel.launch_async((4, 4, 1), 32, out)
    y, x = np.meshgrid(np.arange(4), np.arange(4), indexing="ij")
    got = (await device.copy_to_numpy_async(out)).reshape(4, 4)
    np.testing.assert_array_equal(got, x % 2 + 2 * (y % 2))


async def test_cooperative_groups_clusters_compile_with_the_toolkit_s_headers(
        device: Any) -> None:
    kernel = await device.nvrtc().compile_async(
        COOPERATIVE, "cg_ranks", options=[*cuda_include_options(), "-std=c++17"])
    out = await device.allocate_i32_async(2 * 8)
    await kernel.launch_async(8, 64, out, cluster=2)
    got = (await device.copy_to_numpy_async(out)).reshape(8, 2)
    np.testing.assert_array_equal(got[:, 0], np.arange(8) % 2)
    np.testing.assert_array_equal(got[:, 1], 1 - np.arange(8) % 2)


@pytest.mark.parametrize("arch", ["compute_90", "sm_90a"])
async def test_module_kernels_take_clusters_and_tensor_maps(device: Any, arch: str) -> None:
    from atomr_accel.backends.cuda._kernels import compile_source

    source = SOURCE.replace("BR * BC", "(16 * 32)").replace("BR", "16").replace("BC", "32")
    image, lowered = compile_source(source, "tma_pairs", (f"--gpu-architecture={arch}",))
    kernel = await device.modules().load_async(image, lowered)
    rows, cols = 20, 60
    a = np.random.default_rng(11).standard_normal((rows, cols)).astype(np.float32)
    src, out = (await device.allocate_f32_async(rows * cols),
                await device.allocate_f32_async(rows * cols))
    await device.copy_from_numpy_async(src, a.ravel())
    view = TensorMap.tiled(src, "f32", (rows, cols), (16, 32))
    await kernel.launch_async((2, 2, 1), 128, view, out, np.int32(rows), np.int32(cols),
                              np.int32(cols), cluster=(2, 1, 1), writes=[1])
    got = (await device.copy_to_numpy_async(out)).reshape(rows, cols)
    np.testing.assert_allclose(got, pairs_reference(a.astype(np.float64), 16, 32, 0.0, 2),
                               rtol=1e-6, atol=1e-6)


async def test_a_plain_launch_still_has_no_cluster(device: Any) -> None:
    out = await device.allocate_i32_async(5 * 4)
    kernel = await device.nvrtc().compile_async(SOURCE, "cluster_ranks",
                                                defines={"BR": "1", "BC": "1"})
    await kernel.launch_async(4, 32, out)
    got = (await device.copy_to_numpy_async(out)).reshape(4, 5)
    np.testing.assert_array_equal(got[:, 0], 0)  # every block is a cluster of its own
    np.testing.assert_array_equal(got[:, 1], 1)
    np.testing.assert_array_equal(got[:, 2], np.arange(4))


async def test_a_tensor_map_is_encoded_at_its_buffer_s_address_at_each_launch(
        device: Any) -> None:
    rows, cols = 16, 32
    a = np.random.default_rng(5).standard_normal((rows, cols)).astype(np.float32)
    kernel = await device.nvrtc().compile_async(SOURCE, "tma_pairs",
                                                defines={"BR": "16", "BC": "32"})
    out = await device.allocate_f32_async(rows * cols)
    for _ in range(3):  # a fresh buffer each time: the descriptor follows it
        src = await device.allocate_f32_async(rows * cols)
        await device.copy_from_numpy_async(src, a.ravel())
        view = TensorMap.tiled(src, "f32", (rows, cols), (rows, cols))
        await kernel.launch_async((2, 1, 1), 128, [
            KernelArg.tensor_map(view), KernelArg.buffer_f32(out), KernelArg.scalar_i32(rows),
            KernelArg.scalar_i32(cols), KernelArg.scalar_i32(cols)], cluster=2)
        got = (await device.copy_to_numpy_async(out)).reshape(rows, cols)
        np.testing.assert_allclose(got, a, rtol=1e-6)  # the partner tile lies outside: zeros
        a = a * 3 + 1
