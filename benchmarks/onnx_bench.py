"""ONNX MLP through ``OnnxEngine`` in a ``DynamicBatchingServer``: batched vs unbatched.

An MLP (``--features`` -> ``--hidden`` -> ReLU -> ``--hidden`` -> ReLU ->
``--classes``, f32, built with ``onnx.helper``) is loaded with ``dev.onnx()``
on each device asked for (``--devices cpu,cuda``: the CPU backend on ONNX
Runtime's CPU provider; a CUDA device on the CUDA provider, or on the CPU
provider with a note when this onnxruntime has no CUDA provider).
``CLIENTS`` closed-loop clients on the system's event loop send ``--requests``
single-row requests (host arrays) in all:

* unbatched: each request is its own ``engine.run_async`` of one row;
* through a ``DynamicBatchingServer`` over ``engine.batch_fn()`` with
  ``max_batch`` 1, and with ``max_batch`` 64 (batched), ``max_wait`` 2 ms.

Beside them, ONNX Runtime called directly on the same model in a loop, one
row a call and 64 rows a call (``direct``, rows a second), bounds what
batching can give on that machine.

Goal: batched >= 10x unbatched requests a second at batch 64.

    python benchmarks/onnx_bench.py [--json PATH] [--quick] [--devices cpu,cuda]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import numpy as np
from _report import print_table, write_json

from atomr_accel import LibraryUnavailable, OnnxEngine, System
from atomr_accel.patterns import DynamicBatchingServer

Array = np.ndarray[Any, Any]
T = TypeVar("T")
BATCH = 64


def mlp_model(features: int, hidden: int, classes: int) -> bytes:
    """A two-hidden-layer MLP with random weights and a free batch axis, serialized."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    sizes = [features, hidden, hidden, classes]
    nodes, inits, last = [], [], "x"
    for i, (m, n) in enumerate(itertools.pairwise(sizes)):
        w = (rng.standard_normal((m, n)) / np.sqrt(m)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        out = "y" if i == len(sizes) - 2 else f"h{i}"
        nodes.append(helper.make_node("Gemm", [last, f"w{i}", f"b{i}"],
                                      [out if out == "y" else f"g{i}"]))
        if out != "y":
            nodes.append(helper.make_node("Relu", [f"g{i}"], [out]))
        last = out
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


CLIENTS = 256
"""Closed-loop clients: each sends its next request when the last was answered."""


def on_loop(system: System, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the system's own event loop (where a server's clients, actors, live)
    and wait for it here."""
    return asyncio.run_coroutine_threadsafe(coro, system._portal.loop).result()


async def closed_loop(call: Callable[[Array], Awaitable[Any]], rows: Array) -> float:
    """Requests a second of ``CLIENTS`` closed-loop clients sending ``rows`` through
    ``call``, after a first unmeasured round of ``2 * CLIENTS`` requests."""
    async def run(todo: Iterator[int]) -> None:
        async def client() -> None:
            for i in todo:
                await call(rows[i])

        await asyncio.gather(*(client() for _ in range(CLIENTS)))

    await run(iter(range(2 * CLIENTS)))
    start = time.perf_counter()
    await run(iter(range(len(rows))))
    return len(rows) / (time.perf_counter() - start)


def unbatched_rate(system: System, engine: OnnxEngine, rows: Array) -> float:
    """Requests a second with each request its own ``engine.run_async`` of one row."""
    async def call(row: Array) -> Any:
        return (await engine.run_async({"x": row[None]}))["y"][0]

    return on_loop(system, closed_loop(call, rows))


def served_rate(system: System, engine: OnnxEngine, rows: Array, max_batch: int) -> float:
    """Requests a second through a ``DynamicBatchingServer`` of ``max_batch`` over
    ``engine.batch_fn()``."""
    server = DynamicBatchingServer.spawn(system, engine.batch_fn(), max_batch=max_batch,
                                         max_wait=0.002, queue_capacity=4 * CLIENTS)
    try:
        answer = on_loop(system, server.submit(rows[0], timeout=60))
        assert answer.shape == (engine.info.outputs[0].shape[1],)
        return on_loop(system, closed_loop(lambda r: server.submit(r, timeout=300), rows))
    finally:
        server.stop()


def direct_rate(model: bytes, providers: list[str], rows: Array, batch: int) -> float:
    """Rows a second of ONNX Runtime called directly, ``batch`` rows a call (its threads do
    not spin, as in the engine's session)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model, sess_options=options, providers=providers)
    chunks = [rows[i:i + batch] for i in range(0, len(rows) - batch + 1, batch)]
    for chunk in chunks[:3]:
        session.run(None, {"x": chunk})
    start = time.perf_counter()
    for chunk in chunks:
        session.run(None, {"x": chunk})
    return len(chunks) * batch / (time.perf_counter() - start)


def bench_device(system: System, kind: str, model: bytes, rows: Array,
                 ) -> tuple[list[list[Any]], dict[str, Any]]:
    """The rows of one device: served unbatched and batched, and direct ONNX Runtime."""
    dev = system.spawn_device(mock=kind == "cpu")
    note = ""
    try:
        engine = dev.onnx().load(model)
    except LibraryUnavailable as exc:
        note = f"no CUDA provider ({exc.package} missing): CPU provider on the CUDA device"
        engine = dev.onnx().load(model, providers=["CPUExecutionProvider"])
    providers = list(engine.providers)
    unbatched = unbatched_rate(system, engine, rows)
    served_one = served_rate(system, engine, rows, 1)
    batched = served_rate(system, engine, rows, BATCH)
    names = [p for p in providers if p in ("CUDAExecutionProvider", "CPUExecutionProvider")]
    one = direct_rate(model, names, rows, 1)
    many = direct_rate(model, names, rows, BATCH)
    provider = providers[0].replace("ExecutionProvider", "")
    table = [
        [kind, provider, "engine.run per request (unbatched)", 1, round(unbatched), 1.0],
        [kind, provider, "server, max_batch 1", 1, round(served_one), served_one / unbatched],
        [kind, provider, f"server, max_batch {BATCH} (batched)", BATCH, round(batched),
         batched / unbatched],
        [kind, provider, "direct onnxruntime", 1, round(one), one / unbatched],
        [kind, provider, "direct onnxruntime", BATCH, round(many), many / unbatched],
    ]
    result = {"providers": providers, "note": note, "unbatched_per_s": unbatched,
              "served_max_batch_1_per_s": served_one, "batched_per_s": batched,
              "speedup": batched / unbatched,
              "direct_1_per_s": one, "direct_64_per_s": many,
              "goal_10x_met": batched / unbatched >= 10}
    return table, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the results to this path")
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--devices", default="cpu,cuda",
                        help="comma-separated: cpu (CPU backend), cuda (when CuPy sees a GPU)")
    parser.add_argument("--requests", type=int, default=8192)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--classes", type=int, default=16)
    args = parser.parse_args()
    requests = 1024 if args.quick else args.requests
    model = mlp_model(args.features, args.hidden, args.classes)
    rows = np.random.default_rng(1).standard_normal((requests, args.features)).astype(np.float32)
    kinds = [k.strip() for k in args.devices.split(",") if k.strip()]
    table: list[list[Any]] = []
    results: dict[str, Any] = {}
    with System.open("onnx-bench") as system:
        for kind in kinds:
            if kind == "cuda" and not cuda_present():
                print("no CUDA device here: skipping the cuda rows")
                continue
            rows_of, results[kind] = bench_device(system, kind, model, rows)
            table += rows_of
    print_table(f"ONNX MLP {args.features}-{args.hidden}-{args.hidden}-{args.classes} f32, "
                f"{requests} single-row requests (goal: batched >= 10x unbatched)",
                ["device", "provider", "path", "rows/call", "requests/s", "x unbatched"], table)
    for kind, result in results.items():
        if result["note"]:
            print(f"{kind}: {result['note']}")
    if args.json:
        write_json(args.json, {"benchmark": "onnx", "requests": requests,
                               "model": [args.features, args.hidden, args.hidden, args.classes],
                               "results": results})


def cuda_present() -> bool:
    """Whether CuPy imports and sees a GPU."""
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:
        return False


if __name__ == "__main__":
    main()
