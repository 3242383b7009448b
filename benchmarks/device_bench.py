"""Device tier overhead on the CPU backend, side by side in one run.

1. Tiny-op round trip (8x8x8 f32 gemm): NumPy called directly, the bare thread
   and process hosts, and the full actor path (DeviceActor -> kernel actor ->
   host) on each host.
2. Host-to-device copy throughput, 1 KiB to 256 MiB, to a process-host worker:
   through the shared-memory arena (what the process host does) vs pickling
   the array into the frame (the alternative it avoids).

    python benchmarks/device_bench.py [--reps 2000] [--max-mib 256]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from _report import print_table, summarize_us, write_json

from atomr_accel.actor import ActorSystem
from atomr_accel.core import DType, GpuRef
from atomr_accel.core.ops._blas import Gemm
from atomr_accel.core.ops._memory import Allocate, Upload
from atomr_accel.device import DeviceActor, DeviceConfig
from atomr_accel.hosts import BackendSpec, ProcessHost, ThreadHost
from atomr_accel.hosts._process import _InFlight
from atomr_accel.hosts._wire import encode

N = 8


async def timed(fn: Callable[[], Awaitable[Any]], reps: int) -> list[int]:
    for _ in range(min(200, reps)):
        await fn()
    samples = []
    gc.disable()
    try:
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            await fn()
            samples.append(time.perf_counter_ns() - t0)
    finally:
        gc.enable()
    return samples


async def gemm_refs(submit: Callable[[Any], Awaitable[Any]]) -> Gemm:
    refs = []
    for _ in range(3):
        got = await submit(Allocate(DType.F32, N * N))
        refs.append(got if isinstance(got, GpuRef) else GpuRef(0, got, DType.F32, N * N, 1))
    data = np.random.default_rng(0).standard_normal(N * N).astype(np.float32)
    for ref in refs:
        await submit(Upload(ref, data))
    return Gemm(refs[0], refs[1], refs[2], N, N, N)


async def round_trips(reps: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    a = np.random.default_rng(0).standard_normal((N, N)).astype(np.float32)
    b = a.copy()
    out = np.empty_like(a)

    async def direct() -> None:
        np.matmul(a, b, out=out)

    rows["numpy direct"] = summarize_us(await timed(direct, reps))
    for host_cls in (ThreadHost, ProcessHost):
        host = host_cls(BackendSpec("cpu"))
        await host.start()
        op = await gemm_refs(host.submit)
        rows[f"{host_cls.kind} host (no actors)"] = summarize_us(
            await timed(lambda op=op, host=host: host.submit(op), reps))
        await host.close()
    for isolation in ("thread", "process"):
        async with ActorSystem("bench") as system:
            dev = system.spawn(DeviceActor.props(DeviceConfig(isolation=isolation)))
            op = await gemm_refs(dev.ask)
            rows[f"device actor, {isolation} host"] = summarize_us(
                await timed(lambda op=op, dev=dev: dev.ask(op), reps))
    return rows


class PickleHost(ProcessHost):
    """The process host, but uploads pickle the array into the frame (the baseline)."""

    def submit(self, op: Any, stream: int = 0) -> asyncio.Future[Any]:
        if not isinstance(op, Upload):
            return super().submit(op, stream)
        assert self._proc is not None and self._proc.stdin is not None
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        req_id = next(self._ids)
        self._inflight[req_id] = _InFlight(fut, None, None)
        self._proc.stdin.write(encode((req_id, op, stream, None)))
        return fut


async def copy_throughput(max_mib: int) -> list[dict[str, Any]]:
    sizes = [1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]
    sizes = [s for s in sizes if s <= max_mib << 20]
    results = []
    hosts = {"shared memory": ProcessHost(BackendSpec("cpu")),
             "pickle": PickleHost(BackendSpec("cpu"))}
    for host in hosts.values():
        await host.start()
    for size in sizes:
        data = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
        row: dict[str, Any] = {"bytes": size}
        for name, host in hosts.items():
            buffer_id = await host.submit(Allocate(DType.U8, size))
            ref = GpuRef(0, buffer_id, DType.U8, size, 1)
            op = Upload(ref, data)
            reps = max(3, min(300, (256 << 20) // size // 4))
            samples = await timed(lambda op=op, host=host: host.submit(op), reps)
            median_s = sorted(samples)[len(samples) // 2] / 1e9
            row[name] = size / median_s / 1e9
            await host.submit(dataclasses.replace(op, data=data[:0]))  # keep the worker warm
        results.append(row)
    for host in hosts.values():
        await host.close()
    return results


def human(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size} {unit}"
        size //= 1024
    return f"{size} TiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--max-mib", type=int, default=256)
    parser.add_argument("--out", default="benchmarks/results/device_bench.json")
    args = parser.parse_args()

    trips = asyncio.run(round_trips(args.reps))
    base = trips["numpy direct"]["p50_us"]
    print_table(f"tiny-op round trip ({N}x{N}x{N} f32 gemm), microseconds",
                ["path", "p50", "p99", "p50 / numpy"],
                [[k, v["p50_us"], v["p99_us"], v["p50_us"] / base] for k, v in trips.items()])
    copies = asyncio.run(copy_throughput(args.max_mib))
    print_table("host -> process-host worker copy throughput, GB/s (median)",
                ["size", "shared memory", "pickle", "shm / pickle"],
                [[human(r["bytes"]), r["shared memory"], r["pickle"],
                  r["shared memory"] / r["pickle"]] for r in copies])
    write_json(args.out, {"benchmark": "device_bench", "round_trip": trips, "copies": copies})


if __name__ == "__main__":
    main()
