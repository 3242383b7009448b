"""Device functions given large NumPy arguments (64 KiB and more, which travel beside the
arguments' pickle: through shared memory on the process host) on the thread, process and
Ray hosts: every array arrives whole, as a copy of its own, however many calls are in
flight."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np
import pytest
from _ray_hosts import RAY

from atomr_accel import AskTimeout, FunctionFailed, System
from atomr_accel.hosts._shm import SEGMENT_PREFIX, shm_dir

pytestmark = pytest.mark.anyio
HOSTS = ["thread", "process", RAY]


def _files_of(pid: int) -> list[str]:
    """The shared-memory files process ``pid`` left (a worker's unread replies)."""
    return [name for name in os.listdir(shm_dir()) if name.startswith(f"{SEGMENT_PREFIX}{pid}-")]


@pytest.mark.parametrize("isolation", HOSTS)
async def test_large_and_small_arrays_arrive_whole_in_any_layout(isolation: str) -> None:
    class Batch:  # a user object holding an array: it travels pickled, as it is
        def __init__(self, images: np.ndarray[Any, Any]) -> None:
            self.images = images

    def echo(items: list[Any], table: dict[str, Any], batch: Batch, *,
             weights: np.ndarray[Any, Any]) -> Any:
        seen = [*items, table["a"], table["b"], batch.images, weights]
        return seen, [x.flags.f_contiguous for x in seen], weights.T @ items[0][:, :1]

    rng = np.random.default_rng(11)
    images = [rng.integers(0, 255, (96, 96, 3), dtype=np.uint8) for _ in range(12)]
    items: list[Any] = [rng.standard_normal((300, 64))]  # 150 KiB of float64
    items += images
    items.append(rng.standard_normal((512, 256)).astype(np.float32)[::2, ::3])  # strided
    items.append(rng.standard_normal(16))  # small: pickled with the arguments
    table = {"a": np.asfortranarray(rng.standard_normal((128, 96))),
             "b": (rng.standard_normal(40_000) > 0)}
    batch = Batch(rng.integers(0, 9, (64, 64, 8), dtype=np.int64))
    weights = rng.standard_normal((300, 5))
    sent = [*items, table["a"], table["b"], batch.images, weights]
    async with await System.open_async("large-arrays") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        seen, fortran, product = await dev.function(echo).call_async(
            items, table, batch, weights=weights)
    assert len(seen) == len(sent)
    for got, x in zip(seen, sent, strict=True):
        assert got.dtype == x.dtype and got.shape == x.shape
        np.testing.assert_array_equal(got, x)
    assert fortran[len(items)] and not fortran[0]  # the Fortran-ordered one stayed so
    np.testing.assert_array_equal(product, weights.T @ items[0][:, :1])


@pytest.mark.parametrize("isolation", HOSTS)
async def test_arrays_a_context_keeps_stay_intact_after_later_calls(isolation: str) -> None:
    """The context gets copies: an array it keeps is not changed by the calls after it."""
    rng = np.random.default_rng(12)
    firsts = [rng.standard_normal(20_000) for _ in range(3)]
    async with await System.open_async("large-arrays") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        store = await dev.resident_async(list, name="store")

        def keep(kept: list[Any], x: np.ndarray[Any, Any]) -> int:
            kept.append(x)
            return len(kept)

        def read(kept: list[Any]) -> list[Any]:
            return list(kept)

        for first in firsts:
            await dev.function(keep).call_async(store, first)
        f = dev.function(lambda x: float(x[0]))
        for _ in range(6):  # the same shared memory is used again and again
            await f.call_async(rng.standard_normal(20_000))
        kept = await dev.function(read).call_async(store)
    assert len(kept) == 3
    for got, sent in zip(kept, firsts, strict=True):
        np.testing.assert_array_equal(got, sent)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_many_calls_in_flight_each_get_their_own_arrays(isolation: str) -> None:
    rng = np.random.default_rng(13)
    inputs = [rng.standard_normal((256, 100)) for _ in range(48)]  # 200 KiB each
    with System.open("large-arrays") as system:
        dev = system.spawn_device(mock=True, isolation=isolation)
        f = dev.function(lambda i, x: (i, x.sum(axis=0)))

        async def calls() -> list[Any]:
            return await asyncio.gather(*(f.call_async(i, x) for i, x in enumerate(inputs)))

        answers = asyncio.run(calls())
        blocking = [f(i, x) for i, x in enumerate(inputs[:8])]
    for i, (got_i, got) in enumerate(answers + blocking):
        assert got_i == i % len(inputs)
        np.testing.assert_array_equal(got, inputs[got_i].sum(axis=0))


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_failing_call_with_large_arrays_leaves_the_next_ones_whole(isolation: str) -> None:
    rng = np.random.default_rng(14)
    x = rng.standard_normal(50_000)
    with System.open("large-arrays") as system:
        dev = system.spawn_device(mock=True, isolation=isolation)

        def check(a: np.ndarray[Any, Any]) -> float:
            if a[0] > 1e300:
                raise ValueError("refused")
            return float(a.sum())

        f = dev.function(check)
        bad = x.copy()
        bad[0] = 1e301
        with pytest.raises(FunctionFailed, match="refused"):
            f(bad)
        assert f(x) == float(x.sum())


@pytest.mark.parametrize("isolation", HOSTS)
async def test_large_results_come_back_whole_and_writable(isolation: str) -> None:
    rng = np.random.default_rng(15)
    a = rng.standard_normal((400, 300))
    b = np.asfortranarray(rng.standard_normal((256, 128)).astype(np.float32))
    c = rng.integers(0, 255, (128, 128, 3), dtype=np.uint8)

    def results(x: np.ndarray[Any, Any], y: np.ndarray[Any, Any],
                z: np.ndarray[Any, Any]) -> Any:
        return {"a": x * 2.0, "pair": (y, z[::-1].copy()), "small": np.arange(4.0), "n": 3}

    async with await System.open_async("large-arrays") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        got = await dev.function(results).call_async(a, b, c)
        pid = (await dev.stats_async()).host_pid
    np.testing.assert_array_equal(got["a"], a * 2.0)
    np.testing.assert_array_equal(got["pair"][0], b)
    np.testing.assert_array_equal(got["pair"][1], c[::-1])
    np.testing.assert_array_equal(got["small"], np.arange(4.0))
    assert got["n"] == 3 and got["pair"][0].dtype == np.float32
    if isolation != "ray":  # Ray hands out its object store's arrays read-only
        got["a"][0, 0] = 42.0  # the caller's own array
        assert got["a"][0, 0] == 42.0
    if pid is not None:
        assert _files_of(pid) == []  # nothing of the worker's left behind


def test_a_large_result_nobody_waits_for_leaves_nothing_behind() -> None:
    with System.open("large-arrays") as system:
        dev = system.spawn_device(mock=True, isolation="process")
        pid = dev.stats().host_pid

        def late(seconds: float) -> np.ndarray[Any, Any]:
            import time

            time.sleep(seconds)
            return np.ones(100_000)

        f = dev.function(late)
        with pytest.raises(AskTimeout):
            f(0.3, timeout_secs=0.05)  # its reply comes after the caller gave up
        deadline = time.monotonic() + 10
        while not _files_of(pid) and time.monotonic() < deadline:
            time.sleep(0.01)  # the reply's buffers are written: nobody reads them
        assert len(_files_of(pid)) == 1
        for _ in range(50):  # a later call takes the slot back once answered, reply and all
            assert f(0.0).sum() == 100_000
            if not _files_of(pid):
                break
            time.sleep(0.01)
        assert _files_of(pid) == []
        assert dev.stats().host_pid == pid  # the same worker all along
