"""DynamicBatchingServer and its BatchQueue: flushing, result matching, overflow, time-outs."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from atomr_accel import ActorStopped, InvalidArgument, System
from atomr_accel.actor import ActorSystem, AskTimeout
from atomr_accel.patterns import (
    BatchQueue,
    BatchResultMismatch,
    DynamicBatchingServer,
    QueueOverflow,
    RequestDropped,
    RequestRejected,
    split_results,
)

pytestmark = pytest.mark.anyio

LONG = 30.0  # a max_wait no test waits for: flushes in those tests come from full batches


class Recorder:
    """A batch function that records each batch and doubles its items."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []

    async def __call__(self, items: list[Any]) -> list[Any]:
        self.batches.append(list(items))
        return [2 * x for x in items]


class Held:
    """A batch function that holds each batch open until ``release`` is set."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, items: list[Any]) -> list[Any]:
        self.batches.append(list(items))
        self.entered.set()
        await self.release.wait()
        return [x * 10 for x in items]


async def started(server: DynamicBatchingServer, *items: Any) -> list[asyncio.Task[Any]]:
    """Submit ``items`` as tasks, in order, and return once every submit is in the mailbox."""
    tasks = [asyncio.ensure_future(server.submit(x)) for x in items]
    await asyncio.sleep(0)  # each task runs to its first await: the ask is enqueued
    return tasks


# ----------------------------------------------------------------- the pure queue


def test_queue_flushes_when_full_or_when_the_oldest_is_due() -> None:
    q: BatchQueue[str] = BatchQueue(max_batch=3, max_wait=1.0, capacity=10)
    assert q.deadline() is None and not q.is_due(100.0)
    q.offer("a", now=5.0)
    q.offer("b", now=5.5)
    assert q.deadline() == 6.0  # the oldest's arrival + max_wait, not the newest's
    assert not q.is_due(5.9) and q.is_due(6.0)
    q.offer("c", now=5.6)
    assert q.is_due(5.6)  # full
    assert q.take() == ["a", "b", "c"] and q.deadline() is None


def test_queue_take_keeps_order_and_the_next_oldest_sets_the_deadline() -> None:
    q: BatchQueue[int] = BatchQueue(max_batch=2, max_wait=0.5, capacity=10)
    for i in range(5):
        q.offer(i, now=float(i))
    assert q.take() == [0, 1]
    assert q.deadline() == 2.5
    assert q.take() == [2, 3] and q.take() == [4] and q.take() == []


def test_queue_take_skips_requests_without_giving_them_a_place() -> None:
    q: BatchQueue[int] = BatchQueue(max_batch=2, max_wait=0.5, capacity=10)
    for i in range(6):
        q.offer(i, now=0.0)
    assert q.take(skip=lambda v: v in (1, 2)) == [0, 3]
    assert q.take_all() == [4, 5] and len(q) == 0


def test_queue_overflow_reject_returns_the_new_request() -> None:
    q: BatchQueue[str] = BatchQueue(max_batch=5, max_wait=1.0, capacity=2)
    assert q.offer("a", 0.0) is None and q.offer("b", 0.0) is None
    assert q.offer("c", 0.0) == "c"
    assert q.take() == ["a", "b"]


def test_queue_overflow_drop_oldest_evicts_and_keeps_the_new_one() -> None:
    q: BatchQueue[str] = BatchQueue(max_batch=5, max_wait=1.0, capacity=2,
                                    overflow="drop_oldest")
    q.offer("a", 0.0)
    q.offer("b", 1.0)
    assert q.offer("c", 2.0) == "a"
    assert q.deadline() == 2.0  # b is the oldest now
    assert q.take() == ["b", "c"]


@pytest.mark.parametrize("kwargs", [
    {"max_batch": 0}, {"max_wait": -1.0}, {"capacity": 0}, {"overflow": "lifo"},
    {"max_wait": float("nan")}, {"max_batch": 2.5},
])
def test_queue_refuses_bad_settings(kwargs: dict[str, Any]) -> None:
    settings: dict[str, Any] = {"max_batch": 2, "max_wait": 0.1, "capacity": 4, **kwargs}
    with pytest.raises(InvalidArgument):
        BatchQueue(**settings)


def test_split_results_takes_sequences_and_arrays_of_the_right_length() -> None:
    assert split_results((1, 2), 2) == [1, 2]
    rows = split_results(np.arange(6).reshape(3, 2), 3)
    assert [r.tolist() for r in rows] == [[0, 1], [2, 3], [4, 5]]
    for bad in (42, "ab", {0: 1, 1: 2}, (x for x in range(2))):
        with pytest.raises(BatchResultMismatch) as info:
            split_results(bad, 2)
        assert info.value.got is None and info.value.expected == 2
    with pytest.raises(BatchResultMismatch) as info:
        split_results([1], 2)
    assert (info.value.expected, info.value.got) == (2, 1)


# ---------------------------------------------------------------------- the server


async def test_full_batches_flush_at_once_and_result_i_answers_request_i() -> None:
    fn = Recorder()
    async with ActorSystem("t") as system:
        server = DynamicBatchingServer.spawn(system, fn, max_batch=4, max_wait=LONG)
        results = await asyncio.gather(*(server.submit(i) for i in range(8)))
        assert results == [2 * i for i in range(8)]
        assert fn.batches == [[0, 1, 2, 3], [4, 5, 6, 7]]
        stats = await server.stats()
        assert (stats.batches, stats.completed, stats.queued) == (2, 8, 0)


async def test_a_partial_batch_flushes_when_the_oldest_has_waited_max_wait() -> None:
    fn = Recorder()
    async with ActorSystem("t") as system:
        server = DynamicBatchingServer.spawn(system, fn, max_batch=100, max_wait=0.02)
        assert await asyncio.gather(*(server.submit(i) for i in range(3))) == [0, 2, 4]
        assert fn.batches == [[0, 1, 2]]
        assert await server.submit(7) == 14  # a lone request is not stranded either
        assert fn.batches[-1] == [7]


async def test_one_timer_for_the_oldest_request_not_one_per_request() -> None:
    fn = Recorder()
    async with ActorSystem("t") as system:
        server = DynamicBatchingServer.spawn(system, fn, max_batch=1000, max_wait=1.0)
        tasks = await started(server, *range(50))
        stats = await server.stats()
        assert stats.queued == 50 and stats.timer_sets == 1
        assert await asyncio.gather(*tasks) == [2 * i for i in range(50)]
        assert fn.batches == [list(range(50))]
        assert (await server.stats()).timer_sets == 1


async def test_the_next_oldest_request_sets_the_timer_after_a_flush() -> None:
    fn = Recorder()
    async with ActorSystem("t") as system:
        server = DynamicBatchingServer.spawn(system, fn, max_batch=3, max_wait=0.05)
        assert await asyncio.gather(*(server.submit(i) for i in range(4))) == [0, 2, 4, 6]
        assert fn.batches == [[0, 1, 2], [3]]  # 3 waited for its own deadline
        assert (await server.stats()).timer_sets == 2  # for 0, then for 3


@pytest.mark.parametrize("result", [42, "xy", {"a": 1}, None])
async def test_a_non_sequence_result_fails_the_whole_batch_and_serving_goes_on(
        result: Any) -> None:
    calls: list[list[int]] = []

    async def fn(items: list[int]) -> Any:
        calls.append(items)
        return result if items[0] == 0 else [x + 1 for x in items]

    async with ActorSystem("t") as system:
        server = DynamicBatchingServer.spawn(system, fn, max_batch=2, max_wait=LONG)
        outcomes = await asyncio.gather(*(server.submit(i) for i in range(4)),
                                        return_exceptions=True)
        assert all(isinstance(o, BatchResultMismatch) for o in outcomes[:2])
        assert outcomes[0].got is None  # type: ignore[union-attr]
        assert outcomes[2:] == [3, 4]
        stats = await server.stats()
        assert (stats.failed, stats.completed) == (2, 2)


@pytest.mark.parametrize("delta", [-1, 1])
async def test_a_wrong_length_result_fails_every_request_of_that_batch(delta: int) -> None:
    async def fn(items: list[int]) -> list[int]:
        n = len(items) + delta if items[0] < 3 else len(items)
        return list(range(n))

    async with ActorSystem("t") as system:
        server = DynamicBatchingServer.spawn(system, fn, max_batch=3, max_wait=LONG)
        outcomes = await asyncio.gather(*(server.submit(i) for i in range(6)),
                                        return_exceptions=True)
        for outcome in outcomes[:3]:
            assert isinstance(outcome, BatchResultMismatch)
            assert (outcome.expected, outcome.got) == (3, 3 + delta)
            assert "batch of 3" in str(outcome)
        assert outcomes[3:] == [0, 1, 2]


async def test_a_batch_fn_error_fails_that_batch_only() -> None:
    async def fn(items: list[str]) -> list[str]:
        if "bad" in items:
            raise ValueError("bad input in batch")
        return [s.upper() for s in items]

    async with ActorSystem("t") as system:
        server = DynamicBatchingServer.spawn(system, fn, max_batch=2, max_wait=LONG)
        outcomes = await asyncio.gather(
            *(server.submit(s) for s in ["ok", "bad", "x", "y"]), return_exceptions=True)
        assert isinstance(outcomes[0], ValueError) and outcomes[0] is outcomes[1]
        assert outcomes[2:] == ["X", "Y"]
        assert await asyncio.gather(server.submit("z"), server.submit("w")) == ["Z", "W"]
        stats = await server.stats()
        assert (stats.failed, stats.completed) == (2, 4)


async def test_overflow_reject_refuses_the_new_request() -> None:
    fn = Held()
    async with ActorSystem("t") as system:
        server = DynamicBatchingServer.spawn(system, fn, max_batch=2, max_wait=LONG,
                                             queue_capacity=2, overflow="reject")
        running = await started(server, 1, 2)
        await fn.entered.wait()  # batch [1, 2] is running and holds the only slot
        queued = await started(server, 3, 4)
        with pytest.raises(RequestRejected) as info:
            await server.submit(5)
        assert isinstance(info.value, QueueOverflow) and info.value.capacity == 2
        fn.release.set()
        assert await asyncio.gather(*running, *queued) == [10, 20, 30, 40]
        assert fn.batches == [[1, 2], [3, 4]]
        assert (await server.stats()).rejected == 1


async def test_overflow_drop_oldest_fails_the_oldest_waiting_request() -> None:
    fn = Held()
    async with ActorSystem("t") as system:
        server = DynamicBatchingServer.spawn(system, fn, max_batch=2, max_wait=LONG,
                                             queue_capacity=2, overflow="drop_oldest")
        running = await started(server, 1, 2)
        await fn.entered.wait()
        oldest, kept = await started(server, 3, 4)
        newest = await started(server, 5)
        with pytest.raises(RequestDropped) as info:
            await oldest
        assert info.value.policy == "drop_oldest"
        fn.release.set()
        assert await asyncio.gather(*running, kept, *newest) == [10, 20, 40, 50]
        assert fn.batches == [[1, 2], [4, 5]]
        assert (await server.stats()).dropped == 1


async def test_a_timed_out_request_is_answered_and_then_skipped() -> None:
    fn = Held()
    async with ActorSystem("t") as system:
        server = DynamicBatchingServer.spawn(system, fn, max_batch=2, max_wait=LONG)
        running = await started(server, 1, 2)
        await fn.entered.wait()
        with pytest.raises(AskTimeout):
            await server.submit(3, timeout=0.05)
        late = await started(server, 4, 5)
        fn.release.set()
        assert await asyncio.gather(*running, *late) == [10, 20, 40, 50]
        assert fn.batches == [[1, 2], [4, 5]]  # 3 was never computed
        assert (await server.stats()).expired == 1


@pytest.mark.parametrize("limit", [1, 2])
async def test_batches_overlap_only_up_to_max_concurrent_batches(limit: int) -> None:
    fn = Held()
    async with ActorSystem("t") as system:
        server = DynamicBatchingServer.spawn(system, fn, max_batch=1, max_wait=LONG,
                                             max_concurrent_batches=limit)
        tasks = await started(server, 1, 2, 3)
        stats = await server.stats()  # answered after the three submits were handled
        assert (stats.running_batches, stats.queued) == (limit, 3 - limit)
        fn.release.set()
        assert await asyncio.gather(*tasks) == [10, 20, 30]
        assert fn.batches == [[1], [2], [3]]


async def test_a_sync_batch_fn_runs_off_the_event_loop() -> None:
    loop_thread = threading.get_ident()
    threads: list[int] = []

    def fn(items: list[int]) -> list[int]:
        threads.append(threading.get_ident())
        return [x * x for x in items]

    async with ActorSystem("t") as system:
        server = DynamicBatchingServer.spawn(system, fn, max_batch=4, max_wait=LONG)
        assert await asyncio.gather(*(server.submit(i) for i in range(4))) == [0, 1, 4, 9]
        assert threads and loop_thread not in threads


async def test_a_stopped_server_fails_queued_and_running_requests() -> None:
    fn = Held()
    async with ActorSystem("t") as system:
        server = DynamicBatchingServer.spawn(system, fn, max_batch=2, max_wait=LONG)
        running = await started(server, 1, 2)
        await fn.entered.wait()
        queued = await started(server, 3)
        server.stop()
        outcomes = await asyncio.gather(*running, *queued, return_exceptions=True)
        assert all(isinstance(o, ActorStopped) for o in outcomes)
        with pytest.raises(ActorStopped):
            await server.submit(4)


@pytest.mark.parametrize("kwargs", [
    {"max_batch": 0}, {"max_wait": -0.1}, {"queue_capacity": 0},
    {"overflow": "newest"}, {"max_concurrent_batches": 0},
])
async def test_bad_settings_are_refused_before_spawning(kwargs: dict[str, Any]) -> None:
    settings: dict[str, Any] = {"max_batch": 2, "max_wait": 0.1, **kwargs}
    async with ActorSystem("t") as system:
        with pytest.raises(InvalidArgument):
            DynamicBatchingServer.spawn(system, Recorder(), **settings)
        with pytest.raises(InvalidArgument):
            DynamicBatchingServer.spawn(system, "not callable", max_batch=2,  # type: ignore[arg-type]
                                        max_wait=0.1)


async def test_a_device_backed_batch_fn_serves_each_request_its_own_row() -> None:
    rng = np.random.default_rng(0)
    d_in, d_out, max_batch = 8, 5, 4
    w = rng.standard_normal((d_in, d_out)).astype(np.float32)
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True)
        w_buf = await dev.allocate_f32_async(d_in * d_out)
        x_buf = await dev.allocate_f32_async(max_batch * d_in)
        y_buf = await dev.allocate_f32_async(max_batch * d_out)
        await dev.copy_from_numpy_async(w_buf, w)

        async def forward(xs: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
            n = len(xs)
            await dev.copy_from_numpy_async(x_buf, np.stack(xs), offset=0)
            await dev.blas().matmul_async(x_buf, w_buf, y_buf, m=n, n=d_out, k=d_in)
            return await dev.copy_to_numpy_async(y_buf, length=n * d_out, shape=(n, d_out))

        server = DynamicBatchingServer.spawn(system, forward, max_batch=max_batch, max_wait=0.01)
        xs = [rng.standard_normal(d_in).astype(np.float32) for _ in range(10)]
        ys = await asyncio.gather(*(server.submit(x) for x in xs))
        for x, y in zip(xs, ys, strict=True):
            np.testing.assert_allclose(y, x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)
        assert (await server.stats()).batches >= 3
