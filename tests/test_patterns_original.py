"""Section 8 of the original package's API: the seven pattern classes used as its users
did (``System.open``, blocking methods, ``timeout_secs``), and the blueprints' own callable
forms on a facade ``System``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import atomr_accel
from atomr_accel import AskTimeout, GpuRuntimeError, InvalidArgument, System, SystemClosed, patterns
from atomr_accel.actor import ActorSystem
from atomr_accel.patterns import (
    DynamicBatchingServer,
    FairShareScheduler,
    HotSwapServer,
    InferenceCascade,
    ModelHotSwapServer,
    ModelReplicaPool,
    MoeRouter,
    SpeculativeDecoder,
    Stage,
)

PATTERN_NAMES = ("DynamicBatchingServer", "InferenceCascade", "ModelReplicaPool",
                 "FairShareScheduler", "HotSwapServer", "SpeculativeDecoder", "MoeRouter")


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("patterns-original") as opened:
        yield opened


def spawn_each(system: System) -> dict[str, Any]:
    """One handle of each class, spawned in the original's form."""
    return {
        "DynamicBatchingServer": DynamicBatchingServer.spawn(system, max_batch=2, max_wait_ms=20),
        "InferenceCascade": InferenceCascade.spawn(system),
        "ModelReplicaPool": ModelReplicaPool.spawn(system, n_replicas=3),
        "FairShareScheduler": FairShareScheduler.spawn(system, tenants=[(1, 1), (2, 3)],
                                                       max_in_flight=2),
        "HotSwapServer": HotSwapServer.spawn(system),
        "SpeculativeDecoder": SpeculativeDecoder.spawn(system, k=4, max_total_tokens=16),
        "MoeRouter": MoeRouter.spawn(system, n_experts=3, top_k=1),
    }


# ------------------------------------------------------------------ names and shapes


def test_the_names_are_importable_classes_from_patterns_and_the_top_level() -> None:
    for name in PATTERN_NAMES:
        cls = getattr(patterns, name)
        assert isinstance(cls, type), name
        assert getattr(atomr_accel, name) is cls, name
        assert name in patterns.__all__ and name in atomr_accel.__all__
    assert HotSwapServer is ModelHotSwapServer


def test_calling_a_class_directly_is_a_type_error() -> None:
    for name in PATTERN_NAMES:
        with pytest.raises(TypeError):
            getattr(patterns, name)()
        with pytest.raises(TypeError, match="spawn"):
            getattr(patterns, name)("not a ref")


def test_each_repr_names_its_class(system: System) -> None:
    for name, handle in spawn_each(system).items():
        assert name in repr(handle), repr(handle)


def test_the_methods_have_the_originals_signatures() -> None:
    expected = {
        patterns.OriginalDynamicBatchingServer.submit: ["payload", "timeout_secs"],
        patterns.OriginalInferenceCascade.infer: ["input", "timeout_secs"],
        patterns.OriginalModelReplicaPool.submit: ["payload", "timeout_secs"],
        patterns.OriginalFairShareScheduler.submit: ["tenant", "payload", "timeout_secs"],
        patterns.OriginalHotSwapServer.serve: ["payload", "timeout_secs"],
        patterns.OriginalHotSwapServer.swap: ["timeout_secs"],
        patterns.OriginalSpeculativeDecoder.decode: ["prompt", "budget", "timeout_secs"],
        patterns.OriginalMoeRouter.route: ["input", "timeout_secs"],
    }
    for method, names in expected.items():
        params = list(inspect.signature(method).parameters.values())[1:]
        assert [p.name for p in params] == names, method
        assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params), method
        assert params[-1].default == 5.0, method
    decode = inspect.signature(patterns.OriginalSpeculativeDecoder.decode)
    assert decode.parameters["budget"].default == 64


# ------------------------------------------------------- each class, as documented


def test_dynamic_batching_server_echoes(system: System) -> None:
    server = DynamicBatchingServer.spawn(system, max_batch=2, max_wait_ms=20)
    assert "DynamicBatchingServer" in repr(server)
    assert server.submit(b"hello", timeout_secs=5.0) == list(b"hello")
    assert server.submit(bytearray(b"ab")) == [97, 98]
    assert server.submit(memoryview(b"c"), 5.0) == [99]
    assert server.submit([1, 2, 255]) == [1, 2, 255]  # a sequence of byte values, as Vec<u8>
    assert server.submit(b"") == []


def test_dynamic_batching_server_batches_payloads_from_many_threads(system: System) -> None:
    server = DynamicBatchingServer.spawn(system, 4, 50)  # positional, as the original allowed
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        out = list(pool.map(lambda i: server.submit(bytes([i])), range(16)))
    assert out == [[i] for i in range(16)]
    stats = asyncio.run(server.client.stats())
    assert stats.completed == 16 and stats.batches < 16


def test_inference_cascade_answers_from_stage_zero(system: System) -> None:
    cascade = InferenceCascade.spawn(system)
    resp, idx, conf = cascade.infer(b"abc", timeout_secs=5.0)
    assert (resp, idx, conf) == ([97, 98, 99], 0, 1.0)
    assert cascade.infer(input=b"") == ([], 0, 1.0)


def test_model_replica_pool_echoes_round_robin(system: System) -> None:
    pool = ModelReplicaPool.spawn(system, n_replicas=3)
    for i in range(6):
        assert pool.submit(bytes([i]), timeout_secs=5.0) == [i]
    assert asyncio.run(pool.client.stats()).served == (2, 2, 2)
    assert ModelReplicaPool.spawn(system).submit(b"z") == [122]  # n_replicas=2


def test_fair_share_scheduler_echoes_for_each_tenant(system: System) -> None:
    scheduler = FairShareScheduler.spawn(system, tenants=[(1, 1), (2, 3)], max_in_flight=2)
    for tenant in (1, 2):
        assert scheduler.submit(tenant, b"payload", timeout_secs=5.0) == list(b"payload")
    positional = FairShareScheduler.spawn(system, [(7, 2)])  # max_in_flight=4
    assert positional.submit(7, b"q", 5.0) == [113]
    completed = asyncio.run(scheduler.client.stats()).completed
    assert completed == {1: 1, 2: 1}


def test_hot_swap_server_tags_the_generation(system: System) -> None:
    server = HotSwapServer.spawn(system)
    assert "HotSwapServer" in repr(server)
    assert server.serve(b"x", timeout_secs=5.0) == [120, 0]
    assert server.swap(timeout_secs=5.0) == 1
    assert server.serve(b"x") == [120, 1]
    assert server.swap() == 2
    assert server.serve(b"xy") == [120, 121, 2]
    assert ModelHotSwapServer.spawn(system).serve(b"x") == [120, 0]  # ours' name, same form


def test_hot_swap_generations_follow_the_swaps_from_many_threads(system: System) -> None:
    server = HotSwapServer.spawn(system)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        generations = sorted(pool.map(lambda _: server.swap(), range(12)))
    assert generations == list(range(1, 13))
    assert server.serve(b"x") == [120, 12]  # the model serving is the one swapped in last


def test_speculative_decoder_counts_up_from_the_last_token(system: System) -> None:
    decoder = SpeculativeDecoder.spawn(system, k=4, max_total_tokens=16)
    tokens, iters, accepted = decoder.decode(prompt=[0], budget=8, timeout_secs=5.0)
    assert tokens == list(range(8))  # the prompt, then last+1, last+2, ...
    assert iters >= 1 and accepted >= 1
    assert (iters, accepted) == (2, 5)  # 4 drafted + the verifier's own, then 1 + 1
    tokens, iters, accepted = decoder.decode([3, 9])  # budget=64: max_total_tokens rules
    assert tokens == [3, *range(9, 24)] and len(tokens) == 16
    assert accepted <= 4 * iters
    assert decoder.decode([5, 6, 7], 2) == ([5, 6], 0, 0)  # cut to the budget, no round
    assert decoder.decode([], 3)[0] == [1, 2, 3]  # no token yet: the draft starts after 0
    assert SpeculativeDecoder.spawn(system).decode([0])[0] == list(range(64))


def test_moe_router_lets_the_last_expert_win(system: System) -> None:
    router = MoeRouter.spawn(system, n_experts=3, top_k=1)
    out = router.route([1.0, 2.0], timeout_secs=5.0)
    assert out == [3.0, 4.0] and all(isinstance(v, float) for v in out)
    blended = MoeRouter.spawn(system, 3, 2).route(np.array([1.0, 2.0]))
    w = 1 / (1 + math.exp(-1.0))  # softmax over the two best scores, 2 and 1
    np.testing.assert_allclose(blended, [1 + 2 * w + (1 - w), 2 + 2 * w + (1 - w)])
    assert MoeRouter.spawn(system).route([0.5]) == [1.5]  # n_experts=2: expert 1 wins


# --------------------------------------------------------------- bad arguments


def test_bad_spawn_settings_are_typed_errors(system: System) -> None:
    bad: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = [
        (DynamicBatchingServer, (), {"max_batch": 0}),
        (DynamicBatchingServer, (), {"max_wait_ms": -1}),
        (DynamicBatchingServer, (), {"max_batch": 2.5}),
        (ModelReplicaPool, (), {"n_replicas": 0}),
        (FairShareScheduler, ([],), {}),
        (FairShareScheduler, ([(1, -1)],), {}),
        (FairShareScheduler, ([(1, 0)],), {}),
        (FairShareScheduler, ([(1, 1), (1, 2)],), {}),
        (FairShareScheduler, ([(-1, 1)],), {}),
        (FairShareScheduler, ([(1, 1, 1)],), {}),
        (FairShareScheduler, ("ab",), {}),
        (FairShareScheduler, ([(1, 1)],), {"max_in_flight": 0}),
        (SpeculativeDecoder, (), {"k": 0}),
        (SpeculativeDecoder, (), {"max_total_tokens": 0}),
        (MoeRouter, (), {"n_experts": 0}),
        (MoeRouter, (), {"top_k": 0}),
        (MoeRouter, (), {"n_experts": 2, "top_k": 3}),
        (InferenceCascade, (), {"name": 5}),
        (HotSwapServer, (), {"name": "a/b"}),
    ]
    for cls, args, kwargs in bad:
        with pytest.raises(InvalidArgument):
            cls.spawn(system, *args, **kwargs)
    InferenceCascade.spawn(system, name="taken")
    with pytest.raises(InvalidArgument, match="already exists"):
        InferenceCascade.spawn(system, name="taken")
    with pytest.raises(TypeError):
        ModelReplicaPool.spawn(system, n_replicas=2, policy="least_loaded")  # not the original's


def test_the_original_form_needs_a_system() -> None:
    async def main() -> None:
        async with ActorSystem("plain") as actors:
            with pytest.raises(InvalidArgument, match="System"):
                DynamicBatchingServer.spawn(actors, max_batch=2)
            with pytest.raises(InvalidArgument, match="System"):
                HotSwapServer.spawn(actors)

    asyncio.run(main())


def test_bad_call_arguments_are_typed_errors_raised_at_once(system: System) -> None:
    h = spawn_each(system)
    calls: list[Any] = [
        lambda: h["DynamicBatchingServer"].submit("text"),
        lambda: h["DynamicBatchingServer"].submit(5),
        lambda: h["DynamicBatchingServer"].submit([256]),
        lambda: h["DynamicBatchingServer"].submit(None),
        lambda: h["InferenceCascade"].infer(1.5),
        lambda: h["ModelReplicaPool"].submit({"a": 1}),
        lambda: h["FairShareScheduler"].submit(3, b"x"),  # an unknown tenant
        lambda: h["FairShareScheduler"].submit(True, b"x"),
        lambda: h["FairShareScheduler"].submit("1", b"x"),
        lambda: h["FairShareScheduler"].submit(1, "x"),
        lambda: h["HotSwapServer"].serve("x"),
        lambda: h["SpeculativeDecoder"].decode("abc"),
        lambda: h["SpeculativeDecoder"].decode([1, -2]),
        lambda: h["SpeculativeDecoder"].decode([1.5]),
        lambda: h["SpeculativeDecoder"].decode([1], -1),
        lambda: h["SpeculativeDecoder"].decode([1], budget=True),
        lambda: h["MoeRouter"].route([[1.0, 2.0]]),
        lambda: h["MoeRouter"].route(["a"]),
        lambda: h["MoeRouter"].route(3.0),
        lambda: h["DynamicBatchingServer"].submit_async("text"),  # the async twins check at once
        lambda: h["SpeculativeDecoder"].decode_async([-1]),
    ]
    for timeout in (0, -1.0, math.nan, math.inf, "5", None, True):
        calls += [lambda t=timeout: h["InferenceCascade"].infer(b"x", t),
                  lambda t=timeout: h["HotSwapServer"].swap(t),
                  lambda t=timeout: h["MoeRouter"].route_async([1.0], timeout_secs=t)]
    for i, call in enumerate(calls):
        with pytest.raises(InvalidArgument):
            call()
            pytest.fail(f"call {i} was accepted")
    assert issubclass(InvalidArgument, GpuRuntimeError)


# ----------------------------------------------------------- time-outs, loops, closing


def test_a_time_out_raises_ask_timeout(system: System) -> None:
    server = DynamicBatchingServer.spawn(system, max_batch=8, max_wait_ms=10_000)
    with pytest.raises(AskTimeout) as caught:
        server.submit(b"late", timeout_secs=0.05)
    assert isinstance(caught.value, GpuRuntimeError) and isinstance(caught.value, TimeoutError)
    with pytest.raises(AskTimeout):
        server.submit(b"late", 0.05)  # timeout_secs is the last positional parameter


def test_blocking_methods_work_inside_a_foreign_event_loop(system: System) -> None:
    h = spawn_each(system)

    async def main() -> list[Any]:  # blocking calls on a loop that is not the system's
        return [h["InferenceCascade"].infer(b"a"), h["HotSwapServer"].swap(),
                h["MoeRouter"].route([1.0]), h["SpeculativeDecoder"].decode([0], 3)]

    assert asyncio.run(main()) == [([97], 0, 1.0), 1, [3.0], ([0, 1, 2], 1, 1)]


def test_async_twins_on_a_foreign_loop(system: System) -> None:
    h = spawn_each(system)

    async def main() -> list[Any]:
        return list(await asyncio.gather(
            h["DynamicBatchingServer"].submit_async(b"a"),
            h["ModelReplicaPool"].submit_async(b"b"),
            h["FairShareScheduler"].submit_async(2, b"c"),
            h["HotSwapServer"].serve_async(b"d"),
            h["HotSwapServer"].swap_async(),
        ))

    assert asyncio.run(main()) == [[97], [98], [99], [100, 0], 1]


def test_the_original_form_in_a_system_on_the_callers_loop() -> None:
    async def main() -> None:
        async with await System.open_async("own-loop-original") as system:
            server = HotSwapServer.spawn(system)
            assert await server.serve_async(b"x") == [120, 0]
            assert await server.swap_async() == 1
            assert await server.serve_async(b"x") == [120, 1]
            with pytest.raises(RuntimeError, match="_async twin"):
                server.serve(b"x")  # a blocking call on the system's own loop would deadlock

    asyncio.run(main())


def test_calls_after_close_raise_system_closed() -> None:
    system = System.open("closing-patterns")
    h = spawn_each(system)
    system.close()
    with pytest.raises(SystemClosed):
        h["DynamicBatchingServer"].submit(b"x")
    with pytest.raises(SystemClosed):
        h["HotSwapServer"].swap()
    with pytest.raises(SystemClosed):
        MoeRouter.spawn(system)


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
