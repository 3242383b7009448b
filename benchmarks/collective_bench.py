"""Collectives: ``Collective.all_reduce`` against raw NCCL through CuPy on the same GPUs.

In one run, on the first ``--gpus`` GPUs (2 unless said; f32, sum):

* bus bandwidth of all_reduce at 256 MiB and 1 GiB, one call at a time (each
  waits for completion), ``busbw = 2 (n-1)/n * bytes / seconds`` as nccl-tests
  counts it: raw NCCL (``NcclCommunicator.initAll``, every rank's call in one
  group from this thread, then every stream synchronized), our world on thread
  hosts, our world on process hosts;
* the round trip of an 8-byte all_reduce (p50 and p99), raw NCCL + synchronize
  from Python against our blocking call on both hosts;
* the time from SIGKILL of rank 1's worker (process hosts, ``standby=1``) to the
  next successful all_reduce on the rebuilt world.

Goals: bus bandwidth >= 95% of raw NCCL at both sizes; the 8-byte
round trip <= 1.5x raw; kill to next success <= 3 s. Keep NVLink multicast off
(``NCCL_NVLS_ENABLE=0``) on shared machines.

    python benchmarks/collective_bench.py [--json PATH] [--iters N] [--gpus N]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np
from _report import add_quick, percentile, print_table, require_cuda, write_json

from atomr_accel import System
from atomr_accel.facade import Collective, Device

SIZES = {"256 MiB": 256 << 20, "1 GiB": 1 << 30}


def busbw(nbytes: int, seconds: float, n: int = 2) -> float:
    """nccl-tests' bus bandwidth of an all_reduce, GB/s."""
    return 2 * (n - 1) / n * nbytes / seconds / 1e9


def raw_nccl(iters: int, small_iters: int, n: int
             ) -> tuple[dict[str, float], list[float]]:
    """Raw NCCL through CuPy: bandwidth per size (GB/s) and 8-byte round trips (seconds)."""
    import cupy as cp
    from cupy.cuda import nccl

    comms = nccl.NcclCommunicator.initAll(list(range(n)))
    streams, bufs = [], {}
    for dev in range(n):
        with cp.cuda.Device(dev):
            streams.append(cp.cuda.Stream(non_blocking=True))
    for label, nbytes in {**SIZES, "8 B": 8}.items():
        per_rank = []
        for dev in range(n):
            with cp.cuda.Device(dev):
                per_rank.append(cp.ones(nbytes // 4, dtype=cp.float32))
        bufs[label] = per_rank

    def once(label: str) -> None:
        per_rank = bufs[label]
        nccl.groupStart()
        for rank in range(n):
            ptr = per_rank[rank].data.ptr
            comms[rank].allReduce(ptr, ptr, per_rank[rank].size, nccl.NCCL_FLOAT32,
                                  nccl.NCCL_SUM, streams[rank].ptr)
        nccl.groupEnd()
        for stream in streams:
            stream.synchronize()

    bandwidth = {}
    for label, nbytes in SIZES.items():
        for _ in range(3):
            once(label)
        start = time.perf_counter()
        for _ in range(iters):
            once(label)
        bandwidth[label] = busbw(nbytes, (time.perf_counter() - start) / iters, n)
    for _ in range(20):
        once("8 B")
    trips = []
    for _ in range(small_iters):
        start = time.perf_counter()
        once("8 B")
        trips.append(time.perf_counter() - start)
    bufs.clear()
    for comm in comms:
        comm.destroy()
    return bandwidth, trips


def ours(world: Collective, devices: list[Device], iters: int, small_iters: int
         ) -> tuple[dict[str, float], list[float]]:
    """Our world: bandwidth per size (GB/s) and 8-byte round trips (seconds)."""
    bandwidth = {}
    for label, nbytes in SIZES.items():
        bufs = [d.allocate(nbytes // 4, "f32") for d in devices]
        for _ in range(3):
            world.all_reduce(bufs)
        start = time.perf_counter()
        for _ in range(iters):
            world.all_reduce(bufs)
        bandwidth[label] = busbw(nbytes, (time.perf_counter() - start) / iters, len(devices))
        for d, b in zip(devices, bufs, strict=True):
            d.free(b)
    small = [d.allocate(2, "f32") for d in devices]
    for _ in range(20):
        world.all_reduce(small)
    trips = []
    for _ in range(small_iters):
        start = time.perf_counter()
        world.all_reduce(small)
        trips.append(time.perf_counter() - start)
    return bandwidth, trips


def kill_to_success(world: Collective, devices: list[Device]) -> float:
    """SIGKILL rank 1's worker; seconds until an all_reduce on the rebuilt world succeeds."""
    pid = devices[1].stats().host_pid
    assert pid is not None
    start = time.perf_counter()
    os.kill(pid, 9)
    while True:
        try:
            bufs = []
            for d in devices:
                b = d.allocate(1024, "f32")
                d.copy_from_numpy(b, np.ones(1024, np.float32))
                bufs.append(b)
            world.all_reduce(bufs, timeout_secs=30)
            elapsed = time.perf_counter() - start
            assert np.all(devices[0].copy_to_numpy(bufs[0]) == len(devices))
            return elapsed
        except Exception as exc:  # a buffer of the dead context, or the epoch it aborted
            print(f"  (after the kill: {type(exc).__name__}: {str(exc)[:100]})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the results as JSON here")
    parser.add_argument("--iters", type=int, default=20, help="large all_reduces per size")
    parser.add_argument("--small-iters", type=int, default=300, help="8-byte round trips")
    parser.add_argument("--gpus", type=int, default=2, help="ranks, one a GPU")
    add_quick(parser, iters=3, small_iters=20)
    args = parser.parse_args()
    require_cuda()

    raw_bw, raw_trips = raw_nccl(args.iters, args.small_iters, args.gpus)
    results: dict[str, Any] = {"raw": {"busbw_gbs": raw_bw,
                                       "p50_us": percentile(raw_trips, 50) * 1e6,
                                       "p99_us": percentile(raw_trips, 99) * 1e6}}
    with System.open("collective-bench", op_timeout=120) as system:
        for host in ("thread", "process"):
            devices = [system.spawn_device(i, mock=False, isolation=host, libraries=["nccl"],
                                           standby=1 if host == "process" else 0)
                       for i in range(args.gpus)]
            world = system.nccl_world(devices, name=f"bench-{host}", timeout_secs=30)
            bandwidth, trips = ours(world, devices, args.iters, args.small_iters)
            results[host] = {"busbw_gbs": bandwidth, "p50_us": percentile(trips, 50) * 1e6,
                             "p99_us": percentile(trips, 99) * 1e6}
            if host == "process":
                results[host]["kill_to_success_s"] = [kill_to_success(world, devices)
                                                      for _ in range(2)]
            results[host]["stats"] = repr(world.stats())

    rows = []
    for label in SIZES:
        raw = results["raw"]["busbw_gbs"][label]
        for host in ("thread", "process"):
            got = results[host]["busbw_gbs"][label]
            rows.append([f"all_reduce {label}", host, got, raw, f"{100 * got / raw:.1f}%"])
    for host in ("thread", "process"):
        raw50 = results["raw"]["p50_us"]
        rows.append(["8 B round trip p50 (us)", host, results[host]["p50_us"], raw50,
                     f"{results[host]['p50_us'] / raw50:.2f}x"])
        rows.append(["8 B round trip p99 (us)", host, results[host]["p99_us"],
                     results["raw"]["p99_us"], ""])
    kills = results["process"]["kill_to_success_s"]
    rows.append(["SIGKILL -> next all_reduce (s)", "process", max(kills), "", "goal <= 3 s"])
    print_table(f"all_reduce f32 sum on {args.gpus} GPUs: ours vs raw NCCL (CuPy), busbw GB/s "
                "unless said",
                ["what", "host", "ours", "raw NCCL", "ratio"], rows)
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
