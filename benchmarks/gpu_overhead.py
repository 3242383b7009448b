"""What the actor layer costs over calling CuPy directly, on a real GPU, in one run.

1. SGEMM 4096^3 f32 through BlasActor vs cupy.matmul (goal: >= 98% of direct).
2. 64x64 gemm round trip: direct launch + synchronize vs the thread host (goal <= 1.3x)
   and the process host (goal <= 100 us p50).
3. Completion strategies: launch -> done latency in the backend, and the device
   round trip, p50/p99.
4. Host -> device copies, 1 MiB to 1 GiB, from a PinnedBufferPool buffer through
   the device vs CuPy's own pinned copy (goal >= 90%).
5. RNG fill of 2^24 f32 vs the same cuRAND Philox fill called directly (goal >= 98%);
   CuPy's own default generator (another algorithm) is shown beside it.

    python benchmarks/gpu_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from typing import Any

import cupy as cp
import numpy as np
from _report import print_table, summarize_us, write_json

from atomr_accel import System
from atomr_accel.backends.cuda._completion import COMPLETIONS
from atomr_accel.core import DType, GpuRef
from atomr_accel.core.ops._blas import Gemm
from atomr_accel.core.ops._memory import Allocate
from atomr_accel.device import PinnedBufferPool
from atomr_accel.hosts import BackendSpec


def cuda_time(fn: Any, reps: int) -> float:
    """Seconds per call of ``fn`` on the current stream, timed with CUDA events."""
    fn()
    cp.cuda.get_current_stream().synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return float(cp.cuda.get_elapsed_time(start, end)) / 1e3 / reps


async def sgemm(system: System, n: int, reps: int) -> dict[str, float]:
    a = cp.random.standard_normal((n, n), dtype=cp.float32)
    b = cp.random.standard_normal((n, n), dtype=cp.float32)
    c = cp.empty((n, n), dtype=cp.float32)
    flops = 2.0 * n**3
    direct = flops / cuda_time(lambda: cp.matmul(a, b, out=c), reps) / 1e12
    rows = {"direct cupy.matmul TFLOP/s": direct}
    for completion in ("inline", "sync"):
        dev = await system.spawn_device_async(mock=False, completion=completion)
        bufs = [await dev.allocate_f32_async(n * n) for _ in range(3)]
        for buf, arr in zip(bufs[:2], (a, b), strict=True):
            await dev.copy_from_numpy_async(buf, cp.asnumpy(arr).reshape(-1))
        op = Gemm(bufs[0].ref, bufs[1].ref, bufs[2].ref, n, n, n)
        await dev.run_async(op)
        t0 = time.perf_counter()
        await asyncio.gather(*(dev.run_async(op) for _ in range(reps)))
        rows[f"BlasActor ({completion}, pipelined) TFLOP/s"] = flops * reps / (
            time.perf_counter() - t0) / 1e12
        t0 = time.perf_counter()
        for _ in range(reps):
            await dev.run_async(op)
        rows[f"BlasActor ({completion}, one at a time) TFLOP/s"] = flops * reps / (
            time.perf_counter() - t0) / 1e12
    return rows


async def timed(fn: Any, reps: int) -> list[int]:
    for _ in range(min(200, reps)):
        await fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        await fn()
        out.append(time.perf_counter_ns() - t0)
    return out


async def small_gemm(system: System, reps: int) -> dict[str, Any]:
    n = 64
    a = cp.random.standard_normal((n, n), dtype=cp.float32)
    c = cp.empty_like(a)
    stream = cp.cuda.get_current_stream()

    async def direct() -> None:
        cp.matmul(a, a, out=c)
        stream.synchronize()

    rows: dict[str, Any] = {"direct launch+sync": summarize_us(await timed(direct, reps))}
    for isolation in ("thread", "process"):
        for completion in COMPLETIONS:
            dev = await system.spawn_device_async(mock=False, isolation=isolation,
                                                  completion=completion)
            bufs = [await dev.allocate_f32_async(n * n) for _ in range(3)]
            op = Gemm(bufs[0].ref, bufs[1].ref, bufs[2].ref, n, n, n)
            rows[f"{isolation} host, {completion}"] = summarize_us(
                await timed(lambda op=op, dev=dev: dev.run_async(op), reps))
            if isolation == "process" and completion != "inline":
                break  # the strategies are compared on the thread host
    return rows


def wakeups(reps: int) -> dict[str, Any]:
    """Backend-level: launch a tiny gemm, wait for done (no actors, no event loop)."""
    rows = {}
    for completion in COMPLETIONS:
        backend = BackendSpec("cuda", options={"completion": completion}).create()
        refs = [GpuRef(0, backend.execute(Allocate(DType.F32, 64 * 64)), DType.F32, 4096, 0)
                for _ in range(3)]
        op = Gemm(refs[0], refs[1], refs[2], 64, 64, 64)
        samples = []
        for i in range(reps + 200):
            finished = threading.Event()
            t0 = time.perf_counter_ns()
            backend.launch(op, 1, lambda result, error, e=finished: e.set())
            backend.flush()  # as a host does when it has nothing more to launch
            finished.wait()
            if i >= 200:
                samples.append(time.perf_counter_ns() - t0)
        rows[completion] = summarize_us(samples)
        backend.close()
    return rows


async def copies(system: System, max_mib: int) -> list[dict[str, Any]]:
    dev = await system.spawn_device_async(mock=False)
    results = []
    with PinnedBufferPool(capacity=2 * (max_mib << 20) + (1 << 20)) as pool:
        size = 1 << 20
        while size <= max_mib << 20:
            pinned = pool.acquire(size)
            pinned.array[:] = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
            target = cp.empty(size, dtype=cp.uint8)
            reps = max(3, min(50, (256 << 20) // size))
            direct = size / cuda_time(lambda t=target, p=pinned: t.set(p.array), reps) / 1e9
            buf = await dev.allocate_async(size, DType.U8)
            await dev.copy_from_numpy_async(buf, pinned.array)
            t0 = time.perf_counter()
            for _ in range(reps):
                await dev.copy_from_numpy_async(buf, pinned.array)
            ours = size * reps / (time.perf_counter() - t0) / 1e9
            results.append({"bytes": size, "cupy pinned GB/s": direct, "device GB/s": ours,
                            "ratio": ours / direct})
            pinned.release()
            await dev.free_async(buf)
            del target
            size *= 4
    return results


async def rng_fill(system: System, reps: int) -> dict[str, float] | None:
    dev = await system.spawn_device_async(mock=False)
    from atomr_accel.backends.cuda import CudaBackend
    from atomr_accel.core.ops._rng import RngFill

    if RngFill not in CudaBackend.handlers:
        return None
    n = 1 << 24
    out = cp.empty(n, dtype=cp.float32)
    gen = cp.random.default_rng(1)
    cupy_rng = n / cuda_time(lambda: gen.random(n, dtype=cp.float32, out=out), reps) / 1e9
    from cupy.cuda import curand

    philox = curand.createGenerator(curand.CURAND_RNG_PSEUDO_PHILOX4_32_10)
    curand.setPseudoRandomGeneratorSeed(philox, 1)
    curand.setStream(philox, cp.cuda.get_current_stream().ptr)

    def direct_fill() -> None:  # what the RNG actor wraps: a keyed Philox fill
        curand.setGeneratorOffset(philox, 0)
        curand.generateUniform(philox, out.data.ptr, n)

    direct = n / cuda_time(direct_fill, reps) / 1e9
    curand.destroyGenerator(philox)
    buf = await dev.allocate_f32_async(n)
    rng = dev.rng(seed=1)
    await rng.uniform_async(buf)
    t0 = time.perf_counter()
    await asyncio.gather(*(rng.uniform_async(buf) for _ in range(reps)))
    pipelined = n * reps / (time.perf_counter() - t0) / 1e9
    t0 = time.perf_counter()
    for _ in range(reps):
        await rng.uniform_async(buf)
    one = n * reps / (time.perf_counter() - t0) / 1e9
    return {"cupy.random default_rng (XORWOW) Gsamples/s": cupy_rng,
            "direct cuRAND Philox Gsamples/s": direct,
            "RngActor (pipelined) Gsamples/s": pipelined,
            "RngActor (one at a time) Gsamples/s": one, "ratio": pipelined / direct}


async def main(quick: bool) -> dict[str, Any]:
    reps = 200 if quick else 2000
    async with await System.open_async("bench") as system:
        return {
            "sgemm": await sgemm(system, 4096, 10 if quick else 30),
            "small_gemm": await small_gemm(system, reps),
            "wakeup": wakeups(reps),
            "copies": await copies(system, 256 if quick else 1024),
            "rng": await rng_fill(system, 20 if quick else 100),
        }


def report(results: dict[str, Any]) -> None:
    sg = results["sgemm"]
    base = sg["direct cupy.matmul TFLOP/s"]
    print_table("1. SGEMM 4096^3 f32", ["path", "TFLOP/s", "of direct"],
                [[k.replace(" TFLOP/s", ""), v, f"{v / base:.1%}"] for k, v in sg.items()])
    small = results["small_gemm"]
    direct = small["direct launch+sync"]["p50_us"]
    print_table("2. 64x64 gemm round trip (us)", ["path", "p50", "p99", "p50 / direct"],
                [[k, v["p50_us"], v["p99_us"], v["p50_us"] / direct] for k, v in small.items()])
    print_table("3. completion wake-up, backend launch -> done (us)", ["strategy", "p50", "p99"],
                [[k, v["p50_us"], v["p99_us"]] for k, v in results["wakeup"].items()])
    print_table("4. host -> device from a PinnedBufferPool buffer (GB/s)",
                ["size", "cupy pinned", "device", "ratio"],
                [[f"{r['bytes'] >> 20} MiB", r["cupy pinned GB/s"], r["device GB/s"],
                  f"{r['ratio']:.1%}"] for r in results["copies"]])
    rng = results["rng"]
    if rng is None:
        print("\n5. RNG fill: the CUDA backend has no RNG handler yet; not measured")
    else:
        print_table("5. RNG uniform fill of 2^24 f32", ["path", "Gsamples/s"],
                    [[k, v] for k, v in rng.items() if k != "ratio"] + [["ratio", rng["ratio"]]])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--out", default="benchmarks/results/gpu_overhead.json")
    args = parser.parse_args()
    out = asyncio.run(main(args.quick))
    report(out)
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    write_json(args.out, {"benchmark": "gpu_overhead", "device": name, "results": out})
