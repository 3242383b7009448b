"""The data plane: ops go straight from their callers to the context host, and fall back to
the actor path while the context is (re)built; every invariant of the device holds on both."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import pytest
from _ray_hosts import RAY

from atomr_accel import (
    AskTimeout,
    ContextPoisoned,
    FaultKind,
    GpuRefStale,
    InvalidArgument,
    OutOfMemory,
    System,
)
from atomr_accel.backends._spin import wait_until
from atomr_accel.backends.cpu import CpuBackend
from atomr_accel.core import DType, GpuRef, Op
from atomr_accel.core.ops._blas import Axpy
from atomr_accel.core.ops._graph import CaptureGraph
from atomr_accel.core.ops._memory import Allocate, Download, MemoryInfo, Upload
from atomr_accel.core.ops._peer import CanAccessPeer
from atomr_accel.hosts import BackendSpec, ProcessHost, ThreadHost
from atomr_accel.hosts._base import FREE
from atomr_accel.hosts._shm import live_segments

pytestmark = pytest.mark.anyio

HOSTS = ["thread", "process", RAY]
LOST = (ContextPoisoned, GpuRefStale)  # what an op caught by a rebuild may answer


def run_threads(target: Callable[[int], None], count: int, limit: float = 60.0) -> None:
    """Run ``target(i)`` on ``count`` threads; re-raise the first failure; never hang."""
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(limit)
        assert not thread.is_alive(), "a caller hung"
    if errors:
        raise errors[0]


@pytest.mark.parametrize("isolation", HOSTS)
async def test_blocking_ops_do_not_wait_for_the_event_loop(isolation: str) -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        x = np.random.default_rng(1).standard_normal(64)
        buf = await dev.allocate_f64_async(64)
        await dev.copy_from_numpy_async(buf, x)
        seen: list[float] = []

        def caller() -> None:
            for _ in range(20):
                start = time.perf_counter()
                np.testing.assert_array_equal(dev.copy_to_numpy(buf), x)
                seen.append(time.perf_counter() - start)

        thread = threading.Thread(target=caller)
        thread.start()
        thread.join(0.5)  # this event loop, the system's, is blocked all the while
        thread.join(5.0)
        assert len(seen) == 20 and max(seen) < 0.25


@pytest.mark.parametrize("isolation", HOSTS)
async def test_eight_threads_and_eight_tasks_at_once(isolation: str) -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        blas = dev.blas()
        rounds = 25
        before = await dev.stats_async()
        kept: list[Any] = []  # a collected buffer is freed: keep them out of the count

        def thread_work(i: int) -> None:
            rng = np.random.default_rng(i)
            x, y = rng.standard_normal(100), rng.standard_normal(100)
            bx, by = dev.allocate_f64(100), dev.allocate_f64(100)
            kept.extend((bx, by))
            dev.copy_from_numpy(bx, x)
            dev.copy_from_numpy(by, y)
            for r in range(rounds):
                blas.axpy(100, 0.5, bx, by)
                y = y + 0.5 * x
                if r % 5 == 0:
                    np.testing.assert_allclose(dev.copy_to_numpy(by), y, rtol=1e-12)
            assert blas.dot(100, bx, by) == pytest.approx(float(x @ y), rel=1e-12)

        async def task_work(i: int) -> None:
            rng = np.random.default_rng(100 + i)
            x, y = rng.standard_normal(100), rng.standard_normal(100)
            bx, by = await dev.allocate_f64_async(100), await dev.allocate_f64_async(100)
            kept.extend((bx, by))
            await asyncio.gather(dev.copy_from_numpy_async(bx, x),
                                 dev.copy_from_numpy_async(by, y))
            for r in range(rounds):
                await blas.axpy_async(100, 0.5, bx, by)
                y = y + 0.5 * x
                if r % 5 == 0:
                    np.testing.assert_allclose(await dev.copy_to_numpy_async(by), y,
                                               rtol=1e-12)
            assert await blas.dot_async(100, bx, by) == pytest.approx(float(x @ y), rel=1e-12)

        await asyncio.gather(*(asyncio.to_thread(thread_work, i) for i in range(8)),
                             *(task_work(i) for i in range(8)))
        after = await dev.stats_async()
        per_caller = 2 + 2 + rounds + rounds // 5 + 1  # allocs, uploads, axpys, reads, dot
        assert after.completed - before.completed == 16 * per_caller
        assert after.failed == before.failed and after.in_flight == 0
        assert after.generation == 1 and after.restarts == 0


@pytest.mark.parametrize("isolation", HOSTS)
async def test_requests_during_a_rebuild_queue_in_order(isolation: str) -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async(FaultKind.POISON)
        blocking: list[Any] = []
        thread = threading.Thread(target=lambda: blocking.append(dev.allocate_f32(4)))
        thread.start()
        made = await asyncio.gather(*(dev.allocate_f32_async(1) for _ in range(8)))
        await asyncio.to_thread(thread.join, 10.0)  # it may need this loop (the actor path)
        assert [b.generation for b in made] == [2] * 8
        ids = [b.ref.buffer_id for b in made]
        assert ids == sorted(ids) and len(set(ids)) == 8  # FIFO on the new context
        assert blocking and blocking[0].generation == 2
        x = np.arange(8.0)
        buf = await dev.allocate_f64_async(8)
        await asyncio.gather(*(dev.copy_from_numpy_async(buf, x + k) for k in range(10)))
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(buf), x + 9)
        assert (await dev.stats_async()).in_flight == 0


@pytest.mark.parametrize("isolation", HOSTS)
async def test_stale_and_foreign_buffers_are_refused_before_anything_runs(isolation: str) -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        other = await system.spawn_device_async(mock=True)
        old = await dev.allocate_f64_async(4)
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async(FaultKind.POISON)
        fresh = await dev.allocate_f64_async(4)
        failed = (await dev.stats_async()).failed
        with pytest.raises(GpuRefStale):
            await dev.copy_to_numpy_async(old)
        with pytest.raises(GpuRefStale):
            await asyncio.to_thread(dev.copy_to_numpy, old)
        foreign = await other.allocate_f64_async(4)
        with pytest.raises(InvalidArgument, match="belongs to another device"):
            await dev.copy_async(foreign, fresh)
        with pytest.raises(InvalidArgument, match="not allocated by this device"):
            await asyncio.to_thread(dev.blas().axpy, 4, 1.0, foreign.ref, fresh)
        assert (await dev.stats_async()).failed == failed + 3  # counted like any failed op
        await dev.copy_from_numpy_async(fresh, np.ones(4))
        assert (await dev.blas().asum_async(4, fresh)) == 4.0


@pytest.mark.parametrize("isolation", HOSTS)
def test_a_poisoned_context_mid_flight_answers_every_call(isolation: str) -> None:
    with System.open("t") as system:
        dev = system.spawn_device(mock=True, isolation=isolation)
        answered, lost = [0] * 6, [0] * 6
        go, poisoned = threading.Barrier(7), threading.Event()
        kept: list[Any] = []  # a collected buffer is freed: keep frees out of the count

        def caller(i: int) -> None:
            x = np.random.default_rng(i).standard_normal(256)
            buf = dev.allocate_f64(256)
            dev.copy_from_numpy(buf, x)
            go.wait()
            after = 0
            while after < 50:  # reading when the poison lands, and 50 times after it
                try:
                    np.testing.assert_array_equal(dev.copy_to_numpy(buf), x)
                except LOST:
                    lost[i] += 1
                    buf = dev.allocate_f64(256)  # the rebuilt context has fresh buffers
                    dev.copy_from_numpy(buf, x)
                answered[i] += 1
                after += poisoned.is_set()
            kept.append(buf)

        def poisoner(i: int) -> None:
            if i < 6:
                caller(i)
                return
            go.wait()
            time.sleep(0.01)
            with pytest.raises(ContextPoisoned):
                dev.inject_fault(FaultKind.POISON)
            poisoned.set()

        run_threads(poisoner, 7)
        assert min(answered) >= 50 and lost == [1] * 6  # each lost its buffer once, no call
        stats = dev.stats()
        assert stats.generation == 2 and stats.restarts == 1 and stats.in_flight == 0


def test_a_killed_worker_wakes_every_blocked_caller() -> None:
    with System.open("t") as system:
        dev = system.spawn_device(mock=True, isolation="process")
        n = 200_000
        x = np.random.default_rng(0).standard_normal(n)
        src = dev.allocate_f64(n)
        dev.copy_from_numpy(src, x)
        pid = dev.stats().host_pid
        assert pid is not None and pid != os.getpid()
        outcomes: list[str] = []
        started = threading.Barrier(5)

        def caller(i: int) -> None:
            if i == 4:
                started.wait()
                time.sleep(0.02)
                os.kill(pid, 9)
                return
            started.wait()
            for _ in range(200):
                try:
                    assert dev.blas().nrm2(n, src) == pytest.approx(np.linalg.norm(x))
                    outcomes.append("ok")
                except LOST:
                    outcomes.append("lost")
                    return

        run_threads(caller, 5)
        assert "lost" in outcomes  # each caller was answered: a result or a typed error
        fresh = dev.allocate_f64(n)
        dev.copy_from_numpy(fresh, x)
        assert dev.blas().nrm2(n, fresh) == pytest.approx(np.linalg.norm(x))
        assert dev.stats().host_pid not in (None, pid)


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.parametrize(("isolation", "timeout"), [("thread", 0.2), ("process", 2.0)])
async def test_the_op_timeout_bounds_the_data_plane(isolation: str, timeout: float) -> None:
    async with await System.open_async("t", op_timeout=timeout) as system:  # spawn waits too
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        delay = timeout + 0.8
        start = time.perf_counter()
        with pytest.raises(AskTimeout):
            await dev.inject_fault_async(FaultKind.OOM, delay=delay)
        assert time.perf_counter() - start < delay
        if isolation == "process":  # a blocking caller waits in a slot, bounded too
            with pytest.raises(AskTimeout):
                await asyncio.to_thread(dev.inject_fault, FaultKind.OOM, delay)
        await asyncio.sleep(1.0)  # the late OOMs arrive and are dropped; the device goes on
        buf = await dev.allocate_f32_async(4)
        await asyncio.to_thread(dev.copy_from_numpy, buf, np.ones(4, np.float32))
        assert (await dev.blas().asum_async(4, buf)) == 4.0


@pytest.mark.parametrize("isolation", HOSTS)
def test_out_of_memory_on_the_data_plane_resumes(isolation: str) -> None:
    with System.open("t") as system:
        dev = system.spawn_device(mock=True, isolation=isolation,
                                  backend_options={"capacity": 4096})
        with pytest.raises(OutOfMemory):
            dev.allocate_f64(10_000)
        buf = dev.allocate_f64(8)
        dev.copy_from_numpy(buf, np.ones(8))
        stats = dev.stats()
        assert stats.out_of_memory == 1 and stats.generation == 1


async def test_a_large_upload_is_copied_off_the_event_loop_while_tiny_ops_go_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 256 MiB upload from an event loop is staged on another thread; tiny ops on another
    device keep being answered meanwhile (benchmarks/interference_bench.py measures how
    fast)."""
    staged_on: set[int] = set()
    stage = ProcessHost._stage

    def recording_stage(self: ProcessHost, request: Any, data: Any) -> None:
        staged_on.add(threading.get_ident())
        stage(self, request, data)

    monkeypatch.setattr(ProcessHost, "_stage", recording_stage)
    async with await System.open_async("t") as system:
        big = await system.spawn_device_async(0, mock=True, isolation="process")
        small = await system.spawn_device_async(1, mock=True)
        a, b = await big.allocate_f32_async(64 << 20), await small.allocate_f32_async(4)
        upload = asyncio.ensure_future(big.copy_from_numpy_async(a, np.ones(64 << 20,
                                                                            np.float32)))
        answered = 0
        while not upload.done():
            await small.copy_to_numpy_async(b)
            answered += 1
        await upload
        assert staged_on and threading.get_ident() not in staged_on
        assert answered > 1
        assert (await big.blas().asum_async(64 << 20, a)) == float(64 << 20)


# ------------------------------------------------------------------ the process host's ring


def host(**options: Any) -> ProcessHost:
    return ProcessHost(BackendSpec("cpu"), arena_bytes=1 << 20, **options)


async def test_a_full_ring_keeps_the_order_of_requests() -> None:
    proc = host(ring_bytes=4096)
    await proc.start()
    try:
        buffer_id = await proc.submit(Allocate(DType.F64, 4))
        ref = GpuRef(0, buffer_id, DType.F64, 4, 1)
        uploads = [proc.submit(Upload(ref, np.full(4, float(k)))) for k in range(300)]
        read = proc.submit(Download(ref))
        await asyncio.gather(*uploads)
        np.testing.assert_array_equal(await read, np.full(4, 299.0))
    finally:
        await proc.close()


async def test_more_blocking_callers_than_slots_are_all_answered() -> None:
    proc = host(slots=2)
    await proc.start()
    try:
        buffer_id = await proc.submit(Allocate(DType.F64, 8))
        ref = GpuRef(0, buffer_id, DType.F64, 8, 1)
        await proc.submit(Upload(ref, np.zeros(8)))
        ones = GpuRef(0, await proc.submit(Allocate(DType.F64, 8)), DType.F64, 8, 1)
        await proc.submit(Upload(ones, np.ones(8)))

        def caller(_: int) -> None:
            for _ in range(50):
                outcome = proc.call(Axpy(8, 1.0, ones, ref), 0, FREE, None)
                assert outcome == (None, None)

        await asyncio.to_thread(run_threads, caller, 6)
        np.testing.assert_array_equal(await proc.submit(Download(ref)), np.full(8, 300.0))
    finally:
        await proc.close()


async def test_requests_and_replies_too_large_for_the_ring_travel_in_segments() -> None:
    proc = host(ring_bytes=4096)
    await proc.start()
    try:
        peers = tuple(range(30_000))  # a 60 KiB request and a 30 KiB reply
        assert await proc.submit(CanAccessPeer(peers)) == (False,) * len(peers)
        outcome = await asyncio.to_thread(proc.call, CanAccessPeer(peers), 0, FREE, None)
        assert outcome == ((False,) * len(peers), None)
        buffer_id = await proc.submit(Allocate(DType.F64, 4))
        ref = GpuRef(0, buffer_id, DType.F64, 4, 1)
        ops = tuple(Axpy(4, 1.0, ref, ref) for _ in range(200))
        graph = await proc.submit(CaptureGraph(ops))
        assert isinstance(graph, int)
    finally:
        await proc.close()
    assert live_segments() == []


async def test_a_large_upload_from_an_event_loop_keeps_its_place() -> None:
    proc = host()
    await proc.start()
    try:
        n = 1 << 20  # 8 MiB: staged on an executor thread, not on this loop
        ref = GpuRef(0, await proc.submit(Allocate(DType.F64, n)), DType.F64, n, 1)
        x = np.random.default_rng(3).standard_normal(n)
        first = proc.submit(Upload(ref, x))
        second = proc.submit(Axpy(n, 1.0, ref, ref))  # sent after it: runs after it
        read = proc.submit(Download(ref))
        await asyncio.gather(first, second)
        np.testing.assert_array_equal(await read, 2 * x)
    finally:
        await proc.close()


# ------------------------------------------- an event loop launching device work itself


class _DeviceLike(CpuBackend):
    """A CPU backend whose axpys only queue work that "runs" for ``delay`` seconds, as a
    GPU kernel does, so the thread host launches them on the caller's event loop."""

    delay = 0.0

    def queues_only(self, op: Any) -> bool:
        return isinstance(op, Axpy)

    def begin(self, op: Any, stream: int) -> Any:
        return op, self.execute(op, stream), time.perf_counter() + self.delay

    def finished(self, started: Any) -> bool:
        return bool(time.perf_counter() >= started[2])

    def wait(self, started: Any, deadline: float | None) -> Any:
        wait_until(lambda: self.finished(started), deadline)
        return started[1]


@dataclasses.dataclass(frozen=True)
class _DeviceLikeSpec(BackendSpec):
    def create(self) -> Any:
        return _DeviceLike(self.device_id)


async def _ref_and_ones(host: ThreadHost) -> tuple[GpuRef, GpuRef]:
    """Two 4-element f64 buffers of ``host``: zeros, and ones."""
    ref = GpuRef(0, await host.submit(Allocate(DType.F64, 4)), DType.F64, 4, 1)
    ones = GpuRef(0, await host.submit(Allocate(DType.F64, 4)), DType.F64, 4, 1)
    await host.submit(Upload(ones, np.ones(4)))
    return ref, ones


@pytest.mark.parametrize("delay", [0.0, 0.0002, 0.02])  # done at once, in the spin, after it
async def test_work_an_event_loop_launches_itself_is_reported_in_order(delay: float) -> None:
    _DeviceLike.delay = delay
    host = ThreadHost(_DeviceLikeSpec("cpu"))
    await host.start()
    try:
        ref, ones = await _ref_and_ones(host)
        order: list[int] = []
        futures = []
        for i in range(20):
            fut = host.submit(Axpy(4, 1.0, ones, ref), stream=1 + i % 2)
            fut.add_done_callback(lambda _, i=i: order.append(i))
            futures.append(fut)
        futures.append(host.submit(Upload(ones, np.full(4, 2.0))))  # not launched on the loop
        futures.append(host.submit(Axpy(4, 1.0, ones, ref)))  # waits behind that upload
        await asyncio.gather(*futures)
        np.testing.assert_array_equal(await host.submit(Download(ref)), np.full(4, 22.0))
        assert sorted(order) == list(range(20))
        assert [i for i in order if i % 2 == 0] == list(range(0, 20, 2))  # in order per stream
    finally:
        await host.close()


class _Logged(_DeviceLike):
    """A ``_DeviceLike`` that logs each launch and each report, in order."""

    log: ClassVar[list[str]] = []

    def begin(self, op: Any, stream: int) -> Any:
        self.log.append("launch")
        return super().begin(op, stream)

    def wait(self, started: Any, deadline: float | None) -> Any:
        self.log.append("report")
        return super().wait(started, deadline)


@dataclasses.dataclass(frozen=True)
class _LoggedSpec(BackendSpec):
    def create(self) -> Any:
        return _Logged(self.device_id)


async def test_gathered_calls_all_launch_before_the_loop_waits_for_any() -> None:
    """A loop that launched a short op waits for it in place only when nothing else is
    ready to run: gathered calls queue all their work first, as direct library calls would,
    instead of each waiting for the one before it."""
    _Logged.delay = 0.00002  # done within the in-place wait of a lone op
    host = ThreadHost(_LoggedSpec("cpu"))
    await host.start()
    try:
        ref, ones = await _ref_and_ones(host)
        # the context thread ran those: it answers before it lets go of the context, and
        # an op that finds the context taken is queued for that thread, not launched here
        await asyncio.sleep(0.05)

        async def axpy() -> None:
            await host.submit(Axpy(4, 1.0, ones, ref))

        _Logged.log.clear()
        await axpy()  # alone: waited for in place, so reported before the next launch
        await asyncio.gather(*(axpy() for _ in range(8)))
        assert _Logged.log == ["launch", "report"] + ["launch"] * 8 + ["report"] * 8
        np.testing.assert_array_equal(await host.submit(Download(ref)), np.full(4, 9.0))
    finally:
        await host.close()


async def test_an_op_the_loop_reports_itself_waits_for_the_context_threads_reports() -> None:
    """The context thread's report reaches its caller one loop turn late; an op launched on
    the loop after it, and finished at once, must still be reported after it."""
    _DeviceLike.delay = 0.0
    host = ThreadHost(_DeviceLikeSpec("cpu"))
    await host.start()
    try:
        ref = GpuRef(0, await host.submit(Allocate(DType.F64, 4)), DType.F64, 4, 1)
        order: list[str] = []
        upload = host.submit(Upload(ref, np.ones(4)))  # runs on the context thread
        upload.add_done_callback(lambda _: order.append("upload"))
        time.sleep(0.2)  # noqa: ASYNC251 -- the loop is held on purpose: the report waits
        axpy = host.submit(Axpy(4, 1.0, ref, ref))  # launched (and finished) on the loop
        axpy.add_done_callback(lambda _: order.append("axpy"))
        assert upload.done() or not axpy.done()
        await asyncio.gather(upload, axpy)
        assert order == ["upload", "axpy"]
        np.testing.assert_array_equal(await host.submit(Download(ref)), np.full(4, 2.0))
    finally:
        await host.close()


@dataclasses.dataclass(frozen=True, slots=True)
class _Unsendable(Op):
    """An op with a field no pickle can carry to a worker."""

    fn: Any


async def test_an_op_that_cannot_reach_its_worker_is_a_typed_error() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process")
        with pytest.raises(InvalidArgument, match="cannot be sent"):
            await dev.run_async(_Unsendable(lambda: 1))
        with pytest.raises(InvalidArgument, match="cannot be sent"):
            await asyncio.to_thread(dev.run, _Unsendable(lambda: 2))
        stats = await dev.stats_async()
        assert stats.in_flight == 0 and stats.failed == 2 and stats.generation == 1
        buf = await dev.allocate_f32_async(4)
        assert len(buf) == 4


def test_ops_a_killed_worker_never_took_run_on_the_next_context() -> None:
    """Sent right after the kill, before the death is noticed: not lost, not failed."""
    with System.open("t") as system:
        dev = system.spawn_device(mock=True, isolation="process")
        for round_ in range(3):
            pid = dev.stats().host_pid
            assert pid is not None
            os.kill(pid, 9)
            made = [dev.allocate_f32(4) for _ in range(3)]
            assert [b.generation for b in made] == [round_ + 2] * 3
            dev.copy_from_numpy(made[0], np.ones(4, np.float32))
            assert dev.blas().asum(4, made[0]) == 4.0
        assert dev.stats().in_flight == 0


@pytest.mark.parametrize("isolation", HOSTS)
def test_a_download_past_the_end_is_refused_and_the_device_is_untouched(isolation: str) -> None:
    with System.open("t") as system:
        dev = system.spawn_device(mock=True, isolation=isolation)
        buf = dev.allocate_f64(4)
        dev.copy_from_numpy(buf, np.arange(4.0))
        for offset, length in ((17, None), (5, None), (3, 2), (-1, None)):
            with pytest.raises(InvalidArgument):
                dev.copy_to_numpy(buf, offset=offset, length=length)
        assert dev.copy_to_numpy(buf, offset=4).size == 0  # the end itself: nothing to copy
        np.testing.assert_array_equal(dev.copy_to_numpy(buf), np.arange(4.0))
        assert dev.stats().generation == 1


def test_a_request_handed_back_after_the_device_moved_on_runs_on_its_context() -> None:
    """A host may hand a request back (it never ran) after the next context is up."""
    with System.open("t") as system:
        dev = system.spawn_device(mock=True)
        with pytest.raises(ContextPoisoned):
            dev.inject_fault(FaultKind.POISON)
        dev.allocate_f32(1)  # generation 2 serves
        answered = threading.Event()
        answers: list[Any] = []

        class Answer:
            def set_result(self, value: Any) -> None:
                answers.append(value)
                answered.set()

            def set_exception(self, exc: BaseException) -> None:
                answers.append(exc)
                answered.set()

        ticket = dev._state.track(MemoryInfo(), Answer()).ticket(1)
        assert ticket.claim()  # taken by generation 1's host, which then closed ...
        ticket.unclaim()  # ... and handed it back: the device sends it on
        assert answered.wait(5.0)
        free, total = answers[0]
        assert 0 <= free <= total
        assert dev.stats().in_flight == 0


@pytest.mark.parametrize("isolation", HOSTS)
@pytest.mark.parametrize("dtype", ["bf16", "f16", "c64", "i8"])
async def test_every_dtype_round_trips_through_both_hosts(isolation: str, dtype: str) -> None:
    """Uploads and downloads of every buffer dtype, bf16 (an ml_dtypes extension type that
    the process host once staged as a bare ``'<V2'`` and could not copy) included."""
    numpy_dtype = DType.of(dtype).numpy
    data = (np.random.default_rng(5).standard_normal(37) * 9).astype(numpy_dtype)
    async with await System.open_async("round-trip") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        buffer = await dev.allocate_async(37, dtype)
        await dev.copy_from_numpy_async(buffer, data)
        back = await dev.copy_to_numpy_async(buffer)
        assert back.dtype == numpy_dtype
        np.testing.assert_array_equal(back.view(np.uint8), data.view(np.uint8))
