"""The caller's turn: a blocking call runs a blueprint actor's handler on the calling
thread while the actor is idle, with the mailbox's exclusion, errors and restarts."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any, Literal

import numpy as np
import pytest

from atomr_accel import (
    ContextPoisoned,
    FaultKind,
    GpuRefStale,
    InvalidArgument,
    System,
    Unrecoverable,
)
from atomr_accel.actor import Props
from atomr_accel.agents import CpuVectorIndex, EmbeddingCache, GpuVectorIndex
from atomr_accel.blueprint import TIMEOUT, BlueprintClient, TurnActor, Turns, twin
from atomr_accel.realtime import ParticleSystemActor
from atomr_accel.train import AsyncParameterServer

UNLUCKY = 13
"""The number whose addition is a bug in the tally (an untyped error: the actor restarts)."""
STALLED = 99
"""The number whose addition waits for ``GO``, then is a bug (after setting ``INSIDE``)."""
PAUSED = 98
"""The number whose addition waits for ``GO`` (after setting ``INSIDE``), then adds it."""
INSIDE = threading.Event()
GO = threading.Event()
STOPPED = threading.Event()
"""Set by a tally actor's ``post_stop`` once it has run."""


class _TallyActor(TurnActor):
    """A running total; answers ``(total, the thread that added)``."""

    def __init__(self, turns: Turns[_TallyActor]) -> None:
        super().__init__(turns)
        self.total = 0

    async def handle(self, message: int) -> tuple[int, str]:
        return await self.add(message)

    async def add(self, n: int) -> tuple[int, str]:
        if n < 0:
            raise InvalidArgument(f"cannot add {n}")
        if n == UNLUCKY:
            raise RuntimeError("a bug")
        if n in (STALLED, PAUSED):
            INSIDE.set()
            GO.wait(10)
            if n == STALLED:
                raise RuntimeError("a bug, late")
        total = self.total + n
        time.sleep(0)  # noqa: ASYNC251 - let other threads in between the read and the write
        self.total = total
        return total, threading.current_thread().name

    async def post_stop(self) -> None:
        await super().post_stop()
        STOPPED.set()


class Tally(BlueprintClient):
    """The tally's client: ``add`` takes the caller's turn when it can."""

    @classmethod
    def spawn(cls, system: System) -> Tally:
        turns: Turns[_TallyActor] = Turns()
        return cls._start(system, Props(_TallyActor, turns), None, turns)

    def add_async(self, n: int, timeout_secs: float = TIMEOUT,
                  ) -> Coroutine[Any, Any, tuple[int, str]]:
        return self._on_turn(n, timeout_secs, "add")

    add = twin(add_async)


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("turns") as opened:
        yield opened


def test_a_blocking_call_runs_on_the_calling_thread_an_awaited_one_on_the_actor(
        system: System) -> None:
    tally = Tally.spawn(system)
    assert tally.add(2) == (2, threading.current_thread().name)
    total, where = asyncio.run(tally.add_async(3))
    assert total == 5
    assert where != threading.current_thread().name  # the actor's, on the system's loop


def test_many_threads_and_awaited_calls_each_get_the_whole_state(system: System) -> None:
    tally = Tally.spawn(system)
    seen: list[int] = []
    lock = threading.Lock()

    def adder(calls: int) -> None:
        for _ in range(calls):
            total, _ = tally.add(1)
            with lock:
                seen.append(total)

    async def awaited(calls: int) -> None:
        for _ in range(calls):
            total, _ = await tally.add_async(1)
            with lock:
                seen.append(total)

    threads = [threading.Thread(target=adder, args=(150,), name=f"add-{i}") for i in range(8)]
    threads.append(threading.Thread(target=asyncio.run, args=(awaited(100),)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(seen) == list(range(1, 8 * 150 + 100 + 1))  # no total seen twice
    assert tally.add(0)[0] == 8 * 150 + 100


def test_a_typed_error_on_a_turn_fails_the_call_and_keeps_the_state(system: System) -> None:
    tally = Tally.spawn(system)
    tally.add(4)
    with pytest.raises(InvalidArgument):
        tally.add(-1)
    assert tally.add(1) == (5, threading.current_thread().name)


def test_a_bug_on_a_turn_restarts_the_actor_as_one_met_by_the_actor_does(
        system: System) -> None:
    tally = Tally.spawn(system)
    tally.add(7)
    with pytest.raises(RuntimeError, match="a bug") as awaited:
        asyncio.run(tally.add_async(UNLUCKY))
    assert tally.add(0)[0] == 0  # restarted: the initial state
    tally.add(7)
    with pytest.raises(RuntimeError, match="a bug") as blocking:
        tally.add(UNLUCKY)
    assert type(blocking.value) is type(awaited.value)
    assert tally.add(1)[0] == 1  # restarted before it took another call
    assert tally.add(1) == (2, threading.current_thread().name)  # and takes turns again


def test_a_call_waiting_behind_a_failing_turn_is_answered_by_the_next_incarnation(
        system: System) -> None:
    tally = Tally.spawn(system)
    tally.add(10)
    INSIDE.clear()
    GO.clear()
    failed: list[BaseException] = []

    def stalled() -> None:
        try:
            tally.add(STALLED)
        except RuntimeError as exc:
            failed.append(exc)

    turn = threading.Thread(target=stalled)
    turn.start()
    assert INSIDE.wait(10)  # the turn is under way on that thread
    answers: list[tuple[int, str]] = []
    waiting = threading.Thread(target=lambda: answers.append(asyncio.run(tally.add_async(5))))
    waiting.start()
    time.sleep(0.2)  # the awaited call reaches the actor, which waits for the turn
    GO.set()
    turn.join()
    waiting.join()
    assert [str(e) for e in failed] == ["a bug, late"]
    assert answers[0][0] == 5  # handled after the restart the failure called for
    assert tally.add(0)[0] == 5  # and its addition kept


def test_an_actor_stopped_during_a_turn_ends_after_it(system: System) -> None:
    tally = Tally.spawn(system)
    tally.add(1)
    INSIDE.clear()
    GO.clear()
    STOPPED.clear()
    answers: list[tuple[int, str]] = []
    turn = threading.Thread(target=lambda: answers.append(tally.add(PAUSED)))
    turn.start()
    assert INSIDE.wait(10)  # the turn is under way on that thread
    tally.stop()
    assert not STOPPED.wait(0.3)  # the actor's stop waits for the turn
    GO.set()
    turn.join()
    assert answers == [(1 + PAUSED, turn.name)]  # the turn finished on its thread
    assert STOPPED.wait(10)  # and then the actor stopped
    with pytest.raises(Unrecoverable):
        tally.add(1)


def test_no_turn_is_taken_on_a_stopped_actor(system: System) -> None:
    tally = Tally.spawn(system)
    tally.add(1)
    tally.stop()
    with pytest.raises(Unrecoverable):
        tally.add(1)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_particles_stepped_and_emitted_from_many_threads_stay_whole(
        system: System, isolation: Literal["thread", "process"]) -> None:
    device = system.spawn_device(mock=True, isolation=isolation)
    particles = ParticleSystemActor.spawn(system, gravity_y=0.0, device=device, ground_y=-1e9)
    rng = np.random.default_rng(3)
    batches = [rng.standard_normal((5, 3)).astype(np.float32) for _ in range(8 * 20)]

    def emitter(first: int) -> None:
        for batch in batches[first::8]:
            particles.emit(batch, np.zeros_like(batch))
            particles.step(0.01)  # at rest, no gravity, no ground in reach: they stay

    threads = [threading.Thread(target=emitter, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert particles.live_count() == 5 * len(batches)
    got = particles.positions()
    expected = np.concatenate(batches).astype(np.float64)
    order = np.lexsort(got.T.astype(np.float64))
    np.testing.assert_allclose(got[order], expected[np.lexsort(expected.T)], rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["cpu", "device"])
def test_an_index_changed_from_many_threads_while_searched_holds_every_vector(
        system: System, kind: str) -> None:
    if kind == "cpu":
        index: Any = CpuVectorIndex.spawn(system, 16, metric="ip")
    else:
        index = GpuVectorIndex.spawn(system, system.spawn_device(mock=True), 16, metric="ip")
    rng = np.random.default_rng(11)
    vectors = rng.standard_normal((8 * 30, 16))
    failures: list[BaseException] = []

    def inserter(first: int) -> None:
        for row in range(first, len(vectors), 8):
            index.insert(row, vectors[row])
            if row % 3 == 0:
                index.remove(row)
                index.insert(row, vectors[row])

    def searcher() -> None:
        try:
            for row in range(60):
                found = index.search(vectors[row], 1)
                assert len(found) <= 1
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=inserter, args=(i,)) for i in range(8)]
    threads.append(threading.Thread(target=searcher))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert index.count() == len(vectors)
    for row in range(len(vectors)):  # each vector is its own best match by inner product
        best = vectors @ vectors[row]
        assert index.search(vectors[row], 1)[0][0] == int(np.argmax(best))


def test_an_embedding_cache_used_from_many_threads_counts_every_call(system: System) -> None:
    cache = EmbeddingCache.spawn(system, 64, 4)
    rows = {f"k{i}": np.arange(4, dtype=np.float32) + i for i in range(40)}

    def user(first: int) -> None:
        for i in range(first, 40, 8):
            assert cache.get(f"k{i}") is None
            cache.insert(f"k{i}", rows[f"k{i}"])
            assert cache.get(f"k{i}") == rows[f"k{i}"].tolist()

    threads = [threading.Thread(target=user, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["inserts"], stats["entries"]) == (40, 40, 40, 40)


def test_a_parameter_server_pushed_and_pulled_from_many_threads_counts_every_call(
        system: System) -> None:
    device = system.spawn_device(mock=True)
    server = AsyncParameterServer.spawn(system, np.zeros(64, np.float32), lr=1.0,
                                        max_staleness=10_000, device=device)
    gradient = np.ones(64, np.float32)
    versions: list[int] = []
    lock = threading.Lock()

    def worker(worker_id: int) -> None:
        for _ in range(25):
            _, version = server.pull_weights(worker_id)
            new = server.push_gradient(worker_id, version, gradient)
            with lock:
                versions.append(new)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(versions) == list(range(1, 8 * 25 + 1))  # each push saw its own version
    counters = server.counters()
    assert (counters.version, counters.gradients_applied, counters.weights_pulled) == (
        200, 200, 200)
    weights, version = server.pull_weights(0)
    assert version == 200
    assert np.all(np.asarray(weights) < 0)  # every push moved the weights down


def test_a_context_poisoned_under_blocking_callers_restarts_the_actor_once_and_serves_on(
        system: System) -> None:
    device = system.spawn_device(mock=True)
    particles = ParticleSystemActor.spawn(system, gravity_y=0.0, device=device, ground_y=-1e9)
    particles.emit(np.ones((4, 3)), np.zeros((4, 3)))
    seen: list[list[object]] = [[] for _ in range(4)]  # each thread's results, in order
    done = threading.Event()

    def stepper(mine: list[object]) -> None:
        while not done.is_set():
            try:
                mine.append(particles.step(0.01))
            except (GpuRefStale, ContextPoisoned) as exc:  # the poisoning caught a step
                mine.append(exc)

    threads = [threading.Thread(target=stepper, args=(mine,)) for mine in seen]
    for thread in threads:
        thread.start()
    while sum(map(len, seen)) < 20:
        time.sleep(0.001)
    with pytest.raises(ContextPoisoned):
        device.inject_fault(FaultKind.POISON)
    before = sum(map(len, seen))
    while sum(map(len, seen)) < before + 40:
        time.sleep(0.001)
    done.set()
    for thread in threads:
        thread.join()
    results = [r for mine in seen for r in mine]
    assert sum(isinstance(r, GpuRefStale) for r in results) == 1  # the actor restarted once
    assert sum(isinstance(r, ContextPoisoned) for r in results) <= 1  # the one in flight
    for mine in seen:  # 4 particles, then (past the restart) the initial, empty state
        counts = [r for r in mine if isinstance(r, int)]
        assert set(counts) <= {0, 4}
        assert counts == sorted(counts, reverse=True)
    assert particles.emit(np.ones((2, 3)), np.zeros((2, 3))) == 2
    assert particles.step(0.01) == 2
