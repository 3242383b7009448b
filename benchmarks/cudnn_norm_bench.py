"""Normalization forward on CUDA: ``Cudnn`` calls beside PyTorch's own ops (informative).

For each case: the path our handler ran (``cudnn-graph`` or ``cupy``); the
median time of one blocking facade call (it returns once the op completed, so
it includes the actor round trip); PyTorch's median time of one call followed
by ``torch.cuda.synchronize()`` (the same contract); and PyTorch's mean time
per call over back-to-back calls (kernel time, no per-call wait). No goal is
set for these; the table says where the time goes.

    python benchmarks/cudnn_norm_bench.py [--reps 50] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _report import add_quick, print_table, require_cuda, write_json

from atomr_accel import DType, System

CASES = [  # name, dims, dtype, extra
    ("layer_norm", (8192, 4096), DType.BF16, {"norm_axes": 1}),
    ("layer_norm", (8192, 4096), DType.F32, {"norm_axes": 1}),
    ("rms_norm", (8192, 4096), DType.BF16, {"norm_axes": 1}),
    ("batch_norm", (64, 256, 28, 28), DType.F32, {}),
    ("instance_norm", (32, 256, 28, 28), DType.F32, {}),
    ("group_norm", (32, 256, 28, 28), DType.F32, {"groups": 32}),
]


def median_us(fn: Callable[[], Any], reps: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1000


def calls(cudnn: Any, functional: Any, name: str, dims: tuple[int, ...],
          extra: dict[str, Any], ours: tuple[Any, ...], theirs: tuple[Any, ...],
          ) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """Our blocking call and PyTorch's op for one case."""
    x, y, scale, bias = ours
    tx, tw, tb = theirs
    if name == "layer_norm":
        return (lambda: cudnn.layer_norm(x, y, scale, bias, dims, 1),
                lambda: functional.layer_norm(tx, dims[-1:], tw, tb))
    if name == "rms_norm":
        return (lambda: cudnn.rms_norm(x, y, scale, dims, 1),
                lambda: functional.rms_norm(tx, dims[-1:], tw))
    if name == "batch_norm":
        return (lambda: cudnn.batch_norm(x, y, scale, bias, dims),
                lambda: functional.batch_norm(tx, None, None, tw, tb, training=True))
    if name == "instance_norm":
        return (lambda: cudnn.instance_norm(x, y, scale, bias, dims),
                lambda: functional.instance_norm(tx, weight=tw, bias=tb))
    return (lambda: cudnn.group_norm(x, y, scale, bias, dims, extra["groups"]),
            lambda: functional.group_norm(tx, extra["groups"], tw, tb))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--json", default=None)
    add_quick(parser, reps=5)
    args = parser.parse_args()
    require_cuda()
    import torch
    from torch.nn import functional

    rows, records = [], []
    with System.open("norm-bench") as system:
        dev = system.spawn_device(mock=False)
        cudnn = dev.cudnn()
        for name, dims, dtype, extra in CASES:
            try:
                dtype.numpy  # noqa: B018 - bf16 needs ml_dtypes
            except Exception as exc:
                print(f"skipped {name} {dtype.value}: {exc}")
                continue
            n = int(np.prod(dims))
            k = dims[-1] if name in ("layer_norm", "rms_norm") else dims[1]
            x, y = dev.allocate(n, dtype), dev.allocate(n, dtype)
            dev.copy_from_numpy(x, np.random.default_rng(0).standard_normal(n)
                                .astype(dtype.numpy))
            scale, bias = dev.allocate(k, DType.F32), dev.allocate(k, DType.F32)
            tdtype = torch.bfloat16 if dtype is DType.BF16 else torch.float32
            tensors = (torch.randn(dims, device="cuda", dtype=tdtype),
                       torch.ones(k, device="cuda", dtype=tdtype),
                       torch.zeros(k, device="cuda", dtype=tdtype))
            call, op = calls(cudnn, functional, name, dims, extra, (x, y, scale, bias), tensors)
            path = call()
            ours = median_us(call, args.reps)

            theirs = median_us(lambda op=op: (op(), torch.cuda.synchronize()), args.reps)
            torch.cuda.synchronize()
            start = time.perf_counter_ns()
            for _ in range(args.reps):
                op()
            torch.cuda.synchronize()
            kernel = (time.perf_counter_ns() - start) / args.reps / 1000
            label = f"{name} {dtype.value} {'x'.join(map(str, dims))}"
            rows.append([label, path, ours, theirs, kernel, theirs / ours])
            records.append({"case": label, "path": path, "ours_us": ours,
                            "torch_synced_us": theirs, "torch_kernel_us": kernel})
    print_table("Normalization forward, H100 (median us per call)",
                ["case", "path", "ours (blocking call)", "torch + sync", "torch kernel",
                 "torch+sync / ours"], rows)
    if args.json:
        write_json(args.json, {"benchmark": "cudnn_norm", "reps": args.reps,
                               "results": records})


if __name__ == "__main__":
    main()
