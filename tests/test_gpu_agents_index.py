"""GpuVectorIndex on CUDA against CpuVectorIndex on the same data.

f32: the same ids as the CPU index (integer data: exact products, real ties;
Gaussian data: float32 rounding only) and scores to 1e-4 relative. f16: recall@10
of at least 0.99 against the exact float32 index on Gaussian data (the hard
case: random vectors have the smallest gaps between neighbours' scores).
Run on a GPU machine: ``PYTHONPATH=src python3 -m pytest -m gpu``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import System
from atomr_accel.agents import CpuVectorIndex, GpuVectorIndex
from atomr_accel.core.ops._topk import ScoreTopK, TopK

pytestmark = pytest.mark.gpu

METRICS = ("cosine", "ip", "l2")


@pytest.fixture(scope="module")
def gpu() -> Iterator[tuple[System, Any]]:
    with System.open("agents-index-gpu") as system:
        yield system, system.spawn_device(mock=False)


def both(system: System, device: Any, dim: int, metric: str, dtype: str,
         matrix: np.ndarray[Any, Any]) -> tuple[CpuVectorIndex, GpuVectorIndex]:
    cpu = CpuVectorIndex.spawn(system, dim, metric=metric)
    cuda = GpuVectorIndex.spawn(system, device, dim, metric, dtype)
    ids = np.random.default_rng(9).permutation(10 * len(matrix))[: len(matrix)]
    for part in np.array_split(np.arange(len(matrix)), 4):  # growth on the device
        cpu.insert_many(ids[part], matrix[part])
        cuda.insert_many(ids[part], matrix[part], timeout_secs=60)
    for victim in ids[:50]:
        cpu.remove(int(victim))
        cuda.remove(int(victim))
    return cpu, cuda


CASES = [("ip", True), ("l2", True), *((metric, False) for metric in METRICS)]
"""(metric, integer data); normalized integer vectors are not exact, so cosine is Gaussian."""


@pytest.mark.parametrize(("metric", "integer"), CASES)
def test_f32_equals_the_cpu_index(gpu: tuple[System, Any], metric: str, integer: bool) -> None:
    system, device = gpu
    rng = np.random.default_rng(3)
    if integer:
        matrix = rng.integers(-2, 3, (20_000, 32)).astype(np.float32)
        matrix[np.abs(matrix).sum(axis=1) == 0, 0] = 1
        queries = rng.integers(-2, 3, (64, 32)).astype(np.float32)
        queries[np.abs(queries).sum(axis=1) == 0, 0] = 1
    else:
        matrix = rng.standard_normal((20_000, 32)).astype(np.float32)
        queries = rng.standard_normal((64, 32)).astype(np.float32)
    cpu, cuda = both(system, device, 32, metric, "f32", matrix)
    want, got = cpu.search_batch(queries, 10), cuda.search_batch(queries, 10, timeout_secs=60)
    for g, w in zip(got, want, strict=True):
        assert [i for i, _ in g] == [i for i, _ in w]
        np.testing.assert_allclose([s for _, s in g], [s for _, s in w], rtol=1e-4, atol=1e-4)
    single = cuda.search(queries[0], 10)
    assert [i for i, _ in single] == [i for i, _ in got[0]]


@pytest.mark.parametrize("metric", ["cosine", "ip"])
def test_f16_recall_at_10(gpu: tuple[System, Any], metric: str) -> None:
    system, device = gpu
    rng = np.random.default_rng(4)
    matrix = rng.standard_normal((100_000, 256)).astype(np.float32)
    queries = rng.standard_normal((256, 256)).astype(np.float32)
    cpu, cuda = both(system, device, 256, metric, "f16", matrix)
    want, got = cpu.search_batch(queries, 10), cuda.search_batch(queries, 10, timeout_secs=60)
    recall = np.mean([len({i for i, _ in g} & {i for i, _ in w}) / 10
                      for g, w in zip(got, want, strict=True)])
    print(f"f16 {metric} recall@10 = {recall:.4f}")
    assert recall >= 0.99


@pytest.mark.parametrize(("dtype", "m"), [("f16", 5), ("f32", 5), ("f16", 40)])
def test_top_k_ops_on_long_rows_equal_the_cpu_backend(gpu: tuple[System, Any],
                                                      dtype: str, m: int) -> None:
    """Rows long enough for the two-stage selection (taken on CUDA from 32 rows on), with
    many ties (small integers are exact in f16): the CUDA answer is the CPU backend's,
    column for column."""
    system, device = gpu
    cpu_device = system.spawn_device(mock=True)
    rng = np.random.default_rng(12)
    n, dim, k = 200_003, 4, 10
    numpy_dtype = np.dtype(np.float16 if dtype == "f16" else np.float32)
    matrix = rng.integers(-3, 4, (n, dim)).astype(numpy_dtype)
    queries = rng.integers(-3, 4, (m, dim)).astype(numpy_dtype)
    keys = rng.permutation(n).astype(np.int64)
    answers = []
    for dev in (device, cpu_device):
        mb, kb = dev.allocate(n * dim, dtype), dev.allocate(n, "i64")
        dev.copy_from_numpy(mb, matrix.reshape(-1))
        dev.copy_from_numpy(kb, keys)
        scored = dev.run(ScoreTopK(queries, dev.ref_of(mb), n, dim, k, dev.ref_of(kb)))
        selected = dev.run(TopK(dev.ref_of(mb), n * dim // 1000, 1000, k, None))
        answers.append((scored, selected))
    for (cuda_columns, cuda_values), (cpu_columns, cpu_values) in zip(*answers, strict=True):
        np.testing.assert_array_equal(cuda_columns, cpu_columns)
        np.testing.assert_array_equal(cuda_values, cpu_values)
    expected = queries.astype(np.float64) @ matrix.T.astype(np.float64)
    for row in range(m):
        order = np.lexsort((keys, -expected[row]))[:k]
        assert answers[0][0][0][row].tolist() == order.tolist()
