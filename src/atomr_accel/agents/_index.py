"""CpuVectorIndex: exact top-k search over a NumPy matrix, in an actor."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from atomr_accel.actor import Props
from atomr_accel.agents._index_base import IndexActor, Published, Results, VectorIndex
from atomr_accel.agents._vectors import F32, I64, Metric, best_first

__all__ = ["CpuVectorIndex", "HostStore"]


class HostStore:
    """A float32 matrix in host memory that grows geometrically (amortized O(1) inserts).

    For ``l2`` it also keeps each row's squared norm. Searches run one matrix
    product for a batch of queries, then ``best_first`` on each query's scores.
    """

    def __init__(self, dim: int, metric: Metric) -> None:
        self.metric = metric
        self.matrix: F32 = np.zeros((16, dim), dtype=np.float32)
        self.norms: F32 = np.zeros(16, dtype=np.float32)

    async def reserve(self, rows: int, count: int) -> None:
        """Grow the matrix (at least doubling) when it has fewer than ``rows`` rows."""
        if rows <= len(self.matrix):
            return
        size = max(rows, 2 * len(self.matrix))
        matrix = np.zeros((size, self.matrix.shape[1]), dtype=np.float32)
        matrix[:count] = self.matrix[:count]
        norms = np.zeros(size, dtype=np.float32)
        norms[:count] = self.norms[:count]
        self.matrix, self.norms = matrix, norms

    async def write(self, first: int, matrix: F32, ids: I64) -> None:
        """Write ``matrix`` from row ``first`` on (and its rows' squared norms)."""
        end = first + len(matrix)
        self.matrix[first:end] = matrix
        if self.metric is Metric.L2:
            self.norms[first:end] = np.einsum("ij,ij->i", matrix, matrix)

    async def move(self, src: int, dst: int) -> None:
        """Copy row ``src`` onto row ``dst``."""
        self.matrix[dst] = self.matrix[src]
        self.norms[dst] = self.norms[src]

    async def search(self, queries: F32, ids: I64, top_k: int,
                     timeout: float | None = None) -> Results:
        """Exact top-k of each query: one matrix product, then ``best_first`` per query
        (``timeout``: unused, no device work)."""
        return search_matrix(self.matrix[: len(ids)], self.norms[: len(ids)], queries, ids,
                             top_k, self.metric)

    async def read(self, count: int) -> F32:
        """A copy of rows ``0 .. count-1``."""
        return self.matrix[:count].copy()


def search_matrix(matrix: F32, norms: F32, queries: F32, ids: I64, top_k: int,
                  metric: Metric) -> Results:
    """Exact top-k of each row of ``queries`` over the rows of ``matrix`` (ids ``ids``).

    Selection scores are ``q . x`` (cosine, ip) or ``2 q . x - |x|^2`` (l2, with
    ``norms`` the rows' ``|x|^2``), computed in float32.
    """
    if len(ids) == 0:
        return [[] for _ in queries]
    scores = queries @ matrix.T
    if metric is Metric.L2:
        scores *= np.float32(2)
        scores -= norms
        query_sq = np.einsum("ij,ij->i", queries, queries)
        return [best_first(row, ids, top_k, metric, float(sq))
                for row, sq in zip(scores, query_sq, strict=True)]
    return [best_first(row, ids, top_k, metric) for row in scores]


class CpuVectorIndex(VectorIndex):
    """Exact nearest-neighbour search on the host (NumPy), in a supervised actor.

    The vectors live in one float32 matrix that grows geometrically; a search
    is one matrix product of the queries with it and a partial sort
    (``np.argpartition``) of each query's scores. See ``VectorIndex`` for the
    methods, metrics, score meaning and errors. The actor runs one request at
    a time, so a search sees every insert and remove sent before it.
    """

    @classmethod
    def spawn(cls, system: Any, dim: int, name: str | None = None, *,
              metric: str = "cosine") -> CpuVectorIndex:
        """Start an index of ``dim``-number vectors compared by ``metric`` (cosine, ip or
        l2) in ``system``; ``name`` names its actor (the original package's
        ``spawn(system, dim, name=None)``, with ``metric`` as a keyword)."""
        size, kind = cls._settings(dim, metric)
        published = Published()
        props = Props(IndexActor, size, kind, functools.partial(HostStore, size, kind),
                      published)
        client: CpuVectorIndex = cls._start(system, props, name, published.turns)
        client._setup(size, kind, published)
        return client
