"""Top-k selection on NumPy or CuPy arrays (``TopK``, ``ScoreTopK``); the CUDA backend brings
its own partial select.

``select`` takes the ``k + SPARE`` largest values of each row (``largest``:
``PARTITION``, ``argpartition`` in groups, by default), downloads only those, and orders them on the
host by value, then key. The ``k`` best are then exact unless every spare
candidate ties the ``k``-th value (a column left out might tie it too and have
a smaller key): such a row takes an exact pass over that row alone. Spares
make that rare where low precision makes ties common (f16 scores of a million
vectors: about one row in eight tied the ``k``-th and ``k + 1``-th values).

A long row is selected in two stages (``grouped``): the maximum of each group
of ``GROUP`` columns, the ``count`` best groups by that maximum, then the
``count`` best of those groups' columns. That is exact: fewer than ``count``
values exceed the row's ``count``-th largest ``v``, so fewer than ``count``
groups have a maximum above ``v`` and all of them are kept, while every kept
group holds a value of at least ``v``; the candidates therefore hold every
value above ``v`` and enough equal to it. It reads the row once (the group
maxima) instead of running a selection over all of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cpu
from atomr_accel.core._dtype import DType
from atomr_accel.core.ops._topk import ScoreTopK, TopK

__all__ = [
    "GROUP", "PARTITION", "SPARE", "Answer", "Largest", "argpartition_largest",
    "best", "grouped", "is_wide", "order", "score_top_k", "scores", "select", "top_k",
]

Array = Any  # a NumPy or CuPy array, whichever ``backend.xp`` makes
SPARE = 8
"""Candidates a row beyond the ``k`` asked for."""
GROUP = 1024
"""Columns a group in the two-stage selection of long rows."""
Largest = Callable[[Any, Array, int], tuple[Array, Array]]
"""``(xp, x, count) -> (values, columns)``: ``count`` largest values of each row, any order."""
Answer = tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]


def argpartition_largest(xp: Any, x: Array, count: int) -> tuple[Array, Array]:
    """The ``count`` largest values of each row of ``x`` and their columns, by ``argpartition``."""
    n = x.shape[1]
    columns = xp.argpartition(x, n - count, axis=1)[:, n - count:]
    return xp.take_along_axis(x, columns, axis=1), columns


def is_wide(n: int, count: int) -> bool:
    """Whether rows of ``n`` columns are worth the two-stage selection of ``count`` values:
    more than ``4 * count`` groups."""
    return -(-n // GROUP) > 4 * count


def grouped(largest: Largest) -> Largest:
    """``largest`` in two stages for wide rows (``is_wide``; see the module docstring);
    other rows go to ``largest`` as they are."""

    def select_grouped(xp: Any, x: Array, count: int) -> tuple[Array, Array]:
        m, n = x.shape
        full = n // GROUP
        if not is_wide(n, count):
            return largest(xp, x, count)
        maxima = x[:, : full * GROUP].reshape(m, full, GROUP).max(axis=2)
        if full * GROUP < n:
            tail = x[:, full * GROUP:].max(axis=1, keepdims=True)
            maxima = xp.concatenate((maxima, tail), axis=1)
        _, groups = largest(xp, maxima, count)
        columns = (groups[:, :, None] * GROUP + xp.arange(GROUP)).reshape(m, count * GROUP)
        inside = columns < n
        columns = xp.minimum(columns, n - 1)  # the tail group's missing columns, masked below
        values = xp.take_along_axis(x, columns, axis=1)
        values = xp.where(inside, values, xp.asarray(-np.inf, dtype=x.dtype))
        best, where = largest(xp, values, count)
        return best, xp.take_along_axis(columns, where, axis=1)

    return select_grouped


def _host(xp: Any, array: Array) -> np.ndarray[Any, Any]:
    """``array`` on the host (a download for CuPy)."""
    return array.get() if xp is not np else np.asarray(array)


def select(xp: Any, x: Array, keys: Array | None, k: int, largest: Largest) -> Answer:
    """``(columns, values)`` of each row of ``x``: its ``min(k, n)`` largest, best first, ties
    by ``keys[column]`` (or the column)."""
    n = x.shape[1]
    k = min(k, n)
    values, columns = largest(xp, x, min(k + SPARE, n))
    host_values = _host(xp, values).astype(np.float64)
    host_columns = _host(xp, columns).astype(np.int64)
    host_keys = host_columns if keys is None else _host(xp, keys[columns]).astype(np.int64)

    def exact_row(row: int, kth_column: int) -> Answer:
        line = x[row]
        tied = xp.flatnonzero(line >= line[kth_column])
        tied_columns = _host(xp, tied).astype(np.int64)
        tied_keys = tied_columns if keys is None else _host(xp, keys[tied]).astype(np.int64)
        return best(_host(xp, line[tied]).astype(np.float64), tied_columns, tied_keys, k)

    return order(host_values, host_columns, host_keys, k, n, exact_row)


def order(values: np.ndarray[Any, Any], columns: np.ndarray[Any, Any],
          keys: np.ndarray[Any, Any], k: int, n: int,
          exact_row: Callable[[int, int], Answer]) -> Answer:
    """The ``k`` best of each row's candidates (host ``values``, ``columns``, ``keys``, all
    ``m x count``) by value, then key; a row whose every spare ties its ``k``-th value goes
    to ``exact_row(row, column of its k-th value)`` instead."""
    count = values.shape[1]
    ranks = np.lexsort((keys, -values), axis=-1)
    rows = np.arange(len(values))[:, None]  # indexing by (rows, ranks): a third of
    values, columns = values[rows, ranks], columns[rows, ranks]  # take_along_axis's cost
    if count < n:
        for row in np.flatnonzero(values[:, count - 1] == values[:, k - 1]):
            columns[row, :k], values[row, :k] = exact_row(int(row), int(columns[row, k - 1]))
    return columns[:, :k], values[:, :k]


def best(values: np.ndarray[Any, Any], columns: np.ndarray[Any, Any],
         keys: np.ndarray[Any, Any], k: int) -> Answer:
    """The ``k`` best of one row's host ``values`` (every column at least its ``k``-th
    value), ordered by value, then key: ``(columns, values)``."""
    ranks = np.lexsort((keys, -values))[:k]
    return columns[ranks], values[ranks]


PARTITION: Largest = grouped(argpartition_largest)
"""The selection of the NumPy (and the torch-less CuPy) backend."""


@cpu.handles(TopK)
def top_k(backend: ArrayBackend, op: TopK, largest: Largest = PARTITION) -> Answer:
    """Answer ``(columns, values)``: each row's ``min(k, n)`` largest, best first, ties by key."""
    xp = backend.xp
    x = backend.array(op.x.buffer_id)[: op.m * op.n].reshape(op.m, op.n)
    keys = None if op.keys is None else backend.array(op.keys.buffer_id)[: op.n]
    return select(xp, x, keys, op.k, largest)


def scores(backend: ArrayBackend, op: ScoreTopK, queries: Array | None = None) -> Array:
    """The ``m x n`` scores of ``op`` in the matrix's dtype (f16 computed in f32 on NumPy,
    which has no half-precision matmul of its own); ``queries``: ``op.queries`` already in
    the backend's memory (None: put there now)."""
    xp = backend.xp
    matrix = backend.array(op.matrix.buffer_id)[: op.n * op.dim].reshape(op.n, op.dim)
    if queries is None:
        queries = xp.asarray(op.queries)
    dtype = op.matrix.dtype
    if xp is np and dtype is DType.F16:
        result = (queries.astype(np.float32) @ matrix.astype(np.float32).T).astype(np.float16)
    else:
        result = queries @ matrix.T
    return scaled(backend, op, result)


def scaled(backend: ArrayBackend, op: ScoreTopK, products: Array) -> Array:
    """``products`` (the queries times the matrix, ``m x n`` in its dtype) times ``alpha``
    plus the bias, in place."""
    if op.alpha != 1.0:
        products *= op.matrix.dtype.numpy.type(op.alpha)
    if op.bias is not None:
        products += backend.array(op.bias.buffer_id)[: op.n]
    return products


@cpu.handles(ScoreTopK)
def score_top_k(backend: ArrayBackend, op: ScoreTopK, largest: Largest = PARTITION) -> Answer:
    """Answer ``TopK``'s ``(columns, values)`` of ``op``'s scores (``scores``)."""
    keys = None if op.keys is None else backend.array(op.keys.buffer_id)[: op.n]
    return select(backend.xp, scores(backend, op), keys, op.k, largest)
