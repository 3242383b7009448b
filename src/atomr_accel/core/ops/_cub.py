"""Device-wide primitives in CUB's terms (``library = "cub"``; the ``Cub`` handle).

Every op reads the first ``n`` elements of its input (``n=None``: the whole
input buffer) and writes its results to device buffers; counts (items
selected, runs found) go to a one-element integer buffer, so nothing waits on
the host. Lengths may be anything from 0 up.

- ``CubReduce``: sum, min, max, argmin, argmax or a custom associative operator
  (a small C expression over ``a`` and ``b``, see ``core._cexpr``) into
  ``output[0]``.
- ``CubScan``: inclusive or exclusive prefix sum, min or max.
- ``CubSort``: a stable radix sort of keys, or of keys with values, ascending or
  descending, on bits ``[begin_bit, end_bit)`` of each key, in CUB's order.
- ``CubHistogramEven`` / ``CubHistogramRange``: counts over equal-width bins or
  explicit edges.
- ``CubSelect``: select (stable compaction) or partition by flags or by a
  predicate (a small C expression over ``x``).
- ``CubUnique`` and ``CubRunLengthEncode``: over runs of equal consecutive items.
- ``CubSegmentedReduce`` and ``CubSegmentedSort``: per segment of an offsets array.

Sort order is CUB's radix order: keys are compared as the bit patterns CUB
makes of them (the sign bit flipped for signed integers; for floats, all bits
flipped when the sign is set, else the sign bit), ``-0.0`` equals ``+0.0``, and
NaNs sort by their bits: the usual (positive) NaN after ``+inf``, a negative
NaN before ``-inf``; descending order reverses that, and equal keys keep their
input order in both directions.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from atomr_accel.core._api import Form, Param
from atomr_accel.core._catalogue import declare
from atomr_accel.core._cexpr import parse
from atomr_accel.core._dtype import DType
from atomr_accel.core._fields import pickle_by_name
from atomr_accel.core._op import (
    Op,
    require,
    require_dtype,
    require_len,
    require_nonneg,
    require_numbers,
    require_positive,
    require_same_dtype,
)
from atomr_accel.core._ref import GpuRef

__all__ = [
    "ARITHMETIC",
    "COUNTS",
    "SORTABLE",
    "CubHistogramEven",
    "CubHistogramRange",
    "CubReduce",
    "CubRunLengthEncode",
    "CubScan",
    "CubSegmentedReduce",
    "CubSegmentedSort",
    "CubSelect",
    "CubSort",
    "CubUnique",
    "ReduceKind",
    "ScanKind",
    "identity_of",
]

declare("cub", "Cub",
        "Device-wide primitives (reduce, scan, radix sort, histogram, select, ...).",
        rank=16, handle="Cub")

INTEGERS = (DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U16, DType.U32,
            DType.U64)
ARITHMETIC = (*INTEGERS, DType.F16, DType.F32, DType.F64)
"""The dtypes reductions, scans, histograms and selections take."""
SORTABLE = (*ARITHMETIC, DType.BF16)
"""The key dtypes of the sorts: every integer and float dtype."""
COUNTS = (DType.I32, DType.I64, DType.U32, DType.U64)
"""The dtypes of count and histogram buffers."""
OFFSETS = (DType.I32, DType.I64)


class ReduceKind(enum.Enum):
    """The operator of a reduction: ``sum``, ``min``, ``max``, ``argmin``, ``argmax`` or
    ``custom`` (a C expression)."""

    SUM = "sum"
    MIN = "min"
    MAX = "max"
    ARGMIN = "argmin"
    ARGMAX = "argmax"
    CUSTOM = "custom"

    __reduce_ex__ = pickle_by_name


class ScanKind(enum.Enum):
    """The operator of a scan: ``sum``, ``min`` or ``max``."""

    SUM = "sum"
    MIN = "min"
    MAX = "max"

    __reduce_ex__ = pickle_by_name


def identity_of(kind: ReduceKind | ScanKind, dtype: np.dtype[Any]) -> Any:
    """The value an empty reduction (or an exclusive scan's first element) holds: 0 for a
    sum, the dtype's largest value (``inf`` for floats) for a min, its lowest for a max."""
    if kind.value == "sum":
        return dtype.type(0)
    high = kind.value == "min"
    if dtype.kind == "f":
        return dtype.type(np.inf if high else -np.inf)
    info = np.iinfo(dtype)
    return dtype.type(info.max if high else info.min)


def _count(n: int | None, ref: GpuRef, name: str) -> int:
    """``n`` checked against ``ref`` (None: the whole buffer)."""
    if n is None:
        return ref.length
    require_nonneg(n=n)
    require_len(ref, n, name)
    return n


def _distinct(a: GpuRef, b: GpuRef, names: str) -> None:
    require((a.device_id, a.buffer_id) != (b.device_id, b.buffer_id),
            f"{names} must be different buffers")


_N = Param("n", None, annotation="int | None")
_VALUES_IN = Param("values_in", annotation="BufferLike")
_VALUES_OUT = Param("values_out", annotation="BufferLike")
_EXPR = Param("expr", annotation="str")
_PREDICATE = Param("predicate", annotation="str")
_NO_CUSTOM = {"expr": "", "init": 0.0}


@dataclass(frozen=True, slots=True)
class CubReduce(Op):
    """Reduce the first ``n`` elements of ``input`` (None: all of it) into ``output[0]``.

    ``kind``: ``sum`` (into an ``output`` of any arithmetic dtype, accumulated in
    it), ``min`` / ``max`` (``output`` of the input's dtype; a NaN propagates, as
    in NumPy), ``argmin`` / ``argmax`` (an i64 ``output``: the index of the first
    extreme; a NaN counts as the extreme, as in NumPy; -1 for an empty input) or
    ``custom``: the associative operator ``expr``, a small C expression over
    ``a`` and ``b`` (``core._cexpr`` lists what both backends accept), with the
    identity ``init``, in the input's dtype. An empty input gives the identity:
    0, the dtype's largest (min), its lowest (max), ``init`` (custom).
    """

    library: ClassVar[str] = "cub"
    outputs: ClassVar[tuple[str, ...]] = ("output",)
    api = (
        Form("reduce", ("input", "output", _N)),
        Form("reduce_sum", ("input", "output", _N), fixed={"kind": ReduceKind.SUM, **_NO_CUSTOM},
             doc="Sum the first ``n`` elements of ``input`` (None: all) into ``output[0]``."),
        Form("reduce_min", ("input", "output", _N), fixed={"kind": ReduceKind.MIN, **_NO_CUSTOM},
             doc="The least of the first ``n`` elements of ``input`` into ``output[0]``."),
        Form("reduce_max", ("input", "output", _N), fixed={"kind": ReduceKind.MAX, **_NO_CUSTOM},
             doc="The greatest of the first ``n`` elements of ``input`` into ``output[0]``."),
        Form("argmin", ("input", "output", _N), fixed={"kind": ReduceKind.ARGMIN, **_NO_CUSTOM},
             doc="The index of the first least element into the i64 ``output[0]``."),
        Form("argmax", ("input", "output", _N), fixed={"kind": ReduceKind.ARGMAX, **_NO_CUSTOM},
             doc="The index of the first greatest element into the i64 ``output[0]``."),
        Form("reduce_custom", ("input", "output", _EXPR, "init", _N),
             fixed={"kind": ReduceKind.CUSTOM},
             doc="Reduce with the associative C expression ``expr`` over ``a`` and ``b`` "
                 "(identity ``init``) into ``output[0]``."),
    )
    input: GpuRef
    output: GpuRef
    n: int | None = None
    kind: ReduceKind = ReduceKind.SUM
    expr: str = ""
    init: float = 0.0

    @property
    def count(self) -> int:
        """Elements reduced."""
        return self.input.length if self.n is None else self.n

    def validate(self) -> None:
        require_dtype(self.input, ARITHMETIC, "input")
        _count(self.n, self.input, "input")
        require_len(self.output, 1, "output")
        kind = self.kind
        if kind is ReduceKind.SUM:
            require_dtype(self.output, ARITHMETIC, "output")
        elif kind in (ReduceKind.ARGMIN, ReduceKind.ARGMAX):
            require_dtype(self.output, (DType.I64,), "output")
        else:
            require_same_dtype(input=self.input, output=self.output)
        if kind is ReduceKind.CUSTOM:
            parse(self.expr, ("a", "b"))
            require_numbers(self.input.dtype, init=self.init)
        else:
            require(self.expr == "", f"expr is only for a custom reduction, not {kind.value}")


@dataclass(frozen=True, slots=True)
class CubScan(Op):
    """Prefix-scan the first ``n`` elements of ``input`` into ``output``.

    Inclusive: ``output[i] = input[0] op ... op input[i]``; exclusive:
    ``output[0]`` is the identity (0, the dtype's largest for min, its lowest for
    max) and ``output[i]`` the inclusive result at ``i - 1``. ``sum`` writes an
    ``output`` of any arithmetic dtype (accumulated in it); ``min`` / ``max`` one of
    the input's dtype (a NaN propagates). ``output`` may be ``input``.
    """

    library: ClassVar[str] = "cub"
    outputs: ClassVar[tuple[str, ...]] = ("output",)
    api = (
        Form("inclusive_scan", ("input", "output", _N), fixed={"exclusive": False}),
        Form("exclusive_scan", ("input", "output", _N), fixed={"exclusive": True},
             doc="Exclusive prefix scan (``kind`` sum, min or max) of ``input`` into "
                 "``output``."),
        Form("inclusive_sum", ("input", "output", _N),
             fixed={"exclusive": False, "kind": ScanKind.SUM},
             doc="Inclusive prefix sum of the first ``n`` elements of ``input`` into "
                 "``output``."),
        Form("exclusive_sum", ("input", "output", _N),
             fixed={"exclusive": True, "kind": ScanKind.SUM},
             doc="Exclusive prefix sum (``output[0] = 0``) of ``input`` into ``output``."),
    )
    input: GpuRef
    output: GpuRef
    n: int | None = None
    kind: ScanKind = ScanKind.SUM
    exclusive: bool = False

    @property
    def count(self) -> int:
        """Elements scanned."""
        return self.input.length if self.n is None else self.n

    def validate(self) -> None:
        require_dtype(self.input, ARITHMETIC, "input")
        n = _count(self.n, self.input, "input")
        require_len(self.output, n, "output")
        if self.kind is ScanKind.SUM:
            require_dtype(self.output, ARITHMETIC, "output")
        else:
            require_same_dtype(input=self.input, output=self.output)


def _require_bits(begin_bit: int, end_bit: int | None, keys: GpuRef) -> None:
    width = keys.dtype.itemsize * 8
    end = width if end_bit is None else end_bit
    require_nonneg(begin_bit=begin_bit, end_bit=end)
    require(begin_bit < end <= width,
            f"the bit range [{begin_bit}, {end}) must be non-empty and within the "
            f"{width} bits of a {keys.dtype.value} key")


def _require_values(values_in: GpuRef | None, values_out: GpuRef | None, n: int) -> None:
    require((values_in is None) == (values_out is None),
            "values_in and values_out go together: pass both or neither")
    if values_in is not None and values_out is not None:
        require_same_dtype(values_in=values_in, values_out=values_out)
        require_len(values_in, n, "values_in")
        require_len(values_out, n, "values_out")


@dataclass(frozen=True, slots=True)
class CubSort(Op):
    """Radix-sort the first ``n`` keys of ``keys_in`` into ``keys_out`` (and, with values,
    carry ``values_in`` along into ``values_out``).

    Stable in both directions; keys are any integer or float dtype, ordered as
    CUB orders them (see the module docstring: ``-0.0 == +0.0``, a positive NaN
    after ``+inf``); only bits ``[begin_bit, end_bit)`` of each key's radix form
    are compared (``end_bit=None``: all). ``keys_out`` may be ``keys_in``, and
    ``values_out`` ``values_in``.
    """

    library: ClassVar[str] = "cub"
    outputs: ClassVar[tuple[str, ...]] = ("keys_out", "values_out")
    api = (
        Form("sort_keys", ("keys_in", "keys_out", _N),
             fixed={"values_in": None, "values_out": None, "descending": False},
             doc="Sort the first ``n`` keys of ``keys_in`` ascending into ``keys_out``."),
        Form("sort_keys_descending", ("keys_in", "keys_out", _N),
             fixed={"values_in": None, "values_out": None, "descending": True},
             doc="Sort the first ``n`` keys of ``keys_in`` descending into ``keys_out``."),
        Form("sort_pairs", ("keys_in", "keys_out", _VALUES_IN, _VALUES_OUT, _N),
             fixed={"descending": False},
             doc="Sort keys ascending, carrying their values along (stable)."),
        Form("sort_pairs_descending", ("keys_in", "keys_out", _VALUES_IN, _VALUES_OUT, _N),
             fixed={"descending": True},
             doc="Sort keys descending, carrying their values along (stable)."),
    )
    keys_in: GpuRef
    keys_out: GpuRef
    n: int | None = None
    values_in: GpuRef | None = None
    values_out: GpuRef | None = None
    descending: bool = False
    begin_bit: int = 0
    end_bit: int | None = None

    @property
    def count(self) -> int:
        """Keys sorted."""
        return self.keys_in.length if self.n is None else self.n

    def validate(self) -> None:
        require_dtype(self.keys_in, SORTABLE, "keys_in")
        require_same_dtype(keys_in=self.keys_in, keys_out=self.keys_out)
        n = _count(self.n, self.keys_in, "keys_in")
        require_len(self.keys_out, n, "keys_out")
        _require_values(self.values_in, self.values_out, n)
        _require_bits(self.begin_bit, self.end_bit, self.keys_in)


@dataclass(frozen=True, slots=True)
class CubHistogramEven(Op):
    """Count the first ``n`` samples into ``num_bins`` equal bins over ``[lower, upper)``.

    Sample ``x`` falls in bin ``floor((x - lower) * (num_bins / (upper - lower)))``,
    computed in f64, when that is in ``[0, num_bins)``; other samples (and NaNs)
    are not counted. ``histogram`` (i32, i64, u32 or u64) is overwritten.
    """

    library: ClassVar[str] = "cub"
    outputs: ClassVar[tuple[str, ...]] = ("histogram",)
    api = (Form("histogram_even", ("samples", "histogram", "num_bins", "lower", "upper", _N)),)
    samples: GpuRef
    histogram: GpuRef
    num_bins: int
    lower: float
    upper: float
    n: int | None = None

    @property
    def count(self) -> int:
        """Samples counted."""
        return self.samples.length if self.n is None else self.n

    def validate(self) -> None:
        require_dtype(self.samples, ARITHMETIC, "samples")
        require_dtype(self.histogram, COUNTS, "histogram")
        _count(self.n, self.samples, "samples")
        require_positive(num_bins=self.num_bins)
        require_len(self.histogram, self.num_bins, "histogram")
        require_numbers(DType.F64, lower=self.lower, upper=self.upper)
        require(bool(np.isfinite(self.lower) and np.isfinite(self.upper)
                     and self.lower < self.upper),
                f"lower ({self.lower}) and upper ({self.upper}) must be finite, lower < upper")


@dataclass(frozen=True, slots=True)
class CubHistogramRange(Op):
    """Count the first ``n`` samples into ``num_bins`` bins with explicit ``edges``.

    Bin ``i`` counts ``edges[i] <= x < edges[i + 1]``; ``edges`` holds ``num_bins +
    1`` ascending values of the samples' dtype. Samples outside (and NaNs) are
    not counted. ``histogram`` (i32, i64, u32 or u64) is overwritten.
    """

    library: ClassVar[str] = "cub"
    outputs: ClassVar[tuple[str, ...]] = ("histogram",)
    api = (Form("histogram_range", ("samples", "edges", "histogram", "num_bins", _N)),)
    samples: GpuRef
    edges: GpuRef
    histogram: GpuRef
    num_bins: int
    n: int | None = None

    @property
    def count(self) -> int:
        """Samples counted."""
        return self.samples.length if self.n is None else self.n

    def validate(self) -> None:
        require_dtype(self.samples, ARITHMETIC, "samples")
        require_same_dtype(samples=self.samples, edges=self.edges)
        require_dtype(self.histogram, COUNTS, "histogram")
        _count(self.n, self.samples, "samples")
        require_positive(num_bins=self.num_bins)
        require_len(self.edges, self.num_bins + 1, "edges")
        require_len(self.histogram, self.num_bins, "histogram")


@dataclass(frozen=True, slots=True)
class CubSelect(Op):
    """Select (or partition) the first ``n`` items of ``input`` by ``flags`` or ``predicate``.

    An item is selected where ``flags`` (an integer buffer) is non-zero, or where
    ``predicate``, a small C expression over ``x`` (``core._cexpr``), holds: give
    exactly one. Select writes the selected items in order to the front of
    ``output``; partition (``partition=True``) also writes the others after them
    in reverse order, as CUB does. ``count[0]`` gets the number selected.
    ``output`` holds at least ``n`` items and is not ``input``.
    """

    library: ClassVar[str] = "cub"
    outputs: ClassVar[tuple[str, ...]] = ("output", "count")
    api = (
        Form("select_flagged", ("input", Param("flags", annotation="BufferLike"), "output",
                                "count", _N), fixed={"predicate": "", "partition": False},
             doc="Copy the items whose flag is non-zero, in order, to ``output``; their "
                 "number to ``count[0]``."),
        Form("select_if", ("input", "output", "count", _PREDICATE, _N),
             fixed={"flags": None, "partition": False},
             doc="Copy the items for which the C expression ``predicate`` over ``x`` holds, "
                 "in order, to ``output``; their number to ``count[0]``."),
        Form("partition_flagged", ("input", Param("flags", annotation="BufferLike"), "output",
                                   "count", _N), fixed={"predicate": "", "partition": True},
             doc="Flagged items first (in order), the rest after them (reversed); the number "
                 "flagged to ``count[0]``."),
        Form("partition_if", ("input", "output", "count", _PREDICATE, _N),
             fixed={"flags": None, "partition": True},
             doc="Items for which ``predicate`` holds first (in order), the rest after them "
                 "(reversed); their number to ``count[0]``."),
    )
    input: GpuRef
    output: GpuRef
    count: GpuRef
    n: int | None = None
    flags: GpuRef | None = None
    predicate: str = ""
    partition: bool = False

    @property
    def items(self) -> int:
        """Items considered."""
        return self.input.length if self.n is None else self.n

    def validate(self) -> None:
        require_dtype(self.input, ARITHMETIC, "input")
        require_same_dtype(input=self.input, output=self.output)
        n = _count(self.n, self.input, "input")
        require_len(self.output, n, "output")
        _distinct(self.input, self.output, "input and output")
        require_dtype(self.count, COUNTS, "count")
        require_len(self.count, 1, "count")
        require((self.flags is None) != (self.predicate == ""),
                "give either flags or a predicate, not both or neither")
        if self.flags is not None:
            require_dtype(self.flags, (*INTEGERS,), "flags")
            require_len(self.flags, n, "flags")
        else:
            parse(self.predicate, ("x",))


@dataclass(frozen=True, slots=True)
class CubUnique(Op):
    """Keep the first item of each run of equal consecutive items of ``input`` (CUB's
    ``DeviceSelect::Unique``: sorted input gives the distinct values), in order, in
    ``output``; their number in ``count[0]``. NaNs never equal each other, so each is kept.
    """

    library: ClassVar[str] = "cub"
    outputs: ClassVar[tuple[str, ...]] = ("output", "count")
    api = (Form("unique", ("input", "output", "count", _N)),)
    input: GpuRef
    output: GpuRef
    count: GpuRef
    n: int | None = None

    @property
    def items(self) -> int:
        """Items considered."""
        return self.input.length if self.n is None else self.n

    def validate(self) -> None:
        require_dtype(self.input, ARITHMETIC, "input")
        require_same_dtype(input=self.input, output=self.output)
        n = _count(self.n, self.input, "input")
        require_len(self.output, n, "output")
        _distinct(self.input, self.output, "input and output")
        require_dtype(self.count, COUNTS, "count")
        require_len(self.count, 1, "count")


@dataclass(frozen=True, slots=True)
class CubRunLengthEncode(Op):
    """Run-length encode the first ``n`` items of ``input``: each run of equal consecutive
    items gives its value in ``unique_out`` and its length in ``counts_out``, in order;
    ``num_runs[0]`` gets the number of runs. NaNs never equal each other (runs of 1)."""

    library: ClassVar[str] = "cub"
    outputs: ClassVar[tuple[str, ...]] = ("unique_out", "counts_out", "num_runs")
    api = (Form("run_length_encode", ("input", "unique_out", "counts_out", "num_runs", _N)),)
    input: GpuRef
    unique_out: GpuRef
    counts_out: GpuRef
    num_runs: GpuRef
    n: int | None = None

    @property
    def items(self) -> int:
        """Items considered."""
        return self.input.length if self.n is None else self.n

    def validate(self) -> None:
        require_dtype(self.input, ARITHMETIC, "input")
        require_same_dtype(input=self.input, unique_out=self.unique_out)
        n = _count(self.n, self.input, "input")
        require_len(self.unique_out, n, "unique_out")
        _distinct(self.input, self.unique_out, "input and unique_out")
        require_dtype(self.counts_out, COUNTS, "counts_out")
        require_len(self.counts_out, n, "counts_out")
        require_dtype(self.num_runs, COUNTS, "num_runs")
        require_len(self.num_runs, 1, "num_runs")


def _require_offsets(offsets: GpuRef, num_segments: int) -> None:
    require_nonneg(num_segments=num_segments)
    require_dtype(offsets, OFFSETS, "offsets")
    require_len(offsets, num_segments + 1, "offsets")


@dataclass(frozen=True, slots=True)
class CubSegmentedReduce(Op):
    """Reduce each of ``num_segments`` segments of ``input`` into ``output[s]``.

    Segment ``s`` is ``input[offsets[s]:offsets[s + 1]]``; ``offsets`` (i32 or
    i64, ``num_segments + 1`` values on the device) should be non-decreasing and
    within the input: each end is clamped to ``[begin, len(input)]`` and each
    begin to ``[0, len(input)]``, so a bad offset gives an empty or short segment,
    never a fault. ``kind`` is ``sum`` (``output`` of any arithmetic dtype),
    ``min`` or ``max`` (``output`` of the input's dtype); an empty segment gives
    the identity (0, the dtype's largest, its lowest).
    """

    library: ClassVar[str] = "cub"
    outputs: ClassVar[tuple[str, ...]] = ("output",)
    api = (Form("segmented_reduce", ("input", "output", "offsets", "num_segments")),)
    input: GpuRef
    output: GpuRef
    offsets: GpuRef
    num_segments: int
    kind: ReduceKind = ReduceKind.SUM

    def validate(self) -> None:
        require_dtype(self.input, ARITHMETIC, "input")
        _require_offsets(self.offsets, self.num_segments)
        require_len(self.output, self.num_segments, "output")
        require(self.kind in (ReduceKind.SUM, ReduceKind.MIN, ReduceKind.MAX),
                f"a segmented reduction is a sum, min or max, not {self.kind.value}")
        if self.kind is ReduceKind.SUM:
            require_dtype(self.output, ARITHMETIC, "output")
        else:
            require_same_dtype(input=self.input, output=self.output)


@dataclass(frozen=True, slots=True)
class CubSegmentedSort(Op):
    """Sort each of ``num_segments`` segments of the first ``n`` keys independently (stable,
    CUB's order as ``CubSort``), carrying values along when given.

    Segments are as in ``CubSegmentedReduce`` (offsets clamped to ``[0, n]``);
    items outside every segment are copied where they are. ``keys_out`` may be
    ``keys_in``, ``values_out`` ``values_in``.
    """

    library: ClassVar[str] = "cub"
    outputs: ClassVar[tuple[str, ...]] = ("keys_out", "values_out")
    api = (
        Form("segmented_sort_keys", ("keys_in", "keys_out", "offsets", "num_segments", _N),
             fixed={"values_in": None, "values_out": None},
             doc="Sort each segment of ``keys_in`` (between consecutive ``offsets``) into "
                 "``keys_out``."),
        Form("segmented_sort_pairs", ("keys_in", "keys_out", _VALUES_IN, _VALUES_OUT, "offsets",
                                      "num_segments", _N),
             doc="Sort each segment of the keys, carrying their values along (stable)."),
    )
    keys_in: GpuRef
    keys_out: GpuRef
    offsets: GpuRef
    num_segments: int
    n: int | None = None
    values_in: GpuRef | None = None
    values_out: GpuRef | None = None
    descending: bool = False

    @property
    def count(self) -> int:
        """Keys considered."""
        return self.keys_in.length if self.n is None else self.n

    def validate(self) -> None:
        require_dtype(self.keys_in, SORTABLE, "keys_in")
        require_same_dtype(keys_in=self.keys_in, keys_out=self.keys_out)
        n = _count(self.n, self.keys_in, "keys_in")
        require_len(self.keys_out, n, "keys_out")
        _require_values(self.values_in, self.values_out, n)
        _require_offsets(self.offsets, self.num_segments)

