"""The one twin rule of the blueprints: every client operation is ``name_async`` and a
blocking twin, both taking ``timeout_secs``; the serving clients keep their old async names."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import numpy as np
import pytest

from atomr_accel import InvalidArgument, System, blueprint
from atomr_accel.actor import ActorSystem, AskTimeout, Props
from atomr_accel.blueprint import BlueprintActor, BlueprintClient, twin
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

SERVING = (DynamicBatchingServer, InferenceCascade, ModelReplicaPool, FairShareScheduler,
           ModelHotSwapServer, SpeculativeDecoder, MoeRouter)


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("blueprint-twins") as opened:
        yield opened


async def double(items: list[int]) -> list[int]:
    return [2 * i for i in items]


def test_every_serving_operation_has_an_async_form_a_blocking_twin_and_timeout_secs() -> None:
    for cls in SERVING:
        forms = [n for n, m in vars(cls).items() if n.endswith("_async") and callable(m)]
        assert "stats_async" in forms, cls.__name__
        for form in forms:
            name = form.removesuffix("_async")
            assert "timeout_secs" in inspect.signature(getattr(cls, form)).parameters
            assert getattr(cls, f"{name}_blocking").__name__ == f"{name}_blocking"
            assert callable(getattr(cls, name))  # the old async name


def test_blocking_twins_block_and_take_timeout_secs(system: System) -> None:
    server = DynamicBatchingServer.spawn(system, double, max_batch=2, max_wait=0.01)
    assert server.submit_blocking(21, timeout_secs=5) == 42
    assert server.stats_blocking(timeout_secs=5).completed == 1
    pool = ModelReplicaPool.spawn(system, [lambda x: x + 1, lambda x: x + 2])
    assert pool.call_blocking(1, timeout_secs=5) in (2, 3)
    cascade = InferenceCascade.spawn(system, [Stage(lambda x: (x, 1.0))])
    assert cascade.infer_blocking("a").answer == "a"
    router = MoeRouter.spawn(system, lambda rows: np.ones((len(rows), 1)), [lambda r: r * 3],
                             top_k=1)
    np.testing.assert_allclose(router.route_blocking(np.array([1.0, 2.0])), [3.0, 6.0])
    hot = ModelHotSwapServer.spawn(system, lambda x: x)
    assert hot.swap_blocking(lambda x: -x) == 2 and hot.infer_blocking(4) == -4
    assert hot.version_blocking() == 2


def test_old_names_still_return_coroutines_and_take_timeout_as_timeout_secs(
        system: System) -> None:
    server = DynamicBatchingServer.spawn(system, double, max_batch=1, max_wait=0.0)
    assert inspect.iscoroutinefunction(DynamicBatchingServer.submit)
    coro = server.submit(1, timeout=5)
    assert inspect.iscoroutine(coro)
    assert system._portal.call(coro) == 2
    with pytest.raises(InvalidArgument, match="not both"):
        system._portal.call(server.submit(1, timeout=5, timeout_secs=5))


def test_a_bad_timeout_secs_is_an_invalid_argument(system: System) -> None:
    server = DynamicBatchingServer.spawn(system, double, max_batch=1, max_wait=0.0)
    for bad in (0, -1.0, float("nan"), "5"):
        with pytest.raises(InvalidArgument):
            server.submit_blocking(1, timeout_secs=bad)


def test_a_slow_answer_past_timeout_secs_is_the_runtimes_ask_timeout(system: System) -> None:
    never = system._portal.loop.create_future

    async def stuck(items: list[int]) -> list[int]:
        await never()
        return items

    server = DynamicBatchingServer.spawn(system, stuck, max_batch=1, max_wait=0.0)
    with pytest.raises(AskTimeout):
        server.submit_blocking(1, timeout_secs=0.05)
    server.stop()


@pytest.mark.anyio
async def test_a_blocking_twin_in_a_bare_actor_system_is_refused_with_the_async_name() -> None:
    async with ActorSystem("bare") as actors:
        server = DynamicBatchingServer(actors.spawn(
            DynamicBatchingServer.props(double, max_batch=1, max_wait=0.0)))
        with pytest.raises(InvalidArgument, match="await submit_async"):
            server.submit_blocking(1)
        assert await server.submit_async(4, timeout_secs=5) == 8


class _Echo(BlueprintActor):
    async def handle(self, message: object) -> object:
        if message == "bad":
            raise InvalidArgument("bad message")
        return message


class _EchoClient(BlueprintClient):
    """A blueprint written on the base alone, as a new blueprint would be."""

    @classmethod
    def spawn(cls, system: System) -> _EchoClient:
        """Start one."""
        return cls._start(system, Props(_Echo), None)

    async def echo_async(self, value: object, timeout_secs: float = 5.0) -> object:
        """Answer ``value``."""
        return await self._call(value, timeout_secs, "echo")

    echo = twin(echo_async)


def test_a_new_blueprint_needs_only_the_base(system: System) -> None:
    client = _EchoClient.spawn(system)
    assert client.echo("hi") == "hi"
    with pytest.raises(InvalidArgument, match="bad message"):
        client.echo("bad")
    assert client.echo(3, timeout_secs=1) == 3  # the actor kept running
    assert "Blocking twin of ``echo_async``" in (_EchoClient.echo.__doc__ or "")
    assert set(blueprint.__all__) >= {"BlueprintActor", "BlueprintClient", "twin"}
