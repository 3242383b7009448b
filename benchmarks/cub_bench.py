"""``dev.cub()`` against the same CuPy routines called directly: sort of 2^28 u32 keys, sort
of 2^26 u32 key / u32 value pairs, reduce (sum) and inclusive scan (sum) of 2^28 f32.

For each primitive one run times, after warm-up, the median of ``--reps`` of:

1. ours, blocking: the ``Cub`` method, wall time of each call (it returns when the
   result is on the device);
2. ours, async: ``--inflight`` ``*_async`` calls gathered, wall time per call;
3. direct CuPy: the routine our handler runs, called directly on a CuPy array
   (``cupy.sort``, ``cupy.argsort`` + two gathers, ``ndarray.sum``,
   ``cupy.cumsum``), timed back to back with CUDA events and as call + synchronize.

Ours / direct is the direct time over ours (blocking against call + synchronize,
async against back to back): the goal is >= 0.95. GB/s counts the bytes a
primitive must move at least (sort and scan: read and write every element;
pairs: keys and values; reduce: read once) against about 3 TB/s of H100
device memory. The results are checked against the direct ones. It prints
CuPy's accelerators (CUB routes ``sum`` / ``cumsum`` when ``cub`` is among them).

    python benchmarks/cub_bench.py [--log2-keys 28] [--log2-pairs 26] [--reps 10] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
from collections.abc import Callable
from typing import Any

try:
    import cupy as cp
except ImportError:  # no CuPy, so no CUDA device: main() says so and skips
    cp = None
import numpy as np
from _report import (
    add_quick,
    cupy_event_samples,
    pipelined,
    print_table,
    require_cuda,
    wall_samples,
    write_json,
)

from atomr_accel import DType, System

PEAK_GBS = 3000.0
"""About what an H100 copies device to device, GB/s."""


PRIMITIVES = ["sort keys", "sort pairs", "reduce sum", "inclusive sum"]
"""What the benchmark times, in its table's order."""





def synced(fn: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        fn()
        cp.cuda.get_current_stream().synchronize()
    return run




def accelerators() -> str:
    try:
        module = importlib.import_module("cupy._core._accelerator")
        routine = module.get_routine_accelerators()
        reduction = module.get_reduction_accelerators()
        return f"routine {routine}, reduction {reduction}"
    except Exception as exc:  # reported, not fatal
        return f"unknown ({type(exc).__name__}: {exc})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2-keys", type=int, default=28)
    parser.add_argument("--log2-pairs", type=int, default=26)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warm", type=int, default=2)
    parser.add_argument("--inflight", type=int, default=4)
    parser.add_argument("--json", default="benchmarks/results/cub_bench.json")
    parser.add_argument("--primitives", nargs="+", default=list(PRIMITIVES),
                        choices=PRIMITIVES, help="the primitives to time (default: all)")
    add_quick(parser, log2_keys=20, log2_pairs=18, reps=3, warm=1, inflight=2)
    args = parser.parse_args()
    require_cuda()
    n, pairs = 1 << args.log2_keys, 1 << args.log2_pairs
    reps, warm = args.reps, args.warm
    rng = np.random.default_rng(0)
    host_keys = rng.integers(0, 1 << 32, n, dtype=np.uint32)
    host_pair_keys = rng.integers(0, 1 << 32, pairs, dtype=np.uint32)
    host_pair_values = rng.integers(0, 1 << 32, pairs, dtype=np.uint32)
    host_x = rng.random(n, dtype=np.float32)
    print(f"CuPy {cp.__version__}; accelerators: {accelerators()}")

    samples: dict[str, dict[str, list[float]]] = {}
    checks: dict[str, bool] = {}
    with System.open("cub-bench") as system:
        dev = system.spawn_device(mock=False)
        cub = dev.cub()
        keys, keys_out = dev.allocate(n, DType.U32), dev.allocate(n, DType.U32)
        dev.copy_from_numpy(keys, host_keys)
        pk, pv = dev.allocate(pairs, DType.U32), dev.allocate(pairs, DType.U32)
        pk_out, pv_out = dev.allocate(pairs, DType.U32), dev.allocate(pairs, DType.U32)
        dev.copy_from_numpy(pk, host_pair_keys)
        dev.copy_from_numpy(pv, host_pair_values)
        x, total, prefix = (dev.allocate(n, DType.F32), dev.allocate(1, DType.F32),
                            dev.allocate(n, DType.F32))
        dev.copy_from_numpy(x, host_x)
        timeout = 120.0
        ours: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
            "sort keys": (lambda: cub.sort_keys(keys, keys_out, timeout_secs=timeout),
                          lambda: cub.sort_keys_async(keys, keys_out, timeout_secs=timeout)),
            "sort pairs": (lambda: cub.sort_pairs(pk, pk_out, pv, pv_out, timeout_secs=timeout),
                           lambda: cub.sort_pairs_async(pk, pk_out, pv, pv_out,
                                                        timeout_secs=timeout)),
            "reduce sum": (lambda: cub.reduce_sum(x, total, timeout_secs=timeout),
                           lambda: cub.reduce_sum_async(x, total, timeout_secs=timeout)),
            "inclusive sum": (lambda: cub.inclusive_sum(x, prefix, timeout_secs=timeout),
                              lambda: cub.inclusive_sum_async(x, prefix, timeout_secs=timeout)),
        }
        ours = {name: paths for name, paths in ours.items() if name in args.primitives}
        for name, (blocking, running) in ours.items():
            samples[name] = {"ours, blocking": wall_samples(blocking, reps, warm),
                             f"ours, async ({args.inflight} in flight)":
                                 pipelined(running, args.inflight, reps, warm)}
        ours_keys = dev.copy_to_numpy(keys_out)
        ours_pk, ours_pv = dev.copy_to_numpy(pk_out), dev.copy_to_numpy(pv_out)
        ours_total = float(dev.copy_to_numpy(total)[0])
        ours_prefix_tail = dev.copy_to_numpy(prefix)[-1000:]

    ck, cpk, cpv, cx = (cp.asarray(host_keys), cp.asarray(host_pair_keys),
                        cp.asarray(host_pair_values), cp.asarray(host_x))
    def sort_pairs() -> tuple[Any, Any]:
        order = cp.argsort(cpk)
        return cpk[order], cpv[order]

    direct: dict[str, Callable[[], Any]] = {
        "sort keys": lambda: cp.sort(ck),
        "sort pairs": sort_pairs,
        "reduce sum": cx.sum,
        "inclusive sum": lambda: cp.cumsum(cx),
    }
    direct = {name: fn for name, fn in direct.items() if name in args.primitives}
    for name, fn in direct.items():
        samples[name]["direct CuPy, back to back"] = cupy_event_samples(fn, reps, warm)
        samples[name]["direct CuPy, + synchronize"] = wall_samples(synced(fn), reps, warm)
    if "sort keys" in ours:
        checks["sort keys equal"] = bool(np.array_equal(ours_keys, cp.asnumpy(cp.sort(ck))))
    if "sort pairs" in ours:
        order = cp.argsort(cpk)
        checks["sort pairs equal"] = bool(np.array_equal(ours_pk, cp.asnumpy(cpk[order]))
                                          and np.array_equal(ours_pv, cp.asnumpy(cpv[order])))
    if "reduce sum" in ours:
        checks["reduce within 1e-6"] = abs(ours_total - float(cx.sum())) <= 1e-6 * abs(
            ours_total)
    if "inclusive sum" in ours:  # CUB's scan order may vary run to run
        checks["scan tail within 1e-5"] = bool(np.allclose(
            ours_prefix_tail, cp.asnumpy(cp.cumsum(cx)[-1000:]), rtol=1e-5))
    moved = {"sort keys": 2 * 4 * n, "sort pairs": 2 * 8 * pairs, "reduce sum": 4 * n,
             "inclusive sum": 2 * 4 * n}
    versus = {"ours, blocking": "direct CuPy, + synchronize",
              f"ours, async ({args.inflight} in flight)": "direct CuPy, back to back"}
    table, results = [], []
    for name, paths in samples.items():
        medians = {path: statistics.median(s) * 1e3 for path, s in paths.items()}
        for path, ms in medians.items():
            gbs = moved[name] / (ms / 1e3) / 1e9
            ratio = medians[versus[path]] / ms if path in versus else None
            table.append([name, path, ms, gbs, f"{100 * gbs / PEAK_GBS:.0f}%",
                          "" if ratio is None else f"{ratio:.3f}"])
            results.append({"primitive": name, "path": path, "median_ms": ms, "gb_per_s": gbs,
                            "ours_over_direct": ratio,
                            "samples_ms": [v * 1e3 for v in paths[path]]})
    print_table(f"Cub on {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}: 2^"
                f"{args.log2_keys} u32 keys / f32, 2^{args.log2_pairs} u32 pairs; median of "
                f"{reps} after {warm} warm-up",
                ["primitive", "path", "ms", "GB/s", "of 3 TB/s", "ours/direct"], table)
    for name, ok in checks.items():
        print(f"{name}: {ok}")
    write_json(args.json, {"benchmark": "cub_bench", "log2_keys": args.log2_keys,
                           "log2_pairs": args.log2_pairs, "reps": reps, "warm": warm,
                           "accelerators": accelerators(), "results": results,
                           "checks": checks})


if __name__ == "__main__":
    main()
