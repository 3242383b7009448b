"""Collectives on the CPU backend: ``Collective.all_reduce`` latency by host and size.

Two ranks, f32 sum, blocking calls from one thread: the p50 and p99 of each
size on a world of thread hosts (whose ranks meet in memory) and of process
hosts (whose ranks meet in shared-memory files), with NumPy's own sum of the
two arrays beside them for scale. No goal of its own: it shows what a CPU
world costs, and the thread hosts' in-memory exchange against the files.

    python benchmarks/collective_cpu_bench.py [--iters N] [--out PATH]
"""

from __future__ import annotations

import argparse

import numpy as np
from _report import add_quick, percentile, print_table, wall_samples, write_json

from atomr_accel import System

SIZES = {"8 B": 8, "1 MiB": 1 << 20, "16 MiB": 16 << 20}


def latencies(isolation: str, nbytes: int, iters: int) -> list[float]:
    """Seconds of each blocking all_reduce of ``nbytes`` on a world of two ``isolation``
    hosts (after a few to warm up)."""
    count = nbytes // 4
    with System.open("collective-cpu") as system:
        devices = [system.spawn_device(i, mock=True, isolation=isolation) for i in range(2)]
        world = system.nccl_world(devices)
        bufs = [d.allocate_f32(count) for d in devices]
        for d, b in zip(devices, bufs, strict=True):
            d.copy_from_numpy(b, np.random.default_rng(0).standard_normal(count, np.float32))
        return wall_samples(lambda: world.all_reduce(bufs), iters, warm=3)


def numpy_sum(nbytes: int, iters: int) -> list[float]:
    """Seconds of NumPy adding two arrays of ``nbytes`` into a third."""
    a, b = (np.random.default_rng(i).standard_normal(nbytes // 4, np.float32) for i in (1, 2))
    out = np.empty_like(a)
    return wall_samples(lambda: np.add(a, b, out=out), iters, warm=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--out", default="benchmarks/results/collective_cpu_bench.json")
    add_quick(parser, iters=5)
    args = parser.parse_args()
    rows, results = [], {}
    for label, nbytes in SIZES.items():
        paths = {"numpy add (scale)": numpy_sum(nbytes, args.iters),
                 "thread hosts": latencies("thread", nbytes, args.iters),
                 "process hosts": latencies("process", nbytes, args.iters)}
        for path, samples in paths.items():
            ms = [s * 1e3 for s in samples]
            row = {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99)}
            results[f"{label}, {path}"] = row
            rows.append([label, path, row["p50_ms"], row["p99_ms"]])
    print_table("all_reduce of f32 over two CPU ranks, milliseconds",
                ["size", "path", "p50", "p99"], rows)
    write_json(args.out, {"iters": args.iters, "results": results})


if __name__ == "__main__":
    main()
