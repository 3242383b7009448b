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
``convolution_backward``), synchronized once per burst. Both pick their
plans by timing (ours: ``autotune=True``; PyTorch: ``cudnn.benchmark``).

The GPU-time columns take host time out: a spin kernel holds the stream
while a burst is queued behind it (ours: straight on a CUDA backend, the
same handler and cached graph the device runs; PyTorch:
``torch.cuda._sleep``), and CUDA events around the burst measure it.
``ratio`` is PyTorch's time over ours (goal: >= 0.95). TFLOP/s (from GPU
time) counts ``2 * N * K * P * Q * C * R * S`` per pass.

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

from _report import add_quick, print_table, require_cuda, write_json

from atomr_accel import Device, DType, System
from atomr_accel.core import GpuRef
from atomr_accel.core.ops._dnn import (
    Conv2dBackwardData,
    Conv2dBackwardFilter,
    Conv2dForward,
    Layout,
    conv_output_shape,
)
from atomr_accel.core.ops._memory import Allocate
from atomr_accel.hosts import BackendSpec

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
    opts: dict[str, Any] = dict(pad=(pad, pad), stride=(stride, stride), layout="NHWC",
                                autotune=True)
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


_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}
"""
SPIN_CYCLES = 40_000_000  # about 20 ms on an H100: the host queues a burst well within it


def gpu_ms_ours(backend: Any, spin: Any, op: Any, reps: int, repeats: int) -> float:
    """Median GPU ms per call of ``op`` run back to back on a backend's stream 0: a spin
    kernel holds the stream while the burst is queued, so host time drops out."""
    import cupy as cp

    backend.execute(op)  # build (and autotune) the graph
    stream = backend.cuda_stream(0)
    times = []
    for _ in range(repeats):
        with stream:
            spin((1,), (1,), (cp.int64(SPIN_CYCLES),))
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        for _ in range(reps):
            backend.begin(op, 0)
        end.record(stream)
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / reps)
    return statistics.median(times)


def gpu_ms_torch(torch: Any, call: Callable[[], Any], reps: int, repeats: int) -> float:
    """``gpu_ms_ours`` for a PyTorch call on the current stream (``torch.cuda._sleep``)."""
    call()
    times = []
    for _ in range(repeats):
        torch.cuda._sleep(SPIN_CYCLES)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times)


def ours_gpu(layer: tuple[Any, ...], reps: int, repeats: int) -> dict[str, float]:
    """Per-pass median GPU ms of our graphs, queued on a CUDA backend directly."""
    import cupy as cp

    _, c, k, h, r, stride, pad = layer
    x_shape, w_shape = (BATCH, c, h, h), (k, c, r, r)
    y_shape = conv_output_shape(x_shape, w_shape, (pad, pad), (stride, stride))
    backend = BackendSpec("cuda").create()
    try:
        spin = cp.RawKernel(_SPIN, "spin")
        x, w, y = (GpuRef(0, backend.execute(Allocate(DType.BF16, math.prod(s))), DType.BF16,
                          math.prod(s), 0) for s in (x_shape, w_shape, y_shape))
        opts: dict[str, Any] = dict(pad=(pad, pad), stride=(stride, stride),
                                    layout=Layout.NHWC, autotune=True)
        ops = {"fwd": Conv2dForward(x, w, y, x_shape, w_shape, y_shape, **opts),
               "dgrad": Conv2dBackwardData(y, w, x, y_shape, w_shape, x_shape, **opts),
               "wgrad": Conv2dBackwardFilter(x, y, w, x_shape, y_shape, w_shape, **opts)}
        return {name: gpu_ms_ours(backend, spin, op, reps, repeats) for name, op in ops.items()}
    finally:
        backend.close()


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
        out[f"{name} gpu"] = gpu_ms_torch(torch, call, reps, repeats)
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
            try:
                mine_gpu = ours_gpu(layer, args.reps, args.repeats)
            except Exception as exc:
                print(f"{layer[0]}: ours (backend) failed: {type(exc).__name__}: {exc}")
                mine_gpu = {}
            torch_ms = theirs(torch, layer, args.reps, args.repeats)
            for name in PASSES:
                got, got_gpu = mine.get(name), mine_gpu.get(name)
                theirs_gpu = torch_ms[f"{name} gpu"]
                ratio = torch_ms[name] / got if got else float("nan")
                gpu_ratio = theirs_gpu / got_gpu if got_gpu else float("nan")
                rows.append([layer[0], name, got or "failed", torch_ms[name], ratio,
                             got_gpu or "failed", theirs_gpu, gpu_ratio,
                             tflops(layer, got_gpu) if got_gpu else "-",
                             tflops(layer, theirs_gpu)])
                results.append({"layer": layer[0], "pass": name, "ours_ms": got,
                                "torch_ms": torch_ms[name], "ratio": ratio,
                                "ours_gpu_ms": got_gpu, "torch_gpu_ms": theirs_gpu,
                                "gpu_ratio": gpu_ratio})
    return rows, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", default="benchmarks/results/cudnn_conv_bench.json")
    add_quick(parser, reps=3, repeats=1)
    args = parser.parse_args()
    require_cuda()
    import torch

    torch.backends.cudnn.benchmark = True
    rows, results = asyncio.run(run(args, torch))
    print_table(f"conv2d, batch {BATCH}, bf16, NHWC: median ms per call over bursts of "
                f"{args.reps} (ratio = torch / ours; goal >= 0.95). 'ms': through the device "
                "/ PyTorch's API, host included; 'gpu': GPU time of back-to-back calls",
                ["layer", "pass", "ours ms", "torch ms", "ratio", "ours gpu", "torch gpu",
                 "gpu ratio", "ours TFLOP/s", "torch TFLOP/s"], rows)
    for key, label in (("ratio", "through the API"), ("gpu_ratio", "GPU time")):
        valid = [r[key] for r in results if r[key] == r[key]]
        if valid:
            met = sum(1 for v in valid if v >= 0.95)
            print(f"{label}: ratio >= 0.95 in {met} of {len(results)} rows; geometric mean "
                  f"{statistics.geometric_mean(valid):.3f}")
    write_json(args.json, {"batch": BATCH, "dtype": "bf16", "layout": "NHWC",
                           "reps": args.reps, "repeats": args.repeats,
                           "torch": torch.__version__, "rows": results})


if __name__ == "__main__":
    main()
