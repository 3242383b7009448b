"""Realtime frames and hash map: the actors vs the same work written directly in CuPy.

Frames: 3840x2160x4 u8 frames through a 3-stage chain (3x3 box kernel, Sobel
magnitude, threshold), frames a second:

* ``ImageFilterPipeline.process_buffers`` on frames already on the device, one
  frame awaited at a time, with 8 requests in flight, and 8 frames a request;
* ``ImageFilterPipeline.process`` host frame in, host frame out (PCIe bound);
* beside them, in the same run, the same chain in CuPy (``cupyx.scipy.ndimage``
  correlations, ``sqrt``, ``where``) on device frames: streamed (one
  synchronization at the end) and synchronized after every frame; and our
  ``FilterFrames`` CUDA handler called directly (the kernels' own rate).

Goal: >= 1000 frames/s for the 3-stage chain. Hash map: ``--keys``
8-byte keys and values inserted then looked up through ``GpuHashMapActor``
(host arrays in and out), beside a direct CuPy sorted-array map (upload, sort,
``searchsorted``, gather, download); keys a second.

    python benchmarks/realtime_frames_bench.py [--json PATH] [--quick] [--frames N]

``--quick`` runs small sizes on the CPU backend (a smoke run, no CuPy).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from _report import print_table, write_json

from atomr_accel import System
from atomr_accel.core._dtype import DType
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._realtime_frames import FilterFrames
from atomr_accel.facade import Device
from atomr_accel.realtime import (
    Correlate,
    GpuHashMapActor,
    ImageFilterPipeline,
    SobelMagnitude,
    Threshold,
)

BOX = [1 / 9] * 9
LEVEL = 40.0
SOBEL = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], np.float32)
BATCH = 8
STAGES = (Correlate(tuple(BOX)), SobelMagnitude(), Threshold(LEVEL))


async def per_second(step: Callable[[], Awaitable[Any]], count: int, warmup: int = 3) -> float:
    """Calls a second of ``await step()`` over ``count`` calls after ``warmup`` untimed."""
    for _ in range(warmup):
        await step()
    start = time.perf_counter()
    for _ in range(count):
        await step()
    return count / (time.perf_counter() - start)


async def actor_frames(system: System, device: Device, shape: tuple[int, int, int], frames: int,
                       ) -> tuple[dict[str, float], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Frames a second through the pipeline: device frames (1 and 8 in flight), host frames."""
    h, w, c = shape
    pipeline = ImageFilterPipeline.spawn(system, w, h, c, None, device=device, stages=STAGES)
    frame = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    src = [await device.allocate_async(frame.size, "u8") for _ in range(8)]
    dst = [await device.allocate_async(frame.size, "u8") for _ in range(8)]
    for buffer in src:
        await device.copy_from_numpy_async(buffer, frame)
    rates = {"actor, device frames": await per_second(
        lambda: pipeline.process_buffers_async(src[0], dst[0]), frames)}

    async def eight() -> None:
        await asyncio.gather(*(pipeline.process_buffers_async(s, d)
                               for s, d in zip(src, dst, strict=True)))

    rates["actor, device frames, 8 in flight"] = 8 * await per_second(eight, max(1, frames // 8))
    batch_src = await device.allocate_async(BATCH * frame.size, "u8")
    batch_dst = await device.allocate_async(BATCH * frame.size, "u8")
    for i in range(BATCH):
        await device.copy_from_numpy_async(batch_src, frame.reshape(-1), i * frame.size)
    rates[f"actor, device frames, {BATCH} a request"] = BATCH * await per_second(
        lambda: pipeline.process_buffers_async(batch_src, batch_dst, BATCH),
        max(1, frames // BATCH))
    rates["actor, host frame in and out"] = await per_second(
        lambda: pipeline.process_async(frame), max(3, frames // 20))
    result = (await device.copy_to_numpy_async(dst[0])).reshape(shape)
    pipeline.stop()
    return rates, frame, result


def cupy_frames(frame: np.ndarray[Any, Any], frames: int,
                ) -> tuple[dict[str, float], np.ndarray[Any, Any]]:
    """Frames a second of the same chain in CuPy, streamed and synchronized per frame."""
    import cupy as cp
    from cupyx.scipy import ndimage

    src = cp.asarray(frame)
    box = cp.full((3, 3, 1), 1 / 9, cp.float32)
    sx = cp.asarray(SOBEL[:, :, None])
    sy = cp.asarray(SOBEL.T[:, :, None])

    def chain() -> Any:
        blurred = ndimage.correlate(src.astype(cp.float32), box, mode="nearest")
        gx = ndimage.correlate(blurred, sx, mode="nearest")
        gy = ndimage.correlate(blurred, sy, mode="nearest")
        return cp.where(cp.sqrt(gx * gx + gy * gy) > LEVEL, 255, 0).astype(cp.uint8)

    for _ in range(3):
        chain()
    cp.cuda.get_current_stream().synchronize()
    start = time.perf_counter()
    for _ in range(frames):
        out = chain()
    cp.cuda.get_current_stream().synchronize()
    streamed = frames / (time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(frames):
        out = chain()
        cp.cuda.get_current_stream().synchronize()
    synced = frames / (time.perf_counter() - start)
    rates = {"cupy direct, streamed": streamed, "cupy direct, sync each frame": synced,
             "our kernels alone (handler, no actor), streamed": kernels_alone(src, frames)}
    return rates, cp.asnumpy(out)


class _Arrays:
    """Just enough of a backend for the CUDA handler: buffer ids to CuPy arrays."""

    def __init__(self, *arrays: Any) -> None:
        self.arrays = arrays

    def array(self, buffer_id: int) -> Any:
        return self.arrays[buffer_id]


def kernels_alone(src: Any, frames: int) -> float:
    """Frames a second of the ``FilterFrames`` CUDA handler called directly (no actor, no
    device op), one synchronization at the end: the kernels' own rate."""
    import cupy as cp

    from atomr_accel.backends.cuda._realtime_frames import filter_frames

    h, w, c = src.shape
    arrays = _Arrays(src.reshape(-1), cp.empty(src.size, cp.uint8))
    op = FilterFrames(GpuRef(0, 0, DType.U8, src.size, 0, 0), GpuRef(0, 1, DType.U8, src.size,
                      0, 0), h, w, c, STAGES)
    for _ in range(3):
        filter_frames(arrays, op)
    cp.cuda.get_current_stream().synchronize()
    start = time.perf_counter()
    for _ in range(frames):
        filter_frames(arrays, op)
    cp.cuda.get_current_stream().synchronize()
    rate = frames / (time.perf_counter() - start)
    from cupyx.profiler import benchmark

    timing = benchmark(filter_frames, (arrays, op), n_repeat=50, n_warmup=3)
    print(f"our kernels alone, a frame: GPU {timing.gpu_times.mean() * 1e3:.3f} ms, host "
          f"(launching) {timing.cpu_times.mean() * 1e3:.3f} ms")
    return rate


async def hash_rates(system: System, device: Device, n: int, gpu: bool) -> dict[str, float]:
    """Keys a second: insert then lookup ``n`` distinct 8-byte keys, actor vs CuPy."""
    rng = np.random.default_rng(1)
    keys = rng.choice(2**62, n, replace=False).astype(np.uint64)
    values = rng.integers(0, 2**62, n, dtype=np.uint64)
    key_rows, value_rows = keys.view(np.uint8).reshape(n, 8), values.view(np.uint8).reshape(n, 8)
    table = GpuHashMapActor.spawn(system, 2 * n, 8, 8, device=device)
    await table.insert_async(key_rows[:1], value_rows[:1], timeout_secs=600)  # compile, warm
    start = time.perf_counter()
    await table.insert_async(key_rows, value_rows, timeout_secs=600)
    insert = n / (time.perf_counter() - start)
    start = time.perf_counter()
    got, found = await table.lookup_async(key_rows, timeout_secs=600)
    lookup = n / (time.perf_counter() - start)
    assert found.all() and np.array_equal(got.reshape(-1).view(np.uint64), values)
    table.stop()
    rates = {"actor insert": insert, "actor lookup": lookup}
    if gpu:
        import cupy as cp

        def build() -> tuple[Any, Any]:
            k = cp.asarray(keys)
            order = cp.argsort(k)
            return k[order], cp.asarray(values)[order]

        build()
        cp.cuda.get_current_stream().synchronize()
        start = time.perf_counter()
        sorted_keys, sorted_values = build()
        cp.cuda.get_current_stream().synchronize()
        rates["cupy sorted-array build"] = n / (time.perf_counter() - start)
        def lookup(queries: np.ndarray[Any, Any]) -> tuple[Any, Any]:
            on_device = cp.asarray(queries)
            at = cp.minimum(cp.searchsorted(sorted_keys, on_device), n - 1)
            return cp.asnumpy(sorted_keys[at] == on_device), cp.asnumpy(sorted_values[at])

        lookup(keys[:16])  # compile every kernel of the path, warm
        start = time.perf_counter()
        hits, answer = lookup(keys)
        rates["cupy sorted-array lookup"] = n / (time.perf_counter() - start)
        assert hits.all() and np.array_equal(answer, values)
    return rates


async def main(args: argparse.Namespace) -> None:
    gpu = not args.quick
    shape = (2160, 3840, 4) if gpu else (90, 160, 4)
    frames = args.frames or (400 if gpu else 5)
    system = await System.open_async("realtime-frames-bench")
    device = await system.spawn_device_async(mock=not gpu)
    rates, frame, result = await actor_frames(system, device, shape, frames)
    rows = [[name, rate] for name, rate in rates.items()]
    payload: dict[str, Any] = {"shape": list(shape), "frames": frames, "frames_per_s": rates}
    if gpu:
        direct, expected = cupy_frames(frame, frames)
        rows += [[name, rate] for name, rate in direct.items()]
        payload["frames_per_s"] |= direct
        differ = float(np.mean(result != expected))
        payload["fraction_of_pixels_differing_from_cupy"] = differ
        print(f"pixels differing from the CuPy chain: {differ:.2e} (float rounding at the "
              f"threshold)")
    print_table(f"3-stage chain (3x3 box, Sobel magnitude, threshold) on {shape[0]}x{shape[1]}"
                f"x{shape[2]} u8 frames", ["path", "frames/s"], rows)
    keys = args.keys or (1_000_000 if gpu else 2_000)
    hashed = await hash_rates(system, device, keys, gpu)
    payload["hash_keys_per_s"] = hashed
    payload["hash_keys"] = keys
    print_table(f"hash map, {keys} 8-byte keys and values (host arrays in and out)",
                ["path", "keys/s"], [[name, rate] for name, rate in hashed.items()])
    await system.close_async()
    if args.json:
        write_json(args.json, payload)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results as JSON to this path")
    parser.add_argument("--quick", action="store_true", help="small sizes, CPU backend")
    parser.add_argument("--frames", type=int, default=0, help="frames timed a path")
    parser.add_argument("--keys", type=int, default=0, help="hash map keys")
    asyncio.run(main(parser.parse_args()))
