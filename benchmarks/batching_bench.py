"""Dynamic batching: an MLP layer served batched vs unbatched, and vs Ray Serve's @serve.batch.

The layer is ``relu(x @ W + b)`` on a device: each call uploads its rows,
copies the tiled bias into the output, runs one gemm (``beta=1`` adds the
bias) and downloads the result; ReLU runs in NumPy on the downloaded rows
(the device API has no elementwise op yet). Every row of the table runs that
same function. Concurrent closed-loop clients send single rows:

* unbatched: each client calls the layer with its one row (own buffers);
* ``DynamicBatchingServer``: clients submit rows, the server runs batches;
* Ray Serve's ``@serve.batch`` on the same function, run inside a Serve
  replica (with our server run in that replica too, for the same conditions).

Per-request overhead is the wall time per request through the batching layer
with a no-op batch function. Goals: batched throughput >= 10x unbatched; p99
<= max_wait + 2x the full batch's compute time; overhead <= 1/3 of Ray's.

OpenBLAS runs one thread by default here (``--blas-threads``), as in Ray's
workers: on a small VM a multi-threaded OpenBLAS gemm issued from the device's
host thread after a short idle took about 8-15 ms instead of 0.1 ms.

    python benchmarks/batching_bench.py [--cuda] [--no-ray] [--uvloop] [--blas-threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import numpy as np
from _report import add_quick, percentile, print_table, write_json

from atomr_accel import Device, System
from atomr_accel.patterns import DynamicBatchingServer

Array = np.ndarray[Any, Any]
Submit = Callable[[Array], Awaitable[Any]]


class MlpLayer:
    """``relu(x @ W + b)`` for up to ``rows`` inputs, on its own device buffers."""

    def __init__(self, dev: Device, w: Array, b: Array, rows: int) -> None:
        self.dev = dev
        self.w_host, self.b_host = w, b
        self.rows = rows
        self.d_in, self.d_out = w.shape

    async def setup(self, shared_w: Any = None) -> MlpLayer:
        """Allocate buffers; ``shared_w`` reuses another layer's weight buffer."""
        dev = self.dev
        self.x = await dev.allocate_f32_async(self.rows * self.d_in)
        self.y = await dev.allocate_f32_async(self.rows * self.d_out)
        self.bias = await dev.allocate_f32_async(self.rows * self.d_out)
        await dev.copy_from_numpy_async(self.bias, np.tile(self.b_host, (self.rows, 1)))
        if shared_w is None:
            shared_w = await dev.allocate_f32_async(self.d_in * self.d_out)
            await dev.copy_from_numpy_async(shared_w, self.w_host)
        self.w = shared_w
        return self

    async def forward(self, xs: list[Array]) -> Array:
        """Run the layer on ``len(xs)`` rows; return ``len(xs) x d_out``."""
        n, dev = len(xs), self.dev
        await dev.copy_from_numpy_async(self.x, np.stack(xs), offset=0)
        await dev.copy_async(self.bias, self.y, length=n * self.d_out)
        await dev.blas().matmul_async(self.x, self.w, self.y, m=n, n=self.d_out, k=self.d_in,
                                      beta=1.0)
        out = await dev.copy_to_numpy_async(self.y, length=n * self.d_out, shape=(n, self.d_out))
        return np.maximum(out, 0.0, out=out)


async def noop(xs: list[Any]) -> list[Any]:
    """The no-op batch function: answers each request with its own input."""
    return xs


async def drive(make_submit: Callable[[int], Submit], inputs: list[Array],
                clients: int) -> dict[str, Any]:
    """Closed loop: ``clients`` tasks send ``inputs`` one at a time; throughput and latency.

    A first, unmeasured round of ``4 * clients`` requests warms the path up.
    """
    latencies: list[float] = []

    async def run(todo: Iterator[int], record: bool) -> None:
        async def client(submit: Submit) -> None:
            for i in todo:
                t0 = time.perf_counter()
                await submit(inputs[i])
                if record:
                    latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(client(make_submit(c)) for c in range(clients)))

    await run(iter(range(min(len(inputs), 4 * clients))), record=False)
    start = time.perf_counter()
    await run(iter(range(len(inputs))), record=True)
    wall = time.perf_counter() - start
    return {"requests": len(inputs), "wall_s": wall, "throughput": len(inputs) / wall,
            "p50_ms": percentile(latencies, 50) * 1e3, "p99_ms": percentile(latencies, 99) * 1e3,
            "per_request_us": wall / len(inputs) * 1e6}


async def drive_server(server: DynamicBatchingServer, inputs: list[Array],
                       clients: int) -> dict[str, Any]:
    """``drive`` through ``server``; adds the mean batch size of the whole run."""
    row = await drive(lambda c: server.submit_async, inputs, clients)
    stats = await server.stats_async()
    row["mean_batch"] = stats.completed / stats.batches
    return row


def weights(d_in: int, d_out: int) -> tuple[Array, Array, list[Array]]:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((d_in, d_out)) / np.sqrt(d_in)).astype(np.float32)
    b = rng.standard_normal(d_out).astype(np.float32)
    inputs = [rng.standard_normal(d_in).astype(np.float32) for _ in range(4096)]
    return w, b, inputs


async def compute_time(layer: MlpLayer, inputs: list[Array], reps: int = 50) -> float:
    """Median seconds of one full-batch forward, called directly."""
    batch = inputs[: layer.rows]
    for _ in range(5):
        await layer.forward(batch)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        await layer.forward(batch)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


async def our_rows(system: System, dev: Device, cfg: dict[str, Any], *,
                   unbatched: bool) -> dict[str, Any]:
    """Our server with the MLP and with a no-op; unbatched calls too when asked."""
    w, b, inputs = weights(cfg["d_in"], cfg["d_out"])
    inputs = inputs[: cfg["requests"]]
    clients, max_batch, max_wait = cfg["clients"], cfg["max_batch"], cfg["max_wait"]
    layer = await MlpLayer(dev, w, b, max_batch).setup()
    expected = np.maximum(inputs[0].astype(np.float64) @ w + b, 0)
    np.testing.assert_allclose(await layer.forward([inputs[0]]), expected[None], atol=1e-4)
    rows: dict[str, Any] = {"compute_s": await compute_time(layer, inputs)}
    if unbatched:
        per_client = [await MlpLayer(dev, w, b, 1).setup(layer.w) for _ in range(clients)]

        def direct(c: int) -> Submit:
            return lambda x: per_client[c].forward([x])

        rows["unbatched"] = await drive(direct, inputs, clients)
    server = DynamicBatchingServer.spawn(system, layer.forward, max_batch=max_batch,
                                         max_wait=max_wait, queue_capacity=4 * clients)
    np.testing.assert_allclose(await server.submit_async(inputs[0]), expected, atol=1e-4)
    rows["batched"] = await drive_server(server, inputs, clients)
    server.stop()
    empty = DynamicBatchingServer.spawn(system, noop, max_batch=max_batch, max_wait=max_wait,
                                        queue_capacity=4 * clients)
    rows["noop"] = await drive_server(empty, inputs, clients)
    empty.stop()
    return rows


def ray_rows(cfg: dict[str, Any]) -> dict[str, Any] | str:
    """Run @serve.batch (and our server, for the same conditions) inside a Serve replica."""
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        return f"Ray Serve is not installed ({exc}); install the bench extra"

    @serve.deployment(max_ongoing_requests=10_000)
    class Bench:
        @serve.batch(max_batch_size=cfg["max_batch"], batch_wait_timeout_s=cfg["max_wait"])
        async def mlp(self, xs: list[Array]) -> list[Array]:
            return list(await self.layer.forward(xs))

        @serve.batch(max_batch_size=cfg["max_batch"], batch_wait_timeout_s=cfg["max_wait"])
        async def nothing(self, xs: list[Array]) -> list[Array]:
            return await noop(xs)

        async def run(self) -> dict[str, Any]:
            limit_blas(cfg["blas_threads"])
            loop = asyncio.get_running_loop()
            system = await System.open_async("ray-replica")
            dev = await system.spawn_device_async(mock=not cfg["cuda"])
            w, b, inputs = weights(cfg["d_in"], cfg["d_out"])
            inputs = inputs[: cfg["requests"]]
            self.layer = await MlpLayer(dev, w, b, cfg["max_batch"]).setup()
            expected = np.maximum(inputs[0].astype(np.float64) @ w + b, 0)
            np.testing.assert_allclose(await self.mlp(inputs[0]), expected, atol=1e-4)
            out = {"loop": f"{type(loop).__module__}.{type(loop).__name__}",
                   "ray": ray.__version__}
            out["ray_batched"] = await drive(lambda c: self.mlp, inputs, cfg["clients"])
            out["ray_noop"] = await drive(lambda c: self.nothing, inputs, cfg["clients"])
            ours = await our_rows(system, dev, cfg, unbatched=False)
            out["ours_in_replica"] = ours
            await system.close_async()
            return out

    try:
        ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        handle = serve.run(Bench.bind(), name="batching-bench")
        result: dict[str, Any] = handle.run.remote().result(timeout_s=600)
    except Exception as exc:  # report why the row is missing, keep the others
        return f"Ray Serve could not run here: {type(exc).__name__}: {exc}"
    finally:
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
    return result


def limit_blas(threads: int) -> None:
    """Limit the BLAS thread pools of this process (threadpoolctl, from the bench extra)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        print("threadpoolctl is not installed: BLAS keeps its default thread count")
        return
    threadpool_limits(limits=threads, user_api="blas")


async def local(cfg: dict[str, Any]) -> dict[str, Any]:
    async with await System.open_async("batching-bench") as system:
        dev = await system.spawn_device_async(mock=not cfg["cuda"])
        return await our_rows(system, dev, cfg, unbatched=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4096)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument("--d-in", type=int, default=256)
    parser.add_argument("--d-out", type=int, default=256)
    parser.add_argument("--cuda", action="store_true", help="the CUDA backend (default: CPU)")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray Serve rows")
    parser.add_argument("--uvloop", action="store_true", help="run our rows on uvloop")
    parser.add_argument("--blas-threads", type=int, default=1, help="OpenBLAS threads")
    parser.add_argument("--out", default="benchmarks/results/batching_bench.json")
    add_quick(parser, requests=256, clients=8, no_ray=True)
    args = parser.parse_args()
    cfg = {"requests": min(args.requests, 4096), "clients": args.clients,
           "max_batch": args.max_batch, "max_wait": args.max_wait_ms / 1e3,
           "d_in": args.d_in, "d_out": args.d_out, "cuda": args.cuda,
           "blas_threads": args.blas_threads}
    limit_blas(args.blas_threads)

    if args.uvloop:
        import uvloop

        ours = uvloop.run(local(cfg))
    else:
        ours = asyncio.run(local(cfg))
    ray = "skipped (--no-ray)" if args.no_ray else ray_rows(cfg)
    report(cfg, ours, ray, args)


def report(cfg: dict[str, Any], ours: dict[str, Any], ray: dict[str, Any] | str,
           args: argparse.Namespace) -> None:
    compute_ms = ours["compute_s"] * 1e3
    backend = "CUDA" if cfg["cuda"] else "the CPU backend"
    title = (f"MLP layer {cfg['d_in']}->{cfg['d_out']} on {backend}, {cfg['clients']} "
             f"clients, {cfg['requests']} requests, max_batch {cfg['max_batch']}, max_wait "
             f"{cfg['max_wait'] * 1e3:g} ms; full-batch compute {compute_ms:.2f} ms")
    rows = [["unbatched", ours["unbatched"]], ["DynamicBatchingServer", ours["batched"]],
            ["DynamicBatchingServer, no-op fn", ours["noop"]]]
    if isinstance(ray, dict):
        replica = ray["ours_in_replica"]
        rows += [["in a Serve replica: DynamicBatchingServer", replica["batched"]],
                 ["in a Serve replica: Ray @serve.batch", ray["ray_batched"]],
                 ["in a Serve replica: DynamicBatchingServer, no-op", replica["noop"]],
                 ["in a Serve replica: Ray @serve.batch, no-op", ray["ray_noop"]]]
    print_table(title, ["path", "req/s", "p50 ms", "p99 ms", "us/request", "mean batch"],
                [[name, r["throughput"], r["p50_ms"], r["p99_ms"], r["per_request_us"],
                  r.get("mean_batch", "-")] for name, r in rows])
    if isinstance(ray, str):
        print(f"\nRay Serve rows skipped: {ray}")
    else:
        print(f"\nRay {ray['ray']}; the Serve replica's event loop: {ray['loop']}")

    speedup = ours["batched"]["throughput"] / ours["unbatched"]["throughput"]
    p99_limit = cfg["max_wait"] * 1e3 + 2 * compute_ms
    goals = [["batched / unbatched throughput", f"{speedup:.1f}x", ">= 10x", speedup >= 10],
             ["batched p99", f"{ours['batched']['p99_ms']:.2f} ms",
              f"<= {p99_limit:.2f} ms", ours["batched"]["p99_ms"] <= p99_limit]]
    if isinstance(ray, dict):
        mine = ray["ours_in_replica"]["noop"]["per_request_us"]
        theirs = ray["ray_noop"]["per_request_us"]
        goals.append(["no-op overhead, ours / Ray's (same replica)",
                      f"{mine:.1f} / {theirs:.1f} us", "<= 1/3", mine <= theirs / 3])
    print_table("goals", ["goal", "measured", "target", "met"],
                [[g[0], g[1], g[2], "yes" if g[3] else "NO"] for g in goals])
    write_json(args.out, {"benchmark": "batching_bench", "config": cfg, "ours": ours,
                          "ray": ray, "goals": {g[0]: {"measured": g[1], "target": g[2],
                                                       "met": g[3]} for g in goals},
                          "uvloop": args.uvloop})


if __name__ == "__main__":
    main()
