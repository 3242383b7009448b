"""CUB's device primitives on NumPy (``core.ops._cub``), and the helpers both backends share.

``radix_form`` makes the unsigned keys CUB's radix sort compares (sign
twiddles, ``-0.0`` as ``+0.0``, descending as the bitwise complement, the bit
range extracted); sorting them stably gives CUB's order, so the sorts here and
on CUDA are a stable argsort of that form and a gather. ``segment_bounds``
clamps a segmented op's offsets as the op classes document. A custom
reduction folds neighbours pairwise (``tree_reduce``): ``log2(n)`` vectorized
steps that keep the operands' order, so any associative operator fits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cpu
from atomr_accel.core._cexpr import Expr, evaluate, holds, parse
from atomr_accel.core._dtype import DType
from atomr_accel.core.ops._cub import (
    CubHistogramEven,
    CubHistogramRange,
    CubReduce,
    CubRunLengthEncode,
    CubScan,
    CubSegmentedReduce,
    CubSegmentedSort,
    CubSelect,
    CubSort,
    CubUnique,
    ReduceKind,
    ScanKind,
    identity_of,
)

__all__ = [
    "UNSIGNED", "even_scale", "radix_form", "segment_bounds", "segment_ids",
    "tree_reduce",
]

Array = Any
UNSIGNED: dict[int, Any] = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
"""The unsigned type of each key width in bytes."""


def radix_form(xp: Any, keys: Array, dtype: DType, descending: bool, begin_bit: int,
               end_bit: int | None) -> Array:
    """The unsigned keys CUB's radix sort compares for ``keys`` (see the module docstring);
    ``keys`` itself when that is the identity (unsigned keys, ascending, every bit)."""
    width = dtype.itemsize * 8
    end = width if end_bit is None else end_bit
    kind = UNSIGNED[dtype.itemsize]
    bits = keys.view(kind)
    sign = kind(1 << (width - 1))
    if dtype.is_float:
        bits = xp.where(bits == sign, kind(0), bits)  # -0.0 sorts as +0.0
        bits = bits ^ xp.where((bits & sign) != 0, kind(~kind(0)), sign)
    elif dtype.value.startswith("i"):
        bits = bits ^ sign
    if descending:
        bits = ~bits
    if begin_bit > 0 or end < width:
        bits = (bits >> kind(begin_bit)) & kind((1 << (end - begin_bit)) - 1)
    return bits


def segment_bounds(xp: Any, offsets: Array, length: int, running_max: Any) -> Array:
    """A segmented op's ``num_segments + 1`` offsets clamped to ``[0, length]`` and made
    non-decreasing (``running_max``, an inclusive max-scan), as int64."""
    return running_max(xp.clip(offsets.astype(np.int64), 0, length))


def segment_ids(xp: Any, bounds: Array, n: int) -> Array:
    """The segment of each of ``n`` items: -1 before the first segment, ``num_segments``
    after the last."""
    return xp.searchsorted(bounds, xp.arange(n, dtype=np.int64), side="right") - 1


def even_scale(op: CubHistogramEven) -> float:
    """Bins per unit of sample value: ``num_bins / (upper - lower)``, in f64."""
    return float(op.num_bins) / (float(op.upper) - float(op.lower))


def tree_reduce(fold: Any, x: Array, init: Any) -> Any:
    """Reduce ``x`` with the associative ``fold(a, b)`` (vectorized) pairwise, then fold
    ``init`` in front: the result equals the left-to-right fold."""
    while x.size > 1:
        pairs = x.size // 2
        folded = fold(x[0:2 * pairs:2], x[1:2 * pairs:2])
        x = folded if x.size % 2 == 0 else np.concatenate((folded, x[-1:]))
    if x.size == 0:
        return init
    return fold(np.asarray([init], dtype=x.dtype), x)[0]


def _custom(tree: Expr, dtype: np.dtype[Any]) -> Any:
    def fold(a: Array, b: Array) -> Array:
        return evaluate(tree, {"a": a, "b": b}, dtype)
    return fold


def _reduced(op: CubReduce, x: np.ndarray[Any, Any], out: np.dtype[Any]) -> Any:
    kind = op.kind
    if kind is ReduceKind.SUM:
        return x.sum(dtype=out)
    if kind is ReduceKind.CUSTOM:
        init = np.asarray(op.init).astype(x.dtype)
        return tree_reduce(_custom(parse(op.expr, ("a", "b")), x.dtype), x, init)
    if x.size == 0:
        return -1 if kind in (ReduceKind.ARGMIN, ReduceKind.ARGMAX) else identity_of(kind, out)
    extreme: dict[ReduceKind, Callable[[Array], Any]] = {
        ReduceKind.MIN: np.min, ReduceKind.MAX: np.max, ReduceKind.ARGMIN: np.argmin,
        ReduceKind.ARGMAX: np.argmax}
    return extreme[kind](x)


@cpu.handles(CubReduce)
def reduce(backend: ArrayBackend, op: CubReduce) -> None:
    """Write the reduction of the first ``n`` inputs to ``output[0]``."""
    x = backend.array(op.input.buffer_id)[: op.count]
    out = backend.array(op.output.buffer_id)
    out[0] = _reduced(op, x, out.dtype)


@cpu.handles(CubScan)
def scan(backend: ArrayBackend, op: CubScan) -> None:
    """Write the inclusive or exclusive prefix scan of the first ``n`` inputs."""
    n = op.count
    x = backend.array(op.input.buffer_id)[:n]
    out = backend.array(op.output.buffer_id)
    if op.kind is ScanKind.SUM:
        result = np.cumsum(x, dtype=out.dtype)
    else:
        ufunc = np.minimum if op.kind is ScanKind.MIN else np.maximum
        result = ufunc.accumulate(x) if n else x.copy()
    if op.exclusive and n:
        result = np.concatenate(([identity_of(op.kind, out.dtype)], result[:-1]))
    out[:n] = result


@cpu.handles(CubSort)
def sort(backend: ArrayBackend, op: CubSort) -> None:
    """Stable radix-order sort of the first ``n`` keys (and values)."""
    n = op.count
    keys = backend.array(op.keys_in.buffer_id)[:n]
    form = radix_form(np, keys, op.keys_in.dtype, op.descending, op.begin_bit, op.end_bit)
    order = np.argsort(form, kind="stable")
    _gather(backend, op, order, n)


def _gather(backend: ArrayBackend, op: CubSort | CubSegmentedSort, order: Array,
            n: int) -> None:
    """Write keys (and values) in ``order`` to the outputs (safe when they alias the inputs)."""
    keys = backend.array(op.keys_in.buffer_id)[:n]
    backend.array(op.keys_out.buffer_id)[:n] = keys[order]
    if op.values_in is not None and op.values_out is not None:
        values = backend.array(op.values_in.buffer_id)[:n]
        backend.array(op.values_out.buffer_id)[:n] = values[order]


@cpu.handles(CubHistogramEven)
def histogram_even(backend: ArrayBackend, op: CubHistogramEven) -> None:
    """Count samples into equal bins (the bin formula of ``CubHistogramEven``)."""
    x = backend.array(op.samples.buffer_id)[: op.count].astype(np.float64)
    bins = np.floor((x - float(op.lower)) * even_scale(op))
    kept = (bins >= 0) & (bins < op.num_bins)
    counts = np.bincount(bins[kept].astype(np.int64), minlength=op.num_bins)
    backend.array(op.histogram.buffer_id)[: op.num_bins] = counts


@cpu.handles(CubHistogramRange)
def histogram_range(backend: ArrayBackend, op: CubHistogramRange) -> None:
    """Count samples into the bins between consecutive edges."""
    x = backend.array(op.samples.buffer_id)[: op.count]
    edges = backend.array(op.edges.buffer_id)[: op.num_bins + 1]
    bins = np.searchsorted(edges, x, side="right") - 1
    kept = (bins >= 0) & (bins < op.num_bins)  # NaN sorts after every edge
    counts = np.bincount(bins[kept], minlength=op.num_bins)
    backend.array(op.histogram.buffer_id)[: op.num_bins] = counts


def _write_selected(out: Array, count: Array, x: Array, chosen: Array, partition: bool) -> None:
    kept = x[chosen]
    out[: kept.size] = kept
    if partition:
        out[kept.size: x.size] = x[~chosen][::-1]
    count[0] = kept.size


@cpu.handles(CubSelect)
def select(backend: ArrayBackend, op: CubSelect) -> None:
    """Select or partition by flags or a predicate; the number selected to ``count[0]``."""
    n = op.items
    x = backend.array(op.input.buffer_id)[:n]
    if op.flags is not None:
        chosen = backend.array(op.flags.buffer_id)[:n] != 0
    else:
        truth = holds(parse(op.predicate, ("x",)), {"x": x}, x.dtype)
        chosen = np.broadcast_to(truth, x.shape)
    _write_selected(backend.array(op.output.buffer_id), backend.array(op.count.buffer_id),
                    x, chosen, op.partition)


def run_heads(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """True where a run of equal consecutive items starts (NaNs never equal)."""
    heads = np.ones(x.size, dtype=bool)
    heads[1:] = x[1:] != x[:-1]
    return heads


@cpu.handles(CubUnique)
def unique(backend: ArrayBackend, op: CubUnique) -> None:
    """Keep the first item of each run; their number to ``count[0]``."""
    x = backend.array(op.input.buffer_id)[: op.items]
    _write_selected(backend.array(op.output.buffer_id), backend.array(op.count.buffer_id),
                    x, run_heads(x), False)


@cpu.handles(CubRunLengthEncode)
def run_length_encode(backend: ArrayBackend, op: CubRunLengthEncode) -> None:
    """Each run's value and length; the number of runs to ``num_runs[0]``."""
    n = op.items
    x = backend.array(op.input.buffer_id)[:n]
    starts = np.flatnonzero(run_heads(x))
    runs = starts.size
    backend.array(op.unique_out.buffer_id)[:runs] = x[starts]
    backend.array(op.counts_out.buffer_id)[:runs] = np.diff(np.append(starts, n))
    backend.array(op.num_runs.buffer_id)[0] = runs


def _running_max(bounds: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.maximum.accumulate(bounds)


@cpu.handles(CubSegmentedReduce)
def segmented_reduce(backend: ArrayBackend, op: CubSegmentedReduce) -> None:
    """Reduce each segment; an empty one gives the identity."""
    x = backend.array(op.input.buffer_id)
    out = backend.array(op.output.buffer_id)
    offsets = backend.array(op.offsets.buffer_id)[: op.num_segments + 1]
    bounds = segment_bounds(np, offsets, x.size, _running_max)
    identity = identity_of(op.kind, out.dtype if op.kind is ReduceKind.SUM else x.dtype)
    data = x.astype(out.dtype) if op.kind is ReduceKind.SUM else x
    padded = np.append(data, identity)  # every bound, the last included, indexes it
    ufunc = {ReduceKind.SUM: np.add, ReduceKind.MIN: np.minimum,
             ReduceKind.MAX: np.maximum}[op.kind]
    if op.num_segments == 0:
        return
    sums = ufunc.reduceat(padded, bounds[:-1])
    filled = bounds[1:] > bounds[:-1]
    # reduceat runs each segment to the next bound: the last one to the end of the padding
    last = ufunc.reduce(padded[bounds[-2]: bounds[-1]]) if filled[-1] else identity
    sums[-1] = last
    out[: op.num_segments] = np.where(filled, sums, identity)


@cpu.handles(CubSegmentedSort)
def segmented_sort(backend: ArrayBackend, op: CubSegmentedSort) -> None:
    """Sort each segment stably; items outside every segment stay where they are."""
    n = op.count
    keys = backend.array(op.keys_in.buffer_id)[:n]
    offsets = backend.array(op.offsets.buffer_id)[: op.num_segments + 1]
    bounds = segment_bounds(np, offsets, n, _running_max)
    segments = segment_ids(np, bounds, n)
    form = radix_form(np, keys, op.keys_in.dtype, op.descending, 0, None).copy()
    form[(segments < 0) | (segments >= op.num_segments)] = 0  # outside: keep their order
    order = np.lexsort((form, segments))
    _gather(backend, op, order, n)
