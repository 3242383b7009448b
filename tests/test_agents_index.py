"""EmbeddingCache, CpuVectorIndex and GpuVectorIndex (on the CPU backend) against plain models.

The indexes are checked against an independent exact top-k in float64 NumPy
(sort by score, then by id); integer-valued data makes every float32 product
exact, so ties are real ties and ids must match exactly. The cache is checked
against an ``OrderedDict`` LRU model under random interleavings (hypothesis).
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atomr_accel import InvalidArgument, System
from atomr_accel.agents import CpuVectorIndex, EmbeddingCache, GpuVectorIndex, UnknownVectorId
from atomr_accel.core.ops._topk import ScoreTopK, TopK

METRICS = ("cosine", "ip", "l2")


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("agents-index") as opened:
        yield opened


def reference(matrix: np.ndarray[Any, Any], ids: list[int], query: np.ndarray[Any, Any],
              top_k: int, metric: str) -> list[tuple[int, float]]:
    """Exact top-k in float64: best score first, equal scores by smaller id."""
    m = np.asarray(matrix, dtype=np.float64)
    q = np.asarray(query, dtype=np.float64)
    if metric == "cosine":
        m = m / np.linalg.norm(m, axis=1, keepdims=True)
        q = q / np.linalg.norm(q)
    if metric == "l2":
        keyed = [(float(((row - q) ** 2).sum()), i) for row, i in zip(m, ids, strict=True)]
    else:
        keyed = [(-float(row @ q), i) for row, i in zip(m, ids, strict=True)]
    keyed.sort()
    return [(i, -s if metric != "l2" else s) for s, i in keyed[:top_k]]


def assert_same(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> None:
    assert [i for i, _ in got] == [i for i, _ in want]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=1e-5, atol=1e-5)


def data(seed: int, n: int, dim: int, integer: bool) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    if integer:
        matrix = rng.integers(-2, 3, (n, dim)).astype(np.float32)
        matrix[np.abs(matrix).sum(axis=1) == 0, 0] = 1  # no zero vector (cosine)
        return matrix
    return rng.standard_normal((n, dim)).astype(np.float32)


# ------------------------------------------------------------------------ CpuVectorIndex


CASES = [("cosine", False), ("ip", False), ("l2", False), ("ip", True), ("l2", True)]
"""(metric, integer data): integer data makes ties (cosine ties: ``test_cosine_ties_by_id``)."""


@pytest.mark.parametrize(("metric", "integer"), CASES)
def test_search_equals_numpy_exact_top_k(system: System, metric: str, integer: bool) -> None:
    index = CpuVectorIndex.spawn(system, 8, metric=metric)
    matrix = data(1, 300, 8, integer)
    ids = [int(i) for i in np.random.default_rng(2).permutation(10_000)[:300]]
    index.insert_many(ids, matrix)
    queries = data(3, 12, 8, integer)
    for query in queries:
        assert_same(index.search(query, 10), reference(matrix, ids, query, 10, metric))
    batch = index.search_batch(queries, 7)
    for query, got in zip(queries, batch, strict=True):
        assert_same(got, reference(matrix, ids, query, 7, metric))


def test_cosine_ties_by_id(system: System) -> None:
    index = CpuVectorIndex.spawn(system, 3, metric="cosine")
    index.insert_many([9, 4, 7, 1], [[0, 2, 0], [0, 5, 0], [1, 0, 0], [0, 1, 0]])
    assert [i for i, _ in index.search([0, 3, 0], 2)] == [1, 4]
    assert [i for i, _ in index.search([0, 3, 0], 4)] == [1, 4, 9, 7]


def test_upsert_remove_and_growth(system: System) -> None:
    index = CpuVectorIndex.spawn(system, 4, metric="ip")
    rng = np.random.default_rng(5)
    model: dict[int, np.ndarray[Any, Any]] = {}
    for step in range(60):
        ids = [int(i) for i in rng.choice(200, size=int(rng.integers(1, 30)), replace=False)]
        rows = rng.integers(-3, 4, (len(ids), 4)).astype(np.float32)
        index.insert_many(ids, rows)
        model.update(zip(ids, rows, strict=True))
        for victim in rng.choice(sorted(model), size=min(3, len(model)), replace=False):
            index.remove(int(victim))
            del model[int(victim)]
        if step % 10 == 0:
            index.insert(5000 + step, [1, 2, 3, 4])
            model[5000 + step] = np.array([1, 2, 3, 4], dtype=np.float32)
        assert len(index) == index.count() == len(model)
        query = rng.integers(-3, 4, 4).astype(np.float32)
        ids_now = sorted(model)
        want = reference(np.array([model[i] for i in ids_now]), ids_now, query, 15, "ip")
        assert_same(index.search(query, 15), want)


def test_upsert_replaces_the_vector(system: System) -> None:
    index = CpuVectorIndex.spawn(system, 2, metric="l2")
    index.insert_many([1, 2], [[0, 0], [10, 10]])
    index.insert(1, [20, 20])
    index.insert_many([3, 2], [[5, 5], [0, 1]])
    assert len(index) == 3
    assert index.search([0, 0], 3) == [(2, 1.0), (3, 50.0), (1, 800.0)]


def test_remove_unknown_id_is_typed(system: System) -> None:
    index = CpuVectorIndex.spawn(system, 2, metric="ip")
    index.insert(1, [1, 0])
    index.remove(1)
    with pytest.raises(UnknownVectorId) as caught:
        index.remove(1)
    assert caught.value.id == 1
    assert isinstance(caught.value, InvalidArgument)
    assert index.search([1, 0], 3) == []
    index.insert(1, [0, 1])  # the actor kept running
    assert index.search([0, 1], 3) == [(1, 1.0)]


def test_top_k_beyond_the_count_returns_all(system: System) -> None:
    index = CpuVectorIndex.spawn(system, 2, metric="ip")
    index.insert_many([3, 1, 2], [[1, 0], [2, 0], [1, 0]])
    assert index.search([1, 0], 10) == [(1, 2.0), (2, 1.0), (3, 1.0)]


@pytest.mark.parametrize("metric", METRICS)
def test_save_and_load_round_trip(system: System, tmp_path: Path, metric: str) -> None:
    index = CpuVectorIndex.spawn(system, 6, metric=metric)
    matrix = data(7, 50, 6, False)
    index.insert_many(range(100, 150), matrix)
    index.remove(120)
    path = tmp_path / "index.npz"
    assert index.save(path) == 49
    with np.load(path) as saved:
        assert str(saved["metric"]) == metric
        assert sorted(saved["ids"].tolist()) == [i for i in range(100, 150) if i != 120]
        assert saved["vectors"].shape == (49, 6)
    copy = CpuVectorIndex.spawn(system, 6, metric=metric)
    copy.insert(1, matrix[0])  # load replaces the contents
    assert copy.load(str(path)) == 49
    assert len(copy) == 49
    for query in data(8, 5, 6, False):
        assert copy.search(query, 5) == index.search(query, 5)


def test_load_refuses_another_dim_metric_or_file(system: System, tmp_path: Path) -> None:
    index = CpuVectorIndex.spawn(system, 3, metric="ip")
    index.insert(1, [1, 2, 3])
    path = tmp_path / "ip.npz"
    index.save(path)
    with pytest.raises(InvalidArgument, match="vectors of 4 numbers"):
        CpuVectorIndex.spawn(system, 4, metric="ip").load(path)
    with pytest.raises(InvalidArgument, match="l2"):
        CpuVectorIndex.spawn(system, 3, metric="l2").load(path)
    with pytest.raises(InvalidArgument, match="cannot read"):
        index.load(tmp_path / "missing.npz")
    other = tmp_path / "other.npz"
    np.savez(other, x=np.zeros(3))
    with pytest.raises(InvalidArgument):
        index.load(other)
    assert index.search([1, 0, 0], 1) == [(1, 1.0)]


@pytest.mark.parametrize(("call", "message"), [
    (lambda ix: ix.insert(1, [1, 2]), "3 numbers"),
    (lambda ix: ix.insert(1, [[1, 2, 3]]), "3 numbers"),
    (lambda ix: ix.insert(1, [1, float("nan"), 3]), "finite"),
    (lambda ix: ix.insert(1, [0, 0, 0]), "zero vector"),
    (lambda ix: ix.insert(True, [1, 2, 3]), "int"),
    (lambda ix: ix.insert("a", [1, 2, 3]), "int"),
    (lambda ix: ix.insert_many([1, 1], [[1, 2, 3], [1, 2, 3]]), "distinct"),
    (lambda ix: ix.insert_many([1, 2], [[1, 2, 3]]), "2 ids for 1 rows"),
    (lambda ix: ix.insert_many([1], [1, 2, 3]), "sequence of vectors"),
    (lambda ix: ix.search([1, 2], 3), "3 numbers"),
    (lambda ix: ix.search([1, 2, 3], 0), "top_k"),
    (lambda ix: ix.search([1, 2, 3], 2.5), "top_k"),
    (lambda ix: ix.search_batch([1, 2, 3], 2), "sequence of vectors"),
    (lambda ix: ix.search_batch([], 2), "sequence of vectors"),
    (lambda ix: ix.search([1, 2, 3], 1, timeout_secs=0), "timeout_secs"),
    (lambda ix: ix.remove(None), "int"),
    (lambda ix: ix.save(3), "path"),
])
def test_bad_arguments_are_invalid_argument(system: System, call: Any, message: str) -> None:
    index = CpuVectorIndex.spawn(system, 3, metric="cosine")
    with pytest.raises(InvalidArgument, match=message):
        call(index)


def test_bad_settings_are_invalid_argument(system: System) -> None:
    with pytest.raises(InvalidArgument, match="metric"):
        CpuVectorIndex.spawn(system, 3, metric="dot")
    with pytest.raises(InvalidArgument, match="dim"):
        CpuVectorIndex.spawn(system, 0)
    with pytest.raises(InvalidArgument, match="System"):
        CpuVectorIndex.spawn(object(), 3)


def test_async_twins_from_a_foreign_event_loop(system: System) -> None:
    index = CpuVectorIndex.spawn(system, 2, metric="ip")

    async def use() -> list[tuple[int, float]]:
        await index.insert_many_async([1, 2], [[1, 0], [0, 1]])
        await asyncio.gather(index.insert_async(3, [2, 0]), index.remove_async(2))
        assert await index.count_async() == 2
        return await index.search_async([1, 0], 5)

    assert asyncio.run(use()) == [(3, 2.0), (1, 1.0)]


# ------------------------------------------------------------------------- EmbeddingCache


@st.composite
def cache_ops(draw: st.DrawFn) -> list[tuple[str, Any]]:
    keys = st.sampled_from([b"a", b"b", "c", "d", b"e", "f"])
    op = st.one_of(st.tuples(st.just("get"), keys),
                   st.tuples(st.just("insert"), keys),
                   st.tuples(st.just("get_many"), st.lists(keys, max_size=4)))
    return draw(st.lists(op, max_size=40))


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(1, 4), ops=cache_ops())
def test_cache_is_an_lru_like_the_ordered_dict_model(system: System, capacity: int,
                                                      ops: list[tuple[str, Any]]) -> None:
    cache = EmbeddingCache.spawn(system, capacity, 2)
    model: OrderedDict[bytes | str, list[float]] = OrderedDict()
    hits = misses = evictions = 0

    def model_get(key: bytes | str) -> list[float] | None:
        nonlocal hits, misses
        if key not in model:
            misses += 1
            return None
        hits += 1
        model.move_to_end(key)
        return model[key]

    for step, (name, arg) in enumerate(ops):
        if name == "get":
            assert cache.get(arg) == model_get(arg)
        elif name == "get_many":
            assert cache.get_many(arg) == [model_get(key) for key in arg]
        else:
            value = [float(step), 0.5]
            cache.insert(arg, value)
            model[arg] = value
            model.move_to_end(arg)
            while len(model) > capacity:
                model.popitem(last=False)
                evictions += 1
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["evictions"], stats["entries"]) == (
        hits, misses, evictions, len(model))
    assert [cache.get(key) for key in model] == list(model.values())
    cache.stop()


def test_cache_bounds_bytes_and_keeps_float32(system: System) -> None:
    cache = EmbeddingCache.spawn(system, 100, 4, capacity_bytes=40)  # 16 bytes a key: 2 keys
    for key in ("x", "y", "z"):
        cache.insert(key, [0.1, 0.2, 0.3, 0.4])
    assert cache.get("x") is None
    assert cache.get("z") == np.float32([0.1, 0.2, 0.3, 0.4]).tolist()
    assert cache.stats()["entries"] == 2
    assert cache.stats()["evictions"] == 1


def test_cache_bad_arguments_are_invalid_argument(system: System) -> None:
    cache = EmbeddingCache.spawn(system, 2, 3)
    with pytest.raises(InvalidArgument, match="3 numbers"):
        cache.insert(b"k", [1.0, 2.0])
    with pytest.raises(InvalidArgument, match="finite"):
        cache.insert(b"k", [1.0, 2.0, float("inf")])
    with pytest.raises(InvalidArgument, match="bytes or str"):
        cache.get(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="sequence of keys"):
        cache.get_many("abc")
    with pytest.raises(InvalidArgument, match="capacity_entries"):
        EmbeddingCache.spawn(system, 0, 3)
    with pytest.raises(InvalidArgument, match="capacity_bytes"):
        EmbeddingCache.spawn(system, 2, 3, capacity_bytes=8)
    assert cache.stats()["entries"] == 0


def test_cache_async_twins(system: System) -> None:
    cache = EmbeddingCache.spawn(system, 4, 2, name="twins")

    async def use() -> list[list[float] | None]:
        await cache.insert_async("q", [1.0, 2.0])
        assert await cache.get_async("q") == [1.0, 2.0]
        return await cache.get_many_async(["q", "r"])

    assert asyncio.run(use()) == [[1.0, 2.0], None]
    assert cache.path.endswith("twins")


# ------------------------------------------------- GpuVectorIndex and TopK on the CPU backend


@pytest.fixture(scope="module")
def device(system: System) -> Any:
    return system.spawn_device(mock=True)


def fill_both(indexes: list[Any], seed: int, n: int, dim: int) -> np.ndarray[Any, Any]:
    """The same inserts (in chunks: growth), upserts and removes on every index."""
    rng = np.random.default_rng(seed)
    matrix = data(seed, n, dim, integer=True)
    ids = rng.permutation(50 * n)[:n]
    for part in np.array_split(np.arange(n), 5):
        for index in indexes:
            index.insert_many(ids[part], matrix[part])
    for victim in ids[: n // 10]:
        for index in indexes:
            index.remove(int(victim))
    for index in indexes:
        index.insert_many(ids[n // 2: n // 2 + 3], matrix[:3])
    return data(seed + 1, 16, dim, integer=True)


@pytest.mark.parametrize(("metric", "dtype"), [
    ("cosine", "f32"), ("ip", "f32"), ("l2", "f32"), ("ip", "f16"), ("l2", "f16")])
def test_gpu_index_on_the_cpu_backend_equals_the_cpu_index(
        system: System, device: Any, metric: str, dtype: str) -> None:
    """f16 too for ip/l2: small integers and their products are exact in float16."""
    cpu = CpuVectorIndex.spawn(system, 16, metric=metric)
    gpu = GpuVectorIndex.spawn(system, device, 16, metric, dtype)
    queries = fill_both([cpu, gpu], 11, 2500, 16)  # small integers: exact in f16 too
    assert len(gpu) == len(cpu)
    want = cpu.search_batch(queries, 10)
    got = gpu.search_batch(queries, 10)
    for g, w in zip(got, want, strict=True):
        assert [i for i, _ in g] == [i for i, _ in w]
        np.testing.assert_allclose([s for _, s in g], [s for _, s in w], rtol=1e-5, atol=1e-5)
    assert gpu.search(queries[0], 3) == cpu.search(queries[0], 3)
    gpu.stop()


def test_gpu_index_save_load_and_errors(system: System, device: Any, tmp_path: Path) -> None:
    gpu = GpuVectorIndex.spawn(system, device, 4, "l2")
    gpu.insert_many([5, 6, 7], [[0, 0, 0, 1], [0, 0, 2, 0], [3, 0, 0, 0]])
    with pytest.raises(UnknownVectorId):
        gpu.remove(8)
    gpu.save(tmp_path / "gpu.npz")
    cpu = CpuVectorIndex.spawn(system, 4, metric="l2")
    assert cpu.load(tmp_path / "gpu.npz") == 3
    assert cpu.search([0, 0, 0, 0], 3) == gpu.search([0, 0, 0, 0], 3) == [
        (5, 1.0), (6, 4.0), (7, 9.0)]
    with pytest.raises(InvalidArgument, match="Device"):
        GpuVectorIndex.spawn(system, object(), 4)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="dtype"):
        GpuVectorIndex.spawn(system, device, 4, dtype="bf16")
    empty = GpuVectorIndex.spawn(system, device, 4, "ip")
    assert empty.search([1, 0, 0, 0], 2) == []


@pytest.mark.parametrize("levels", [2, 4, 1000], ids=["all-spares-tie", "ties", "few-ties"])
def test_top_k_op_orders_by_value_then_key(device: Any, levels: int) -> None:
    rng = np.random.default_rng(4)
    m, n, k = 6, 40, 5
    x = rng.integers(0, levels, (m, n)).astype(np.float32)
    keys = rng.permutation(1000)[:n].astype(np.int64)
    xb = device.allocate(m * n, "f32")
    kb = device.allocate(n, "i64")
    device.copy_from_numpy(xb, x.reshape(-1))
    device.copy_from_numpy(kb, keys)
    columns, values = device.run(TopK(device.ref_of(xb), m, n, k, device.ref_of(kb)))
    plain_columns, _ = device.run(TopK(device.ref_of(xb), m, n, n + 3))
    for row in range(m):
        order = sorted(range(n), key=lambda j: (-x[row, j], keys[j]))
        assert columns[row].tolist() == order[:k]
        assert values[row].tolist() == x[row, order[:k]].tolist()
        assert plain_columns[row].tolist() == sorted(range(n), key=lambda j: (-x[row, j], j))
    with pytest.raises(InvalidArgument, match="k must be"):
        device.run(TopK(device.ref_of(xb), m, n, 0))
    with pytest.raises(InvalidArgument, match="keys"):
        device.run(TopK(device.ref_of(xb), m, n, 2, device.ref_of(xb)))


@pytest.mark.parametrize(("n", "levels"), [(100_000, 3), (150_001, 50), (99_999, 10**6)],
                         ids=["ties", "tail-group", "few-ties"])
def test_top_k_of_long_rows_selects_by_groups_exactly(device: Any, n: int, levels: int) -> None:
    """Rows of more than 4 * (k + 8) groups of 1024 columns take the two-stage selection;
    the answer is still every row's exact best, ties by key."""
    rng = np.random.default_rng(n)
    m, k = 3, 7
    x = rng.integers(0, levels, (m, n)).astype(np.float32)
    x[1, -1] = levels + 5.0  # the best value of a row in its last column
    keys = rng.permutation(n).astype(np.int64)
    xb = device.allocate(m * n, "f32")
    kb = device.allocate(n, "i64")
    device.copy_from_numpy(xb, x.reshape(-1))
    device.copy_from_numpy(kb, keys)
    columns, values = device.run(TopK(device.ref_of(xb), m, n, k, device.ref_of(kb)))
    for row in range(m):
        order = np.lexsort((keys, -x[row]))[:k]
        assert columns[row].tolist() == order.tolist()
        assert values[row].tolist() == x[row, order].tolist()
    assert columns[1, 0] == n - 1


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_score_top_k_scores_host_queries_against_device_rows(device: Any, dtype: str) -> None:
    rng = np.random.default_rng(8)
    n, dim, m, k = 300, 6, 4, 5
    numpy_dtype = np.dtype(np.float32 if dtype == "f32" else np.float64)
    matrix = rng.integers(-3, 4, (n + 20, dim)).astype(numpy_dtype)  # 20 rows past n unused
    queries = rng.integers(-3, 4, (m, dim)).astype(numpy_dtype)
    bias = rng.integers(-5, 6, n).astype(numpy_dtype)
    keys = rng.permutation(10 * n)[:n].astype(np.int64)
    mb = device.allocate(matrix.size, dtype)
    bb = device.allocate(n, dtype)
    kb = device.allocate(n, "i64")
    device.copy_from_numpy(mb, matrix.reshape(-1))
    device.copy_from_numpy(bb, bias)
    device.copy_from_numpy(kb, keys)
    op = ScoreTopK(queries, device.ref_of(mb), n, dim, k, device.ref_of(kb), device.ref_of(bb),
                   2.0)
    columns, values = device.run(op)
    expected_scores = 2.0 * queries.astype(np.float64) @ matrix[:n].T.astype(np.float64) + bias
    for row in range(m):
        order = np.lexsort((keys, -expected_scores[row]))[:k]
        assert columns[row].tolist() == order.tolist()
        assert values[row].tolist() == expected_scores[row, order].tolist()
    plain, _ = device.run(ScoreTopK(queries, device.ref_of(mb), n, dim, n + 1))
    assert plain.shape == (m, n)
    with pytest.raises(InvalidArgument, match="queries"):
        device.run(ScoreTopK(queries[:, :3], device.ref_of(mb), n, dim, k))
    with pytest.raises(InvalidArgument, match="dtype"):
        device.run(ScoreTopK(queries.astype(np.float16), device.ref_of(mb), n, dim, k))
    with pytest.raises(InvalidArgument, match="matrix needs"):
        device.run(ScoreTopK(queries, device.ref_of(mb), n + 21, dim, k))
    with pytest.raises(InvalidArgument, match="bias"):
        device.run(ScoreTopK(queries, device.ref_of(mb), n, dim, k, bias=device.ref_of(kb)))
    assert device.run(ScoreTopK(queries, device.ref_of(mb), n, dim, 1))[0].shape == (m, 1)


@pytest.mark.parametrize("kind", ["host", "device"])
def test_blocking_searches_stay_consistent_while_the_index_changes(
        system: System, device: Any, kind: str) -> None:
    """Blocking searches run on their callers' threads (no hop to the actor) while another
    thread inserts and removes ids: every answer pairs each id with its own vector's score,
    and a search issued after an insert returned sees that insert."""
    dim = 8

    def vector(vector_id: int) -> np.ndarray[Any, Any]:
        return np.random.default_rng(vector_id).standard_normal(dim).astype(np.float32)

    index = (CpuVectorIndex.spawn(system, dim, metric="ip") if kind == "host"
             else GpuVectorIndex.spawn(system, device, dim, "ip"))
    index.insert_many(range(200), np.stack([vector(i) for i in range(200)]))
    queries = np.random.default_rng(99).standard_normal((6, dim)).astype(np.float32)
    stop = threading.Event()
    failures: list[str] = []

    def searcher() -> None:
        while not stop.is_set():
            for query, found in zip(queries, index.search_batch(queries, 5), strict=True):
                for vector_id, score in found:
                    expected = float(query @ vector(vector_id))
                    if abs(score - expected) > 1e-4:
                        failures.append(f"id {vector_id}: score {score}, its vector {expected}")

    threads = [threading.Thread(target=searcher) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        for round_ in range(40):
            fresh = 1000 + round_
            index.insert(fresh, vector(fresh))
            held = {i for i, _ in index.search(vector(fresh), 1000)}
            assert fresh in held and round_ in held
            index.remove(round_)  # the last row moves into the freed one
            assert round_ not in {i for i, _ in index.search(vector(fresh), 1000)}
            index.insert_many([2000 + round_, 3000 + round_],
                              np.stack([vector(2000 + round_), vector(3000 + round_)]))
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert not failures, failures[:5]
    assert index.count() == 200 + 3 * 40 - 40


def test_cache_counters_are_prometheus_metrics_with_telemetry() -> None:
    pytest.importorskip("prometheus_client")
    with System.open("agents-cache-telemetry") as system:
        telemetry = system.enable_telemetry(interval=None)
        first = EmbeddingCache.spawn(system, 1, 2, name="first")
        second = EmbeddingCache.spawn(system, 4, 2, name="second")
        first.insert("a", [1.0, 2.0])
        first.insert("b", [1.0, 2.0])  # evicts "a"
        assert first.get("a") is None
        assert first.get("b") == [1.0, 2.0]
        second.get("x")
        text = telemetry.render()
    path, other = first.path, second.path
    assert f'atomr_accel_embedding_cache_hits_total{{cache="{path}"}} 1.0' in text
    assert f'atomr_accel_embedding_cache_misses_total{{cache="{path}"}} 1.0' in text
    assert f'atomr_accel_embedding_cache_evictions_total{{cache="{path}"}} 1.0' in text
    assert f'atomr_accel_embedding_cache_entries{{cache="{path}"}} 1.0' in text
    assert f'atomr_accel_embedding_cache_misses_total{{cache="{other}"}} 1.0' in text


def test_the_original_positional_forms_name_the_actor(system: System) -> None:
    index = CpuVectorIndex.spawn(system, 3, "docs-index")  # spawn(system, dim, name=None)
    cache = EmbeddingCache.spawn(system, 4, 3, "docs-cache")  # (system, entries, dim, name)
    assert index.path.endswith("/docs-index") and cache.path.endswith("/docs-cache")
    index.insert(7, [1.0, 0.0, 0.0])
    assert index.search([1.0, 0.0, 0.0], 1)[0][0] == 7
