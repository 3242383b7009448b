"""What both vector indexes share: metrics, argument checks, top-k order and the file format.

Scores: for ``cosine`` and ``ip`` a result's score is the similarity (higher is
better); for ``l2`` it is the squared Euclidean distance (lower is better).
Results come best first; equal scores are ordered by the smaller id.
"""

from __future__ import annotations

import enum
import numbers
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument
from atomr_accel.core._files import read_npz

__all__ = [
    "FORMAT",
    "F32",
    "I64",
    "Metric",
    "Saved",
    "UnknownVectorId",
    "as_ids",
    "as_matrix",
    "best_first",
    "metric_of",
    "read_index",
    "require_top_k",
    "write_index",
]

F32 = np.ndarray[Any, np.dtype[np.float32]]
I64 = np.ndarray[Any, np.dtype[np.int64]]

FORMAT = "atomr-accel-vector-index/1"
"""The ``format`` entry of a saved index (``save``/``load``; see ``write_index``)."""


class UnknownVectorId(InvalidArgument, KeyError):
    """``remove`` named an id the index does not hold; ``id`` is that id."""

    def __init__(self, vector_id: int) -> None:
        super().__init__(f"the index holds no vector with id {vector_id}")
        self.id = vector_id

    def __str__(self) -> str:
        return str(self.args[0])


class Metric(enum.Enum):
    """How a query is compared with the stored vectors."""

    COSINE = "cosine"
    """Cosine similarity: vectors are L2-normalized when stored, queries when searched."""
    IP = "ip"
    """Inner product (dot product), as given."""
    L2 = "l2"
    """Squared Euclidean distance (lower is better)."""


def metric_of(value: object) -> Metric:
    """``value`` (a ``Metric`` or its name) as a ``Metric``; ``InvalidArgument`` else."""
    try:
        return Metric(value)
    except ValueError:
        raise InvalidArgument(f"metric must be 'cosine', 'ip' or 'l2', got {value!r}") from None


def require_top_k(top_k: object) -> int:
    """``top_k`` if it is an int >= 1 (``InvalidArgument`` else)."""
    if not isinstance(top_k, numbers.Integral) or isinstance(top_k, bool) or top_k < 1:
        raise InvalidArgument(f"top_k must be an int >= 1, got {top_k!r}")
    return int(top_k)


def _id(value: object) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise InvalidArgument(f"a vector id is an int, got {value!r}")
    result = int(value)
    if not -(2 ** 63) <= result < 2 ** 63:
        raise InvalidArgument(f"a vector id fits in 64 bits, got {result}")
    return result


def as_ids(values: Iterable[object]) -> list[int]:
    """``values`` as a list of distinct 64-bit int ids (``InvalidArgument`` else)."""
    if isinstance(values, np.ndarray) and (values.ndim != 1 or values.dtype.kind not in "iu"):
        raise InvalidArgument(f"ids must be a 1-D sequence of ints, got {values.dtype} "
                              f"array of shape {values.shape}")
    if not isinstance(values, Iterable) or isinstance(values, str | bytes):
        raise InvalidArgument(f"ids must be a sequence of ints, got {values!r:.60}")
    ids = [_id(value) for value in values]
    if len(set(ids)) != len(ids):
        raise InvalidArgument("ids must be distinct within one insert_many or load")
    return ids


_UNIT = 4 * float(np.finfo(np.float32).eps)
"""How far from 1 the norm of a normalized float32 row may be."""


def as_matrix(value: object, dim: int, what: str, metric: Metric, *, rows: bool) -> F32:
    """``value`` as a C-contiguous float32 ``(n, dim)`` matrix of finite numbers.

    ``rows=False`` takes one vector of ``dim`` numbers (a ``(1, dim)`` matrix),
    ``rows=True`` a sequence of such vectors (at least one). For ``cosine``
    each row is L2-normalized (a zero row is an ``InvalidArgument``: it has
    no direction); a row whose norm is 1 to float32 rounding stays as it is.
    """
    try:
        matrix = np.array(value, dtype=np.float32, order="C")
    except (TypeError, ValueError):
        raise InvalidArgument(f"{what} must be numbers, got {value!r:.60}") from None
    shape = matrix.shape
    wanted = f"a sequence of vectors of {dim} numbers" if rows else f"{dim} numbers"
    if matrix.ndim != (2 if rows else 1) or shape[-1] != dim or matrix.size == 0:
        raise InvalidArgument(f"{what} must be {wanted}, got shape {shape}")
    if not rows:
        matrix = matrix.reshape(1, dim)
    if not np.isfinite(matrix).all():
        raise InvalidArgument(f"{what} must be finite (no NaN or infinity)")
    if metric is Metric.COSINE:
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        if (norms == 0).any():
            raise InvalidArgument(f"{what}: a zero vector has no cosine similarity")
        off = np.abs(norms[:, 0] - 1) > _UNIT  # so a saved, normalized row loads unchanged
        matrix[off] /= norms[off]
    return matrix


def best_first(scores: F32, ids: I64, top_k: int, metric: Metric,
               query_sq: float = 0.0) -> list[tuple[int, float]]:
    """The ``top_k`` best ``(id, score)`` pairs of one query, best first, ties by smaller id.

    ``scores`` holds one selection score a stored vector, higher is better: the
    similarity for cosine/ip; ``2 q.x - |x|^2`` for l2, reported as the squared
    distance ``|q|^2 - score`` (``query_sq`` is ``|q|^2``), never below 0.
    """
    count = len(scores)
    if top_k < count:
        part = np.argpartition(scores, count - top_k)[count - top_k:]
        candidates = np.flatnonzero(scores >= scores[part].min())
    else:
        candidates = np.arange(count)
    chosen = candidates[np.lexsort((ids[candidates], -scores[candidates]))[:top_k]]
    best = scores[chosen].astype(np.float64)
    if metric is Metric.L2:
        best = np.maximum(query_sq - best, 0.0)
    return list(zip(ids[chosen].tolist(), best.tolist(), strict=True))


@dataclass(frozen=True, slots=True)
class Saved:
    """An index read from a file: its metric, ids and ``(n, dim)`` float32 vectors."""

    metric: Metric
    ids: I64
    vectors: F32


def write_index(path: str | os.PathLike[str], metric: Metric, ids: I64, vectors: F32) -> None:
    """Write an index as an uncompressed ``.npz`` file (NumPy's ``np.savez``).

    Entries: ``format`` (the string ``FORMAT``), ``metric`` (``cosine``/``ip``/
    ``l2``), ``ids`` (int64, ``n``) and ``vectors`` (float32, ``n x dim``; for
    cosine the stored, L2-normalized rows). ``path`` is used as given (NumPy
    adds ``.npz`` to a name without it).
    """
    try:
        np.savez(path, format=np.array(FORMAT), metric=np.array(metric.value),
                 ids=ids.astype(np.int64), vectors=vectors.astype(np.float32))
    except OSError as exc:
        raise GpuRuntimeError(f"cannot write the index to {os.fspath(path)!r}: {exc}") from exc


def read_index(path: str | os.PathLike[str], dim: int, metric: Metric) -> Saved:
    """Read a file ``write_index`` wrote, for a ``metric`` index of ``dim`` numbers a vector.

    The content passes the checks ``insert_many`` applies (distinct 64-bit ids,
    finite numbers, rows L2-normalized for cosine). A missing, unreadable or
    damaged file, another format, metric or dimension, or content ``insert_many``
    would refuse raises ``InvalidArgument``.
    """
    name = os.fspath(path)
    data = read_npz(path, "a vector index")
    if str(data.get("format")) != FORMAT:
        raise InvalidArgument(f"{name!r} is not a saved vector index "
                              f"(format {data.get('format')!r})")
    saved = metric_of(str(data.get("metric")))
    if saved is not metric:
        raise InvalidArgument(f"the file holds a {saved.value} index; this index is "
                              f"{metric.value}")
    ids, vectors = data.get("ids"), data.get("vectors")
    if ids is None or vectors is None:
        raise InvalidArgument(f"{name!r} has no ids or no vectors")
    id_list = as_ids(ids)
    if not id_list and vectors.shape == (0, dim):
        return Saved(metric, np.zeros(0, np.int64), np.zeros((0, dim), np.float32))
    matrix = as_matrix(vectors, dim, f"the vectors of {name!r}", metric, rows=True)
    if len(matrix) != len(id_list):
        raise InvalidArgument(f"{name!r} holds {len(id_list)} ids for {len(matrix)} vectors")
    return Saved(metric, np.array(id_list, np.int64), matrix)
