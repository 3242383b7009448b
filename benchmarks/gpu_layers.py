"""Where a tiny op's time goes on CUDA, layer by layer, on the data plane (diagnostic).

Each row adds one layer to the one above it, for a 64x64 f32 gemm:
CuPy direct; the cuBLAS call the backend makes, waited for by polling its
event; the backend (``begin`` + ``wait``: hazard tracking, event, device
and stream made current); the thread host (``call``: its lock and order
check); the op's construction and validation alone; the data plane
(``Lane.call``: registering the request, generation check, answer); a
blocking ``Device.run(op)``; and the facade (``Blas.gemm_f32``). The same
for the process host. A profile of the facade call closes the report.

    python benchmarks/gpu_layers.py [--reps 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import time
from collections.abc import Callable
from typing import Any

import numpy as np

try:
    import cupy as cp
    from cupy_backends.cuda.libs import cublas
except ImportError:  # no CuPy, so no CUDA device: main() says so and skips
    cp = cublas = None
from _report import add_quick, print_table, require_cuda, summarize_us, write_json

from atomr_accel import System
from atomr_accel.core import DType, GpuRef
from atomr_accel.core.ops._blas import Gemm
from atomr_accel.core.ops._memory import Allocate
from atomr_accel.hosts import BackendSpec, ThreadHost
from atomr_accel.hosts._base import FREE

N = 64


def samples(fn: Callable[[], Any], reps: int) -> dict[str, float]:
    for _ in range(300):
        fn()
    out = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - start)
    return summarize_us(out)


def main(reps: int) -> tuple[dict[str, Any], str]:
    rows: dict[str, Any] = {}
    a = cp.random.standard_normal((N, N), dtype=cp.float32)
    c = cp.empty_like(a)
    current = cp.cuda.get_current_stream()
    rows["cupy matmul + synchronize"] = samples(
        lambda: (cp.matmul(a, a, out=c), current.synchronize()), reps)

    stream = cp.cuda.Stream(non_blocking=True)
    handle = cp.cuda.device.get_cublas_handle()
    one, zero = np.array(1.0, np.float32), np.array(0.0, np.float32)
    event = cp.cuda.Event(disable_timing=True)

    def raw() -> None:
        cublas.setStream(handle, stream.ptr)
        cublas.sgemm(handle, 0, 0, N, N, N, one.ctypes.data, a.data.ptr, N, a.data.ptr, N,
                     zero.ctypes.data, c.data.ptr, N)
        event.record(stream)
        while cp.cuda.runtime.eventQuery(event.ptr) != 0:
            os.sched_yield()

    rows["cuBLAS sgemm + event poll"] = samples(raw, reps)

    backend = BackendSpec("cuda").create()
    refs = [GpuRef(0, backend.execute(Allocate(DType.F32, N * N)), DType.F32, N * N, 0)
            for _ in range(3)]
    op = Gemm(refs[0], refs[1], refs[2], N, N, N)
    rows["backend begin + wait"] = samples(lambda: backend.wait(backend.begin(op, 1), None),
                                           reps)
    backend.close()

    async def host_layer() -> dict[str, float]:
        host = ThreadHost(BackendSpec("cuda"))
        await host.start()
        try:
            ids = [await host.submit(Allocate(DType.F32, N * N)) for _ in range(3)]
            hop = Gemm(*(GpuRef(0, i, DType.F32, N * N, 0) for i in ids), N, N, N)
            return await asyncio.to_thread(
                samples, lambda: host.call(hop, 1, FREE, None), reps)
        finally:
            await host.close()

    rows["thread host call"] = asyncio.run(host_layer())
    rows["build + validate a Gemm (alone)"] = samples(
        lambda: Gemm(refs[0], refs[1], refs[2], N, N, N).validate(), reps)

    profile_text = ""
    with System.open("layers") as system:
        for isolation in ("thread", "process"):
            dev = system.spawn_device(mock=False, isolation=isolation)
            bufs = [dev.allocate_f32(N * N) for _ in range(3)]
            dop = Gemm(bufs[0].ref, bufs[1].ref, bufs[2].ref, N, N, N)
            lane = dev._state.lane
            rows[f"{isolation}: Lane.call (data plane)"] = samples(
                lambda lane=lane, dop=dop: lane.call(dop, None), reps)
            rows[f"{isolation}: Device.run(op), blocking"] = samples(
                lambda dev=dev, dop=dop: dev.run(dop), reps)
            blas = dev.blas()
            rows[f"{isolation}: Blas.gemm_f32, blocking"] = samples(
                lambda blas=blas, b=bufs: blas.gemm_f32(b[0], b[1], b[2], N, N, N), reps)
            if isolation == "thread":
                profile = cProfile.Profile()
                profile.enable()
                for _ in range(reps):
                    blas.gemm_f32(bufs[0], bufs[1], bufs[2], N, N, N)
                profile.disable()
                text = io.StringIO()
                pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
                profile_text = text.getvalue()
    return rows, profile_text


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3000)
    parser.add_argument("--out", default="benchmarks/results/gpu_layers.json")
    add_quick(parser, reps=200)
    args = parser.parse_args()
    require_cuda()
    results, profile_text = main(args.reps)
    print(profile_text[:6000])
    base = results["cupy matmul + synchronize"]["p50_us"]
    print_table(f"{N}x{N} f32 gemm by layer (us)", ["layer", "p50", "p99", "p50 / cupy"],
                [[k, v["p50_us"], v["p99_us"], v["p50_us"] / base] for k, v in results.items()])
    write_json(args.out, {"benchmark": "gpu_layers", "results": results})
