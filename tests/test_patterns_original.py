"""The blueprints with a facade ``System``: their own (callable) forms from any event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import System
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


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("patterns-original") as opened:
        yield opened


# ------------------------------------------- the callable forms on a blocking System


def test_batching_with_a_callable_on_a_blocking_system(system: System) -> None:
    async def double(items: list[int]) -> list[int]:
        return [2 * i for i in items]

    server = DynamicBatchingServer.spawn(system, double, max_batch=4, max_wait=0.005)

    async def main() -> list[int]:  # a loop of the caller's own, not the system's
        return list(await asyncio.gather(*(server.submit(i) for i in range(10))))

    assert asyncio.run(main()) == [2 * i for i in range(10)]
    assert asyncio.run(server.stats()).completed == 10


def test_cascade_with_stages_on_a_blocking_system(system: System) -> None:
    def small(x: int) -> tuple[str, float]:
        return "small", 0.95 if x < 5 else 0.1

    cascade = InferenceCascade.spawn(system, [Stage(small, threshold=0.9),
                                              Stage(lambda x: ("large", 0.6))])
    low, high = asyncio.run(cascade.infer(1)), asyncio.run(cascade.infer(9))
    assert (low.answer, low.stage) == ("small", 0)
    assert (high.answer, high.stage, high.confidence) == ("large", 1, 0.6)


def test_pool_with_replicas_on_a_blocking_system(system: System) -> None:
    pool = ModelReplicaPool.spawn(system, [lambda x: ("a", x), lambda x: ("b", x)])

    async def main() -> list[tuple[str, int]]:
        return [await pool.call(i) for i in range(4)]

    assert asyncio.run(main()) == [("a", 0), ("b", 1), ("a", 2), ("b", 3)]


def test_scheduler_with_a_callable_on_a_blocking_system(system: System) -> None:
    async def square(x: int) -> int:
        return x * x

    scheduler = FairShareScheduler.spawn(system, square, weights={"gold": 3, "free": 1},
                                         max_in_flight=2)

    async def main() -> list[int]:
        return list(await asyncio.gather(scheduler.submit("gold", 3),
                                         scheduler.submit("free", 4, cost=2.0)))

    assert asyncio.run(main()) == [9, 16]


def test_hot_swap_with_models_on_a_blocking_system(system: System) -> None:
    server = ModelHotSwapServer.spawn(system, lambda x: ("v1", x))

    async def main() -> tuple[Any, int, Any]:
        before = await server.infer(1)
        version = await server.swap(lambda x: ("v2", x))
        return before, version, await server.infer(2)

    assert asyncio.run(main()) == (("v1", 1), 2, ("v2", 2))


def test_decoder_with_draft_and_verifier_on_a_blocking_system(system: System) -> None:
    def draft(context: tuple[int, ...], n: int) -> list[int]:
        return [context[-1] + 1 + i for i in range(n)]

    def verifier(context: tuple[int, ...], proposal: tuple[int, ...]) -> list[int]:
        seq = [*context, *proposal]
        return [seq[len(context) + i - 1] + 1 for i in range(len(proposal) + 1)]

    decoder = SpeculativeDecoder.spawn(system, draft, verifier, k=3, max_tokens=7)
    out = asyncio.run(decoder.generate([10]))
    assert out.tokens == tuple(range(11, 18)) and out.accepted == out.drafted


def test_router_with_gate_and_experts_on_a_blocking_system(system: System) -> None:
    router = MoeRouter.spawn(system, lambda xs: np.tile([0.0, 5.0], (len(xs), 1)),
                             [lambda rows: rows * 10, lambda rows: rows + 1], top_k=1)
    np.testing.assert_allclose(asyncio.run(router.route(np.array([1.0, 2.0]))), [2.0, 3.0])


def test_a_callable_form_on_the_systems_own_loop() -> None:
    async def main() -> list[int]:
        async with await System.open_async("own-loop") as system:
            server = DynamicBatchingServer.spawn(system, lambda xs: [x + 1 for x in xs],
                                                 max_batch=2, max_wait=0.005)
            return list(await asyncio.gather(*(server.submit(i) for i in range(3))))

    assert asyncio.run(main()) == [1, 2, 3]
