"""The CUDA top-k kernels (``backends.cuda._topk_kernel``) through ``TopK`` against the CPU
backend and NumPy in float64: Gaussian rows, rows of many ties (small integers, exact in
f16, so the exact pass runs), a few NaNs a row, rows too short for a vector, rows not
16-byte aligned, ``k`` at and past the row's length and ``k + SPARE`` at the kernels' limit
(and one past it: torch's path), with keys and without.
Run on a GPU machine: ``PYTHONPATH=src python3 -m pytest -m gpu``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import System
from atomr_accel.core.ops._topk import TopK

pytestmark = pytest.mark.gpu

SHAPES = [  # (m, n, k)
    (1, 1, 1), (1, 7, 3), (2, 7, 10), (3, 1000, 10), (1, 1_000_003, 10), (4, 100_003, 10),
    (37, 20_011, 24), (5, 20_011, 50), (5, 20_011, 120), (3, 20_011, 121),
]
DTYPES = {"f16": np.float16, "f32": np.float32, "f64": np.float64}


@pytest.fixture(scope="module")
def devices() -> Iterator[tuple[Any, Any]]:
    with System.open("topk-kernel-gpu") as system:
        yield system.spawn_device(mock=False), system.spawn_device(mock=True)


def data(kind: str, m: int, n: int, dtype: str, seed: int) -> np.ndarray[Any, Any]:
    """An ``m x n`` matrix: ``gauss``, ``ties`` (integers -3..3) or ``nan`` (Gaussian, a few
    NaNs a row)."""
    rng = np.random.default_rng(seed)
    if kind == "ties":
        return rng.integers(-3, 4, (m, n)).astype(DTYPES[dtype])
    x = rng.standard_normal((m, n)).astype(DTYPES[dtype])
    if kind == "nan":
        for row in x:
            row[rng.choice(n, min(n - 1, 3), replace=False)] = np.nan
    return x


def top_k(device: Any, x: np.ndarray[Any, Any], keys: np.ndarray[Any, Any] | None,
          k: int, dtype: str) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """``TopK`` of ``x`` on ``device``: ``(columns, values)``."""
    m, n = x.shape
    xb = device.allocate(m * n, dtype)
    device.copy_from_numpy(xb, x.reshape(-1))
    kb = None
    if keys is not None:
        kb = device.allocate(n, "i64")
        device.copy_from_numpy(kb, keys)
    try:
        answer: tuple[Any, Any] = device.run(
            TopK(device.ref_of(xb), m, n, k, None if kb is None else device.ref_of(kb)),
            timeout_secs=60)
        return answer
    finally:
        device.free(xb)
        if kb is not None:
            device.free(kb)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize("kind", ["gauss", "ties"])
@pytest.mark.parametrize("keyed", [False, True])
def test_equals_the_cpu_backend_and_numpy(devices: tuple[Any, Any], dtype: str, m: int, n: int,
                                          k: int, kind: str, keyed: bool) -> None:
    cuda, cpu = devices
    x = data(kind, m, n, dtype, seed=m * 7 + n + k)
    keys = np.random.default_rng(n).permutation(n).astype(np.int64) if keyed else None
    columns, values = top_k(cuda, x, keys, k, dtype)
    want_columns, want_values = top_k(cpu, x, keys, k, dtype)
    np.testing.assert_array_equal(columns, want_columns)
    np.testing.assert_array_equal(values, want_values)
    exact = x.astype(np.float64)
    tie = np.arange(n) if keys is None else keys
    for row in range(m):
        best = np.lexsort((tie, -exact[row]))[: min(k, n)]
        assert columns[row].tolist() == best.tolist()
        np.testing.assert_array_equal(values[row], exact[row, best])


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize(("m", "n", "k"), [(3, 1000, 10), (2, 100_003, 5), (2, 20_011, 60)])
def test_nan_as_the_cpu_backend(devices: tuple[Any, Any], dtype: str, m: int, n: int,
                                k: int) -> None:
    """NaN ranks above every value in the selection and last in the order, on both."""
    cuda, cpu = devices
    x = data("nan", m, n, dtype, seed=n)
    columns, values = top_k(cuda, x, None, k, dtype)
    want_columns, want_values = top_k(cpu, x, None, k, dtype)
    np.testing.assert_array_equal(columns, want_columns)
    np.testing.assert_array_equal(values, want_values)
    assert not np.isnan(values).any()


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_infinities_and_signed_zeros(devices: tuple[Any, Any], dtype: str) -> None:
    """Rows of -inf, +inf and zeros of both signs: ties everywhere, the exact pass decides."""
    cuda, cpu = devices
    rng = np.random.default_rng(5)
    x = rng.choice(np.array([-np.inf, np.inf, 0.0, -0.0, 1.0]), (6, 5000)).astype(DTYPES[dtype])
    x[0] = -np.inf
    keys = rng.permutation(5000).astype(np.int64)
    columns, values = top_k(cuda, x, keys, 10, dtype)
    want_columns, want_values = top_k(cpu, x, keys, 10, dtype)
    np.testing.assert_array_equal(columns, want_columns)
    np.testing.assert_array_equal(values, want_values)
