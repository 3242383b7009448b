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

The library is declared here; the selection ops live in ``_cub_select`` and
what the ops share (dtypes, kinds, checks) in ``_cub_common``. This module
names them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from atomr_accel.core._api import Form
from atomr_accel.core._catalogue import declare
from atomr_accel.core._cexpr import parse
from atomr_accel.core._dtype import DType
from atomr_accel.core._op import (
    require,
    require_dtype,
    require_len,
    require_numbers,
    require_positive,
    require_same_dtype,
    require_shared_dtype,
)
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._cub_common import (
    _EXPR,
    _N,
    _NO_CUSTOM,
    _VALUES_IN,
    _VALUES_OUT,
    ARITHMETIC,
    COUNTS,
    SORTABLE,
    ReduceKind,
    ScanKind,
    _count,
    _CubOp,
    _require_bits,
    _require_offsets,
    _require_values,
    identity_of,
)
from atomr_accel.core.ops._cub_select import CubRunLengthEncode, CubSelect, CubUnique

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


@dataclass(frozen=True, slots=True)
class CubReduce(_CubOp):
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
class CubScan(_CubOp):
    """Prefix-scan the first ``n`` elements of ``input`` into ``output``.

    Inclusive: ``output[i] = input[0] op ... op input[i]``; exclusive:
    ``output[0]`` is the identity (0, the dtype's largest for min, its lowest for
    max) and ``output[i]`` the inclusive result at ``i - 1``. ``sum`` writes an
    ``output`` of any arithmetic dtype (accumulated in it); ``min`` / ``max`` one of
    the input's dtype (a NaN propagates). ``output`` may be ``input``.
    """

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


class _Sort(_CubOp):
    """The sorts: the keys they consider and the checks of the keys and the values."""

    __slots__ = ()
    keys_in: GpuRef
    keys_out: GpuRef
    n: int | None
    values_in: GpuRef | None
    values_out: GpuRef | None

    @property
    def count(self) -> int:
        """Keys considered."""
        return self.keys_in.length if self.n is None else self.n

    def _check_keys(self) -> None:
        """Check the keys in and out and the values, if any, that go with them."""
        require_shared_dtype(SORTABLE, keys_in=self.keys_in, keys_out=self.keys_out)
        n = _count(self.n, self.keys_in, "keys_in")
        require_len(self.keys_out, n, "keys_out")
        _require_values(self.values_in, self.values_out, n)


@dataclass(frozen=True, slots=True)
class CubSort(_Sort):
    """Radix-sort the first ``n`` keys of ``keys_in`` into ``keys_out`` (and, with values,
    carry ``values_in`` along into ``values_out``).

    Stable in both directions; keys are any integer or float dtype, ordered as
    CUB orders them (see the module docstring: ``-0.0 == +0.0``, a positive NaN
    after ``+inf``); only bits ``[begin_bit, end_bit)`` of each key's radix form
    are compared (``end_bit=None``: all). ``keys_out`` may be ``keys_in``, and
    ``values_out`` ``values_in``.
    """

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

    def validate(self) -> None:
        self._check_keys()
        _require_bits(self.begin_bit, self.end_bit, self.keys_in)


class _Histogram(_CubOp):
    """The histogram ops: the samples they count and the checks of the samples, the
    histogram and ``num_bins``."""

    __slots__ = ()
    samples: GpuRef
    histogram: GpuRef
    num_bins: int
    n: int | None

    @property
    def count(self) -> int:
        """Samples counted."""
        return self.samples.length if self.n is None else self.n

    def _check_bins(self, **same: GpuRef) -> None:
        """Check the samples (and ``same``, buffers of their dtype), the histogram's dtype
        and ``num_bins``."""
        require_dtype(self.samples, ARITHMETIC, "samples")
        if same:
            require_same_dtype(samples=self.samples, **same)
        require_dtype(self.histogram, COUNTS, "histogram")
        _count(self.n, self.samples, "samples")
        require_positive(num_bins=self.num_bins)


@dataclass(frozen=True, slots=True)
class CubHistogramEven(_Histogram):
    """Count the first ``n`` samples into ``num_bins`` equal bins over ``[lower, upper)``.

    Sample ``x`` falls in bin ``floor((x - lower) * (num_bins / (upper - lower)))``,
    computed in f64, when that is in ``[0, num_bins)``; other samples (and NaNs)
    are not counted. ``histogram`` (i32, i64, u32 or u64) is overwritten.
    """

    outputs: ClassVar[tuple[str, ...]] = ("histogram",)
    api = (Form("histogram_even", ("samples", "histogram", "num_bins", "lower", "upper", _N)),)
    samples: GpuRef
    histogram: GpuRef
    num_bins: int
    lower: float
    upper: float
    n: int | None = None

    def validate(self) -> None:
        self._check_bins()
        require_len(self.histogram, self.num_bins, "histogram")
        require_numbers(DType.F64, lower=self.lower, upper=self.upper)
        require(bool(np.isfinite(self.lower) and np.isfinite(self.upper)
                     and self.lower < self.upper),
                f"lower ({self.lower}) and upper ({self.upper}) must be finite, lower < upper")


@dataclass(frozen=True, slots=True)
class CubHistogramRange(_Histogram):
    """Count the first ``n`` samples into ``num_bins`` bins with explicit ``edges``.

    Bin ``i`` counts ``edges[i] <= x < edges[i + 1]``; ``edges`` holds ``num_bins +
    1`` ascending values of the samples' dtype. Samples outside (and NaNs) are
    not counted. ``histogram`` (i32, i64, u32 or u64) is overwritten.
    """

    outputs: ClassVar[tuple[str, ...]] = ("histogram",)
    api = (Form("histogram_range", ("samples", "edges", "histogram", "num_bins", _N)),)
    samples: GpuRef
    edges: GpuRef
    histogram: GpuRef
    num_bins: int
    n: int | None = None

    def validate(self) -> None:
        self._check_bins(edges=self.edges)
        require_len(self.edges, self.num_bins + 1, "edges")
        require_len(self.histogram, self.num_bins, "histogram")


@dataclass(frozen=True, slots=True)
class CubSegmentedReduce(_CubOp):
    """Reduce each of ``num_segments`` segments of ``input`` into ``output[s]``.

    Segment ``s`` is ``input[offsets[s]:offsets[s + 1]]``; ``offsets`` (i32 or
    i64, ``num_segments + 1`` values on the device) should be non-decreasing and
    within the input: each end is clamped to ``[begin, len(input)]`` and each
    begin to ``[0, len(input)]``, so a bad offset gives an empty or short segment,
    never a fault. ``kind`` is ``sum`` (``output`` of any arithmetic dtype),
    ``min`` or ``max`` (``output`` of the input's dtype); an empty segment gives
    the identity (0, the dtype's largest, its lowest).
    """

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
class CubSegmentedSort(_Sort):
    """Sort each of ``num_segments`` segments of the first ``n`` keys independently (stable,
    CUB's order as ``CubSort``), carrying values along when given.

    Segments are as in ``CubSegmentedReduce`` (offsets clamped to ``[0, n]``);
    items outside every segment are copied where they are. ``keys_out`` may be
    ``keys_in``, ``values_out`` ``values_in``.
    """

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

    def validate(self) -> None:
        self._check_keys()
        _require_offsets(self.offsets, self.num_segments)

