"""ModelHotSwapServer: zero failed requests across swaps, draining, versions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from atomr_accel import ActorStopped, InvalidArgument
from atomr_accel.actor import ActorSystem
from atomr_accel.patterns import ModelHotSwapServer

pytestmark = pytest.mark.anyio


class Model:
    """Answers ``(tag, x)``; ``hold`` keeps calls open until ``release``; records ``close``."""

    def __init__(self, tag: str, hold: bool = False) -> None:
        self.tag = tag
        self.release = asyncio.Event()
        if not hold:
            self.release.set()
        self.in_call = 0
        self.entered = asyncio.Event()
        self.closed = 0
        self.calls_after_close = 0

    async def __call__(self, x: Any) -> tuple[str, Any]:
        if self.closed:
            self.calls_after_close += 1
        self.in_call += 1
        self.entered.set()
        await self.release.wait()
        self.in_call -= 1
        return self.tag, x

    async def close(self) -> None:
        assert self.in_call == 0, "closed while a call was still running on it"
        self.closed += 1


async def test_version_starts_at_one_and_counts_swaps() -> None:
    async with ActorSystem("t") as system:
        server = ModelHotSwapServer.spawn(system, Model("v1"))
        assert await server.version() == 1
        assert await server.infer(3) == ("v1", 3)
        assert await server.swap(Model("v2")) == 2
        assert await server.version() == 2
        assert await server.infer(4) == ("v2", 4)


async def test_in_flight_work_on_the_old_model_drains_before_it_is_released() -> None:
    old, new = Model("old", hold=True), Model("new")
    async with ActorSystem("t") as system:
        server = ModelHotSwapServer.spawn(system, old)
        held = [asyncio.ensure_future(server.infer(i)) for i in range(3)]
        async with asyncio.timeout(10):
            while old.in_call < 3:
                await old.entered.wait()
                old.entered.clear()
        swap = asyncio.ensure_future(server.swap(new))
        await asyncio.sleep(0)  # the swap is in the mailbox
        assert await server.infer("after") == ("new", "after")  # new requests: new model
        stats = await server.stats()
        assert stats.version == 2 and stats.draining == (1,)
        assert not swap.done() and old.closed == 0  # the old one still has 3 calls
        old.release.set()
        assert await asyncio.gather(*held) == [("old", 0), ("old", 1), ("old", 2)]
        assert await swap == 2
        assert old.closed == 1 and new.closed == 0
        assert (await server.stats()).draining == ()


async def test_swapping_under_concurrent_load_fails_no_request() -> None:
    models = [Model(f"v{i}") for i in range(1, 7)]
    results: list[tuple[str, int]] = []
    stop = asyncio.Event()

    async def client(cid: int) -> None:
        n = 0
        while not stop.is_set():
            tag, x = await server.infer(cid * 100_000 + n)
            assert x == cid * 100_000 + n
            results.append((tag, x))
            n += 1

    async with ActorSystem("t") as system:
        server = ModelHotSwapServer.spawn(system, models[0])
        clients = [asyncio.ensure_future(client(c)) for c in range(8)]
        for i, model in enumerate(models[1:], start=2):
            await asyncio.sleep(0.005)  # let load build up on the current model
            assert await server.swap(model) == i
            tag, _ = await server.infer(-1)
            assert tag == model.tag  # a request after the swap never sees an older model
        stop.set()
        await asyncio.gather(*clients)  # any failed request would raise here
        stats = await server.stats()
        assert stats.failed == 0 and stats.served == len(results) + len(models) - 1
        assert {tag for tag, _ in results} >= {"v1", "v6"}
        assert [m.closed for m in models] == [1, 1, 1, 1, 1, 0]
        assert sum(m.calls_after_close for m in models) == 0


async def test_model_errors_reach_the_caller_and_count_as_failed() -> None:
    def model(x: int) -> int:
        if x < 0:
            raise ValueError("negative")
        return x * 2

    async with ActorSystem("t") as system:
        server = ModelHotSwapServer.spawn(system, model)
        with pytest.raises(ValueError):
            await server.infer(-1)
        assert await server.infer(2) == 4
        stats = await server.stats()
        assert (stats.served, stats.failed) == (1, 1)
        with pytest.raises(InvalidArgument):
            await server.swap("not a model")  # type: ignore[arg-type]


async def test_stopping_fails_running_calls_and_closes_the_models() -> None:
    old = Model("old", hold=True)
    async with ActorSystem("t") as system:
        server = ModelHotSwapServer.spawn(system, old)
        held = asyncio.ensure_future(server.infer(1))
        await old.entered.wait()
        swap = asyncio.ensure_future(server.swap(new := Model("new")))
        await asyncio.sleep(0)
        await server.stats()
        server.stop()
        for pending in (held, swap):
            with pytest.raises(ActorStopped):
                await pending
    assert new.closed == 1
