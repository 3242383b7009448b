"""Graph and LangGraphGpuActor: cycle detection, ordering, concurrent branches, conditional
edges, supervised retries, checkpoints and resume, and the original's n_nodes form."""

from __future__ import annotations

import asyncio
import operator
import threading
from typing import Any

import numpy as np
import pytest

from atomr_accel import InvalidArgument, System
from atomr_accel.actor import ActorSystem
from atomr_accel.agents import (
    END,
    Graph,
    GraphCycleError,
    LangGraphGpuActor,
    NodeFailed,
    OriginalLangGraphGpuActor,
    UnknownNode,
    UnknownRun,
)

pytestmark = pytest.mark.anyio


def put(key: str, value: Any) -> Any:
    """A sync node that sets ``key`` and appends its key to the ``trace``."""
    def node(state: dict[str, Any]) -> dict[str, Any]:
        return {key: value, "trace": [*state.get("trace", []), key]}
    return node


def diamond() -> Graph:
    """a -> (b, c) -> d."""
    graph = Graph()
    for name in "abcd":
        graph.add_node(name, put(name, name.upper()))
    return (graph.add_edge("a", "b").add_edge("a", "c").add_edge("b", "d").add_edge("c", "d")
            .set_entry_point("a").set_finish_point("d"))


# ------------------------------------------------------------------ building


def test_a_cycle_is_rejected_naming_its_nodes() -> None:
    graph = Graph()
    for name in ["start", "plan", "act", "check", "done"]:
        graph.add_node(name, put(name, 1))
    graph.add_edge("start", "plan").add_edge("plan", "act").add_edge("act", "check")
    graph.add_conditional_edges("check", lambda s: s["ok"], {True: "done", False: "plan"})
    graph.set_entry_point("start").set_finish_point("done")
    with pytest.raises(GraphCycleError) as caught:
        graph.compile()
    assert caught.value.cycle == ("plan", "act", "check", "plan")
    assert "plan -> act -> check -> plan" in str(caught.value)
    assert isinstance(caught.value, InvalidArgument)


def test_a_self_loop_is_a_cycle() -> None:
    graph = Graph().add_node("a", put("a", 1)).add_edge("a", "a")
    with pytest.raises(GraphCycleError, match="a -> a"):
        graph.set_entry_point("a").set_finish_point("a").compile()


def test_unknown_nodes_and_missing_points_are_typed_errors() -> None:
    with pytest.raises(UnknownNode, match="'x'"):
        Graph().add_node("a", put("a", 1)).add_edge("a", "x").compile()
    with pytest.raises(UnknownNode):
        Graph().add_node("a", put("a", 1)).set_entry_point("b").compile()
    with pytest.raises(InvalidArgument, match="no entry point"):
        Graph().add_node("a", put("a", 1)).set_finish_point("a").compile()
    with pytest.raises(InvalidArgument, match="no finish point"):
        Graph().add_node("a", put("a", 1)).set_entry_point("a").compile()
    with pytest.raises(InvalidArgument, match="not a finish point"):
        (Graph().add_node("a", put("a", 1)).add_node("b", put("b", 1)).add_node("c", put("c", 1))
         .add_edge("a", "b").add_edge("a", "c").set_entry_point("a").set_finish_point("b")
         .compile())
    with pytest.raises(InvalidArgument, match="cannot be reached"):
        (Graph().add_node("a", put("a", 1)).add_node("b", put("b", 1))
         .set_entry_point("a").set_finish_point("a").set_finish_point("b").compile())
    with pytest.raises(InvalidArgument):
        Graph().add_node("a", "not callable")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        Graph().add_node("a", put("a", 1)).add_node("a", put("a", 2))


def test_the_topological_order_is_deterministic() -> None:
    assert diamond().compile().order == ("a", "b", "c", "d")
    graph = Graph()
    for name in ["z", "y", "x", "w"]:
        graph.add_node(name, put(name, 1))
    graph.add_edge("z", "x").add_edge("z", "y").add_edge("x", "w").add_edge("y", "w")
    assert graph.set_entry_point("z").set_finish_point("w").compile().order == \
        ("z", "y", "x", "w")  # ties in the order the nodes were added


# ------------------------------------------------------------------ running


async def test_step_runs_every_node_after_its_predecessors() -> None:
    async with ActorSystem("t") as system:
        executor = LangGraphGpuActor.spawn(system, diamond())
        state = await executor.step_async({"input": 1})
        assert {k: state[k] for k in "abcd"} == {"a": "A", "b": "B", "c": "C", "d": "D"}
        assert state["input"] == 1
        assert state["trace"][0] == "a" and state["trace"][-1] == "d"


async def test_reducers_combine_concurrent_updates_in_topological_order() -> None:
    def note(name: str) -> Any:
        async def node(state: dict[str, Any]) -> dict[str, Any]:
            return {"trace": [name], "last": name}
        return node

    graph = Graph(reducers={"trace": operator.add})
    for name in ["a", "b", "c", "d"]:
        graph.add_node(name, note(name))
    graph.add_edge("a", "b").add_edge("a", "c").add_edge("b", "d").add_edge("c", "d")
    graph.set_entry_point("a").set_finish_point("d")
    async with ActorSystem("t") as system:
        executor = LangGraphGpuActor.spawn(system, graph)
        for _ in range(3):
            state = await executor.step_async({"trace": ["input"]})
            assert state == {"trace": ["input", "a", "b", "c", "d"], "last": "d"}
    with pytest.raises(InvalidArgument):
        Graph(reducers={"trace": "add"})  # type: ignore[dict-item]


async def test_independent_branches_really_run_concurrently() -> None:
    b_in, c_in = asyncio.Event(), asyncio.Event()

    async def b(state: dict[str, Any]) -> dict[str, Any]:
        b_in.set()
        await asyncio.wait_for(c_in.wait(), 5)  # deadlocks if c could only run after b
        return {"b": True}

    async def c(state: dict[str, Any]) -> dict[str, Any]:
        c_in.set()
        await asyncio.wait_for(b_in.wait(), 5)
        return {"c": True}

    graph = (Graph().add_node("a", put("a", 1)).add_node("b", b).add_node("c", c)
             .add_node("d", lambda s: {"both": s["b"] and s["c"]})
             .add_edge("a", "b").add_edge("a", "c").add_edge("b", "d").add_edge("c", "d")
             .set_entry_point("a").set_finish_point("d"))
    async with ActorSystem("t") as system:
        executor = LangGraphGpuActor.spawn(system, graph, max_retries=0)
        assert (await executor.step_async({}, timeout_secs=10))["both"] is True


async def test_sync_branches_run_on_worker_threads_concurrently() -> None:
    barrier = threading.Barrier(2, timeout=5)  # both sync nodes must be inside at once

    def meet(key: str) -> Any:
        def node(state: dict[str, Any]) -> dict[str, Any]:
            barrier.wait()
            return {key: threading.get_ident()}
        return node

    graph = (Graph().add_node("a", put("a", 1)).add_node("b", meet("b")).add_node("c", meet("c"))
             .add_edge("a", "b").add_edge("a", "c").set_entry_point("a")
             .set_finish_point("b").set_finish_point("c"))
    async with ActorSystem("t") as system:
        state = await LangGraphGpuActor.spawn(system, graph, max_retries=0).step_async({})
        assert state["b"] != state["c"]


async def test_conditional_edges_route_and_skip_the_other_branch() -> None:
    graph = (Graph().add_node("classify", lambda s: {"kind": "big" if s["n"] > 10 else "small"})
             .add_node("big", put("handled", "big")).add_node("small", put("handled", "small"))
             .add_node("report", lambda s: {"report": f"{s['n']}:{s['handled']}"})
             .add_conditional_edges("classify", lambda s: s["kind"],
                                    {"big": "big", "small": "small"})
             .add_edge("big", "report").add_edge("small", "report")
             .set_entry_point("classify").set_finish_point("report"))
    async with ActorSystem("t") as system:
        executor = LangGraphGpuActor.spawn(system, graph)
        big = await executor.step_async({"n": 50})
        small = await executor.step_async({"n": 3})
        assert big["report"] == "50:big" and big["trace"] == ["handled"]
        assert small["report"] == "3:small" and small["trace"] == ["handled"]  # one branch only


async def test_a_conditional_edge_to_end_stops_the_branch() -> None:
    graph = (Graph().add_node("gate", lambda s: None).add_node("work", put("worked", True))
             .add_conditional_edges("gate", lambda s: s["go"], {True: "work", False: END})
             .set_entry_point("gate").set_finish_point("work"))
    async with ActorSystem("t") as system:
        executor = LangGraphGpuActor.spawn(system, graph)
        assert "worked" not in await executor.step_async({"go": False})
        assert (await executor.step_async({"go": True}))["worked"] is True
        with pytest.raises(InvalidArgument, match="router"):
            await executor.step_async({"go": "maybe"})


class Flaky:
    """Fails its first ``failures`` calls, then answers; counts its calls."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def __call__(self, state: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError(f"flaky call {self.calls}")
        return {"flaky": self.calls}


async def test_a_node_failing_twice_is_retried_by_its_supervisor_and_succeeds() -> None:
    flaky = Flaky(2)
    graph = (Graph().add_node("a", put("a", 1)).add_node("flaky", flaky).add_edge("a", "flaky")
             .set_entry_point("a").set_finish_point("flaky"))
    async with ActorSystem("t") as system:
        executor = LangGraphGpuActor.spawn(system, graph, max_retries=2)
        assert (await executor.step_async({}))["flaky"] == 3
        stats = await executor.stats_async()
        assert stats.retries == 2 and stats.completed == 1


async def test_past_the_retry_limit_the_run_fails_with_the_nodes_error() -> None:
    flaky = Flaky(10)
    graph = (Graph().add_node("a", put("a", 1)).add_node("flaky", flaky).add_edge("a", "flaky")
             .set_entry_point("a").set_finish_point("flaky"))
    async with ActorSystem("t") as system:
        executor = LangGraphGpuActor.spawn(system, graph, max_retries=1)
        with pytest.raises(NodeFailed) as caught:
            await executor.step_async({})
        failed = caught.value
        assert failed.node == "flaky" and failed.attempts == 2 and flaky.calls == 2
        assert isinstance(failed.__cause__, RuntimeError)
        assert str(failed.__cause__) == "flaky call 2"


async def test_resume_continues_from_the_last_checkpoint_without_rerunning_nodes() -> None:
    calls = {"a": 0, "b": 0, "c": 0}
    broken = True

    def counted(name: str) -> Any:
        def node(state: dict[str, Any]) -> dict[str, Any]:
            calls[name] += 1
            if name == "c" and broken:
                raise OSError("the service behind c is down")
            return {name: state.get("seed", 0) + calls[name]}
        return node

    graph = Graph()
    for name in "abc":
        graph.add_node(name, counted(name))
    graph.add_edge("a", "b").add_edge("b", "c").set_entry_point("a").set_finish_point("c")
    async with ActorSystem("t") as system:
        executor = LangGraphGpuActor.spawn(system, graph, max_retries=1)
        with pytest.raises(NodeFailed) as caught:
            await executor.step_async({"seed": 10})
        run_id = caught.value.run_id
        checkpoints = await executor.checkpoints_async(run_id)
        assert [c.node for c in checkpoints] == ["a", "b"]
        assert checkpoints[-1].state == {"seed": 10, "a": 11, "b": 11}
        broken = False
        state = await executor.resume_async(run_id)
        assert state == {"seed": 10, "a": 11, "b": 11, "c": 13}
        assert calls == {"a": 1, "b": 1, "c": 3}  # a and b were not run again
        assert await executor.resume_async(run_id) == state  # a finished run: its state
        assert calls["c"] == 3
        with pytest.raises(UnknownRun):
            await executor.resume_async("run-999")


async def test_a_node_returning_no_dict_fails_typed() -> None:
    graph = Graph().add_node("a", lambda s: 42).set_entry_point("a").set_finish_point("a")
    async with ActorSystem("t") as system:
        executor = LangGraphGpuActor.spawn(system, graph, max_retries=0)
        with pytest.raises(NodeFailed) as caught:
            await executor.step_async({})
        assert isinstance(caught.value.__cause__, InvalidArgument)
        with pytest.raises(InvalidArgument):
            executor.step_async([1.0])  # type: ignore[arg-type]


def test_a_sync_node_may_run_device_ops_in_a_system() -> None:
    with System.open("graph-device") as system:
        device = system.spawn_device(mock=True)
        blas = device.blas()

        def gemm(state: dict[str, Any]) -> dict[str, Any]:
            n = state["n"]
            a, b, c = (device.allocate_f32(n * n) for _ in range(3))
            device.copy_from_numpy(a, np.asarray(state["a"], dtype=np.float32))
            device.copy_from_numpy(b, np.asarray(state["b"], dtype=np.float32))
            blas.gemm_f32(a, b, c, m=n, n=n, k=n)  # column-major C = A @ B
            return {"c": device.copy_to_numpy(c).tolist()}

        graph = Graph().add_node("gemm", gemm).set_entry_point("gemm").set_finish_point("gemm")
        executor = LangGraphGpuActor.spawn(system, graph)
        rng = np.random.default_rng(3)
        x, y = rng.standard_normal(9), rng.standard_normal(9)
        out = executor.step({"n": 3, "a": x.tolist(), "b": y.tolist()})["c"]
        expected = (x.reshape(3, 3).T @ y.reshape(3, 3).T).T.ravel()  # column-major
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------- the original


def test_the_originals_n_nodes_form_multiplies_by_i_plus_1() -> None:
    with System.open("graph-original") as system:
        two = LangGraphGpuActor.spawn(system)
        three = LangGraphGpuActor.spawn(system, n_nodes=3, name="three")
        assert isinstance(two, OriginalLangGraphGpuActor)
        assert two.step([1.0, 2.0]) == [2.0, 4.0]
        assert three.step([1.0, -0.5], timeout_secs=10.0) == [6.0, -3.0]
        assert LangGraphGpuActor.spawn(system, 4).step([1.0]) == [24.0]
        with pytest.raises(InvalidArgument):
            LangGraphGpuActor.spawn(system, n_nodes=0)
        with pytest.raises(InvalidArgument):
            two.step("abc")  # type: ignore[arg-type]


async def test_the_originals_async_step() -> None:
    async with ActorSystem("t") as system:
        actor = LangGraphGpuActor.spawn(system, n_nodes=3)
        assert await actor.step_async([2.0]) == [12.0]


async def test_a_run_out_of_time_fails_and_resumes_later() -> None:
    release = asyncio.Event()
    calls = 0

    async def slow(state: dict[str, Any]) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        await release.wait()
        return {"slow": calls}

    graph = (Graph().add_node("a", put("a", 1)).add_node("slow", slow).add_edge("a", "slow")
             .add_edge("slow", END).set_entry_point("a"))
    async with ActorSystem("t") as system:
        executor = LangGraphGpuActor.spawn(system, graph, max_retries=3)
        with pytest.raises(NodeFailed) as caught:
            await executor.step_async({}, timeout_secs=0.1)
        assert caught.value.node == "slow" and isinstance(caught.value.__cause__, TimeoutError)
        release.set()
        state = await executor.resume_async(caught.value.run_id)
        assert state["a"] == 1 and state["slow"] == 2 and calls == 2
