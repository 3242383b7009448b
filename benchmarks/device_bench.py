"""Device tier overhead on the CPU backend, side by side in one run.

1. Tiny-op round trip (8x8x8 f32 gemm through ``Blas.gemm_f32``): NumPy called
   directly; the bare baseline of handing that NumPy op to a worker thread and
   waiting; the blocking facade and the async facade on each host; and the actor
   path (an ask to the device actor: the route every op took before the data
   plane). Goals: blocking facade <= 2x the worker-thread baseline on the thread
   host, <= 3x on the process host.
2. Throughput of tiny ops from 1 and 8 calling threads, blocking facade vs the
   actor path (goal: 8 threads >= 4x what the actor path gave, about 4k ops/s),
   the median of ``--rounds`` rounds, each a 1-thread and an 8-thread run in turn.
3. Many calling threads: 8 calling threads' tiny-op throughput over one
   thread's, per host, blocking facade (goal: >= 1.0 on both hosts: a web
   server's thread pool adds to the throughput, it never queues on a lock); the
   median of the rounds' ratios, with their spread.
4. Host-to-device copy throughput, 1 KiB to 256 MiB, to a process-host worker:
   through the shared-memory arena (what the process host does) vs pickling
   the array into the request (the alternative it avoids).

    python benchmarks/device_bench.py [--reps 2000] [--max-mib 256] [--seconds 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import queue
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _report import add_quick, print_table, samples_ns_async, summarize_us, write_json

from atomr_accel import Device, System
from atomr_accel.core import DType, GpuRef
from atomr_accel.core.ops._blas import Gemm
from atomr_accel.core.ops._memory import Allocate, Upload
from atomr_accel.hosts import BackendSpec, ProcessHost
from atomr_accel.hosts._base import Done, Ticket
from atomr_accel.hosts._request import Request

N = 8
HOSTS = ("thread", "process")


def timed(fn: Callable[[], Any], reps: int) -> list[int]:
    """Nanoseconds of each of ``reps`` calls of ``fn`` (after a warm-up; GC off)."""
    for _ in range(min(200, reps)):
        fn()
    samples = []
    gc.disable()
    try:
        for _ in range(reps):
            start = time.perf_counter_ns()
            fn()
            samples.append(time.perf_counter_ns() - start)
    finally:
        gc.enable()
    return samples


async def timed_async(fn: Callable[[], Any], reps: int) -> list[int]:
    """``timed`` for a coroutine function (GC left on, as before)."""
    return await samples_ns_async(fn, reps, min(200, reps))


class WorkerThread:
    """The bare baseline: hand a callable to one worker thread and wait for it."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, done = job
            fn()
            done.set()

    def run(self, fn: Callable[[], Any]) -> None:
        done = threading.Event()
        self._jobs.put((fn, done))
        done.wait()

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join()


def gemm_setup(dev: Device) -> tuple[Any, ...]:
    bufs = [dev.allocate_f32(N * N) for _ in range(3)]
    data = np.random.default_rng(0).standard_normal(N * N).astype(np.float32)
    for buf in bufs[:2]:
        dev.copy_from_numpy(buf, data)
    return (dev.blas(), *bufs)


def actor_call(system: System, dev: Device, op: Gemm) -> Callable[[], Any]:
    """A blocking ask of the device actor: the route ops took before the data plane."""
    portal = system._portal
    return lambda: portal.call(dev.ref.ask(op))


def round_trips(system: System, devices: dict[str, Device], reps: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    a = np.random.default_rng(0).standard_normal((N, N)).astype(np.float32)
    b = a.copy()
    out = np.empty_like(a)
    rows["numpy direct"] = summarize_us(timed(lambda: np.matmul(a, b, out=out), reps))
    worker = WorkerThread()
    rows["numpy on a worker thread, waited for (baseline)"] = summarize_us(
        timed(lambda: worker.run(lambda: np.matmul(a, b, out=out)), reps))
    worker.stop()
    for isolation, dev in devices.items():
        blas, x, y, z = gemm_setup(dev)
        rows[f"{isolation} host, blocking facade"] = summarize_us(
            timed(lambda blas=blas, x=x, y=y, z=z: blas.gemm_f32(x, y, z, N, N, N), reps))

        async def awaited(blas: Any = blas, x: Any = x, y: Any = y, z: Any = z) -> list[int]:
            return await timed_async(lambda: blas.gemm_f32_async(x, y, z, N, N, N), reps)

        rows[f"{isolation} host, async facade from a user's loop"] = summarize_us(
            asyncio.run(awaited()))
        op = Gemm(x.ref, y.ref, z.ref, N, N, N)
        rows[f"{isolation} host, actor path (ask)"] = summarize_us(
            timed(actor_call(system, dev, op), reps))
    return rows


def throughput(system: System, devices: dict[str, Device], seconds: float,
               rounds: int) -> dict[str, list[float]]:
    """Ops per second of each path, host and thread count: one sample a round, the 1- and
    8-thread runs of a round back to back (so a ratio compares like with like)."""
    samples: dict[str, list[float]] = {}
    for isolation, dev in devices.items():
        blas, x, y, z = gemm_setup(dev)
        paths: dict[str, Callable[[], Any]] = {
            "blocking facade": lambda blas=blas, x=x, y=y, z=z: blas.gemm_f32(x, y, z, N, N, N),
            "actor path (ask)": actor_call(system, dev, Gemm(x.ref, y.ref, z.ref, N, N, N)),
        }
        for path, fn in paths.items():
            for _ in range(rounds):
                for threads in (1, 8):
                    samples.setdefault(f"{isolation} host, {path}, {threads} threads", []).append(
                        ops_per_second(fn, threads, seconds))
    return samples


def thread_ratios(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Per host, 8 calling threads' throughput over one thread's (blocking facade): the
    median of the rounds' ratios, and their least and greatest."""
    ratios = {}
    for isolation in HOSTS:
        one = samples[f"{isolation} host, blocking facade, 1 threads"]
        eight = samples[f"{isolation} host, blocking facade, 8 threads"]
        each = [e / o for o, e in zip(one, eight, strict=True)]
        ratios[f"{isolation} host, 8 threads / 1 thread"] = {
            "median": statistics.median(each), "min": min(each), "max": max(each),
            "rounds": len(each)}
    return ratios


def ops_per_second(fn: Callable[[], Any], threads: int, seconds: float) -> float:
    """Calls of ``fn`` per second from ``threads`` threads, counted over ``seconds``: the
    calls finished when the time is up (the threads' exits are not in the window)."""
    counts = [0] * threads
    start = threading.Barrier(threads + 1)
    stop = threading.Event()

    def run(i: int) -> None:
        start.wait()
        while not stop.is_set():
            fn()
            counts[i] += 1

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    done, elapsed = sum(counts), time.perf_counter() - began
    stop.set()
    for worker in workers:
        worker.join()
    return done / elapsed


class PickleHost(ProcessHost):
    """The process host, but uploads pickle the array into the request (the baseline)."""

    def _request(self, op: Any, stream: int, ticket: Ticket, done: Done | None,
                 slot: int) -> Request:
        request = Request(op, stream, ticket, done, None, None, slot)
        request.payload = self._encode(request)
        return request


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
            op = Upload(GpuRef(0, buffer_id, DType.U8, size, 1), data)
            reps = max(3, min(300, (256 << 20) // size // 4))
            samples = await timed_async(lambda op=op, host=host: host.submit(op), reps)
            median_s = sorted(samples)[len(samples) // 2] / 1e9
            row[name] = size / median_s / 1e9
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
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="how long each throughput row runs")
    parser.add_argument("--out", default="benchmarks/results/device_bench.json")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of the throughput rows (each: 1 thread, then 8)")
    add_quick(parser, reps=200, max_mib=8, seconds=0.3)
    args = parser.parse_args()

    with System.open("bench") as system:
        devices = {isolation: system.spawn_device(mock=True, isolation=isolation)
                   for isolation in HOSTS}
        trips = round_trips(system, devices, args.reps)
        samples = throughput(system, devices, args.seconds, args.rounds)
    rates = {k: statistics.median(v) for k, v in samples.items()}
    ratios = thread_ratios(samples)
    base = trips["numpy on a worker thread, waited for (baseline)"]["p50_us"]
    print_table(f"1. tiny-op round trip ({N}x{N}x{N} f32 gemm), microseconds",
                ["path", "p50", "p99", "p50 / baseline"],
                [[k, v["p50_us"], v["p99_us"], v["p50_us"] / base] for k, v in trips.items()])
    print_table("2. tiny ops per second from calling threads",
                ["path", "ops/s", "vs actor path, same threads"],
                [[k, v, v / rates[k.replace("blocking facade", "actor path (ask)")]]
                 for k, v in rates.items()])
    print_table("3. many calling threads: 8 threads' tiny-op throughput / 1 thread's "
                "(blocking facade; goal >= 1.0)",
                ["host", "median", "min", "max", "rounds"],
                [[k, v["median"], v["min"], v["max"], v["rounds"]] for k, v in ratios.items()])
    copies = asyncio.run(copy_throughput(args.max_mib))
    print_table("4. host -> process-host worker copy throughput, GB/s (median)",
                ["size", "shared memory", "pickle", "shm / pickle"],
                [[human(r["bytes"]), r["shared memory"], r["pickle"],
                  r["shared memory"] / r["pickle"]] for r in copies])
    write_json(args.out, {"benchmark": "device_bench", "round_trip": trips,
                          "throughput": rates, "throughput_rounds": samples,
                          "thread_ratios": ratios, "copies": copies})


if __name__ == "__main__":
    main()
