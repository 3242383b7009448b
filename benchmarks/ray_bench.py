"""Devices on Ray: a tiny op through the Ray host vs a bare Ray actor call; node loss to serving.

Latency (a local Ray started here): ``--calls`` sequential tiny ops, each
``scal`` of 4 float64s on a buffer of the device, through an
``isolation="ray"`` device, blocking (``blas.scal``) and from asyncio
(``await blas.scal_async``); beside them, in the same run, a bare Ray actor
holding a 4-element NumPy array and scaling it in a method, called with
``ray.get(actor.scal.remote())`` and ``await actor.scal.remote()``. Goal (issue
19): the Ray host's p50 <= 1.2x the bare call's.

Node loss (a ``ray.cluster_utils.Cluster`` of ``--nodes`` nodes): a journaled
device with a durable buffer on one node; the node is removed (ungracefully) and
the time from ``remove_node`` until a download of the durable buffer succeeds on
the rebuilt context, ``--losses`` times (a fresh node joins after each). Goal:
<= 5 s.

    python benchmarks/ray_bench.py [--json PATH] [--calls N] [--losses N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _report import add_quick, percentile, print_table, quiet_expected_faults, write_json

from atomr_accel import GpuRuntimeError, System

ROUNDS = 10


class Bare:
    """The baseline: a plain Ray actor doing the same tiny NumPy work."""

    def __init__(self) -> None:
        self.x = np.ones(4)

    def scal(self, alpha: float) -> None:
        self.x *= alpha


def timed(call: Callable[[], Any], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - t) / 1000)
    return samples


async def timed_async(call: Callable[[], Any], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t = time.perf_counter_ns()
        await call()
        samples.append((time.perf_counter_ns() - t) / 1000)
    return samples


def latency(ray: Any, calls: int) -> tuple[list[list[Any]], dict[str, Any]]:
    ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    bare = ray.remote(Bare).options(num_cpus=1).remote()
    ray.get(bare.scal.remote(1.0))
    results: dict[str, list[float]] = {}
    with System.open("bench") as system:
        dev = system.spawn_device(mock=True, isolation="ray", libraries=("blas",))
        buf = dev.allocate_f64(4)
        dev.copy_from_numpy(buf, np.ones(4))
        blas = dev.blas()
        for _ in range(ROUNDS):  # interleaved, so that both paths share the machine's noise
            for name, call in (("bare ray.get(actor.scal.remote())",
                                lambda: ray.get(bare.scal.remote(1.0))),
                               ("ray host blas.scal (blocking)",
                                lambda: blas.scal(4, 1.0, buf))):
                timed(call, 20)  # warm up
                results.setdefault(name, []).extend(timed(call, calls // ROUNDS))

        async def on_loop() -> None:
            for _ in range(ROUNDS):
                for name, call in (("bare await actor.scal.remote()",
                                    lambda: bare.scal.remote(1.0)),
                                   ("ray host await blas.scal_async",
                                    lambda: blas.scal_async(4, 1.0, buf))):
                    await timed_async(call, 20)
                    results.setdefault(name, []).extend(
                        await timed_async(call, calls // ROUNDS))

        system._portal.call(on_loop())
    ray.kill(bare)
    ray.shutdown()
    rows = []
    summary: dict[str, Any] = {}
    for name, samples in results.items():
        p50, p99 = percentile(samples, 50), percentile(samples, 99)
        summary[name] = {"p50_us": p50, "p99_us": p99, "mean_us": statistics.fmean(samples)}
        rows.append([name, p50, p99, statistics.fmean(samples), ""])
    for host, bare_name in (("ray host blas.scal (blocking)", "bare ray.get(actor.scal.remote())"),
                            ("ray host await blas.scal_async", "bare await actor.scal.remote()")):
        ratio = summary[host]["p50_us"] / summary[bare_name]["p50_us"]
        summary[host]["ratio_to_bare"] = ratio
        rows[list(results).index(host)][4] = f"{ratio:.2f}x ({'met' if ratio <= 1.2 else 'missed'})"
    return rows, summary


def node_loss(ray: Any, nodes: int, losses: int) -> tuple[list[list[Any]], dict[str, Any]]:
    cluster_utils = __import__("ray.cluster_utils", fromlist=["Cluster"])
    cluster = cluster_utils.Cluster(initialize_head=True,
                                    head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(nodes):
        cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    cluster.wait_for_nodes()
    seconds: list[float] = []
    data = np.random.default_rng(0).standard_normal(1024)
    try:
        with System.open("bench-loss", op_timeout=30) as system:
            dev = system.spawn_device(mock=True, isolation="ray", journal=":memory:",
                                      libraries=("blas",), max_restarts=losses + 1)
            buf = dev.allocate_f64(1024, durable=True)
            dev.copy_from_numpy(buf, data)
            for _ in range(losses):
                node = next(n for n in cluster.list_all_nodes() if n.node_id == dev.node)
                start = time.perf_counter()
                cluster.remove_node(node, allow_graceful=False)
                while True:
                    try:
                        out = dev.copy_to_numpy(buf, timeout_secs=10)
                    except GpuRuntimeError:
                        continue
                    if dev.node != node.node_id:
                        break
                seconds.append(time.perf_counter() - start)
                assert np.array_equal(out, data), "the durable buffer changed"
                cluster.add_node(num_cpus=2)
                cluster.wait_for_nodes()
    finally:
        ray.shutdown()
        cluster.shutdown()
    worst = max(seconds)
    rows = [[f"node lost -> serving again ({len(seconds)} losses, {nodes} nodes)",
             statistics.median(seconds), worst, f"{'met' if worst <= 5 else 'missed'} (<= 5 s)"]]
    return rows, {"node_loss_s": seconds, "median_s": statistics.median(seconds), "max_s": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the results to this path")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--losses", type=int, default=3)
    add_quick(parser, calls=100, nodes=2, losses=1)
    args = parser.parse_args()
    quiet_expected_faults()  # it removes nodes on purpose
    import ray

    rows, lat = latency(ray, args.calls)
    print_table(f"Tiny op, sequential, {args.calls} calls each (us)",
                ["path", "p50", "p99", "mean", "p50 vs bare (goal <= 1.2x)"], rows)
    loss_rows, loss = node_loss(ray, args.nodes, args.losses)
    print_table("Node loss (s)", ["what", "median", "max", "goal"], loss_rows)
    if args.json:
        write_json(args.json, {"ray": ray.__version__, "latency": lat, "node_loss": loss})


if __name__ == "__main__":
    main()
