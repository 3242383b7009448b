"""Interference and recovery: how one device's trouble shows on others.

1. A 16-byte download on an idle device while another (process-host) device
   uploads 512 MiB three times, from a blocking thread and from an event loop:
   the probe's p50 / p99 / max latency, next to the same probe with no upload.
   Goal: the max stays within a few milliseconds.
2. SIGKILL a worker while 1000 asks are in flight: seconds until the device
   answers a fresh upload + norm on its rebuilt context.

    python benchmarks/interference_bench.py [--mib 512] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
from typing import Any

import numpy as np
from _report import add_quick, percentile, print_table, quiet_expected_faults, write_json

from atomr_accel import ContextPoisoned, GpuRefStale, System


def probe_while(system: System, mib: int, how: str) -> list[float]:
    """Latencies (s) of a 16-byte download on a thread-host device while a process-host
    device uploads ``mib`` MiB three times (``how``: ``none``, ``blocking``, ``async``)."""
    big = system.spawn_device(0, mock=True, isolation="process")
    small = system.spawn_device(1, mock=True)
    n = mib << 18
    a, b = big.allocate_f32(n), small.allocate_f32(4)
    data = np.ones(n, np.float32)
    latencies: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            start = time.perf_counter()
            small.copy_to_numpy(b)
            latencies.append(time.perf_counter() - start)

    thread = threading.Thread(target=probe)
    thread.start()
    time.sleep(0.2)
    if how == "blocking":
        for _ in range(3):
            big.copy_from_numpy(a, data)
    elif how == "async":
        async def three() -> None:
            for _ in range(3):
                await big.copy_from_numpy_async(a, data)
        asyncio.run(three())
    else:
        time.sleep(1.0)
    stop.set()
    thread.join()
    return latencies


async def recovery_seconds() -> float:
    """Seconds from SIGKILLing a worker with 1000 asks in flight until the device serves."""
    async with await System.open_async("recovery") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process")
        n = 4_000_000
        x = np.random.default_rng(0).standard_normal(n)
        src = await dev.allocate_f64_async(n)
        await dev.copy_from_numpy_async(src, x)
        pid = (await dev.stats_async()).host_pid
        assert pid is not None
        tasks = [asyncio.ensure_future(dev.blas().nrm2_async(n, src)) for _ in range(1000)]
        await asyncio.sleep(0.05)
        killed = time.perf_counter()
        os.kill(pid, 9)
        results: list[Any] = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(not isinstance(r, BaseException) or isinstance(r, ContextPoisoned | GpuRefStale)
                   for r in results)
        fresh = await dev.allocate_f64_async(n)
        await dev.copy_from_numpy_async(fresh, x)
        await dev.blas().nrm2_async(n, fresh)
        return time.perf_counter() - killed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--out", default="benchmarks/results/interference_bench.json")
    add_quick(parser, mib=16)
    args = parser.parse_args()
    quiet_expected_faults()  # it kills workers on purpose
    rows, probes = [], {}
    for how in ("none", "blocking", "async"):
        with System.open(f"probe-{how}") as system:
            lat = probe_while(system, args.mib, how)
        ms = [v * 1e3 for v in lat]
        probes[how] = {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
                       "max_ms": max(ms), "samples": len(ms)}
        rows.append([how, percentile(ms, 50), percentile(ms, 99), max(ms), len(ms)])
    print_table(f"16-byte download on an idle device while another uploads {args.mib} MiB x3",
                ["upload from", "p50 ms", "p99 ms", "max ms", "samples"], rows)
    recovered = asyncio.run(recovery_seconds())
    print_table("a worker SIGKILLed under 1000 asks", ["serving again after s"], [[recovered]])
    write_json(args.out, {"benchmark": "interference_bench", "mib": args.mib,
                          "probe": probes, "recovery_s": recovered})


if __name__ == "__main__":
    main()
