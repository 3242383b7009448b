"""MoeRouter: top-k gating, softmax over the chosen scores, parallel experts, NumPy reference."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from atomr_accel import InvalidArgument, System
from atomr_accel.actor import ActorSystem
from atomr_accel.patterns import InvalidModelOutput, MoeRouter, top_k_gating

pytestmark = pytest.mark.anyio

Array = np.ndarray[Any, Any]
D_IN, D_OUT, EXPERTS = 6, 4, 5


def make_weights(seed: int = 0) -> tuple[Array, list[Array], list[Array]]:
    rng = np.random.default_rng(seed)
    gate = rng.standard_normal((D_IN, EXPERTS))
    ws = [rng.standard_normal((D_IN, D_OUT)) for _ in range(EXPERTS)]
    bs = [rng.standard_normal(D_OUT) for _ in range(EXPERTS)]
    return gate, ws, bs


def reference(x: Array, gate: Array, ws: list[Array], bs: list[Array], k: int) -> Array:
    """Token by token, in plain NumPy: top-k, softmax over the chosen scores, weighted sum."""
    out = np.zeros((x.shape[0], D_OUT))
    for t, row in enumerate(x):
        scores = row @ gate
        best = sorted(range(EXPERTS), key=lambda e: (-scores[e], e))[:k]
        exp = np.exp(scores[best] - scores[best].max())
        for e, w in zip(best, exp / exp.sum(), strict=True):
            out[t] += w * (row @ ws[e] + bs[e])
    return out


def experts_from(ws: list[Array], bs: list[Array]) -> list[Any]:
    def expert(e: int) -> Any:
        return lambda rows: rows @ ws[e] + bs[e]  # a sync expert: runs on a worker thread

    return [expert(e) for e in range(EXPERTS)]


# ----------------------------------------------------------------- the pure gating


def test_top_k_gating_picks_the_best_and_softmaxes_their_scores() -> None:
    scores = np.array([[0.1, 2.0, 1.0, 2.0], [5.0, -1.0, 0.0, 1.0]])
    experts, weights = top_k_gating(scores, 2)
    assert experts.tolist() == [[1, 3], [0, 3]]  # a tie goes to the lower index
    np.testing.assert_allclose(weights[0], [0.5, 0.5])
    e = np.exp(np.array([5.0, 1.0]) - 5.0)
    np.testing.assert_allclose(weights[1], e / e.sum())
    np.testing.assert_allclose(weights.sum(axis=1), 1.0)


def test_top_k_gating_is_stable_for_huge_scores() -> None:
    _, weights = top_k_gating(np.array([[1000.0, 999.0, -5.0]]), 2)
    assert np.isfinite(weights).all()
    np.testing.assert_allclose(weights[0], [1 / (1 + np.exp(-1)), 1 / (1 + np.exp(1))])


def test_top_k_gating_refuses_bad_input() -> None:
    with pytest.raises(InvalidArgument):
        top_k_gating(np.zeros((2, 3)), 4)
    with pytest.raises(InvalidArgument):
        top_k_gating(np.zeros((2, 3)), 0)
    with pytest.raises(InvalidModelOutput):
        top_k_gating(np.zeros(3), 1)
    with pytest.raises(InvalidModelOutput):
        top_k_gating(np.array([[np.nan, 1.0]]), 1)


# ---------------------------------------------------------------------- the router


@pytest.mark.parametrize("k", [1, 2, 3])
async def test_router_equals_the_numpy_reference(k: int) -> None:
    gate, ws, bs = make_weights()
    x = np.random.default_rng(1).standard_normal((40, D_IN))
    async with ActorSystem("t") as system:
        router = MoeRouter.spawn(system, lambda xs: xs @ gate, experts_from(ws, bs), top_k=k)
        np.testing.assert_allclose(await router.route(x), reference(x, gate, ws, bs, k),
                                   rtol=1e-12, atol=1e-12)
        one = await router.route(x[3])  # one token: 1-D in, 1-D out
        assert one.shape == (D_OUT,)
        np.testing.assert_allclose(one, reference(x[3:4], gate, ws, bs, k)[0], rtol=1e-12)
        stats = await router.stats()
        assert stats.requests == 2 and stats.tokens == 41
        assert sum(stats.expert_tokens) == 41 * k


async def test_the_experts_of_one_request_run_in_parallel() -> None:
    entered = 0
    all_in = asyncio.Event()

    def expert(e: int) -> Any:
        async def run(rows: Array) -> Array:
            nonlocal entered
            entered += 1
            if entered == EXPERTS:
                all_in.set()
            await all_in.wait()  # only returns once every expert has been called
            return rows[:, :D_OUT] * (e + 1)

        return run

    # every token scores every expert equally high on one of them: all experts get tokens
    x = np.eye(EXPERTS, D_IN)

    async with ActorSystem("t") as system:
        router = MoeRouter.spawn(system, lambda xs: xs[:, :EXPERTS] * 10.0,
                                 [expert(e) for e in range(EXPERTS)], top_k=1)
        async with asyncio.timeout(10):
            out = await router.route(x)
        np.testing.assert_allclose(out, x[:, :D_OUT] * (np.arange(EXPERTS) + 1)[:, None])


async def test_a_failing_expert_fails_the_request_and_is_restarted() -> None:
    gate, ws, bs = make_weights()
    experts = experts_from(ws, bs)
    calls = 0

    def flaky(rows: Array) -> Array:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("expert 0 crashed")
        return rows @ ws[0] + bs[0]

    experts[0] = flaky
    x = np.random.default_rng(2).standard_normal((30, D_IN))
    async with ActorSystem("t") as system:
        router = MoeRouter.spawn(system, lambda xs: xs @ gate, experts, top_k=EXPERTS)
        with pytest.raises(RuntimeError, match="expert 0 crashed"):
            await router.route(x)
        np.testing.assert_allclose(await router.route(x), reference(x, gate, ws, bs, EXPERTS),
                                   rtol=1e-12)
        assert (await router.stats()).restarts == (1, 0, 0, 0, 0)


@pytest.mark.parametrize(("gate_shape", "expert_rows"), [((40, 3), None), (None, 1)])
async def test_bad_gate_or_expert_outputs_are_typed_errors(gate_shape: Any,
                                                           expert_rows: Any) -> None:
    def gate(xs: Array) -> Array:
        return np.ones(gate_shape) if gate_shape else xs[:, :EXPERTS]

    def expert(rows: Array) -> Array:
        return rows[:expert_rows] if expert_rows else rows

    async with ActorSystem("t") as system:
        router = MoeRouter.spawn(system, gate, [expert] * EXPERTS, top_k=2)
        with pytest.raises(InvalidModelOutput):
            await router.route(np.random.default_rng(3).standard_normal((40, D_IN)))


async def test_bad_routers_are_refused() -> None:
    async with ActorSystem("t") as system:
        for gate, experts, k in ((None, [abs], 1), (abs, [], 1), (abs, [abs], 2),
                                 (abs, ["x"], 1), (abs, [abs], 0)):
            with pytest.raises(InvalidArgument):
                MoeRouter.spawn(system, gate, experts, top_k=k)  # type: ignore[arg-type]
        router = MoeRouter.spawn(system, abs, [abs], top_k=1)
        with pytest.raises(InvalidArgument):
            await router.route(np.zeros((2, 2, 2)))


async def test_experts_running_on_a_cpu_backend_device() -> None:
    gate, ws, bs = make_weights(seed=4)
    x = np.random.default_rng(5).standard_normal((24, D_IN))
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True)
        blas = dev.blas()

        def device_expert(e: int) -> Any:
            async def run(rows: Array) -> Array:
                n = rows.shape[0]
                a = await dev.allocate_f64_async(n * D_IN)
                w = await dev.allocate_f64_async(D_IN * D_OUT)
                y = await dev.allocate_f64_async(n * D_OUT)
                await dev.copy_from_numpy_async(a, np.ascontiguousarray(rows))
                await dev.copy_from_numpy_async(w, ws[e])
                await dev.copy_from_numpy_async(y, np.tile(bs[e], (n, 1)))
                await blas.matmul_async(a, w, y, m=n, n=D_OUT, k=D_IN, beta=1.0)  # + bias
                out = await dev.copy_to_numpy_async(y, shape=(n, D_OUT))
                for buffer in (a, w, y):
                    await dev.free_async(buffer)
                return out

            return run

        router = MoeRouter.spawn(system, lambda xs: xs @ gate,
                                 [device_expert(e) for e in range(EXPERTS)], top_k=2)
        np.testing.assert_allclose(await router.route(x), reference(x, gate, ws, bs, 2),
                                   rtol=1e-12, atol=1e-12)
