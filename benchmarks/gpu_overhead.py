"""What atomr-accel costs over calling CuPy directly, on a real GPU, side by side in one run.

The goals (issue "Fast data path"), all through the public facade:

1. SGEMM 4096^3 f32, one blocking call at a time: >= 98% of direct CuPy synchronizing
   each call, on the thread and the process host; pipelined (async calls in flight
   together): >= 99% of direct CuPy launched back to back.
2. 64x64 gemm round trip p50: blocking facade <= 1.3x direct launch + synchronize on
   the thread host, <= 2x on the process host; the async API awaited from a user's own
   asyncio loop <= 1.5x (thread host).
3. Completion wake-up (launch -> the caller resumes) p50 <= 15 us over the kernel's own
   time, measured with CUDA events around the kernel: the wait proper (from the
   launch call's return) and the whole round trip (launch overhead included).
4. Host -> device from a PinnedBufferPool buffer: >= 90% of CuPy's pinned copy (set +
   synchronize) from 4 MiB up, >= 70% at 1 MiB.
5. RNG uniform fill of 2^24 f32: >= 90% of one direct cuRAND Philox call, continuation
   exact (two fills of 2^23 equal one of 2^24).
6. Device -> host download round trip p50 at 4 KiB, 256 KiB and 4 MiB: blocking and
   awaited from a user's loop, both hosts, beside CuPy's ``get`` (which synchronizes).

    python benchmarks/gpu_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np

try:
    import cupy as cp
    from cupy.cuda import curand
except ImportError:  # no CuPy, so no CUDA device: main() says so and skips
    cp = curand = None
from _report import print_table, require_cuda, samples_ns_async, summarize_us, write_json

from atomr_accel import Device, System
from atomr_accel.core import KernelRef
from atomr_accel.core.ops._kernels import CompileKernel, LaunchKernel
from atomr_accel.device import PinnedBufferPool
from atomr_accel.hosts import BackendSpec

HOSTS = ("thread", "process")


def cuda_seconds(fn: Callable[[], Any], reps: int) -> float:
    """Seconds per call of ``fn`` launched back to back on the current stream (CUDA events)."""
    fn()
    cp.cuda.get_current_stream().synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return float(cp.cuda.get_elapsed_time(start, end)) / 1e3 / reps


def wall_seconds(fn: Callable[[], Any], reps: int) -> float:
    """Wall seconds per call of a blocking ``fn`` (after one warm-up call)."""
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def samples_ns(fn: Callable[[], Any], reps: int, warm: int = 200) -> list[int]:
    """Wall nanoseconds of each of ``reps`` calls of a blocking ``fn``."""
    for _ in range(warm):
        fn()
    out = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - start)
    return out


def gemm_buffers(dev: Device, n: int, a: Any, b: Any) -> tuple[Any, Any, Any]:
    bufs = dev.allocate_f32(n * n), dev.allocate_f32(n * n), dev.allocate_f32(n * n)
    dev.copy_from_numpy(bufs[0], cp.asnumpy(a).reshape(-1))
    dev.copy_from_numpy(bufs[1], cp.asnumpy(b).reshape(-1))
    return bufs


def sgemm(devices: dict[str, Device], n: int, reps: int) -> dict[str, float]:
    a = cp.random.standard_normal((n, n), dtype=cp.float32)
    b = cp.random.standard_normal((n, n), dtype=cp.float32)
    c = cp.empty((n, n), dtype=cp.float32)
    stream = cp.cuda.get_current_stream()
    flops = 2.0 * n**3
    rows = {
        "direct cupy, synchronizing each call": flops / wall_seconds(
            lambda: (cp.matmul(a, b, out=c), stream.synchronize()), reps) / 1e12,
        "direct cupy, back to back": flops / cuda_seconds(
            lambda: cp.matmul(a, b, out=c), reps) / 1e12,
    }
    for isolation, dev in devices.items():
        x, y, z = gemm_buffers(dev, n, a, b)
        blas = dev.blas()
        rows[f"{isolation} host, blocking, one at a time"] = flops / wall_seconds(
            lambda blas=blas, x=x, y=y, z=z: blas.gemm_f32(x, y, z, n, n, n), reps) / 1e12

        async def pipelined(blas: Any = blas, x: Any = x, y: Any = y, z: Any = z) -> float:
            await blas.gemm_f32_async(x, y, z, n, n, n)
            start = time.perf_counter()
            await asyncio.gather(*(blas.gemm_f32_async(x, y, z, n, n, n) for _ in range(reps)))
            return (time.perf_counter() - start) / reps

        rows[f"{isolation} host, async, pipelined"] = flops / asyncio.run(pipelined()) / 1e12
        for buf in (x, y, z):
            dev.free(buf)
    return rows


def small_gemm(devices: dict[str, Device], reps: int) -> dict[str, Any]:
    n = 64
    a = cp.random.standard_normal((n, n), dtype=cp.float32)
    c = cp.empty_like(a)
    stream = cp.cuda.get_current_stream()
    rows: dict[str, Any] = {"direct cupy.matmul + synchronize": summarize_us(
        samples_ns(lambda: (cp.matmul(a, a, out=c), stream.synchronize()), reps))}
    for isolation, dev in devices.items():
        x, y, z = gemm_buffers(dev, n, a, a)
        blas = dev.blas()
        rows[f"{isolation} host, blocking facade"] = summarize_us(
            samples_ns(lambda blas=blas, x=x, y=y, z=z: blas.gemm_f32(x, y, z, n, n, n), reps))

        rows[f"{isolation} host, async from a user's loop"] = summarize_us(asyncio.run(
            samples_ns_async(lambda blas=blas, x=x, y=y, z=z: blas.gemm_f32_async(
                x, y, z, n, n, n), reps)))
    return rows


async def small_gemm_on_the_system_loop(reps: int) -> dict[str, Any]:
    """The async API on the loop that runs the system itself (System.open_async)."""
    n = 64
    async with await System.open_async("bench-async") as system:
        dev = await system.spawn_device_async(mock=False)
        bufs = [await dev.allocate_f32_async(n * n) for _ in range(3)]
        await dev.copy_from_numpy_async(bufs[0], np.random.default_rng(0).standard_normal(
            n * n).astype(np.float32))
        blas = dev.blas()
        out = await samples_ns_async(
            lambda: blas.gemm_f32_async(bufs[0], bufs[0], bufs[1], n, n, n), reps)
        return {"thread host, async on the system's own loop": summarize_us(out)}


_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def wakeups(devices: dict[str, Device], reps: int) -> dict[str, Any]:
    """How late the caller learns that a kernel of about 20 us has finished.

    ``wait``: from the moment the launch call returned to the moment the caller
    resumes, less the kernel's own time (CUDA events around it, same stream): the
    wake-up proper. ``round trip``: the whole call, launch overhead included.
    """
    clock = cp.cuda.Device().attributes["ClockRate"] * 1e3  # Hz
    cycles = np.int64(20e-6 * clock)
    kernel = cp.RawKernel(_SPIN, "spin")
    stream = cp.cuda.Stream(non_blocking=True)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    own = []
    for _ in range(50):
        start.record(stream)
        kernel((1,), (1,), (cycles,), stream=stream)
        end.record(stream)
        end.synchronize()
        own.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
    kernel_us = float(np.median(own))

    def waited(launch: Callable[[], Any], wait: Callable[[Any], Any]) -> list[int]:
        out = []
        for i in range(reps + 50):
            handle = launch()
            begin = time.perf_counter_ns()
            wait(handle)
            if i >= 50:
                out.append(time.perf_counter_ns() - begin)
        return out

    def direct_launch() -> None:
        kernel((1,), (1,), (cycles,), stream=stream)

    backend = BackendSpec("cuda").create()
    kernel_id, _ = backend.execute(CompileKernel(_SPIN, "spin"))
    op = LaunchKernel(KernelRef(0, kernel_id, "spin", 0), (1, 1, 1), (1, 1, 1), (cycles,))
    out: dict[str, Any] = {"kernel_us": kernel_us}
    samples = {
        "wait: direct, stream.synchronize": waited(direct_launch,
                                                   lambda _: stream.synchronize()),
        "wait: the data plane (backend wait on the op's event)": waited(
            lambda: backend.begin(op, 1), lambda started: backend.wait(started, None)),
    }
    backend.close()
    samples["round trip: direct launch + synchronize"] = samples_ns(
        lambda: (direct_launch(), stream.synchronize()), reps, warm=50)
    for isolation, dev in devices.items():
        spin = dev.nvrtc().compile(_SPIN, "spin")
        samples[f"round trip: {isolation} host, blocking facade"] = samples_ns(
            lambda spin=spin: spin.launch((1,), (1,), cycles), reps, warm=50)
    for name, values in samples.items():
        summary = summarize_us(values)
        out[name] = {**summary, "over_kernel_us": summary["p50_us"] - kernel_us}
    return out


def copies(dev: Device, max_mib: int) -> list[dict[str, Any]]:
    stream = cp.cuda.get_current_stream()
    results = []
    with PinnedBufferPool(capacity=2 * (max_mib << 20) + (1 << 20)) as pool:
        size = 1 << 20
        while size <= max_mib << 20:
            pinned = pool.acquire(size)
            pinned.array[:] = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
            target = cp.empty(size, dtype=cp.uint8)
            reps = max(5, min(100, (512 << 20) // size))
            direct = size / wall_seconds(
                lambda t=target, p=pinned: (t.set(p.array, stream=stream), stream.synchronize()),
                reps) / 1e9
            buf = dev.allocate(size, "u8")
            ours = size / wall_seconds(lambda b=buf, p=pinned: dev.copy_from_numpy(b, p.array),
                                       reps) / 1e9
            results.append({"bytes": size, "cupy pinned GB/s": direct, "device GB/s": ours,
                            "ratio": ours / direct})
            pinned.release()
            dev.free(buf)
            del target
            size *= 4
    return results


def downloads(devices: dict[str, Device], reps: int) -> dict[str, Any]:
    """p50/p99 of one download of each size: CuPy's ``get``, then each host's blocking and
    awaited facade."""
    rows: dict[str, Any] = {}
    for size in (4 << 10, 256 << 10, 4 << 20):
        label = f"{size >> 10} KiB" if size < 1 << 20 else f"{size >> 20} MiB"
        source = cp.random.standard_normal(size // 4, dtype=cp.float32)
        rows[f"{label}, cupy get"] = summarize_us(samples_ns(source.get, reps, warm=20))
        for isolation, dev in devices.items():
            buf = dev.allocate(size // 4, "f32")
            dev.copy_from_numpy(buf, source.get())
            rows[f"{label}, {isolation} host, blocking"] = summarize_us(
                samples_ns(lambda dev=dev, buf=buf: dev.copy_to_numpy(buf), reps, warm=20))
            rows[f"{label}, {isolation} host, async from a user's loop"] = summarize_us(
                asyncio.run(samples_ns_async(
                    lambda dev=dev, buf=buf: dev.copy_to_numpy_async(buf), reps, warm=20)))
            dev.free(buf)
    return rows


def rng_fill(dev: Device, reps: int) -> dict[str, Any]:
    n = 1 << 24
    out = cp.empty(n, dtype=cp.float32)
    philox = curand.createGenerator(curand.CURAND_RNG_PSEUDO_PHILOX4_32_10)
    curand.setPseudoRandomGeneratorSeed(philox, 1)
    curand.setStream(philox, cp.cuda.get_current_stream().ptr)
    direct = n / cuda_seconds(lambda: curand.generateUniform(philox, out.data.ptr, n),
                              reps) / 1e9
    curand.destroyGenerator(philox)
    buf = dev.allocate_f32(n)
    gen = dev.rng(seed=1)
    one = n / wall_seconds(lambda: gen.uniform(buf), reps) / 1e9

    async def pipelined() -> float:
        start = time.perf_counter()
        await asyncio.gather(*(gen.uniform_async(buf) for _ in range(reps)))
        return (time.perf_counter() - start) / reps

    piped = n / asyncio.run(pipelined()) / 1e9
    half = dev.allocate_f32(n // 2)
    fresh = dev.rng(seed=9)
    fresh.uniform(half)
    first = dev.copy_to_numpy(half)
    fresh.uniform(half)
    second = dev.copy_to_numpy(half)
    dev.rng(seed=9).uniform(buf)
    exact = bool(np.array_equal(np.concatenate([first, second]), dev.copy_to_numpy(buf)))
    return {"direct cuRAND Philox (one call) Gsamples/s": direct,
            "RngGenerator.uniform, async pipelined Gsamples/s": piped,
            "RngGenerator.uniform, blocking one at a time Gsamples/s": one,
            "pipelined / direct": piped / direct, "one at a time / direct": one / direct,
            "continuation exact": exact}


def main(quick: bool) -> dict[str, Any]:
    reps = 300 if quick else 2000
    with System.open("bench") as system:
        devices = {isolation: system.spawn_device(mock=False, isolation=isolation)
                   for isolation in HOSTS}
        results: dict[str, Any] = {
            "sgemm": sgemm(devices, 4096, 10 if quick else 40),
            "small_gemm": small_gemm(devices, reps),
            "wakeup": wakeups(devices, reps),
            "copies": copies(devices["thread"], 256 if quick else 1024),
            "rng": rng_fill(devices["thread"], 20 if quick else 100),
            "downloads": downloads(devices, reps // 2),
        }
    results["small_gemm"].update(asyncio.run(small_gemm_on_the_system_loop(reps)))
    return results


def report(results: dict[str, Any]) -> None:
    sg = results["sgemm"]
    synced, back = sg["direct cupy, synchronizing each call"], sg["direct cupy, back to back"]
    print_table("1. SGEMM 4096^3 f32 (TFLOP/s); one at a time vs direct synchronizing each call, "
                "pipelined vs direct back to back", ["path", "TFLOP/s", "of direct"],
                [[k, v, f"{v / (back if 'pipelined' in k or 'back' in k else synced):.1%}"]
                 for k, v in sg.items()])
    small = results["small_gemm"]
    direct = small["direct cupy.matmul + synchronize"]["p50_us"]
    print_table("2. 64x64 gemm round trip (us)", ["path", "p50", "p99", "p50 / direct"],
                [[k, v["p50_us"], v["p99_us"], v["p50_us"] / direct] for k, v in small.items()])
    wake = results["wakeup"]
    print_table(f"3. completion wake-up: a {wake['kernel_us']:.1f} us kernel (us)",
                ["path", "p50", "p99", "p50 over the kernel"],
                [[k, v["p50_us"], v["p99_us"], v["over_kernel_us"]]
                 for k, v in wake.items() if k != "kernel_us"])
    print_table("4. host -> device from a PinnedBufferPool buffer (GB/s), blocking facade",
                ["size", "cupy pinned", "device", "ratio"],
                [[f"{r['bytes'] >> 20} MiB", r["cupy pinned GB/s"], r["device GB/s"],
                  f"{r['ratio']:.1%}"] for r in results["copies"]])
    print_table("5. RNG uniform fill of 2^24 f32", ["", "value"],
                [[k, v] for k, v in results["rng"].items()])
    print_table("6. device -> host download round trip (us)", ["path", "p50", "p99"],
                [[k, v["p50_us"], v["p99_us"]] for k, v in results["downloads"].items()])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--out", default="benchmarks/results/gpu_overhead.json")
    args = parser.parse_args()
    require_cuda()
    out = main(args.quick)
    report(out)
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    write_json(args.out, {"benchmark": "gpu_overhead", "device": name, "results": out})
