"""Where a tiny op's time goes on CUDA: backend call, thread host, full device (diagnostic).

    python benchmarks/gpu_layers.py
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import pstats
import time

import cupy as cp
from _report import print_table, summarize_us

from atomr_accel import System
from atomr_accel.core import DType, GpuRef
from atomr_accel.core.ops._blas import Gemm
from atomr_accel.core.ops._memory import Allocate
from atomr_accel.hosts import BackendSpec, ThreadHost

N, REPS = 64, 2000


def sync_samples(fn: object) -> list[int]:
    out = []
    for i in range(REPS + 200):
        t0 = time.perf_counter_ns()
        fn()  # type: ignore[operator]
        if i >= 200:
            out.append(time.perf_counter_ns() - t0)
    return out


async def async_samples(fn: object) -> list[int]:
    out = []
    for i in range(REPS + 200):
        t0 = time.perf_counter_ns()
        await fn()  # type: ignore[operator]
        if i >= 200:
            out.append(time.perf_counter_ns() - t0)
    return out


async def main() -> None:
    rows = {}
    a = cp.ones((N, N), cp.float32)
    c = cp.empty_like(a)
    s = cp.cuda.get_current_stream()
    rows["cupy matmul + sync"] = summarize_us(sync_samples(lambda: (cp.matmul(a, a, out=c),
                                                                   s.synchronize())))
    backend = BackendSpec("cuda").create()
    refs = [GpuRef(0, backend.execute(Allocate(DType.F32, N * N)), DType.F32, N * N, 0)
            for _ in range(3)]
    op = Gemm(refs[0], refs[1], refs[2], N, N, N)
    rows["op.validate()"] = summarize_us(sync_samples(op.validate))
    rows["backend.execute"] = summarize_us(sync_samples(lambda: backend.execute(op)))
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(500):
        backend.execute(op)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(14)
    host = ThreadHost(BackendSpec("cuda"))
    await host.start()
    hrefs = [GpuRef(0, await host.submit(Allocate(DType.F32, N * N)), DType.F32, N * N, 0)
             for _ in range(3)]
    hop = Gemm(hrefs[0], hrefs[1], hrefs[2], N, N, N)
    rows["thread host submit"] = summarize_us(await async_samples(lambda: host.submit(hop)))
    await host.close()
    async with await System.open_async("layers") as system:
        dev = await system.spawn_device_async(mock=False)
        bufs = [await dev.allocate_f32_async(N * N) for _ in range(3)]
        dop = Gemm(bufs[0].ref, bufs[1].ref, bufs[2].ref, N, N, N)
        rows["device ask"] = summarize_us(await async_samples(lambda: dev.ref.ask(dop)))
    print(text.getvalue()[:3500])
    print_table("tiny gemm by layer (us)", ["layer", "p50", "p99"],
                [[k, v["p50_us"], v["p99_us"]] for k, v in rows.items()])


if __name__ == "__main__":
    asyncio.run(main())
