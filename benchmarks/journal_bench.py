"""What the replay journal costs on the op path: journaling off vs on, side by side.

For each host (thread, process) and op (an 8x8x8 f64 gemm, a 1 KiB and a
64 KiB upload, every one of them journaled), it measures the round-trip p50 of
one op at a time and the throughput (ops/s) with 16 ops in flight, with no
journal and with the default SQLite journal (a file; batched, written by a
background thread). Configurations alternate over ``--rounds`` rounds and the
median round is reported, so background load hits both alike. The journal's
queue is bounded with back-pressure, so the throughput with it on is at most
what the store can write (64 KiB uploads: the SQLite file's bandwidth).

    python benchmarks/journal_bench.py [--reps 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _report import add_quick, print_table, summarize_us, write_json

from atomr_accel.actor import ActorRef, ActorSystem
from atomr_accel.core import DType, GpuRef
from atomr_accel.core.ops._blas import Gemm
from atomr_accel.core.ops._memory import Allocate, Upload
from atomr_accel.device import DeviceActor, DeviceConfig, JournalConfig

N = 8
IN_FLIGHT = 16


async def make_ops(dev: ActorRef) -> dict[str, Any]:
    """The ops to time, on buffers of ``dev``."""
    refs: list[GpuRef] = [await dev.ask(Allocate(DType.F64, N * N)) for _ in range(3)]
    data = np.random.default_rng(0).standard_normal(N * N)
    for ref in refs:
        await dev.ask(Upload(ref, data))
    small: GpuRef = await dev.ask(Allocate(DType.U8, 1 << 10))
    large: GpuRef = await dev.ask(Allocate(DType.U8, 64 << 10))
    return {
        f"gemm {N}x{N}x{N} f64": Gemm(refs[0], refs[1], refs[2], N, N, N, beta=0.5),
        "upload 1 KiB": Upload(small, np.ones(1 << 10, np.uint8)),
        "upload 64 KiB": Upload(large, np.ones(64 << 10, np.uint8)),
    }


async def round_trip(dev: ActorRef, op: Any, reps: int) -> list[int]:
    for _ in range(min(200, reps)):
        await dev.ask(op)
    samples = []
    gc.disable()
    try:
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            await dev.ask(op)
            samples.append(time.perf_counter_ns() - t0)
    finally:
        gc.enable()
    return samples


async def throughput(dev: ActorRef, op: Any, total: int) -> float:
    async def worker(count: int) -> None:
        for _ in range(count):
            await dev.ask(op)

    start = time.perf_counter()
    await asyncio.gather(*(worker(total // IN_FLIGHT) for _ in range(IN_FLIGHT)))
    return (total // IN_FLIGHT * IN_FLIGHT) / (time.perf_counter() - start)


async def measure(isolation: str, journal: JournalConfig | None, reps: int
                  ) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    config = DeviceConfig(isolation=isolation, journal=journal)
    async with ActorSystem("bench") as system:
        dev = system.spawn(DeviceActor.props(config))
        for name, op in (await make_ops(dev)).items():
            row = summarize_us(await round_trip(dev, op, reps))
            row["ops_per_s"] = await throughput(dev, op, reps * 2)
            rows[name] = row
    return rows


def median_round(rounds: list[dict[str, dict[str, float]]], op: str, key: str) -> float:
    return statistics.median(r[op][key] for r in rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/journal_bench.json")
    add_quick(parser, reps=200, rounds=1)
    args = parser.parse_args()

    results: dict[str, Any] = {}
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        configs: dict[str, Callable[[int], JournalConfig | None]] = {
            "off": lambda _: None,
            "sqlite": lambda i: JournalConfig(str(Path(tmp) / f"journal-{i}.sqlite")),
        }
        for isolation in ("thread", "process"):
            rounds: dict[str, list[dict[str, dict[str, float]]]] = {k: [] for k in configs}
            for i in range(args.rounds):
                for name, make in configs.items():
                    rounds[name].append(asyncio.run(measure(isolation, make(i), args.reps)))
            results[isolation] = rounds
            for op in rounds["off"][0]:
                off_p50 = median_round(rounds["off"], op, "p50_us")
                on_p50 = median_round(rounds["sqlite"], op, "p50_us")
                off_ops = median_round(rounds["off"], op, "ops_per_s")
                on_ops = median_round(rounds["sqlite"], op, "ops_per_s")
                table.append([isolation, op, off_p50, on_p50, 100 * (on_p50 / off_p50 - 1),
                              off_ops, on_ops, 100 * (1 - on_ops / off_ops)])
    print_table(
        f"journal off vs on (SQLite file), median of {args.rounds} rounds; "
        f"ops/s with {IN_FLIGHT} in flight",
        ["host", "op", "p50 off us", "p50 on us", "p50 +%", "ops/s off", "ops/s on",
         "ops/s -%"], table)
    write_json(args.out, {"benchmark": "journal_bench", "reps": args.reps,
                          "rounds": args.rounds, "in_flight": IN_FLIGHT, "results": results,
                          "table": [dict(zip(["host", "op", "p50_off_us", "p50_on_us",
                                              "p50_overhead_pct", "ops_off", "ops_on",
                                              "ops_overhead_pct"], row, strict=True))
                                    for row in table]})


if __name__ == "__main__":
    main()
