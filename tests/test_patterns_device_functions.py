"""Every serving blueprint takes a ``DeviceFunction`` wherever it takes a model, and runs
it inside the device's context (the worker process on the process host), not on a thread
of the caller; a batch one of whose requests kills the context loses only that request."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from atomr_accel import ContextPoisoned, System, WorkerLost
from atomr_accel.facade import Device
from atomr_accel.patterns import (
    DynamicBatchingServer,
    FairShareScheduler,
    InferenceCascade,
    ModelHotSwapServer,
    ModelReplicaPool,
    MoeRouter,
    SpeculativeDecoder,
    Stage,
)

pytestmark = pytest.mark.anyio

Ask = Callable[[], Awaitable[Any]]
"""One request to a blueprint; its answer holds the pid of the process that computed it."""


def doubled(x: int) -> tuple[int, int]:
    return x * 2, os.getpid()


async def batching(system: System, dev: Device) -> Ask:
    server = DynamicBatchingServer.spawn(
        system, dev.function(lambda items: [doubled(x) for x in items]),
        max_batch=4, max_wait=0.001)
    return lambda: server.submit(3, timeout=30)


async def fair_share(system: System, dev: Device) -> Ask:
    fair = FairShareScheduler.spawn(system, dev.function(doubled), weights={"a": 1},
                                    max_in_flight=1)
    return lambda: fair.submit("a", 3, timeout=30)


async def hot_swap(system: System, dev: Device) -> Ask:
    hot = ModelHotSwapServer.spawn(system, dev.function(lambda x: (-1, 0)))
    await hot.swap(dev.function(doubled), timeout=30)
    return lambda: hot.infer(3, timeout=30)


async def cascade(system: System, dev: Device) -> Ask:
    server = InferenceCascade.spawn(system, [Stage(dev.function(lambda x: (doubled(x), 1.0)))])

    async def ask() -> Any:
        return (await server.infer(3, timeout=30)).answer

    return ask


async def replica_pool(system: System, dev: Device) -> Ask:
    pool = ModelReplicaPool.spawn(system, [dev.function(doubled), dev.function(doubled)])
    return lambda: pool.call(3, timeout=30)


async def speculative(system: System, dev: Device) -> Ask:
    def draft(context: tuple[int, ...], n: int) -> list[int]:
        return [os.getpid()] * n

    def verifier(context: tuple[int, ...], proposal: tuple[int, ...]) -> list[int]:
        return [os.getpid()] * (len(proposal) + 1)

    decoder = SpeculativeDecoder.spawn(system, dev.function(draft), dev.function(verifier),
                                       k=2, max_tokens=4)

    async def ask() -> Any:
        tokens = (await decoder.generate([1], timeout=30)).tokens
        assert len(set(tokens)) == 1 and len(tokens) == 4
        return 6, tokens[0]

    return ask


async def moe(system: System, dev: Device) -> Ask:
    def gate(xs: Any) -> Any:
        return np.ones((len(xs), 2)) * os.getpid()

    def expert(xs: Any) -> Any:
        return xs * 0 + os.getpid()

    router = MoeRouter.spawn(system, dev.function(gate), [dev.function(expert)] * 2, top_k=1)

    async def ask() -> Any:
        out = (await router.route(np.ones(3), timeout=30)).tolist()
        assert len(set(out)) == 1
        return 6, int(out[0])

    return ask


BLUEPRINTS = [batching, fair_share, hot_swap, cascade, replica_pool, speculative, moe]


@pytest.mark.parametrize("build", BLUEPRINTS, ids=lambda b: b.__name__)
async def test_a_blueprint_runs_its_device_function_inside_the_worker(
        build: Callable[[System, Device], Awaitable[Ask]]) -> None:
    async with await System.open_async("blueprints") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process")
        worker = (await dev.stats_async()).host_pid
        assert worker is not None and worker != os.getpid()
        ask = await build(system, dev)
        for _ in range(2):
            assert tuple(await ask()) == (6, worker)


def poisoned_by_negatives(items: list[int]) -> list[int]:
    """A model whose bad input (a negative number) kills the process it runs in, as a
    sticky CUDA fault takes a context down."""
    if any(x < 0 for x in items):
        os.kill(os.getpid(), signal.SIGKILL)
    return [x * 2 for x in items]


@pytest.mark.parametrize("standby", [0, 1])
async def test_a_request_that_kills_the_context_fails_alone_its_batch_mates_are_answered(
        standby: int) -> None:
    async with await System.open_async("isolate") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process", standby=standby,
                                              max_restarts=10)
        server = DynamicBatchingServer.spawn(system, dev.function(poisoned_by_negatives),
                                             max_batch=10, max_wait=0.2)
        items = [3, 1, 4, 1, -5, 9, 2, 6, 5, 3]
        answers = await asyncio.gather(*(server.submit(x, timeout=60) for x in items),
                                       return_exceptions=True)
        for x, answer in zip(items, answers, strict=True):
            if x < 0:
                assert isinstance(answer, WorkerLost), answer
                assert isinstance(answer, ContextPoisoned)
            else:
                assert answer == x * 2
        stats = await server.stats()
        assert (stats.completed, stats.failed) == (9, 1)
        assert (await dev.stats_async()).restarts == 3  # the batch, its group, itself
        assert await server.submit(21, timeout=60) == 42  # serving again


async def test_an_error_of_the_model_still_fails_the_whole_batch_without_isolating() -> None:
    async with await System.open_async("isolate") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process")

        def picky(items: list[int]) -> list[int]:
            if 0 in items:
                raise ValueError("no zeros")
            return items

        server = DynamicBatchingServer.spawn(system, dev.function(picky), max_batch=3,
                                             max_wait=0.2)
        answers = await asyncio.gather(*(server.submit(x, timeout=30) for x in (1, 0, 2)),
                                       return_exceptions=True)
        assert all(type(a).__name__ == "FunctionFailed" for a in answers), answers
        assert "no zeros" in str(answers[0])
        assert (await dev.stats_async()).restarts == 0


async def test_a_partial_of_a_device_function_binds_a_resident_and_still_isolates() -> None:
    async with await System.open_async("isolate") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process", max_restarts=10)
        offset = await dev.resident_async(lambda: 100, name="offset")

        def model(base: int, items: list[int]) -> list[int]:
            return [base + x for x in poisoned_by_negatives(items)]

        server = DynamicBatchingServer.spawn(
            system, functools.partial(dev.function(model), offset), max_batch=4, max_wait=0.2)
        answers = await asyncio.gather(*(server.submit(x, timeout=60) for x in (1, -1, 2, 3)),
                                       return_exceptions=True)
        assert answers[0] == 102 and answers[2:] == [104, 106]
        assert isinstance(answers[1], WorkerLost)


def sticky_poisoned_by_negatives(items: list[int]) -> list[int]:
    """A model whose bad input poisons the context as a sticky CUDA fault does: its own call
    and every later one on that context fail with ``ContextPoisoned`` (the worker lives on
    until it is replaced). Each call takes long enough that two batches overlap."""
    time.sleep(0.05)
    if any(x < 0 for x in items):
        raise ContextPoisoned("an illegal address (as CUDA error 700 would say)")
    return [x * 2 for x in items]


async def test_with_two_batches_in_flight_only_the_request_that_kills_the_context_fails(
        ) -> None:
    """The batch in flight beside the one that took the context down fails with it, though
    none of its requests did it: its requests are run again, not failed, and the search
    for the culprit runs alone, so no innocent request of another batch is lost."""
    async with await System.open_async("isolate") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process", max_restarts=30)
        server = DynamicBatchingServer.spawn(
            system, dev.function(sticky_poisoned_by_negatives), max_batch=4, max_wait=0.01,
            max_concurrent_batches=2)
        items = [3, 1, -4, 1, 5, 9, 2, -6, 5, 3, 5, 8, 9, 7, -9, 3]
        answers = await asyncio.gather(*(server.submit(x, timeout=120) for x in items),
                                       return_exceptions=True)
        for x, answer in zip(items, answers, strict=True):
            if x < 0:
                assert isinstance(answer, ContextPoisoned), answer
            else:
                assert answer == x * 2, (x, answer)
        stats = await server.stats()
        assert (stats.completed, stats.failed) == (13, 3)
        assert await server.submit(21, timeout=60) == 42


def slowly_doubled(items: list[int]) -> list[int]:
    time.sleep(0.2)
    return [x * 2 for x in items]


@pytest.mark.parametrize("in_context", [True, False])
async def test_a_device_function_gets_two_batches_in_flight_by_default_a_plain_callable_one(
        in_context: bool) -> None:
    async with await System.open_async("in-flight") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process")
        model = dev.function(slowly_doubled) if in_context else slowly_doubled
        server = DynamicBatchingServer.spawn(system, model, max_batch=2, max_wait=0.001)
        calls = [asyncio.ensure_future(server.submit(x, timeout=30)) for x in range(8)]
        most = 0
        while not all(call.done() for call in calls):
            most = max(most, (await server.stats()).running_batches)
            await asyncio.sleep(0.01)
        assert [call.result() for call in calls] == [x * 2 for x in range(8)]
        assert most == (2 if in_context else 1)
