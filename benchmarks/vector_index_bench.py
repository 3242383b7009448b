"""Vector indexes: GpuVectorIndex vs direct PyTorch on a GPU; CpuVectorIndex vs FAISS or NumPy.

GPU (when CUDA is present): ``--gpu-n`` x ``--dim`` unit vectors in f16 (1M x
768 by default) in a ``GpuVectorIndex`` (metric ``ip``: on unit vectors it is
the cosine, without normalizing each query again), top-10:

* batch-1 query host to host: a NumPy query in, ``[(id, score)]`` out, p50/p99;
* batched: ``search_batch`` of ``--batch`` queries (1024), queries a second;
* beside it, in the same run on the same f16 matrix, direct PyTorch: upload
  the query, ``q @ M.T``, ``torch.topk``, download ids and scores.

Goals: batch-1 p50 <= 1 ms, batched >= 100k queries/s, both >= 95%
of direct PyTorch. CPU: ``--cpu-n`` x ``--cpu-dim`` (100k x 384) in a
``CpuVectorIndex``, batch-1 p50 and batched queries/s beside FAISS's
``IndexFlatIP`` when ``faiss`` imports (goal: within 1.5x), else beside a direct
NumPy matmul + ``argpartition`` (the row says which).

    python benchmarks/vector_index_bench.py [--json PATH] [--gpu-n N] [--no-gpu]
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _report import add_quick, has_cuda, percentile, print_table, write_json

from atomr_accel import System
from atomr_accel.agents._gpu_index import GpuVectorIndex
from atomr_accel.agents._index import CpuVectorIndex
from atomr_accel.core.ops._topk import ScoreTopK, TopK

Array = np.ndarray[Any, Any]
TOP_K = 10


def latencies_ms(call: Callable[[Array], Any], queries: Array, warmup: int) -> list[float]:
    """Wall time of ``call(q)`` for each query after ``warmup`` untimed calls, in ms."""
    for q in queries[:warmup]:
        call(q)
    samples = []
    for q in queries[warmup:]:
        start = time.perf_counter()
        call(q)
        samples.append((time.perf_counter() - start) * 1e3)
    return samples


def qps(call: Callable[[Array], Any], batches: list[Array], warmup: int = 2) -> float:
    """Queries a second of ``call(batch)`` over ``batches`` after ``warmup`` untimed ones."""
    for batch in batches[:warmup]:
        call(batch)
    timed = batches[warmup:]
    start = time.perf_counter()
    for batch in timed:
        call(batch)
    return sum(len(b) for b in timed) / (time.perf_counter() - start)


def optional(name: str) -> Any:
    """The module ``name``, or None when it does not import."""
    try:
        return importlib.import_module(name)
    except Exception:  # ImportError, or a loader error of its native libraries
        return None


# ----------------------------------------------------------------------------- GPU


def gpu_rows(args: argparse.Namespace, system: System) -> tuple[list[list[Any]], dict[str, Any]]:
    """Batch-1 latency and batched throughput of GpuVectorIndex and of direct PyTorch."""
    cp, torch = optional("cupy"), optional("torch")
    n, dim, batch = args.gpu_n, args.dim, args.batch
    rng = cp.random.default_rng(0)
    matrix = rng.standard_normal((n, dim), dtype=cp.float32)
    matrix /= cp.linalg.norm(matrix, axis=1, keepdims=True)
    matrix16 = matrix.astype(cp.float16)
    del matrix
    host16 = matrix16.get()
    queries = np.random.default_rng(1).standard_normal((args.queries + batch * 12, dim))
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)

    device = system.spawn_device(mock=False)
    index = GpuVectorIndex.spawn(system, device, dim, "ip", "f16")
    start = time.perf_counter()
    chunk = 1 << 17
    for first in range(0, n, chunk):
        index.insert_many(np.arange(first, min(n, first + chunk)), host16[first:first + chunk],
                          timeout_secs=120)
    insert_s = time.perf_counter() - start

    index.search(queries[0], TOP_K, timeout_secs=120)  # first call: library set-up
    ours_1 = latencies_ms(lambda q: index.search(q, TOP_K), queries[: args.queries], 50)
    batches = [queries[i * batch:(i + 1) * batch] for i in range(12)]
    ours_qps = qps(lambda b: index.search_batch(b, TOP_K, timeout_secs=60), batches)

    rows = [["GpuVectorIndex f16", f"{n} x {dim}", percentile(ours_1, 50),
             percentile(ours_1, 99), ours_qps]]
    facts: dict[str, Any] = {"n": n, "dim": dim, "batch": batch, "insert_s": insert_s,
                             "ours_p50_ms": percentile(ours_1, 50),
                             "ours_p99_ms": percentile(ours_1, 99), "ours_qps": ours_qps}
    if torch is None:
        return rows, facts
    m = torch.from_dlpack(matrix16)

    def direct(q: Array) -> tuple[Any, Any]:
        x = torch.from_numpy(np.ascontiguousarray(q, dtype=np.float16)).cuda().reshape(-1, dim)
        values, ids = torch.topk(x @ m.T, TOP_K, dim=1)
        return ids.cpu(), values.cpu()

    torch_1 = latencies_ms(direct, queries[: args.queries], 50)
    torch_qps = qps(direct, batches)
    rows.append(["torch q @ M.T + topk", f"{n} x {dim}", percentile(torch_1, 50),
                 percentile(torch_1, 99), torch_qps])
    p50_ratio = percentile(torch_1, 50) / percentile(ours_1, 50)
    qps_ratio = ours_qps / torch_qps
    rows.append(["ours / torch (speed)", "", p50_ratio, "", qps_ratio])
    stage_rows, facts["stages"] = stages(device, index, host16, queries, batch)
    print_table("GPU, where the time goes (p50 ms)", ["stage", "ms"], stage_rows)
    sample = queries[:32]
    ours_ids = [[i for i, _ in r] for r in index.search_batch(sample, TOP_K)]
    torch_ids = direct(sample)[0].numpy()
    agree = np.mean([len(set(a) & set(b.tolist())) / TOP_K
                     for a, b in zip(ours_ids, torch_ids, strict=True)])
    facts.update({"torch_p50_ms": percentile(torch_1, 50), "torch_p99_ms": percentile(torch_1, 99),
                  "torch_qps": torch_qps, "p50_speed_ratio": p50_ratio,
                  "qps_ratio": qps_ratio, "top10_agreement_with_torch": agree})
    return rows, facts


def stages(device: Any, index: GpuVectorIndex, host16: Array, queries: Array,
           batch: int) -> tuple[list[list[Any]], dict[str, float]]:
    """Where a search's time goes, p50 ms: the ``ScoreTopK`` op alone (what a search runs on
    the device), the ``TopK`` op alone on stored scores, direct torch's matmul alone (with a
    synchronize), and the actor round trip (``count()``)."""
    torch = optional("torch")
    n, dim = host16.shape
    matrix = device.allocate(n * dim, "f16")
    device.copy_from_numpy(matrix, host16.reshape(-1))
    found: dict[str, float] = {}
    rows = []
    for m, repeats in ((1, 200), (batch, 8)):
        q16 = queries[:m].astype(np.float16)
        scores = device.allocate(m * n, "f16")
        q = _uploaded(device, q16)
        device.blaslt().matmul(q, matrix, scores, m, n, dim, trans_b=True)

        def fused(_: Array, q16: Array = q16) -> None:
            device.run(ScoreTopK(q16, device.ref_of(matrix), n, dim, TOP_K))

        def top(_: Array, scores: Any = scores, m: int = m) -> None:
            device.run(TopK(device.ref_of(scores), m, n, TOP_K))

        times = {"ScoreTopK op": latencies_ms(fused, queries[:repeats], 3),
                 "TopK op": latencies_ms(top, queries[:repeats], 3)}
        if torch is not None:
            weights = torch.from_numpy(host16).cuda()
            x = torch.from_numpy(q16).cuda()

            def torch_matmul(_: Array, x: Any = x, weights: Any = weights) -> None:
                x @ weights.T
                torch.cuda.synchronize()

            times["torch matmul alone"] = latencies_ms(torch_matmul, queries[:repeats], 3)
            del weights
        for stage, samples in times.items():
            found[f"{stage.replace(' ', '_')}_m{m}_p50_ms"] = percentile(samples, 50)
            rows.append([f"{stage}, {m} queries", percentile(samples, 50)])
        device.free(scores)
        device.free(q)
    device.free(matrix)
    trip = latencies_ms(lambda _: index.count(), queries[:200], 10)
    found["actor_round_trip_p50_ms"] = percentile(trip, 50)
    rows.append(["actor round trip (count())", percentile(trip, 50)])
    return rows, found


def _uploaded(device: Any, host: Array) -> Any:
    """A device buffer holding ``host`` (flattened)."""
    buffer = device.allocate(host.size, "f16")
    device.copy_from_numpy(buffer, host.reshape(-1))
    return buffer


# ----------------------------------------------------------------------------- CPU


def cpu_rows(args: argparse.Namespace, system: System) -> tuple[list[list[Any]], dict[str, Any]]:
    """Batch-1 latency and batched throughput of CpuVectorIndex and of a direct baseline."""
    n, dim = args.cpu_n, args.cpu_dim
    rng = np.random.default_rng(2)
    matrix = rng.standard_normal((n, dim), dtype=np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    queries = rng.standard_normal((args.cpu_queries + 64 * 8, dim), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    batches = [queries[i * 64:(i + 1) * 64] for i in range(8)]
    singles = queries[: args.cpu_queries]

    index = CpuVectorIndex.spawn(system, dim, metric="ip")
    index.insert_many(np.arange(n), matrix, timeout_secs=60)
    ours_1 = latencies_ms(lambda q: index.search(q, TOP_K), singles, 10)
    ours_qps = qps(lambda b: index.search_batch(b, TOP_K), batches)

    faiss = optional("faiss")
    if faiss is not None:
        flat = faiss.IndexFlatIP(dim)
        flat.add(matrix)
        name = "faiss IndexFlatIP"

        def baseline(q: Array) -> Any:
            return flat.search(q.reshape(-1, dim), TOP_K)
    else:
        name = "numpy matmul + argpartition"

        def baseline(q: Array) -> Any:
            scores = q.reshape(-1, dim) @ matrix.T
            top = np.argpartition(scores, n - TOP_K, axis=1)[:, n - TOP_K:]
            order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
            return np.take_along_axis(top, order, axis=1)

    base_1 = latencies_ms(baseline, singles, 10)
    base_qps = qps(baseline, batches)
    ratio = percentile(ours_1, 50) / percentile(base_1, 50)
    rows = [["CpuVectorIndex", f"{n} x {dim}", percentile(ours_1, 50), percentile(ours_1, 99),
             ours_qps],
            [name, f"{n} x {dim}", percentile(base_1, 50), percentile(base_1, 99), base_qps],
            ["ours / baseline (time)", "", ratio, "", base_qps / ours_qps]]
    facts = {"n": n, "dim": dim, "baseline": name, "faiss": faiss is not None,
             "ours_p50_ms": percentile(ours_1, 50), "ours_qps_batch64": ours_qps,
             "baseline_p50_ms": percentile(base_1, 50), "baseline_qps_batch64": base_qps,
             "p50_time_ratio": ratio}
    return rows, facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the results to this path")
    parser.add_argument("--gpu-n", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--cpu-n", type=int, default=100_000)
    parser.add_argument("--cpu-dim", type=int, default=384)
    parser.add_argument("--cpu-queries", type=int, default=100)
    parser.add_argument("--no-gpu", action="store_true", help="run the CPU rows only")
    add_quick(parser, gpu_n=20_000, dim=128, batch=64, queries=20, cpu_n=2_000, cpu_queries=20)
    args = parser.parse_args()
    if args.quick and not args.no_gpu and not has_cuda():
        print("no CUDA device visible: the CPU rows only (--no-gpu)")
        args.no_gpu = True

    columns = ["path", "vectors", "batch-1 p50 ms", "p99 ms", "batched q/s"]
    payload: dict[str, Any] = {}
    cp = None if args.no_gpu else optional("cupy")
    with System.open("vector-index-bench", op_timeout=120.0) as system:
        if cp is not None and cp.cuda.runtime.getDeviceCount() > 0:
            rows, payload["gpu"] = gpu_rows(args, system)
            print_table(f"GPU, f16, top-{TOP_K}, batched = {args.batch} queries a call "
                        "(ratio row: speed, >= 0.95 is the goal)", columns, rows)
        else:
            print("\nGPU rows skipped: no CUDA device (or --no-gpu)")
        rows, payload["cpu"] = cpu_rows(args, system)
        print_table(f"CPU, f32, top-{TOP_K}, batched = 64 queries a call "
                    "(ratio row: time, <= 1.5 is the goal)", columns, rows)
    if args.json:
        write_json(args.json, payload)


if __name__ == "__main__":
    main()
