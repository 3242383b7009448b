"""Stream pipelines (``atomr_accel.streams``): exact output in order, retries, failure and
cancellation that stop every stage, bounded memory, a stage bound to a device."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest

from atomr_accel import Device, InvalidArgument, System
from atomr_accel.streams import Pipeline, Sink, Source, gpu_stage, stage

pytestmark = pytest.mark.anyio


async def test_ten_thousand_elements_through_three_stages_with_flaky_one() -> None:
    rng = np.random.default_rng(7)
    data = rng.integers(-1_000_000, 1_000_000, size=10_000).tolist()
    flaky = set(rng.choice(len(data), size=100, replace=False).tolist())  # 1% fail once
    failed: set[int] = set()
    pulled = [0]
    emitted: list[int] = []
    peak = [0]

    def source() -> Iterator[tuple[int, int]]:
        for i, x in enumerate(data):
            pulled[0] += 1
            yield i, x

    def sometimes_fails(item: tuple[int, int]) -> tuple[int, int]:
        i, x = item
        if i in flaky and i not in failed:
            failed.add(i)
            raise RuntimeError(f"element {i} failed once")
        return i, x * 3

    async def slow_ish(item: tuple[int, int]) -> tuple[int, int]:
        if item[0] % 97 == 0:
            await asyncio.sleep(0)  # lets later elements overtake inside the stage
        return item[0], item[1] - 5

    def take(item: tuple[int, int]) -> None:
        emitted.append(item[1])
        peak[0] = max(peak[0], pulled[0] - len(emitted))

    pipeline = Pipeline(Source.of(source()),
                        [stage(lambda item: (item[0], item[1] + 1), parallelism=2),
                         stage(sometimes_fails, parallelism=4, retries=2),
                         stage(slow_ish, parallelism=3)],
                        Sink.foreach(take), chunk=32, window=8)
    assert await pipeline.run() == len(data)
    assert emitted == [(x + 1) * 3 - 5 for x in data]  # exact, in the source's order
    assert failed == flaky and pipeline.stats.retried == len(flaky)
    assert peak[0] <= 32 * 8  # never more than window chunks between source and sink


async def test_an_element_failing_past_its_retries_fails_the_stream_and_stops_all() -> None:
    calls = [0]

    def bad(x: int) -> int:
        calls[0] += 1
        if x == 500:
            raise ValueError("no 500")
        return x

    started = asyncio.all_tasks()
    pipeline = Pipeline(Source.of(range(100_000)),
                        [stage(bad, parallelism=2, retries=1), stage(lambda x: x)],
                        chunk=16, window=4)
    with pytest.raises(ValueError, match="no 500"):
        await pipeline.run()
    assert asyncio.all_tasks() == started  # every stage's workers are gone
    assert calls[0] < 100_000  # it stopped early


async def test_cancelling_a_run_stops_every_stage() -> None:
    queue: asyncio.Queue[int | None] = asyncio.Queue()
    seen: list[int] = []

    async def slow(x: int) -> int:
        await asyncio.sleep(0.001)
        return x

    ten = asyncio.Event()

    def take(x: int) -> None:
        seen.append(x)
        if len(seen) >= 10:
            ten.set()

    started = asyncio.all_tasks()
    run = asyncio.create_task(Pipeline(Source.from_queue(queue), [stage(slow, parallelism=2)],
                                       Sink.foreach(take)).run())
    for i in range(50):
        queue.put_nowait(i)
    async with asyncio.timeout(10):
        await ten.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert asyncio.all_tasks() == started
    assert seen == list(range(len(seen)))


async def test_async_sources_queue_sources_and_a_stage_bound_to_a_device() -> None:
    rng = np.random.default_rng(8)
    arrays = [rng.standard_normal(16) for _ in range(40)]

    async def produce() -> AsyncIterator[np.ndarray]:
        for a in arrays:
            yield a

    async with await System.open_async("s") as system:
        dev = await system.spawn_device_async(mock=True, libraries=("blas",))

        async def scale_on_device(device: Device, x: np.ndarray) -> np.ndarray:
            buf = await device.allocate_f64_async(16)
            await device.copy_from_numpy_async(buf, x)
            await device.blas().scal_async(16, 2.0, buf)
            out = await device.copy_to_numpy_async(buf)
            await device.free_async(buf)
            return out

        out = await Pipeline(Source.from_async(produce()),
                             [gpu_stage(scale_on_device, dev, parallelism=3)]).run()
        assert len(out) == len(arrays)
        for got, want in zip(out, arrays, strict=True):
            np.testing.assert_array_equal(got, 2.0 * want)

    queue: asyncio.Queue[object] = asyncio.Queue()
    for i in range(100):
        queue.put_nowait(i)
    queue.put_nowait("end")
    assert await Pipeline(Source.from_queue(queue, end="end"), [stage(str)]).run() == [
        str(i) for i in range(100)]


def test_bad_pipelines_are_refused() -> None:
    with pytest.raises(InvalidArgument):
        stage(len, parallelism=0)
    with pytest.raises(InvalidArgument):
        stage(len, retries=-1)
    with pytest.raises(InvalidArgument):
        stage("not callable")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        Pipeline(Source.of([1]), [len])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument):
        Pipeline(Source.of([1]), [], chunk=0)
