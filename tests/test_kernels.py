"""User kernels: NVRTC compiles with a disk cache, modules load PTX/cubin, typed launches,
generation checks, and real recovery from a kernel that writes to an illegal address.

The CPU part checks validation and refusals; the ``gpu`` part runs on a CUDA device and
compares every result with NumPy in float64.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from atomr_accel import (
    ContextPoisoned,
    GpuRefStale,
    InvalidArgument,
    KernelCompileError,
    System,
)
from atomr_accel.core import KernelRef
from atomr_accel.core.ops._kernels import LaunchKernel

pytestmark = pytest.mark.anyio
gpu = pytest.mark.gpu

SOURCE = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

template <typename T>
__global__ void scale(T* x, T s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * s + OFFSET;
}

extern "C" __global__ void poke(unsigned long long address) {
    *reinterpret_cast<int*>(address) = 42;
}
"""


def blocks(n: int, threads: int = 128) -> int:
    return (n + threads - 1) // threads


def cached(directory: Path) -> int:
    """Compiled images in a kernel cache directory."""
    return len(list(directory.glob("*.bin")))


# ----------------------------------------------------------------- CPU: validation


async def test_the_cpu_backend_refuses_kernels_clearly() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True)
        with pytest.raises(InvalidArgument, match="needs the CUDA backend"):
            await dev.nvrtc().compile_async(SOURCE, "saxpy")
        with pytest.raises(InvalidArgument, match="needs the CUDA backend"):
            await dev.modules().load_async(b".version 8.0\n", "saxpy")
        x = await dev.allocate_f32_async(4)  # the device keeps serving
        assert (await dev.copy_to_numpy_async(x)).tolist() == [0, 0, 0, 0]


async def test_launch_arguments_are_typed_and_checked() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True)
        x = await dev.allocate_f32_async(4)
        kernel = KernelRef(0, 1, "saxpy", dev.generation, 0)
        cases = [
            ((x.ref, 2.0), "Python float; pass a typed scalar"),
            ((x.ref, 3), "np.int32"),
            ((x.ref, "s"), "must be a buffer or a NumPy scalar"),
        ]
        for args, message in cases:
            with pytest.raises(InvalidArgument, match=message):
                await dev.run_async(LaunchKernel(kernel, (1, 1, 1), (32, 1, 1), args))
        with pytest.raises(InvalidArgument, match="at most 1024 threads"):
            await dev.run_async(LaunchKernel(kernel, (1, 1, 1), (64, 32, 1), ()))
        with pytest.raises(InvalidArgument, match="grid must be"):
            await dev.run_async(LaunchKernel(kernel, (0, 1, 1), (1, 1, 1), ()))
        with pytest.raises(InvalidArgument, match="written index"):
            await dev.run_async(LaunchKernel(kernel, (1, 1, 1), (1, 1, 1),
                                             (np.float32(1),), written=(0,)))
        with pytest.raises(InvalidArgument, match="source must be"):
            await dev.nvrtc().compile_async("  ", "saxpy")
        with pytest.raises(InvalidArgument, match="arch must look like"):
            await dev.nvrtc().compile_async(SOURCE, "saxpy", arch="90")
        with pytest.raises(InvalidArgument, match="not one string"):
            await dev.nvrtc().compile_async(SOURCE, "saxpy", options="-G")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- GPU: NVRTC


@gpu
async def test_compiled_kernels_match_numpy_and_hit_the_disk_cache(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    n = 1000
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(
            mock=False, backend_options={"kernel_cache_dir": str(tmp_path)})
        dx, dy = await dev.allocate_f32_async(n), await dev.allocate_f32_async(n)
        await dev.copy_from_numpy_async(dx, x)
        await dev.copy_from_numpy_async(dy, y)
        nvrtc = dev.nvrtc()
        saxpy = await nvrtc.compile_async(SOURCE, "saxpy", defines={"OFFSET": "0"})
        assert not saxpy.cache_hit and not saxpy.is_stale()
        await saxpy.launch_async(blocks(n), 128, np.float32(2.5), dx, dy, np.int32(n),
                                 writes=[2])
        expected = 2.5 * x.astype(np.float64) + y
        np.testing.assert_allclose(await dev.copy_to_numpy_async(dy), expected, rtol=1e-6)

        again = await nvrtc.compile_async(SOURCE, "saxpy", defines={"OFFSET": "0"})
        assert again.cache_hit  # same source, name and options: read from disk
        assert cached(tmp_path) == 1
        fast = await nvrtc.compile_async(SOURCE, "saxpy", defines={"OFFSET": "0"},
                                         fast_math=True)
        assert not fast.cache_hit  # other options, another entry
        assert cached(tmp_path) == 2

        # A template instance by name expression, with a define, in double precision.
        z = rng.standard_normal(n)
        dz = await dev.allocate_f64_async(n)
        await dev.copy_from_numpy_async(dz, z)
        scale = await nvrtc.compile_async(SOURCE, "scale<double>", defines={"OFFSET": "1.5"})
        await scale.launch_async(blocks(n), 128, dz, np.float64(-3.0), np.int32(n))
        np.testing.assert_allclose(await dev.copy_to_numpy_async(dz), z * -3.0 + 1.5,
                                   rtol=1e-14, atol=1e-15)  # the GPU fuses into an FMA


@gpu
async def test_a_compile_error_carries_the_compiler_log(tmp_path: Path) -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(
            mock=False, backend_options={"kernel_cache_dir": str(tmp_path)})
        bad = 'extern "C" __global__ void broken(float* x) { x[0] = undefined_name; }'
        with pytest.raises(KernelCompileError) as info:
            await dev.nvrtc().compile_async(bad, "broken")
        assert "undefined_name" in info.value.log and info.value.library == "nvrtc"
        assert cached(tmp_path) == 0
        ok = await dev.nvrtc().compile_async(SOURCE, "saxpy", defines={"OFFSET": "0"})
        assert ok.name == "saxpy"  # the device keeps serving


@gpu
@pytest.mark.parametrize("arch", ["sm", "compute"])
async def test_modules_load_cubin_and_ptx(arch: str) -> None:
    import cupy as cp

    from atomr_accel.backends.cuda._kernels import compile_source

    cc = cp.cuda.Device(0).compute_capability
    image, lowered = compile_source(SOURCE.replace("OFFSET", "0"), "saxpy",
                                    (f"--gpu-architecture={arch}_{cc}",))
    assert image.startswith(b"\x7fELF") == (arch == "sm")
    n = 300
    x = np.arange(n, dtype=np.float32)
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=False)
        kernel = await dev.modules().load_async(image, lowered)
        dx, dy = await dev.allocate_f32_async(n), await dev.allocate_f32_async(n)
        await dev.copy_from_numpy_async(dx, x)
        await kernel.launch_async(blocks(n), 128, np.float32(-1.0), dx, dy, np.int32(n))
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(dy), -x)


@gpu
async def test_a_kernel_write_is_ordered_before_a_reader_on_another_stream(
        tmp_path: Path) -> None:
    """The kernel (NVRTC actor's stream) writes y; BLAS (its own stream) reads y at once."""
    rng = np.random.default_rng(5)
    n = 1 << 22
    x = rng.standard_normal(n).astype(np.float32)
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(
            mock=False, completion="sync", backend_options={"kernel_cache_dir": str(tmp_path)})
        dx, dy = await dev.allocate_f32_async(n), await dev.allocate_f32_async(n)
        await dev.copy_from_numpy_async(dx, x)
        saxpy = await dev.nvrtc().compile_async(SOURCE, "saxpy", defines={"OFFSET": "0"})
        for _ in range(3):
            launch = saxpy.launch_async(blocks(n), 128, np.float32(1.0), dx, dy, np.int32(n))
            norm = dev.blas().nrm2_async(n, dy)
            await asyncio.gather(launch, norm)
        final = await dev.blas().nrm2_async(n, dy)
        assert final == pytest.approx(3 * np.linalg.norm(x.astype(np.float64)), rel=1e-4)


@gpu
async def test_an_illegal_address_with_a_standby_keeps_durable_data(tmp_path: Path) -> None:
    """The faulting launch gets ContextPoisoned; the next op on a durable buffer runs on
    the standby context, on the buffer restored from the journal."""
    data = np.random.default_rng(6).standard_normal(1024)
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(
            mock=False, isolation="process", standby=1, journal=":memory:",
            backend_options={"kernel_cache_dir": str(tmp_path)})
        while not (await dev.stats_async()).standby_ready:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        x = await dev.allocate_f64_async(1024, durable=True)
        await dev.copy_from_numpy_async(x, data)
        poke = await dev.nvrtc().compile_async(SOURCE, "poke", defines={"OFFSET": "0"})
        with pytest.raises(ContextPoisoned):
            await poke.launch_async(1, 1, np.uint64(16))
        await dev.blas().scal_async(1024, 2.0, x)  # on the standby, x restored first
        np.testing.assert_allclose(await dev.copy_to_numpy_async(x), 2.0 * data, rtol=1e-15)
        stats = await dev.stats_async()
        assert stats.generation == 2 and stats.standby_switches == 1


@gpu
async def test_an_illegal_address_kernel_poisons_only_its_worker(tmp_path: Path) -> None:
    """Real recovery: the caller gets ContextPoisoned, a fresh worker serves the next op."""
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(
            mock=False, isolation="process",
            backend_options={"kernel_cache_dir": str(tmp_path)})
        before = (await dev.stats_async()).host_pid
        buf = await dev.allocate_f32_async(16)
        poke = await dev.nvrtc().compile_async(SOURCE, "poke", defines={"OFFSET": "0"})
        with pytest.raises(ContextPoisoned):
            await poke.launch_async(1, 1, np.uint64(16))
        fresh = await dev.allocate_f64_async(8)  # waits for the rebuild, then runs
        stats = await dev.stats_async()
        assert stats.generation == 2 and stats.restarts == 1 and stats.host_pid != before
        await dev.copy_from_numpy_async(fresh, np.arange(8.0))
        assert (await dev.copy_to_numpy_async(fresh)).tolist() == list(range(8))
        assert buf.is_stale() and poke.is_stale()
        with pytest.raises(GpuRefStale):
            await poke.launch_async(1, 1, np.uint64(16))
        with pytest.raises(GpuRefStale):
            await dev.copy_to_numpy_async(buf)
        recompiled = await dev.nvrtc().compile_async(SOURCE, "poke", defines={"OFFSET": "0"})
        assert recompiled.cache_hit and not recompiled.is_stale()


@gpu
def test_on_the_thread_host_an_illegal_address_is_unrecoverable(tmp_path: Path) -> None:
    """In-process CUDA recovery is impossible: the device stops, honestly (in a subprocess)."""
    script = textwrap.dedent(f"""
        import numpy as np
        from atomr_accel import System, Unrecoverable
        SOURCE = {SOURCE!r}
        with System.open("t") as system:
            dev = system.spawn_device(mock=False, backend_options={{
                "kernel_cache_dir": {str(tmp_path)!r}}})
            poke = dev.nvrtc().compile(SOURCE, "poke", defines={{"OFFSET": "0"}})
            try:
                poke.launch(1, 1, np.uint64(16))
            except Unrecoverable as exc:
                print("UNRECOVERABLE", exc)
            try:
                dev.allocate_f32(4)
            except Unrecoverable:
                print("STOPPED")
    """)
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True,
                          text=True, timeout=120)
    assert "UNRECOVERABLE" in done.stdout and "STOPPED" in done.stdout, \
        done.stdout + done.stderr
