"""conv2d forward, backward-data and backward-filter on ResNet-50 layer shapes: our ``Cudnn``
handle against PyTorch's cuDNN-backed convolution, side by side in one run.

Batch 64, bf16, NHWC (PyTorch: ``channels_last``, ``cudnn.benchmark = True``).
Each timing is one burst of ``--reps`` back-to-back calls, waited for at the
end, divided by ``--reps`` (time-for-time: launch cost and GPU time, as a
training step sees them); the table shows the median over ``--repeats``
bursts. Ours submits the burst through the device's async methods
(``conv2d_fwd_async`` ...), so each call crosses the actor path and runs a
cached cuDNN frontend graph; PyTorch calls ``F.conv2d`` and
``torch.nn.grad.conv2d_input`` / ``conv2d_weight`` (aten's
``convolution_backward``), synchronized once per burst. ``ratio`` is
PyTorch's time over ours (goal: >= 0.95). TFLOP/s counts ``2 * N * K * P * Q
* C * R * S`` per pass.

    python benchmarks/cudnn_conv_bench.py [--reps 30] [--repeats 7] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any

from _report import print_table, write_json

from atomr_accel import Device, DType, System
from atomr_accel.core.ops._dnn import conv_output_shape

BATCH = 64
LAYERS = [  # name, C, K, H (= W), R (= S), stride, pad
    ("conv1 7x7/2 3->64 @224", 3, 64, 224, 7, 2, 3),
    ("1x1 64->64 @56", 64, 64, 56, 1, 1, 0),
    ("3x3 64->64 @56", 64, 64, 56, 3, 1, 1),
    ("1x1 64->256 @56", 64, 256, 56, 1, 1, 0),
    ("1x1 256->64 @56", 256, 64, 56, 1, 1, 0),
    ("3x3/2 128->128 @56", 128, 128, 56, 3, 2, 1),
    ("1x1/2 256->512 @56", 256, 512, 56, 1, 2, 0),
    ("3x3 128->128 @28", 128, 128, 28, 3, 1, 1),
    ("3x3 256->256 @14", 256, 256, 14, 3, 1, 1),
    ("3x3 512->512 @7", 512, 512, 7, 3, 1, 1),
    ("1x1 2048->512 @7", 2048, 512, 7, 1, 1, 0),
]
PASSES = ("fwd", "dgrad", "wgrad")


def median_ms(burst: Callable[[], None], reps: int, repeats: int) -> float:
    """Median over ``repeats`` bursts of one burst's time per call, in ms (one warm-up)."""
    burst()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        burst()
        times.append((time.perf_counter() - began) * 1e3 / reps)
    return statistics.median(times)


async def median_ms_async(call: Callable[[], Coroutine[Any, Any, str]], reps: int,
                          repeats: int) -> float:
    """``median_ms`` for bursts of ``reps`` concurrent calls of an async method."""
    times = []
    for i in range(repeats + 1):
        began = time.perf_counter()
        await asyncio.gather(*(call() for _ in range(reps)))
        if i:  # the first burst warms up
            times.append((time.perf_counter() - began) * 1e3 / reps)
    return statistics.median(times)


async def ours(dev: Device, layer: tuple[Any, ...], reps: int, repeats: int,
               ) -> dict[str, float]:
    """Per-pass median ms through a CUDA device's ``Cudnn`` handle (NHWC, bf16)."""
    _, c, k, h, r, stride, pad = layer
    x_shape, w_shape = (BATCH, c, h, h), (k, c, r, r)
    y_shape = conv_output_shape(x_shape, w_shape, (pad, pad), (stride, stride))
    cudnn = dev.cudnn()
    x = await dev.allocate_async(math.prod(x_shape), DType.BF16)
    w = await dev.allocate_async(math.prod(w_shape), DType.BF16)
    y = await dev.allocate_async(math.prod(y_shape), DType.BF16)
    opts: dict[str, Any] = dict(pad=(pad, pad), stride=(stride, stride), layout="NHWC")
    calls: dict[str, Callable[[], Coroutine[Any, Any, str]]] = {
        "fwd": lambda: cudnn.conv2d_fwd_async(x, w, y, x_shape, w_shape, y_shape, **opts),
        "dgrad": lambda: cudnn.conv2d_bwd_data_async(y, w, x, y_shape, w_shape, x_shape, **opts),
        "wgrad": lambda: cudnn.conv2d_bwd_filter_async(x, y, w, x_shape, y_shape, w_shape,
                                                       **opts),
    }
    out = {}
    try:
        for name, call in calls.items():
            path = await call()
            assert path == "cudnn-graph", path
            out[name] = await median_ms_async(call, reps, repeats)
    finally:
        for buf in (x, w, y):
            await dev.free_async(buf)
    return out


def theirs(torch: Any, layer: tuple[Any, ...], reps: int, repeats: int) -> dict[str, float]:
    """Per-pass median ms of PyTorch's convolution (channels_last, bf16, cuDNN autotuned)."""
    _, c, k, h, r, stride, pad = layer
    f, grad = torch.nn.functional, torch.nn.grad
    cl = torch.channels_last
    x = torch.randn(BATCH, c, h, h, device="cuda", dtype=torch.bfloat16).to(memory_format=cl)
    w = torch.randn(k, c, r, r, device="cuda", dtype=torch.bfloat16).to(memory_format=cl)
    y = f.conv2d(x, w, stride=stride, padding=pad)
    dy = torch.randn_like(y).to(memory_format=cl)
    calls: dict[str, Callable[[], Any]] = {
        "fwd": lambda: f.conv2d(x, w, stride=stride, padding=pad),
        "dgrad": lambda: grad.conv2d_input(x.shape, w, dy, stride=stride, padding=pad),
        "wgrad": lambda: grad.conv2d_weight(x, w.shape, dy, stride=stride, padding=pad),
    }
    out = {}
    for name, call in calls.items():
        def burst(call: Callable[[], Any] = call) -> None:
            for _ in range(reps):
                call()
            torch.cuda.synchronize()

        out[name] = median_ms(burst, reps, repeats)
    return out


def tflops(layer: tuple[Any, ...], ms: float) -> float:
    _, c, k, h, r, stride, pad = layer
    _, _, p, q = conv_output_shape((BATCH, c, h, h), (k, c, r, r), (pad, pad), (stride, stride))
    return 2.0 * BATCH * k * p * q * c * r * r / (ms * 1e-3) / 1e12


async def run(args: argparse.Namespace, torch: Any) -> tuple[list[list[Any]],
                                                             list[dict[str, Any]]]:
    """Every layer and pass, ours then PyTorch's: the table's rows and the JSON's."""
    rows: list[list[Any]] = []
    results: list[dict[str, Any]] = []
    async with await System.open_async("cudnn-conv-bench") as system:
        dev = await system.spawn_device_async(mock=False)
        for layer in LAYERS:
            try:
                mine = await ours(dev, layer, args.reps, args.repeats)
            except Exception as exc:  # a shape no engine takes: report it, go on
                print(f"{layer[0]}: ours failed: {type(exc).__name__}: {exc}")
                mine = {}
            torch_ms = theirs(torch, layer, args.reps, args.repeats)
            for name in PASSES:
                got = mine.get(name)
                ratio = torch_ms[name] / got if got else float("nan")
                rows.append([layer[0], name, got if got else "failed", torch_ms[name], ratio,
                             tflops(layer, got) if got else "-", tflops(layer, torch_ms[name])])
                results.append({"layer": layer[0], "pass": name, "ours_ms": got,
                                "torch_ms": torch_ms[name], "ratio": ratio})
    return rows, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", default="benchmarks/results/cudnn_conv_bench.json")
    args = parser.parse_args()
    import torch

    torch.backends.cudnn.benchmark = True
    rows, results = asyncio.run(run(args, torch))
    print_table(f"conv2d, batch {BATCH}, bf16, NHWC: median ms per call over bursts of "
                f"{args.reps} (ratio = torch / ours; goal >= 0.95)",
                ["layer", "pass", "ours ms", "torch ms", "ratio", "ours TFLOP/s",
                 "torch TFLOP/s"], rows)
    valid = [r["ratio"] for r in results if r["ours_ms"]]
    if valid:
        met = sum(1 for v in valid if v >= 0.95)
        print(f"\nratio >= 0.95 in {met} of {len(results)} rows; geometric mean ratio "
              f"{statistics.geometric_mean(valid):.3f}")
    write_json(args.json, {"batch": BATCH, "dtype": "bf16", "layout": "NHWC",
                           "reps": args.reps, "repeats": args.repeats,
                           "torch": torch.__version__, "rows": results})


if __name__ == "__main__":
    main()
