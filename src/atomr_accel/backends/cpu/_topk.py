"""Top-k selection on NumPy or CuPy arrays (``TopK``); the CUDA backend brings its own select.

``top_k`` takes the ``k + SPARE`` largest values of each row with a partial
selection (``largest``: ``argpartition`` by default), downloads only those,
and orders them on the host by value, then key. The ``k`` best are then
exact unless every spare candidate ties the ``k``-th value (a column left out
might tie it too and have a smaller key): such a row takes an exact pass over
that row alone. Spares make that rare where low precision makes ties common
(f16 scores of a million vectors: about one row in eight tied the ``k``-th
and ``k + 1``-th values).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from atomr_accel.backends._base import ArrayBackend, Handler
from atomr_accel.core._op import Op
from atomr_accel.core.ops._topk import TopK

__all__ = ["HANDLERS", "SPARE", "Largest", "argpartition_largest", "top_k"]

Array = Any  # a NumPy or CuPy array, whichever ``backend.xp`` makes
SPARE = 8
"""Candidates a row beyond the ``k`` asked for."""
Largest = Callable[[Any, Array, int], tuple[Array, Array]]
"""``(xp, x, count) -> (values, columns)``: ``count`` largest values of each row, any order."""


def argpartition_largest(xp: Any, x: Array, count: int) -> tuple[Array, Array]:
    """The ``count`` largest values of each row of ``x`` and their columns, by ``argpartition``."""
    n = x.shape[1]
    columns = xp.argpartition(x, n - count, axis=1)[:, n - count:]
    return xp.take_along_axis(x, columns, axis=1), columns


def _host(xp: Any, array: Array) -> np.ndarray[Any, Any]:
    """``array`` on the host (a download for CuPy)."""
    return array.get() if xp is not np else np.asarray(array)


def top_k(backend: ArrayBackend, op: TopK, largest: Largest = argpartition_largest,
          ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Answer ``(columns, values)``: each row's ``min(k, n)`` largest, best first, ties by key."""
    xp = backend.xp
    x = backend.array(op.x.buffer_id)[: op.m * op.n].reshape(op.m, op.n)
    keys = None if op.keys is None else backend.array(op.keys.buffer_id)[: op.n]
    k = min(op.k, op.n)
    count = min(k + SPARE, op.n)
    values, columns = largest(xp, x, count)
    host_values = _host(xp, values).astype(np.float64)
    host_columns = _host(xp, columns).astype(np.int64)
    host_keys = host_columns if keys is None else _host(xp, keys[columns]).astype(np.int64)
    order = np.lexsort((host_keys, -host_values), axis=-1)
    host_values = np.take_along_axis(host_values, order, axis=1)
    host_columns = np.take_along_axis(host_columns, order, axis=1)
    if count < op.n:
        for row in np.flatnonzero(host_values[:, count - 1] == host_values[:, k - 1]):
            host_columns[row, :k], host_values[row, :k] = _exact_row(
                xp, x[int(row)], keys, int(host_columns[row, k - 1]), k)
    return host_columns[:, :k], host_values[:, :k]


def _exact_row(xp: Any, row: Array, keys: Array | None, kth_column: int, k: int,
               ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The ``k`` best of one row when its ``k``-th value ties others: every column at least
    that value, ordered by value, then key."""
    columns = xp.flatnonzero(row >= row[kth_column])
    values = _host(xp, row[columns]).astype(np.float64)
    host_columns = _host(xp, columns).astype(np.int64)
    tie_keys = host_columns if keys is None else _host(xp, keys[columns]).astype(np.int64)
    order = np.lexsort((tie_keys, -values))[:k]
    return host_columns[order], values[order]


HANDLERS: dict[type[Op], Handler] = {TopK: top_k}
