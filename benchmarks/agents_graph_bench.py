"""The lease coordinator and the DAG executor: per-call overheads and branch concurrency.

* Coordinator: an uncontended ``acquire_write`` + ``release_write`` pair
  (latency), and 8 agents contending for the write lease (grants per second).
* Executor: ``step`` latency of a 10-node chain and of a 4-node diamond of
  no-op async nodes (the executor's own overhead per node), and of a fan-out
  of 8 branches that each sleep 10 ms, next to the 80 ms they would take one
  after another.

All on an ``ActorSystem``'s own event loop (the async forms), CPU only.

    python benchmarks/agents_graph_bench.py [--n 2000] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from _report import add_quick, percentile, print_table, write_json

from atomr_accel.actor import ActorSystem
from atomr_accel.agents._coordinator import SharedGpuStateCoordinator
from atomr_accel.agents._graph import Graph
from atomr_accel.agents._graph_actor import LangGraphGpuActor


async def noop(state: dict[str, Any]) -> None:
    """A node that updates nothing."""


async def nap(state: dict[str, Any]) -> None:
    """A node that waits 10 ms (an I/O-bound step: a model server, a database)."""
    await asyncio.sleep(0.01)


def chain(n: int) -> Graph:
    graph = Graph()
    for i in range(n):
        graph.add_node(f"n{i}", noop)
        if i:
            graph.add_edge(f"n{i - 1}", f"n{i}")
    return graph.set_entry_point("n0").set_finish_point(f"n{n - 1}")


def fan(width: int, fn: Any) -> Graph:
    graph = Graph().add_node("start", noop).add_node("join", noop)
    for i in range(width):
        graph.add_node(f"b{i}", fn).add_edge("start", f"b{i}").add_edge(f"b{i}", "join")
    return graph.set_entry_point("start").set_finish_point("join")


async def latency_us(call: Any, n: int) -> tuple[float, float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter_ns()
        await call()
        samples.append((time.perf_counter_ns() - start) / 1000)
    return percentile(samples, 50), percentile(samples, 99)


async def main(n: int) -> dict[str, Any]:
    rows: list[list[Any]] = []
    results: dict[str, Any] = {}
    async with ActorSystem("bench") as system:
        coord = SharedGpuStateCoordinator.spawn(system)

        async def pair() -> None:
            await coord.release_write_async(await coord.acquire_write_async("a"))

        p50, p99 = await latency_us(pair, n)
        rows.append(["coordinator acquire+release, uncontended", p50, p99, "-"])
        results["coordinator_pair"] = {"p50_us": p50, "p99_us": p99}

        async def agent(i: int, rounds: int) -> None:
            for _ in range(rounds):
                await coord.release_write_async(await coord.acquire_write_async(i))

        start = time.perf_counter()
        await asyncio.gather(*(agent(i, n // 8) for i in range(8)))
        rate = 8 * (n // 8) / (time.perf_counter() - start)
        rows.append(["coordinator, 8 agents contending", "-", "-", f"{rate:,.0f} grants/s"])
        results["coordinator_contended_grants_per_s"] = rate

        for label, graph, count in [("10-node chain, no-op nodes", chain(10), n // 4),
                                    ("diamond (4 no-op nodes)", fan(2, noop), n // 4),
                                    ("fan-out 8 x 10 ms nodes", fan(8, nap), 50)]:
            executor = LangGraphGpuActor.spawn(system, graph)

            async def step(executor: LangGraphGpuActor = executor) -> None:
                await executor.step_async({})

            p50, p99 = await latency_us(step, count)
            note = "sequential would be >= 80 ms" if "fan-out" in label else "-"
            rows.append([f"step: {label}", p50, p99, note])
            results[label] = {"p50_us": p50, "p99_us": p99}
    print_table("Lease coordinator and DAG executor (CPU, ActorSystem loop)",
                ["what", "p50 us", "p99 us", "note"], rows)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="calls per latency row")
    parser.add_argument("--json", help="write the results as JSON to this path")
    add_quick(parser, n=100)
    args = parser.parse_args()
    results = asyncio.run(main(args.n))
    if args.json:
        write_json(args.json, {"benchmark": "agents_graph", "results": results})
