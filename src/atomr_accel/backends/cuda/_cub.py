"""CUB's device primitives on CUDA (``core.ops._cub``): CuPy's CUB-backed routines and small
CuPy kernels, all on the op's stream; no handler synchronizes the device itself.

- Sum, min, max, argmin and argmax are CuPy's reductions (``ndarray.sum`` ... with
  no ``dtype`` where the output has the default one, as CuPy's CUB path needs,
  which run ``cub::DeviceReduce`` when CuPy's CUB accelerator is on:
  ``CUPY_ACCELERATORS``; ``benchmarks/cub_bench.py`` prints which are); a
  custom operator is a ``cupy.ReductionKernel`` of the C expression.
- A prefix sum copies the input into the output and scans it in place with
  ``cupy.cuda.cub.cub_scan`` (``cub::DeviceScan::InclusiveSum``), as
  ``cupy.cumsum`` does inside, or with ``cupy.cumsum`` where CUB cannot take
  it; min and max scans are a tiled kernel here (``_SCAN_SOURCE``: a block
  scan per tile, the tiles' totals scanned the same way, then each tile fixed up).
- Sorts are CuPy's Thrust sorts (CUB's radix sort for primitive keys):
  ``ndarray.sort`` in place for plain ascending integer keys, else a stable
  ``cupy.argsort`` of the radix form (``backends.cpu._cub.radix_form``, here
  one element-wise kernel; integer keys ascending on every bit are their own)
  and ``cupy.take`` of keys and values straight into the outputs. Thrust's default
  execution policy, which CuPy's sorts use, may wait for the stream before it
  returns.
- Histograms, select/partition, unique and run-length encoding are one
  ``cupy.cumsum`` of the flags (positions) and element-wise CuPy kernels (bins
  with atomics, scatters); counts are copied from the scan's last element, on
  the device. Segmented reductions are one block per segment (``_SEGMENT_SOURCE``).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import cupy as cp
import numpy as np

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cuda
from atomr_accel.backends.cpu import _cub as shared
from atomr_accel.backends.cuda._prepared import prepares, ran
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

__all__ = ["cub_module"]

Array = Any
_THREADS = 256
_ITEMS = 8
_TILE = _THREADS * _ITEMS
_CTYPES = {
    np.dtype(np.int8): "signed char", np.dtype(np.int16): "short", np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long", np.dtype(np.uint8): "unsigned char",
    np.dtype(np.uint16): "unsigned short", np.dtype(np.uint32): "unsigned int",
    np.dtype(np.uint64): "unsigned long long", np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
}
_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)


@functools.cache
def cub_module() -> tuple[Any, int] | None:
    """``cupy.cuda.cub`` and its code of an inclusive sum, when it imports and has its scan
    (``cub_scan``); else None."""
    try:
        module = importlib.import_module("cupy.cuda.cub")
    except ImportError:
        return None
    code = getattr(module, "CUPY_CUB_CUMSUM", None)
    if code is None:
        code = getattr(getattr(module, "cupy_cub_op", None), "CUPY_CUB_CUMSUM", None)
    return (module, code) if hasattr(module, "cub_scan") and code is not None else None


def _literal(value: Any, dtype: np.dtype[Any]) -> str:
    """``value`` as a C literal of ``dtype`` (infinities and NaN by their bits)."""
    if dtype.kind == "f":
        v = float(value)
        if np.isfinite(v):
            return repr(v)
        if dtype.itemsize == 8:
            return f"__longlong_as_double({int(np.float64(v).view(np.uint64))}ULL)"
        return f"__int_as_float({int(np.float32(v).view(np.int32))})"
    v = int(value)
    if dtype.kind == "u":
        return f"{v}ULL"
    if v == np.iinfo(np.int64).min:
        return "(-9223372036854775807LL - 1)"
    return f"{v}LL"


def _op_macro(kind: str) -> str:
    """``OP(a, b)``: a sum, or a min/max that propagates NaN (as NumPy's)."""
    if kind == "sum":
        return "#define OP(a, b) ((a) + (b))"
    pick = "(b) < (a)" if kind == "min" else "(b) > (a)"
    return f"#define OP(a, b) ((a) != (a) ? (a) : ((b) != (b) ? (b) : ({pick} ? (b) : (a))))"


_SCAN_SOURCE = r"""
typedef TYPE T;
OPDEF
#define IDENT ((T)IDENTITY)
extern "C" __global__ void scan_tiles(const T* x, T* y, T* totals, long long n) {
    __shared__ T part[THREADS];
    const int tid = threadIdx.x;
    const long long base = (long long)blockIdx.x * TILE + (long long)tid * ITEMS;
    T items[ITEMS];
    T acc = IDENT;
    for (int k = 0; k < ITEMS; ++k) {
        const long long i = base + k;
        acc = OP(acc, i < n ? x[i] : IDENT);
        items[k] = acc;
    }
    part[tid] = acc;
    __syncthreads();
    for (int step = 1; step < THREADS; step <<= 1) {
        T left = tid >= step ? part[tid - step] : IDENT;
        __syncthreads();
        part[tid] = OP(left, part[tid]);
        __syncthreads();
    }
    const T before = tid > 0 ? part[tid - 1] : IDENT;
    for (int k = 0; k < ITEMS; ++k) {
        const long long i = base + k;
        if (i < n) y[i] = OP(before, items[k]);
    }
    if (tid == THREADS - 1) totals[blockIdx.x] = part[THREADS - 1];
}
extern "C" __global__ void fix_tiles(T* y, const T* scanned, long long n) {
    const long long tile = (long long)blockIdx.x + 1;
    const T before = scanned[tile - 1];
    const long long end = (tile + 1) * TILE < n ? (tile + 1) * TILE : n;
    for (long long i = tile * TILE + threadIdx.x; i < end; i += blockDim.x) {
        y[i] = OP(before, y[i]);
    }
}
"""

_SEGMENT_SOURCE = r"""
typedef TYPE T;
typedef ACCUMULATOR A;
typedef RESULT R;
OPDEF
#define IDENT ((A)IDENTITY)
extern "C" __global__ void reduce_segments(const T* x, const long long* bounds, R* out,
                                           long long segments) {
    __shared__ A part[THREADS];
    const int tid = threadIdx.x;
    for (long long s = blockIdx.x; s < segments; s += gridDim.x) {
        A acc = IDENT;
        for (long long i = bounds[s] + tid; i < bounds[s + 1]; i += THREADS) {
            acc = OP(acc, (A)x[i]);
        }
        part[tid] = acc;
        __syncthreads();
        for (int half = THREADS / 2; half > 0; half >>= 1) {
            if (tid < half) part[tid] = OP(part[tid], part[tid + half]);
            __syncthreads();
        }
        if (tid == 0) out[s] = (R)part[0];
        __syncthreads();
    }
}
"""


def _source(template: str, **names: str) -> str:
    text = template
    for name, value in names.items():
        text = text.replace(name, value)
    return text


@functools.cache
def _scan_kernels(dtype: np.dtype[Any], kind: str) -> tuple[Any, Any]:
    source = _source(_SCAN_SOURCE, TYPE=_CTYPES[dtype], OPDEF=_op_macro(kind),
                     IDENTITY=_literal(identity_of(ScanKind(kind), dtype), dtype),
                     THREADS=str(_THREADS), TILE=str(_TILE), ITEMS=str(_ITEMS))
    module = cp.RawModule(code=source)
    return module.get_function("scan_tiles"), module.get_function("fix_tiles")


@functools.cache
def _segment_kernel(dtype: np.dtype[Any], accumulator: np.dtype[Any], result: np.dtype[Any],
                    kind: str) -> Any:
    identity = identity_of(ReduceKind(kind), accumulator)
    source = _source(_SEGMENT_SOURCE, ACCUMULATOR=_CTYPES[accumulator], RESULT=_CTYPES[result],
                     TYPE=_CTYPES[dtype], OPDEF=_op_macro(kind),
                     IDENTITY=_literal(identity, accumulator), THREADS=str(_THREADS))
    return cp.RawModule(code=source).get_function("reduce_segments")


def _scan_in_place(y: Array, kind: str) -> None:
    """Inclusive min or max scan of the contiguous 1-D ``y`` (not f16), in place."""
    n = y.size
    if n == 0:
        return
    tiles, fix = _scan_kernels(y.dtype, kind)
    count = -(-n // _TILE)
    totals = cp.empty(count, dtype=y.dtype)
    tiles((count,), (_THREADS,), (y, y, totals, np.int64(n)))
    if count > 1:
        _scan_in_place(totals, kind)
        fix((count - 1,), (_THREADS,), (y, totals, np.int64(n)))


def _running_max(bounds: Array) -> Array:
    _scan_in_place(bounds, "max")
    return bounds


def _cumsum_into(source: Array, target: Array) -> None:
    """``target[:] = cumsum(source)`` in ``target``'s dtype: a copy, then CUB's in-place scan."""
    target[...] = source.astype(target.dtype, copy=False)
    cub = cub_module()
    done = None
    if cub is not None and 0 < target.size < 2**31:
        module, code = cub
        done = module.cub_scan(target, code)  # None where CUB cannot take it
    if done is None:
        target[...] = cp.cumsum(target)
    elif done.data.ptr != target.data.ptr:
        target[...] = done


@functools.cache
def _sum_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype ``sum()`` gives ``dtype`` when none is asked for (NumPy's rule, as CuPy's)."""
    result: np.dtype[Any] = np.asarray(np.zeros(0, dtype=dtype).sum()).dtype
    return result


@functools.cache
def _custom_kernel(expr: str, identity: str) -> Any:
    return cp.ReductionKernel("T x", "T y", "x", expr, "y = a", identity, "atomr_cub_custom",
                              reduce_type="T")


def _store(out: Array, value: Array) -> None:
    """Put a reduction's one-element result ``value`` into ``out`` (one element): a copy of
    its bytes on the current stream where the dtypes agree (on the H100 machine, 38.5 us of
    host time a reduce instead of 56.6 us with the element-wise kernel of
    ``out[...] = value``; ``docs/cub.md``), else that converting assignment."""
    if value.dtype == out.dtype:
        runtime = cp.cuda.runtime
        runtime.memcpyAsync(out.data.ptr, value.data.ptr, value.nbytes,
                            runtime.memcpyDeviceToDevice, cp.cuda.get_current_stream().ptr)
    else:
        out[...] = value


prepares(CubReduce, CubScan)


@cuda.handles(CubReduce)
def reduce(backend: ArrayBackend, op: CubReduce) -> None:
    """Write the reduction of the first ``n`` inputs to ``output[0]`` (see the module doc);
    once it ran, the op only queues work (its kernels are compiled: ``ran``)."""
    _reduce(backend, op)
    ran(backend, op)


def _reduce(backend: ArrayBackend, op: CubReduce) -> None:
    x = backend.array(op.input.buffer_id)[: op.count]
    out = backend.array(op.output.buffer_id)[:1]
    kind = op.kind
    if kind is ReduceKind.SUM:  # CuPy takes CUB's path only with its own result dtype
        _store(out, x.sum() if _sum_dtype(x.dtype) == out.dtype else x.sum(dtype=out.dtype))
    elif kind is ReduceKind.CUSTOM:
        init = np.asarray(op.init).astype(x.dtype)
        _store(out, _custom_kernel(op.expr, _literal(init, x.dtype))(x))
    elif x.size == 0:
        empty = -1 if kind in (ReduceKind.ARGMIN, ReduceKind.ARGMAX) else \
            identity_of(kind, out.dtype)
        out.fill(empty)
    else:
        method = {ReduceKind.MIN: x.min, ReduceKind.MAX: x.max, ReduceKind.ARGMIN: x.argmin,
                  ReduceKind.ARGMAX: x.argmax}[kind]
        _store(out, method())


def _inclusive_scan(x: Array, target: Array, kind: ScanKind) -> None:
    """Inclusive scan of ``x`` into ``target`` (of ``x``'s length; it may be ``x``)."""
    if kind is ScanKind.SUM:
        _cumsum_into(x, target)
    elif target.dtype == _F16:
        wide = x.astype(_F32)
        _scan_in_place(wide, kind.value)
        target[...] = wide.astype(target.dtype)
    else:
        target[...] = x.astype(target.dtype, copy=False)
        _scan_in_place(target, kind.value)


@cuda.handles(CubScan)
def scan(backend: ArrayBackend, op: CubScan) -> None:
    """Inclusive or exclusive prefix scan of the first ``n`` inputs; once it ran, the op only
    queues work (``ran``)."""
    _scan(backend, op)
    ran(backend, op)


def _scan(backend: ArrayBackend, op: CubScan) -> None:
    n = op.count
    if n == 0:
        return
    x = backend.array(op.input.buffer_id)[:n]
    out = backend.array(op.output.buffer_id)[:n]
    same = op.input.buffer_id == op.output.buffer_id
    if not op.exclusive:  # in place is fine: the scans run in their target
        _inclusive_scan(x, out, op.kind)
        return
    head = x[: n - 1].copy() if same else x[: n - 1]
    out[:1] = identity_of(op.kind, out.dtype)
    _inclusive_scan(head, out[1:], op.kind)


def _full_width(op: CubSort) -> bool:
    width = op.keys_in.dtype.itemsize * 8
    return op.begin_bit == 0 and op.end_bit in (None, width)


def _take(backend: ArrayBackend, source: Any, target: Any, order: Array, n: int) -> None:
    """``target[:n] = source[:n][order]``: gathered straight into ``target`` unless it is
    ``source`` (then through a copy)."""
    data, out = backend.array(source.buffer_id)[:n], backend.array(target.buffer_id)[:n]
    if source.buffer_id == target.buffer_id:
        out[...] = data[order]
    else:
        cp.take(data, order, out=out)


def _gather(backend: ArrayBackend, op: CubSort | CubSegmentedSort, order: Array, n: int) -> None:
    _take(backend, op.keys_in, op.keys_out, order, n)
    if op.values_in is not None and op.values_out is not None:
        _take(backend, op.values_in, op.values_out, order, n)


_RADIX_FORM = cp.ElementwiseKernel(
    "U bits, U sign, int32 mode, bool descending, int32 begin, U mask", "U out",
    "U b = bits;"
    "if (mode == 2) { if (b == sign) b = 0; b ^= (b & sign) ? (U)~(U)0 : sign; }"
    "else if (mode == 1) { b ^= sign; }"
    "if (descending) b = (U)~b;"
    "out = (U)(b >> begin) & mask;",
    "atomr_cub_radix_form")


def _radix_form(keys: Array, dtype: Any, descending: bool, begin_bit: int,
                end_bit: int | None) -> Array:
    """``backends.cpu._cub.radix_form`` in one kernel (one per key width)."""
    width = dtype.itemsize * 8
    end = width if end_bit is None else end_bit
    kind = shared.UNSIGNED[dtype.itemsize]
    mode = 2 if dtype.is_float else 1 if dtype.value.startswith("i") else 0
    mask = kind((1 << (end - begin_bit)) - 1)
    return _RADIX_FORM(keys.view(kind), kind(1 << (width - 1)), mode, descending, begin_bit,
                       mask)


@cuda.handles(CubSort)
def sort(backend: ArrayBackend, op: CubSort) -> None:
    """Stable radix-order sort: ``ndarray.sort`` for plain ascending integer keys, else a
    stable ``argsort`` of the radix form and a gather."""
    n = op.count
    if n == 0:
        return
    dtype = op.keys_in.dtype
    keys = backend.array(op.keys_in.buffer_id)[:n]
    if (op.values_in is None and not op.descending and not dtype.is_float
            and _full_width(op)):
        out = backend.array(op.keys_out.buffer_id)[:n]
        if op.keys_out.buffer_id != op.keys_in.buffer_id:
            out[...] = keys
        out.sort()
        return
    if not op.descending and not dtype.is_float and _full_width(op):
        form = keys  # integers ascending on every bit: their own radix order
    else:
        form = _radix_form(keys, dtype, op.descending, op.begin_bit, op.end_bit)
    _gather(backend, op, cp.argsort(form), n)


_HIST_EVEN = cp.ElementwiseKernel(
    "T x, float64 lower, float64 scale, int64 bins", "raw C hist",
    "double v = floor(((double)x - lower) * scale);"
    "if (v >= 0.0 && v < (double)bins) atomicAdd(&hist[(long long)v], (C)1);",
    "atomr_cub_histogram_even")

_HIST_RANGE = cp.ElementwiseKernel(
    "T x, raw T edges, int64 bins", "raw C hist",
    "long long lo = 0, hi = bins + 1;"
    "while (lo < hi) { long long mid = (lo + hi) / 2;"
    "  if (edges[mid] <= x) lo = mid + 1; else hi = mid; }"
    "const long long b = lo - 1;"
    "if (x == x && b >= 0 && b < bins) atomicAdd(&hist[b], (C)1);",
    "atomr_cub_histogram_range")


def _counters(backend: ArrayBackend, ref: Any, bins: int) -> Array:
    """The histogram's first ``bins`` counters, zeroed, as the unsigned type atomics take."""
    hist = backend.array(ref.buffer_id)[:bins]
    view = hist.view(cp.uint64 if hist.dtype.itemsize == 8 else cp.uint32)
    view.fill(0)
    return view


@cuda.handles(CubHistogramEven)
def histogram_even(backend: ArrayBackend, op: CubHistogramEven) -> None:
    """Equal bins, the bin formula of ``CubHistogramEven`` in f64, counted with atomics."""
    hist = _counters(backend, op.histogram, op.num_bins)
    x = backend.array(op.samples.buffer_id)[: op.count]
    if x.size:
        _HIST_EVEN(x, float(op.lower), shared.even_scale(op), op.num_bins, hist)


@cuda.handles(CubHistogramRange)
def histogram_range(backend: ArrayBackend, op: CubHistogramRange) -> None:
    """Bins between consecutive edges: a binary search per sample, counted with atomics."""
    hist = _counters(backend, op.histogram, op.num_bins)
    x = backend.array(op.samples.buffer_id)[: op.count]
    edges = backend.array(op.edges.buffer_id)[: op.num_bins + 1]
    if x.size:
        _HIST_RANGE(x, edges, op.num_bins, hist)


_SELECT = cp.ElementwiseKernel("T x, bool m, int64 p", "raw T out",
                               "if (m) out[p - 1] = x;", "atomr_cub_select")
_PARTITION = cp.ElementwiseKernel("T x, bool m, int64 p, int64 n", "raw T out",
                                  "if (m) out[p - 1] = x; else out[n - 1 - (i - p)] = x;",
                                  "atomr_cub_partition")
_HEADS = cp.ElementwiseKernel("raw T x", "bool m", "m = i == 0 || x[i] != x[i - 1];",
                              "atomr_cub_run_heads")
_RUN_HEADS = cp.ElementwiseKernel("T x, bool m, int64 p", "raw T unique, raw int64 starts",
                                  "if (m) { unique[p - 1] = x; starts[p - 1] = i; }",
                                  "atomr_cub_run_starts")
_RUN_ENDS = cp.ElementwiseKernel(
    "raw T x, int64 p, raw int64 starts, int64 n", "raw C counts",
    "if (i == n - 1 || x[i] != x[i + 1]) counts[p - 1] = i + 1 - starts[p - 1];",
    "atomr_cub_run_lengths")


@functools.cache
def _predicate(expr: str) -> Any:
    return cp.ElementwiseKernel("T x", "bool m", f"m = ({expr});", "atomr_cub_predicate")


def _positions(chosen: Array) -> Array:
    """Inclusive count of chosen items up to each (int64): the scatter positions."""
    positions = cp.empty(chosen.size, dtype=cp.int64)
    _cumsum_into(chosen, positions)
    return positions


def _write_count(count: Array, positions: Array) -> None:
    """``count[0]`` = the last position (0 when there are none), on the device."""
    if positions.size:
        count[:1] = positions[-1:].astype(count.dtype)
    else:
        count[:1] = 0


@cuda.handles(CubSelect)
def select(backend: ArrayBackend, op: CubSelect) -> None:
    """Select or partition by flags or a predicate: positions by a scan, then a scatter."""
    n = op.items
    x = backend.array(op.input.buffer_id)[:n]
    out = backend.array(op.output.buffer_id)
    count = backend.array(op.count.buffer_id)
    if op.flags is not None:
        chosen = backend.array(op.flags.buffer_id)[:n] != 0
    else:
        chosen = cp.empty(n, dtype=cp.bool_)
        if n:
            _predicate(op.predicate)(x, chosen)
    positions = _positions(chosen)
    if n and op.partition:
        _PARTITION(x, chosen, positions, n, out)
    elif n:
        _SELECT(x, chosen, positions, out)
    _write_count(count, positions)


def _heads(x: Array) -> Array:
    heads = cp.empty(x.size, dtype=cp.bool_)
    if x.size:
        _HEADS(x, heads)
    return heads


@cuda.handles(CubUnique)
def unique(backend: ArrayBackend, op: CubUnique) -> None:
    """Keep the first item of each run: heads, positions, a scatter."""
    x = backend.array(op.input.buffer_id)[: op.items]
    heads = _heads(x)
    positions = _positions(heads)
    if x.size:
        _SELECT(x, heads, positions, backend.array(op.output.buffer_id))
    _write_count(backend.array(op.count.buffer_id), positions)


@cuda.handles(CubRunLengthEncode)
def run_length_encode(backend: ArrayBackend, op: CubRunLengthEncode) -> None:
    """Each run's value and length: heads, positions, the runs' starts, then their ends."""
    n = op.items
    x = backend.array(op.input.buffer_id)[:n]
    heads = _heads(x)
    positions = _positions(heads)
    if n:
        starts = cp.empty(n, dtype=cp.int64)
        _RUN_HEADS(x, heads, positions, backend.array(op.unique_out.buffer_id), starts)
        _RUN_ENDS(x, positions, starts, n, backend.array(op.counts_out.buffer_id))
    _write_count(backend.array(op.num_runs.buffer_id), positions)


@cuda.handles(CubSegmentedReduce)
def segmented_reduce(backend: ArrayBackend, op: CubSegmentedReduce) -> None:
    """One block per segment (f16 data are reduced in f32)."""
    segments = op.num_segments
    if segments == 0:
        return
    x = backend.array(op.input.buffer_id)
    out = backend.array(op.output.buffer_id)[:segments]
    offsets = backend.array(op.offsets.buffer_id)[: segments + 1]
    bounds = shared.segment_bounds(cp, offsets, x.size, _running_max)
    data = x.astype(_F32) if x.dtype == _F16 else x
    target = cp.empty(segments, dtype=_F32) if out.dtype == _F16 else out
    accumulator = target.dtype if op.kind is ReduceKind.SUM else data.dtype
    kernel = _segment_kernel(data.dtype, accumulator, target.dtype, op.kind.value)
    kernel((min(segments, 1 << 20),), (_THREADS,), (data, bounds, target, np.int64(segments)))
    if target is not out:
        out[...] = target.astype(out.dtype)


@cuda.handles(CubSegmentedSort)
def segmented_sort(backend: ArrayBackend, op: CubSegmentedSort) -> None:
    """Stable sort by (segment, radix form): two stable argsorts; outside items stay put."""
    n = op.count
    if n == 0:
        return
    keys = backend.array(op.keys_in.buffer_id)[:n]
    offsets = backend.array(op.offsets.buffer_id)[: op.num_segments + 1]
    bounds = shared.segment_bounds(cp, offsets, n, _running_max)
    segments = shared.segment_ids(cp, bounds, n)
    form = _radix_form(keys, op.keys_in.dtype, op.descending, 0, None)
    outside = (segments < 0) | (segments >= op.num_segments)
    form = cp.where(outside, form.dtype.type(0), form)
    by_key = cp.argsort(form)
    order = by_key[cp.argsort(segments[by_key])]
    _gather(backend, op, order, n)
