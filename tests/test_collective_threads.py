"""Collectives called from plain threads and from a user's own event loop (``Collective``
on CPU devices): each rank's op goes straight to its host from the caller. Many threads
(or tasks) at once keep one order on every rank (results checked against NumPy); a rank
that fails, a killed worker, a time-out and an interrupted caller each end typed, and the
world serves again after."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _signals import Alarms

from atomr_accel import ContextPoisoned, FaultKind, GpuRuntimeError, System
from atomr_accel.core.ops._faults import InjectFault
from atomr_accel.errors import CollectiveAborted
from atomr_accel.facade import Collective, Device, GpuBuffer
from atomr_accel.hosts._shm import live_segments


class Busy(threading.Thread):
    """A device call on a thread of its own; keeps what it raised."""

    def __init__(self, device: Device, op: InjectFault) -> None:
        super().__init__(daemon=True)
        self.device, self.op = device, op
        self.raised: BaseException | None = None

    def run(self) -> None:
        try:
            self.device.run(self.op)
        except BaseException as exc:
            self.raised = exc

    def started(self) -> Busy:
        self.start()
        time.sleep(0.05)  # the device's context is busy with it now
        return self


def uploaded(devices: list[Device], xs: list[np.ndarray[Any, Any]]) -> list[GpuBuffer]:
    bufs = []
    for d, x in zip(devices, xs, strict=True):
        buf = d.allocate(len(x), "f64")
        d.copy_from_numpy(buf, x)
        bufs.append(buf)
    return bufs


def settled(devices: list[Device]) -> None:
    """Every request ends: none stays in a device's books."""
    deadline = time.monotonic() + 10.0
    while any(d.stats().in_flight for d in devices):
        assert time.monotonic() < deadline, [d.stats().in_flight for d in devices]
        time.sleep(0.01)


def serves_again(coll: Collective, devices: list[Device], xs: list[np.ndarray[Any, Any]],
                 timeout: float = 10.0) -> None:
    """An all_reduce of ``xs`` on fresh buffers (the old ones may have died with a context)
    runs once the world is rebuilt, and sums right."""
    fresh = uploaded(devices, xs)
    coll.all_reduce(fresh, timeout_secs=timeout)
    check_sum(devices, fresh, xs)


def check_sum(devices: list[Device], bufs: list[GpuBuffer], xs: list[np.ndarray[Any, Any]]
              ) -> None:
    for d, b in zip(devices, bufs, strict=True):
        np.testing.assert_allclose(d.copy_to_numpy(b), sum(xs), rtol=1e-12)


@pytest.fixture(params=["thread", "process"])
def world(request: pytest.FixtureRequest) -> Iterator[tuple[list[Device], Collective]]:
    with System.open("t", op_timeout=20) as system:
        devices = [system.spawn_device(device_id=i, mock=True, isolation=request.param)
                   for i in range(2)]
        yield devices, system.nccl_world(devices)


def test_many_threads_calling_one_world_each_get_their_own_sums(
        world: tuple[list[Device], Collective]) -> None:
    devices, coll = world
    rng = np.random.default_rng(31)
    threads, calls = 4, 30
    inputs = [[rng.standard_normal(33) for _ in devices] for _ in range(threads)]
    bufs = [uploaded(devices, xs) for xs in inputs]
    errors: list[BaseException] = []

    def caller(i: int) -> None:
        try:
            for k in range(calls):
                if k % 3 == 2:
                    with coll.group():  # a group is one launch per rank too
                        coll.all_reduce(bufs[i])
                else:
                    coll.all_reduce(bufs[i])
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(threads)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two launches of a collective
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert not errors and not any(w.is_alive() for w in workers)
    for xs, pair in zip(inputs, bufs, strict=True):
        # after the first all_reduce both ranks hold x0 + x1; each later one doubles it
        want = 2.0 ** (calls - 1) * (xs[0] + xs[1])
        for d, b in zip(devices, pair, strict=True):
            np.testing.assert_allclose(d.copy_to_numpy(b), want, rtol=1e-12)
    stats = coll.stats()
    assert stats.calls["all_reduce"] == threads * calls and stats.aborted == 0


def test_async_calls_from_a_users_own_loop_run_there_and_get_their_own_sums(
        world: tuple[list[Device], Collective]) -> None:
    """Tasks of an event loop that is not the system's, each with its own buffers, all at
    once: the ranks' answers come to that loop, and every task gets its own sums."""
    devices, coll = world
    rng = np.random.default_rng(61)
    tasks, calls = 4, 10
    inputs = [[rng.standard_normal(17) for _ in devices] for _ in range(tasks)]
    bufs = [uploaded(devices, xs) for xs in inputs]

    async def caller(i: int) -> None:
        for _ in range(calls):
            await coll.all_reduce_async(bufs[i], timeout_secs=20)

    async def main() -> None:
        await asyncio.gather(*(caller(i) for i in range(tasks)))

    asyncio.run(main())
    for xs, pair in zip(inputs, bufs, strict=True):
        want = 2.0 ** (calls - 1) * (xs[0] + xs[1])
        for d, b in zip(devices, pair, strict=True):
            np.testing.assert_allclose(d.copy_to_numpy(b), want, rtol=1e-12)
    assert coll.stats().calls["all_reduce"] == tasks * calls


def test_a_rank_that_fails_aborts_the_others_and_the_world_serves_again(
        world: tuple[list[Device], Collective]) -> None:
    devices, coll = world
    rng = np.random.default_rng(37)
    xs = [rng.standard_normal(16) for _ in devices]
    bufs = uploaded(devices, xs)
    coll.all_reduce(bufs)
    check_sum(devices, bufs, xs)
    poison = Busy(devices[1], InjectFault(FaultKind.POISON, delay=0.3)).started()
    # rank 1 is busy failing: the collective waits for it, then aborts
    started = time.perf_counter()
    with pytest.raises(GpuRuntimeError) as raised:
        coll.all_reduce(bufs, timeout_secs=10)
    assert isinstance(raised.value, ContextPoisoned | CollectiveAborted), raised.value
    assert time.perf_counter() - started < 5
    poison.join(10)
    assert isinstance(poison.raised, ContextPoisoned), poison.raised
    serves_again(coll, devices, xs)  # rank 1's buffers died with its context
    stats = coll.stats()
    assert stats.status == "ready" and stats.aborted >= 1 and stats.rebuilds >= 1


def test_a_blocking_collective_past_its_time_out_is_aborted_typed(
        world: tuple[list[Device], Collective]) -> None:
    devices, coll = world
    rng = np.random.default_rng(41)
    xs = [rng.standard_normal(8) for _ in devices]
    bufs = uploaded(devices, xs)
    busy = Busy(devices[1], InjectFault(FaultKind.OOM, delay=1.0)).started()
    started = time.perf_counter()
    with pytest.raises(CollectiveAborted):
        coll.all_reduce(bufs, timeout_secs=0.3)
    assert time.perf_counter() - started < 0.9  # answered at its time-out, not after the op
    busy.join(10)
    assert isinstance(busy.raised, GpuRuntimeError), busy.raised
    coll.all_reduce(bufs, timeout_secs=10)
    check_sum(devices, bufs, xs)
    settled(devices)


def test_a_killed_worker_mid_collective_ends_the_blocking_call_typed() -> None:
    rng = np.random.default_rng(43)
    with System.open("t", op_timeout=20) as system:
        devices = [system.spawn_device(device_id=i, mock=True, isolation="process")
                   for i in range(2)]
        coll = system.nccl_world(devices)
        pid = devices[1].stats().host_pid
        assert pid is not None
        xs = [rng.standard_normal(64) for _ in devices]
        bufs = uploaded(devices, xs)
        timer = threading.Timer(0.3, os.kill, (pid, signal.SIGKILL))
        busy = Busy(devices[1], InjectFault(FaultKind.OOM, delay=2.0)).started()
        timer.start()
        started = time.perf_counter()
        with pytest.raises(GpuRuntimeError) as raised:
            coll.all_reduce(bufs, timeout_secs=10)
        assert isinstance(raised.value, ContextPoisoned | CollectiveAborted), raised.value
        assert time.perf_counter() - started < 5
        busy.join(10)
        assert isinstance(busy.raised, GpuRuntimeError), busy.raised
        serves_again(coll, devices, xs)
        assert devices[1].stats().host_pid not in (None, pid)


class Interrupted(Exception):
    pass


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs SIGUSR1")
def test_an_interrupted_blocking_collective_raises_unchanged_and_the_world_recovers(
        world: tuple[list[Device], Collective]) -> None:
    devices, coll = world
    rng = np.random.default_rng(47)
    xs = [rng.standard_normal(8) for _ in devices]
    bufs = uploaded(devices, xs)
    busy = Busy(devices[1], InjectFault(FaultKind.OOM, delay=0.6)).started()

    alarms = Alarms(Interrupted)
    previous = signal.signal(signal.SIGUSR1, alarms)  # pytest-timeout holds SIGALRM
    try:
        alarms.send(0.2)
        with pytest.raises(Interrupted):
            coll.all_reduce(bufs, timeout_secs=10)  # waits for rank 1 while it lands
    finally:
        alarms.join()
        signal.signal(signal.SIGUSR1, previous)
    busy.join(10)
    assert isinstance(busy.raised, GpuRuntimeError), busy.raised
    serves_again(coll, devices, xs)
    assert coll.stats().aborted >= 1
    settled(devices)


def test_a_collective_right_after_an_aborted_epoch_waits_for_the_rebuild(
        world: tuple[list[Device], Collective]) -> None:
    """A caller that sees a rank fail, or is interrupted, aborts the epoch at once and tells
    the world's actor, which rebuilds a moment later; the next call waits for that rebuild
    instead of launching on the aborted epoch (whose ranks abort at once), and it asks for
    the rebuild itself where the telling never came (an interrupt landed before it)."""
    devices, coll = world
    rng = np.random.default_rng(53)
    for _ in range(3):
        epoch = coll.epoch
        coll._state.failed(epoch)  # as an interrupted caller does, without its telling
        xs = [rng.standard_normal(8) for _ in devices]
        serves_again(coll, devices, xs)
        assert coll.epoch > epoch
    settled(devices)


@pytest.mark.serial  # it counts shared-memory segments: alone, not beside the parallel suite
@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs setitimer")
@pytest.mark.filterwarnings("ignore:coroutine '.*' was never awaited:RuntimeWarning")
# Python swallows (and reports) a handler's exception that lands inside a garbage
# collection callback, such as asyncio's WeakSet of tasks when a task of a collective
# that waited for the world is freed on this thread (see docs/devices.md): not the subject.
@pytest.mark.filterwarnings("ignore:Exception ignored in:pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_storm_of_interrupted_collectives_leaves_the_world_serving_and_nothing_behind(
        isolation: str) -> None:
    """Thousands of blocking all_reduces, one at a time, each interrupted at whatever
    bytecode it had reached by a signal handler's exception: each ends with that exception
    or a typed error, the world serves again afterwards with the right sums, and no shared
    memory is left behind."""
    delays = iter(np.random.default_rng(53).uniform(2e-5, 6e-4, 1 << 16))
    counts = {"ok": 0, "interrupted": 0, "typed": 0}

    def arm() -> None:
        signal.setitimer(signal.ITIMER_PROF, float(next(delays)))

    def alarm(signum: int, frame: Any) -> None:
        while frame is not None:  # only inside the package
            if "atomr_accel" in frame.f_code.co_filename:
                raise Interrupted
            frame = frame.f_back
        arm()  # landed outside a call: again, soon

    with System.open("t", op_timeout=20) as system:
        devices = [system.spawn_device(device_id=i, mock=True, isolation=isolation)
                   for i in range(2)]
        coll = system.nccl_world(devices)
        bufs = [d.allocate_f64(4) for d in devices]
        stale = []  # kept until the storm is over: a buffer's finalizer swallows an interrupt
        previous = signal.signal(signal.SIGPROF, alarm)  # CPU time: pytest-timeout holds SIGALRM
        try:
            end = time.perf_counter() + 3.0
            while time.perf_counter() < end and counts["interrupted"] < 1000:
                try:
                    if signal.getitimer(signal.ITIMER_PROF)[0] == 0:
                        arm()
                    coll.all_reduce(bufs, timeout_secs=5)
                    counts["ok"] += 1
                except Interrupted:
                    counts["interrupted"] += 1
                except GpuRuntimeError:  # a rank was interrupted: the world rebuilt
                    counts["typed"] += 1
                    signal.setitimer(signal.ITIMER_PROF, 0, 0)  # new buffers, in peace
                    stale.append(bufs)
                    bufs = [d.allocate_f64(4) for d in devices]
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0, 0)
            signal.signal(signal.SIGPROF, previous)
        del stale
        rng = np.random.default_rng(59)
        xs = [rng.standard_normal(16) for _ in devices]
        serves_again(coll, devices, xs, timeout=20)
    assert counts["interrupted"] > 50 and counts["ok"] > 50, counts
    assert live_segments() == []
