"""User code may raise any ``BaseException``; the runtime outlives it.

A model, batch function, stage, sink, graph node, router, fenced call or actor
handler that raises ``SystemExit``, ``KeyboardInterrupt`` or a ``CancelledError``
of its own (an inner task it awaited was cancelled) fails only the request it
served, with a ``UserCodeError`` (a ``GpuRuntimeError``) that names and chains
it: the blueprint gives its slot back and serves the next request, a stream's
``run`` fails instead of hanging, and the system's loop thread lives on.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from atomr_accel import GpuRuntimeError, System, UserCodeError, actor
from atomr_accel.actor import Actor, ActorSystem, Directive, OneForOneStrategy, Props
from atomr_accel.agents import (
    CpuVectorIndex,
    EmbeddingCache,
    Graph,
    LangGraphGpuActor,
    RagPipeline,
    SharedGpuStateCoordinator,
)
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
from atomr_accel.streams import Pipeline, Sink, Source, stage

pytestmark = pytest.mark.anyio

RAISED: dict[str, type[BaseException]] = {
    "cancelled": asyncio.CancelledError, "exit": SystemExit, "interrupt": KeyboardInterrupt}


async def _raise(kind: str) -> None:
    """Raise what user code of ``kind`` raises, as a user's code would."""
    if kind == "cancelled":  # an inner task it awaited was cancelled
        inner = asyncio.ensure_future(asyncio.sleep(10))
        inner.cancel()
        await inner
    raise RAISED[kind]("from user code")


class Once:
    """User code that raises ``kind`` on call number ``fail_on``, and is ``fn`` otherwise."""

    def __init__(self, kind: str, fn: Callable[..., Any], fail_on: int = 1) -> None:
        self.kind, self.fn, self.fail_on, self.calls = kind, fn, fail_on, 0

    async def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if self.calls == self.fail_on:
            await _raise(self.kind)
        return self.fn(*args)


class SyncOnce(Once):
    """``Once`` as a plain function (run on a worker thread by the blueprints)."""

    def __call__(self, *args: Any) -> Any:  # type: ignore[override]
        self.calls += 1
        if self.calls == self.fail_on:
            if self.kind == "cancelled":
                raise asyncio.CancelledError("from user code")
            raise RAISED[self.kind]("from user code")
        return self.fn(*args)


def caused_by(error: BaseException, kind: str) -> bool:
    """Whether ``error`` (a typed error) is, or was caused by, a ``UserCodeError`` holding
    what user code of ``kind`` raised."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, UserCodeError):
            return isinstance(seen.cause, RAISED[kind]) and seen.__cause__ is seen.cause \
                and type(seen.cause).__name__ in str(seen)
        seen = seen.__cause__
    return False


Wrap = Callable[[Callable[..., Any]], Any]
Ask = Callable[[], Awaitable[Any]]


async def batching(system: System, wrap: Wrap) -> tuple[Ask, Any]:
    server = DynamicBatchingServer.spawn(system, wrap(lambda items: [x * 2 for x in items]),
                                         max_batch=4, max_wait=0.001)
    return lambda: server.submit(3, timeout=5), 6


async def fair_share(system: System, wrap: Wrap) -> tuple[Ask, Any]:
    fair = FairShareScheduler.spawn(system, wrap(lambda x: x * 2), weights={"a": 1},
                                    max_in_flight=1)
    return lambda: fair.submit("a", 3, timeout=5), 6


async def hot_swap(system: System, wrap: Wrap) -> tuple[Ask, Any]:
    hot = ModelHotSwapServer.spawn(system, wrap(lambda x: x * 2))

    async def ask() -> Any:
        result = await hot.infer(3, timeout=5)
        await hot.swap(lambda x: x * 2, timeout=5)  # the old model drains at once
        assert (await hot.stats()).draining == ()
        return result

    return ask, 6


async def cascade(system: System, wrap: Wrap) -> tuple[Ask, Any]:
    server = InferenceCascade.spawn(system, [Stage(wrap(lambda x: (x * 2, 1.0)))])

    async def ask() -> Any:
        return (await server.infer(3, timeout=5)).answer

    return ask, 6


async def replica_pool(system: System, wrap: Wrap) -> tuple[Ask, Any]:
    pool = ModelReplicaPool.spawn(system, [wrap(lambda x: x * 2)])
    return lambda: pool.call(3, timeout=5), 6


def speculative(role: str) -> Callable[[System, Wrap], Awaitable[tuple[Ask, Any]]]:
    async def build(system: System, wrap: Wrap) -> tuple[Ask, Any]:
        def draft(context: tuple[int, ...], n: int) -> list[int]:
            return [7] * n

        def verifier(context: tuple[int, ...], proposal: tuple[int, ...]) -> list[int]:
            return [7] * (len(proposal) + 1)

        decoder = SpeculativeDecoder.spawn(
            system, wrap(draft) if role == "draft" else draft,
            wrap(verifier) if role == "verifier" else verifier, k=2, max_tokens=4)

        async def ask() -> Any:
            return (await decoder.generate([1], timeout=5)).tokens

        return ask, (7, 7, 7, 7)

    return build


def moe(role: str) -> Callable[[System, Wrap], Awaitable[tuple[Ask, Any]]]:
    async def build(system: System, wrap: Wrap) -> tuple[Ask, Any]:
        def gate(xs: Any) -> Any:
            return np.ones((len(xs), 2))

        def expert(xs: Any) -> Any:
            return xs * 2

        router = MoeRouter.spawn(system, wrap(gate) if role == "gate" else gate,
                                 [wrap(expert) if role == "expert" else expert] * 2, top_k=1)

        async def ask() -> Any:
            return (await router.route(np.ones(3), timeout=5)).tolist()

        return ask, [2.0, 2.0, 2.0]

    return build


def rag(role: str) -> Callable[[System, Wrap], Awaitable[tuple[Ask, Any]]]:
    async def build(system: System, wrap: Wrap) -> tuple[Ask, Any]:
        def embed(texts: list[str]) -> Any:
            return np.ones((len(texts), 8), np.float32)

        def generate(text: str, passages: list[str]) -> str:
            return "answer"

        pipeline = RagPipeline.spawn(
            system, EmbeddingCache.spawn(system, 10, 8), CpuVectorIndex.spawn(system, 8), 8,
            embed=wrap(embed) if role == "embed" else embed,
            generate=wrap(generate) if role == "generate" else generate)
        await pipeline.add_documents_async([1], ["a document"])  # the embed's first call

        async def ask() -> Any:
            return (await pipeline.query_async("a question", 1, timeout_secs=5)).answer

        return ask, "answer"

    return build


def graph(role: str) -> Callable[[System, Wrap], Awaitable[tuple[Ask, Any]]]:
    async def build(system: System, wrap: Wrap) -> tuple[Ask, Any]:
        def node(state: dict[str, Any]) -> dict[str, Any]:
            return {"x": 1}

        def router(state: dict[str, Any]) -> str:
            return "b"

        built = (Graph().add_node("a", wrap(node) if role == "node" else node)
                 .add_node("b", node)
                 .add_conditional_edges("a", wrap(router) if role == "router" else router,
                                        {"b": "b"})
                 .set_entry_point("a").set_finish_point("b"))
        executor = LangGraphGpuActor.spawn(system, built, max_retries=0)

        async def ask() -> Any:
            return (await executor.step_async({}, timeout_secs=5))["x"]

        return ask, 1

    return build


async def coordinator(system: System, wrap: Wrap) -> tuple[Ask, Any]:
    shared = SharedGpuStateCoordinator.spawn(system)
    fn = wrap(lambda: 42)

    async def ask() -> Any:
        token = await shared.acquire_write_async("agent")
        try:
            return await shared.fenced_async(token, fn)
        finally:
            await shared.release_write_async(token)

    return ask, 42


BLUEPRINTS: dict[str, Callable[[System, Wrap], Awaitable[tuple[Ask, Any]]]] = {
    "batching": batching, "fair share": fair_share, "hot swap": hot_swap,
    "cascade": cascade, "replica pool": replica_pool,
    "speculative draft": speculative("draft"), "speculative verifier": speculative("verifier"),
    "moe gate": moe("gate"), "moe expert": moe("expert"),
    "rag generate": rag("generate"), "rag embed": rag("embed"),
    "graph node": graph("node"), "graph router": graph("router"),
    "coordinator fenced": coordinator,
}


@pytest.mark.parametrize("flavor", ["async", "sync"])
@pytest.mark.parametrize("kind", list(RAISED))
@pytest.mark.parametrize("blueprint", list(BLUEPRINTS))
async def test_a_blueprint_answers_user_codes_base_exception_typed_and_serves_on(
        blueprint: str, kind: str, flavor: str) -> None:
    """Its defaults run one request at a time: the next ones pass only if the slot is back."""
    kinds = {"async": Once, "sync": SyncOnce}
    fail_on = 2 if blueprint == "rag embed" else 1  # its first call embeds the document
    async with await System.open_async("user-code") as system:
        ask, expected = await BLUEPRINTS[blueprint](
            system, lambda fn: kinds[flavor](kind, fn, fail_on))
        with pytest.raises(GpuRuntimeError) as info:
            await ask()
        assert caused_by(info.value, kind), repr(info.value)
        for _ in range(3):
            assert await ask() == expected


class Handler(Actor):
    """An actor whose handler runs user code: ``"raise <kind>"`` raises it, else echoes."""

    async def receive(self, message: Any) -> Any:
        if isinstance(message, str) and message.startswith("raise "):
            await _raise(message.removeprefix("raise "))
        return message


class BadStart(Actor):
    async def pre_start(self) -> None:
        raise SystemExit("from pre_start")

    async def receive(self, message: Any) -> Any:
        return message


@pytest.mark.parametrize("kind", list(RAISED))
async def test_an_actor_handlers_base_exception_fails_that_ask_and_the_actor_goes_on(
        kind: str) -> None:
    async with ActorSystem("user-code") as system:
        ref = system.spawn(Props(Handler), "handler")
        with pytest.raises(actor.UserCodeError) as info:
            await ref.ask(f"raise {kind}", timeout=5)
        assert isinstance(info.value.cause, RAISED[kind]) and "receive of /user/handler" in \
            str(info.value)
        assert await ref.ask("again", timeout=5) == "again"  # restarted, serving
        failed = system.spawn(Props(BadStart), "bad-start")  # a hook's SystemExit: start fails
        with pytest.raises(actor.ActorError):
            await failed.ask("hello", timeout=5)
        assert not failed.is_alive
        assert await ref.ask("still", timeout=5) == "still"


def test_user_code_error_joins_both_trees_and_pickles() -> None:
    error = UserCodeError("a model", SystemExit(3))
    assert isinstance(error, GpuRuntimeError) and isinstance(error, actor.UserCodeError)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is UserCodeError and str(copy) == "a model raised SystemExit: 3"
    assert isinstance(copy.cause, SystemExit) and copy.what == "a model"


async def test_an_event_stream_subscriber_that_raises_system_exit_is_logged() -> None:
    def subscriber(event: object) -> None:
        raise SystemExit("from a subscriber")

    async with ActorSystem("user-code") as system:
        system.event_stream.subscribe(subscriber, str)
        system.event_stream.publish("an event")  # logged, not raised
        ref = system.spawn(Props(Handler), "handler")
        assert await ref.ask("served", timeout=5) == "served"


@pytest.mark.parametrize("kind", ["exit", "interrupt"])
def test_a_decider_that_raises_any_base_exception_escalates(kind: str) -> None:
    def decider(exc: BaseException) -> Directive:
        raise RAISED[kind]("from a decider")

    strategy = OneForOneStrategy(decider=decider)
    assert strategy.decide(RuntimeError("a child failed")) is Directive.ESCALATE


@pytest.mark.parametrize("kind", ["exit", "interrupt"])
def test_the_systems_loop_thread_outlives_user_code(kind: str) -> None:
    """A blocking ``System``: a model's SystemExit or KeyboardInterrupt answers its caller
    (awaiting on a loop of its own) with a typed error, and so does a raw coroutine that
    raises it on the system's loop; later calls work and ``close`` returns."""
    async def model(items: list[Any]) -> list[Any]:
        await _raise(kind)
        return items

    system = System.open("user-code")
    try:
        server = DynamicBatchingServer.spawn(system, model, max_batch=2, max_wait=0.001)
        with pytest.raises(UserCodeError):
            asyncio.run(server.submit(1, timeout=5))

        async def raw() -> None:
            await _raise(kind)

        stray = asyncio.run_coroutine_threadsafe(raw(), system.actors.loop)
        with pytest.raises(RAISED[kind]):
            stray.result(5)
        healthy = DynamicBatchingServer.spawn(system, lambda items: items, max_batch=2,
                                              max_wait=0.001)
        assert asyncio.run(healthy.submit(5, timeout=5)) == 5
    finally:
        closer = threading.Thread(target=system.close, daemon=True)
        closer.start()
        closer.join(30)
    assert not closer.is_alive(), "System.close() hung"


# ------------------------------------------------------------------ streams


@pytest.mark.parametrize("kind", list(RAISED))
@pytest.mark.parametrize("where", ["stage", "sink"])
async def test_a_stream_fails_with_user_codes_base_exception_and_the_code_runs_again(
        where: str, kind: str) -> None:
    user = Once(kind, lambda x: x * 2)

    def pipeline() -> Pipeline:
        if where == "stage":
            return Pipeline(Source.of(range(10)), [stage(user, parallelism=2)])
        return Pipeline(Source.of(range(10)), [stage(lambda x: x)], Sink.foreach(user))

    with pytest.raises(UserCodeError) as info:
        await asyncio.wait_for(pipeline().run(), 10)
    assert caused_by(info.value, kind)
    expected = list(range(0, 20, 2)) if where == "stage" else 10
    assert await asyncio.wait_for(pipeline().run(), 10) == expected


async def test_a_retried_stage_gets_past_a_stray_cancelled_error() -> None:
    pipe = Pipeline(Source.of(range(5)), [stage(Once("cancelled", lambda x: x + 1), retries=1)])
    assert await asyncio.wait_for(pipe.run(), 10) == [1, 2, 3, 4, 5]
    assert pipe.stats.retried == 1


async def test_a_source_that_raises_system_exit_fails_the_stream() -> None:
    async def items() -> AsyncIterator[int]:
        yield 1
        raise SystemExit("from the source")

    with pytest.raises(UserCodeError) as info:
        await asyncio.wait_for(Pipeline(Source.from_async(items()), [stage(str)]).run(), 10)
    assert isinstance(info.value.cause, SystemExit)


async def test_a_sink_that_returns_an_awaitable_is_awaited() -> None:
    class Store:
        def __init__(self) -> None:
            self.rows: list[int] = []

        async def __call__(self, row: int) -> None:
            self.rows.append(row)

    store, queue = Store(), asyncio.Queue[int]()
    source = range(100)
    assert await Pipeline(Source.of(source), [stage(lambda x: x)], Sink.foreach(store)).run() \
        == 100
    returns_a_coroutine = lambda r: queue.put(r)  # noqa: E731, PLW0108 - not an async def
    assert await Pipeline(Source.of(source), [stage(lambda x: x)],
                          Sink.foreach(returns_a_coroutine)).run() == 100
    assert store.rows == list(source)
    assert [queue.get_nowait() for _ in source] == list(source)
