"""Recovery time with and without a warm standby context (``spawn_device(standby=1)``).

SIGKILL a process-host device's worker, then time until the device answers a
new op on its next context (an allocation and a 16-byte upload), ``--kills``
times per configuration, side by side in one run: today's rebuild (a new
worker starts, imports its backend and makes its context) and the switch to a
waiting standby. Before each kill the standby (where there is one) is given
time to be ready, as it is between failures far apart. Goal: p50 <= 50 ms on
the CPU, <= 150 ms on an H100.

    python benchmarks/standby_bench.py [--kills 20] [--cuda] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from typing import Any

import numpy as np
from _report import add_quick, percentile, print_table, quiet_expected_faults, write_json

from atomr_accel import System


def recoveries(system: System, standby: int, kills: int, cuda: bool) -> list[float]:
    """Milliseconds from each SIGKILL of the worker to the next op answered."""
    dev = system.spawn_device(0, mock=not cuda, isolation="process", standby=standby,
                              max_restarts=kills + 5, within=3600.0)
    data = np.arange(4, dtype=np.float32)
    times: list[float] = []
    for _ in range(kills):
        deadline = time.monotonic() + 60.0
        while standby and not dev.stats().standby_ready and time.monotonic() < deadline:
            time.sleep(0.01)
        pid = dev.stats().host_pid
        assert pid is not None
        began = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        buf = dev.allocate_f32(4, timeout_secs=60.0)  # a rebuild on a loaded machine
        dev.copy_from_numpy(buf, data)
        times.append((time.perf_counter() - began) * 1e3)
        np.testing.assert_array_equal(dev.copy_to_numpy(buf), data)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--cuda", action="store_true", help="CUDA devices (default: CPU)")
    parser.add_argument("--out", default="benchmarks/results/standby_bench.json")
    add_quick(parser, kills=3)
    args = parser.parse_args()
    quiet_expected_faults()  # it kills workers on purpose
    results: dict[str, Any] = {"backend": "cuda" if args.cuda else "cpu", "kills": args.kills}
    rows = []
    with System.open("standby-bench") as system:
        for standby in (0, 1):
            times = recoveries(system, standby, args.kills, args.cuda)
            label = "standby context" if standby else "rebuild (no standby)"
            row = {"p50_ms": percentile(times, 50), "p90_ms": percentile(times, 90),
                   "max_ms": max(times)}
            results[label] = row
            rows.append([label, f"{row['p50_ms']:.1f}", f"{row['p90_ms']:.1f}",
                         f"{row['max_ms']:.1f}"])
    base, fast = (results[r[0]]["p50_ms"] for r in rows)
    rows.append(["rebuild / standby (p50)", f"{base / fast:.1f}x", "", ""])
    print_table(f"SIGKILL to the next op served ({results['backend']}, {args.kills} kills)",
                ["path", "p50 ms", "p90 ms", "max ms"], rows)
    write_json(args.out, results)


if __name__ == "__main__":
    main()
