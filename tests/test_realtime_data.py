"""GpuHashMapActor and GpuSparseStructureActor on the CPU backend against plain models.

The hash map is checked against a Python dict under random interleavings of
inserts, lookups and erases (hypothesis), with small capacities so probe chains
wrap and erased slots are reused. The sparse structure is checked against
``scipy.sparse.coo_matrix(...).tocsr()`` (duplicates summed) and its products.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import scipy.sparse
from hypothesis import given, settings
from hypothesis import strategies as st

from atomr_accel import GpuRuntimeError, InvalidArgument, System
from atomr_accel.realtime import GpuHashMapActor, GpuSparseStructureActor, HashMapFull


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("realtime-data") as opened:
        opened.spawn_device(mock=True)
        yield opened


# ------------------------------------------------------------------ hash map

KEY, VALUE = 3, 2
_key = st.integers(0, 40).map(lambda i: bytes([i, (7 * i) % 256, i // 3]))  # 41 keys
_value = st.binary(min_size=VALUE, max_size=VALUE)
_op = st.one_of(
    st.tuples(st.just("insert"), st.lists(st.tuples(_key, _value), min_size=1, max_size=8)),
    st.tuples(st.just("lookup"), st.lists(_key, min_size=1, max_size=8)),
    st.tuples(st.just("erase"), st.lists(_key, min_size=1, max_size=8)),
)


@settings(max_examples=30, deadline=None)
@given(st.lists(_op, min_size=1, max_size=12), st.integers(8, 24))
def test_hash_map_equals_a_dict(system: System, ops: list[Any], capacity: int) -> None:
    table = GpuHashMapActor.spawn(system, capacity, KEY, VALUE)
    model: dict[bytes, bytes] = {}
    try:
        for kind, items in ops:
            if kind == "insert":
                keys = b"".join(k for k, _ in items)
                values = b"".join(v for _, v in items)
                batch = dict(items)  # the last of equal keys wins
                new = len(set(batch) - set(model))
                if len(model) + new > capacity:
                    with pytest.raises(HashMapFull):
                        table.insert(keys, values)
                    continue
                assert table.insert(keys, values) == new
                model.update(batch)
            elif kind == "lookup":
                values, found = table.lookup(b"".join(items))
                for key, row, held in zip(items, values, found, strict=True):
                    assert bool(held) == (key in model)
                    assert row.tobytes() == model.get(key, bytes(VALUE))
            else:
                erased = table.erase(b"".join(items))
                assert erased == len(set(items) & set(model))
                for key in items:
                    model.pop(key, None)
        stats = table.stats()
        assert stats["size"] == len(model)
        assert stats["load_factor"] == pytest.approx(len(model) / capacity)
    finally:
        table.stop()


def test_hash_map_takes_the_originals_byte_lists_and_arrays(system: System) -> None:
    table = GpuHashMapActor.spawn(system, 64, 4, 8)
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 256, (20, 4), dtype=np.uint8)
    values = rng.integers(0, 256, (20, 8), dtype=np.uint8)
    assert table.insert(keys.reshape(-1).tolist(), values.reshape(-1).tolist()) == len(
        {k.tobytes() for k in keys})
    got, found = table.lookup(keys)
    assert found.all()
    expected = {k.tobytes(): v.tobytes() for k, v in zip(keys, values, strict=True)}
    assert [row.tobytes() for row in got] == [expected[k.tobytes()] for k in keys]
    assert table.stats()["load_factor"] == pytest.approx(len(expected) / 64)
    table.stop()


def test_a_full_map_raises_a_typed_error_and_keeps_its_entries(system: System) -> None:
    table = GpuHashMapActor.spawn(system, 4, 1, 1)
    assert table.insert(b"abcd", b"ABCD") == 4
    with pytest.raises(HashMapFull) as raised:
        table.insert(b"e", b"E")
    assert isinstance(raised.value, GpuRuntimeError)
    assert table.insert(b"a", b"Z") == 0  # an update still fits
    values, found = table.lookup(b"abcde")
    assert found.tolist() == [True, True, True, True, False]
    assert values.reshape(-1).tobytes() == b"ZBCD\x00"
    assert table.erase(b"b") == 1
    assert table.insert(b"e", b"E") == 1  # the erased slot is reused
    assert table.stats()["load_factor"] == 1.0
    table.stop()


def test_compact_keeps_every_entry(system: System) -> None:
    table = GpuHashMapActor.spawn(system, 32, 2, 3)
    rng = np.random.default_rng(6)
    model: dict[bytes, bytes] = {}
    for _ in range(8):  # churn: erased slots pile up
        keys = rng.integers(0, 256, (10, 2), dtype=np.uint8)
        values = rng.integers(0, 256, (10, 3), dtype=np.uint8)
        table.insert(keys, values)
        model.update({k.tobytes(): v.tobytes() for k, v in zip(keys, values, strict=True)})
        gone = keys[:7]
        table.erase(gone)
        for k in gone:
            model.pop(k.tobytes(), None)
    assert table.compact() == len(model) == table.stats()["size"]
    probe = np.frombuffer(b"".join(model), np.uint8).reshape(-1, 2)
    values, found = table.lookup(probe)
    assert found.all()
    assert [v.tobytes() for v in values] == list(model.values())
    assert GpuHashMapActor.spawn(system, 4, 1, 1).compact() == 0


def test_hash_map_rejects_bad_sizes(system: System) -> None:
    table = GpuHashMapActor.spawn(system, 8, 2, 2)
    with pytest.raises(InvalidArgument):
        table.insert(b"abcd", b"AB")  # two keys, one value
    with pytest.raises(InvalidArgument):
        table.insert(b"abc", b"ABCD")  # not whole keys
    with pytest.raises(InvalidArgument):
        table.lookup([1, 300])
    with pytest.raises(InvalidArgument):
        GpuHashMapActor.spawn(system, 0, 2, 2)
    with pytest.raises(InvalidArgument):
        table.insert(b"ab", b"AB", timeout_secs=0)
    assert table.insert(b"ab", b"AB") == 1  # the actor keeps serving
    table.stop()


# ------------------------------------------------------------ sparse structure


def _triplets(rng: np.random.Generator, rows: int, cols: int, count: int,
              ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Random triplets, many at repeated positions."""
    return (rng.integers(0, rows, count), rng.integers(0, cols, count),
            rng.standard_normal(count))


def _assert_csr(got: Any, want: Any, dtype: Any) -> None:
    indptr, indices, values = got
    want.sum_duplicates()
    want.sort_indices()
    np.testing.assert_array_equal(indptr, want.indptr)
    np.testing.assert_array_equal(indices, want.indices)
    np.testing.assert_allclose(values, want.data.astype(dtype), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_csr_equals_scipy_with_duplicates_summed(system: System, dtype: str) -> None:
    rng = np.random.default_rng(2)
    rows, cols = 40, 30
    matrix = GpuSparseStructureActor.spawn(system, rows, cols, dtype)
    r, c, v = _triplets(rng, rows, cols, 500)
    nnz = matrix.build(r, c, v)
    want = scipy.sparse.coo_matrix((v, (r, c)), shape=(rows, cols)).tocsr()
    assert nnz == want.nnz
    _assert_csr(matrix.to_csr(), want, np.dtype(dtype.replace("f", "float")))
    x = rng.standard_normal(cols)
    np.testing.assert_allclose(matrix.spmv(x), want @ x, rtol=1e-4, atol=1e-4)
    matrix.stop()


def test_incremental_updates_add_to_the_matrix(system: System) -> None:
    rng = np.random.default_rng(3)
    rows, cols = 25, 35
    matrix = GpuSparseStructureActor.spawn(system, rows, cols, "f64")
    want = scipy.sparse.csr_matrix((rows, cols))
    for count in (60, 1, 200, 0, 30):
        r, c, v = _triplets(rng, rows, cols, count)
        nnz = matrix.update(r, c, v)
        want = (want + scipy.sparse.coo_matrix((v, (r, c)), shape=(rows, cols))).tocsr()
        want.eliminate_zeros()
        assert nnz == want.nnz
        _assert_csr(matrix.to_csr(), want.copy(), np.float64)
    x = rng.standard_normal(cols)
    np.testing.assert_allclose(matrix.spmv(x), want @ x, rtol=1e-12)
    r, c, v = _triplets(rng, rows, cols, 10)
    assert matrix.build(r, c, v) == scipy.sparse.coo_matrix(
        (v, (r, c)), shape=(rows, cols)).tocsr().nnz  # build replaces
    assert matrix.stats()["nnz"] == matrix.to_csr()[0][-1]
    matrix.stop()


def test_sparse_rejects_bad_triplets(system: System) -> None:
    matrix = GpuSparseStructureActor.spawn(system, 4, 4)
    with pytest.raises(InvalidArgument):
        matrix.build([0, 4], [0, 0], [1.0, 2.0])  # a row outside
    with pytest.raises(InvalidArgument):
        matrix.build([0], [0, 1], [1.0])  # lengths differ
    with pytest.raises(InvalidArgument):
        matrix.spmv(np.ones(3))
    with pytest.raises(InvalidArgument):
        GpuSparseStructureActor.spawn(system, 4, 4, "f16")
    np.testing.assert_array_equal(matrix.spmv(np.ones(4)), np.zeros(4))  # empty matrix
    assert matrix.build([1, 1], [2, 2], [1.5, 2.0]) == 1
    np.testing.assert_allclose(matrix.spmv(np.arange(4.0)), [0, 7.0, 0, 0])
    matrix.stop()


def test_spawn_takes_a_device_of_the_system(system: System) -> None:
    device = system.devices[0]
    table = GpuHashMapActor.spawn(system, 8, 1, 1, device=device)
    assert table.device() is device
    with pytest.raises(InvalidArgument):
        GpuHashMapActor.spawn(system, 8, 1, 1, device="cpu")  # type: ignore[arg-type]
    table.stop()


def test_placed_by_the_system_and_awaitable(system: System) -> None:
    table = GpuHashMapActor.spawn(system, 8, 2, 1, "placed-map")  # the original's form
    assert table.device() in system.devices

    async def use() -> tuple[int, list[bool]]:
        new = await table.insert_async(b"abcd", b"XY")
        _, found = await table.lookup_async(b"abzz")
        return new, found.tolist()

    assert asyncio.run(use()) == (2, [True, False])
    table.stop()
