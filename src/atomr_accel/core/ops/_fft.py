"""FFT ops (cuFFT on CUDA, ``scipy.fft`` on CPU).

``Fft`` takes ``batch`` contiguous, row-major (C-order) arrays of ``shape``
laid end to end in one buffer; ``FftMany`` takes cuFFT's advanced (plan-many)
layout: strides, distances and embedding arrays on each side. Transforms run
over every axis of the logical shape; the inverse is unnormalized as in cuFFT,
so ``inverse(forward(x)) == prod(shape) * x``.

The ``r2c_output_len*`` helpers size the complex side of an R2C transform.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from atomr_accel.core._api import Form, Param
from atomr_accel.core._catalogue import declare
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import pickle_by_name
from atomr_accel.core._op import (
    Op,
    is_int,
    positive_ints,
    require,
    require_dtype,
    require_len,
    require_nonneg,
    require_positive,
)
from atomr_accel.core._ref import GpuRef, same_buffer

__all__ = [
    "Fft",
    "FftKind",
    "FftLayout",
    "FftMany",
    "r2c_output_len",
    "r2c_output_len_2d",
    "r2c_output_len_3d",
    "r2c_output_len_many",
    "shape_of",
]

declare("fft", "Fft",
        "cuFFT-shaped ops: 1-D/2-D/3-D, R2C/C2R/C2C, batched.",
        rank=2, handle="Fft", capturable=True)

_COMPLEX = (DType.C64, DType.C128)
_REAL = (DType.F32, DType.F64)


class FftKind(enum.Enum):
    """Choose which sides of a transform are complex: C2C, R2C (forward) or C2R (inverse)."""

    C2C = "c2c"
    R2C = "r2c"
    C2R = "c2r"

    __reduce_ex__ = pickle_by_name


def shape_of(shape: object) -> tuple[int, ...]:
    """``shape`` as a tuple of sizes: an int is a 1-D shape (``InvalidArgument`` for neither)."""
    if is_int(shape):
        return (shape,)
    if isinstance(shape, tuple | list):
        return tuple(shape)
    raise InvalidArgument(f"shape must be a size or a sequence of sizes, got {shape!r}")


_SHAPE = Param("shape", parse=shape_of, annotation="int | Sequence[int]")


def _runs_inverse(kind: FftKind, inverse: bool | None) -> bool:
    """The direction a transform runs: ``inverse``, or the kind's own when None (inverse for
    C2R only)."""
    return kind is FftKind.C2R if inverse is None else inverse


def _half(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The complex side of an R2C/C2R transform of ``shape``: the last axis halved, plus one."""
    return (*shape[:-1], shape[-1] // 2 + 1)


def _require_sizes(name: str, sizes: tuple[int, ...]) -> None:
    """Every size must be an int >= 1; the error names the first bad one as ``name[axis]``."""
    if not positive_ints(*sizes):
        for axis, size in enumerate(sizes):
            require_positive(**{f"{name}[{axis}]": size})


def _require_rank(rank: object) -> None:
    if not (is_int(rank) and 1 <= rank <= 3):
        raise InvalidArgument(f"rank must be 1, 2 or 3, got {rank!r}")


def _require_inverse(inverse: object) -> None:
    if not (inverse is None or isinstance(inverse, bool)):
        raise InvalidArgument(f"inverse must be a bool or None, got {inverse!r}")


def _require_sides(kind: FftKind, is_inverse: bool, src: GpuRef, dst: GpuRef) -> None:
    """Check both sides' dtypes (one precision) and the direction against ``kind``."""
    if kind is FftKind.C2C:
        require_dtype(src, _COMPLEX, "input")
        require_dtype(dst, _COMPLEX, "output")
    elif kind is FftKind.R2C:
        require(not is_inverse, "an R2C transform only runs forward")
        require_dtype(src, _REAL, "input")
        require_dtype(dst, _COMPLEX, "output")
    else:
        require(is_inverse, "a C2R transform only runs inverse")
        require_dtype(src, _COMPLEX, "input")
        require_dtype(dst, _REAL, "output")
    if src.dtype.real is not dst.dtype.real:
        raise InvalidArgument(
            f"input ({src.dtype.value}) and output ({dst.dtype.value}) must share one precision"
        )


class _Transform(Op):
    """The base of the two transforms: their library and traits, and their direction."""

    __slots__ = ()
    library: ClassVar[str] = "fft"
    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("output",)
    kind: FftKind
    inverse: bool | None

    @property
    def is_inverse(self) -> bool:
        """True when the transform runs in the inverse (unnormalized) direction."""
        return _runs_inverse(self.kind, self.inverse)


@dataclass(frozen=True, slots=True)
class Fft(_Transform):
    """Transform ``batch`` arrays of ``shape`` (1 to 3 dims) from ``input`` into ``output``.

    ``shape`` always names the logical (real-side) size. For R2C each output
    item holds ``shape[:-1] + (shape[-1] // 2 + 1,)`` complex values (the
    non-redundant half, as cuFFT and ``rfftn`` produce); C2R takes that many and
    writes ``shape`` real values. Complex sides are c64/c128, real sides f32/f64,
    and both sides share one precision (f32 with c64, f64 with c128).

    ``inverse`` picks the direction: None means the kind's own (forward for C2C
    and R2C, inverse for C2R); R2C can only run forward and C2R only inverse.
    Inverse transforms are unnormalized (no ``1/n`` factor), like cuFFT.
    ``input`` may be ``output`` (in place) for C2C only.
    """

    api = (
        Form("c2c", ("input", "output", _SHAPE), fixed={"kind": FftKind.C2C},
             doc="Transform complex ``input`` into ``output`` (in place allowed; "
             "``inverse=True``: the unnormalized inverse)."),
        Form("r2c", ("input", "output", _SHAPE), fixed={"kind": FftKind.R2C, "inverse": False},
             doc="Transform real ``input`` of ``shape`` forward into its half spectrum in "
             "``output``."),
        Form("c2r", ("input", "output", _SHAPE), fixed={"kind": FftKind.C2R, "inverse": True},
             doc="Transform a half spectrum in ``input`` back (unnormalized) into real "
             "``output`` of ``shape``."),
    )
    input: GpuRef
    output: GpuRef
    shape: tuple[int, ...]
    kind: FftKind
    inverse: bool | None = None
    batch: int = 1

    @property
    def complex_shape(self) -> tuple[int, ...]:
        """Shape of one item on the complex side (halved last axis for R2C/C2R)."""
        if self.kind is FftKind.C2C:
            return self.shape
        return _half(self.shape)

    @property
    def input_count(self) -> int:
        """Elements read from ``input`` (all batch items)."""
        item = self.complex_shape if self.kind is FftKind.C2R else self.shape
        return self.batch * math.prod(item)

    @property
    def output_count(self) -> int:
        """Elements written to ``output`` (all batch items)."""
        item = self.complex_shape if self.kind is FftKind.R2C else self.shape
        return self.batch * math.prod(item)

    def validate(self) -> None:
        kind, shape = self.kind, self.shape
        if not isinstance(kind, FftKind):
            raise InvalidArgument(f"kind must be an FftKind, got {kind!r}")
        if not (isinstance(shape, tuple) and 1 <= len(shape) <= 3):
            raise InvalidArgument(f"shape must be a tuple of 1 to 3 sizes, got {shape!r}")
        _require_sizes("shape", shape)
        require_positive(batch=self.batch)
        _require_inverse(self.inverse)
        _require_sides(kind, self.is_inverse, self.input, self.output)
        if kind is not FftKind.C2C and same_buffer(self.input, self.output):
            raise InvalidArgument(
                f"{kind.name} transforms cannot run in place; use separate buffers"
            )
        require_len(self.input, self.input_count, "input")
        require_len(self.output, self.output_count, "output")


class FftLayout(NamedTuple):
    """Where one side of an ``FftMany`` keeps its elements (cuFFT's advanced data layout).

    Element ``(x, y, z)`` of item ``b`` sits at flat index
    ``b * dist + ((x * embed[1] + y) * embed[2] + z) * stride`` (``(b * dist +
    (x * embed[1] + y) * stride`` for rank 2, ``b * dist + x * stride`` for rank
    1), in elements of the side's dtype. ``embed[0]`` only bounds the first index.
    """

    embed: tuple[int, ...]
    stride: int
    dist: int

    @classmethod
    def of(cls, embed: tuple[int, ...] | None, stride: int, dist: int,
           shape: tuple[int, ...]) -> FftLayout:
        """Resolve a side's layout: no ``embed`` is ``shape`` (tight), a ``dist`` of 0 the
        natural distance ``prod(embed) * stride`` (items end to end)."""
        resolved = shape if embed is None else embed
        return cls(resolved, stride, dist or math.prod(resolved) * stride)

    @property
    def pitches(self) -> tuple[int, ...]:
        """Elements between neighbours along each axis: ``stride`` times the later embeds."""
        pitch, out = self.stride, []
        for size in reversed(self.embed):
            out.append(pitch)
            pitch *= size
        return tuple(reversed(out))

    def extent(self, shape: tuple[int, ...], batch: int) -> int:
        """Elements from the buffer's start through the last one ``batch`` items of ``shape``
        address: one more than the largest index."""
        last = sum((size - 1) * pitch for size, pitch in zip(shape, self.pitches, strict=True))
        return (batch - 1) * self.dist + last + 1


def _require_embed(name: str, embed: tuple[int, ...] | None, shape: tuple[int, ...],
                   side: str) -> None:
    """An embed is None or one int per axis, each at least the side's size along it."""
    if embed is None:
        return
    if not (isinstance(embed, tuple) and len(embed) == len(shape)):
        raise InvalidArgument(
            f"{name} must be None or a tuple of rank ({len(shape)}) sizes, got {embed!r}")
    for axis, (size, needed) in enumerate(zip(embed, shape, strict=True)):
        if not (is_int(size) and size >= needed):
            raise InvalidArgument(
                f"{name}[{axis}] is {size!r}; it must be an int >= {needed}, the {side}'s "
                f"size along axis {axis}")


@dataclass(frozen=True, slots=True)
class FftMany(_Transform):
    """Transform ``batch`` items of size ``n`` (``rank`` 1 to 3) laid out as cufftPlanMany says.

    Kinds, dtypes and directions are as for ``Fft``: C2C on c64/c128, R2C from
    f32/f64 to c64/c128 (forward only), C2R back (inverse only), one precision
    on both sides; ``inverse`` None means the kind's own direction, and the
    inverse is unnormalized. ``n`` is the real-side size; the complex side of
    R2C/C2R holds ``n[:-1] + (n[-1] // 2 + 1,)`` values per item.

    Each side has a layout (``FftLayout``): input element ``(x, y, z)`` of item
    ``b`` is ``input[b * idist + ((x * inembed[1] + y) * inembed[2] + z) * istride]``,
    and likewise for the output with ``onembed``, ``ostride`` and ``odist``.
    ``inembed``/``onembed`` None mean tight (the side's own logical size); a
    distance of 0 means the natural one, ``prod(embed) * stride``. Strides are
    ``>= 1``, and each embed is at least the side's size along each axis.
    Only the addressed output elements are written; layouts whose output items
    share elements are not refused, and which value such an element ends with
    is unspecified. ``input`` may be ``output`` for C2C with one layout on both sides.
    """

    api = (Form("plan_many", ("input", "output", "rank", "n", "kind")),)
    input: GpuRef
    output: GpuRef
    rank: int
    n: tuple[int, ...]
    kind: FftKind
    inverse: bool | None = None
    batch: int = 1
    inembed: tuple[int, ...] | None = None
    istride: int = 1
    idist: int = 0
    onembed: tuple[int, ...] | None = None
    ostride: int = 1
    odist: int = 0

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Logical shape of one input item (the complex side's for C2R)."""
        return _half(self.n) if self.kind is FftKind.C2R else self.n

    @property
    def output_shape(self) -> tuple[int, ...]:
        """Logical shape of one output item (the complex side's for R2C)."""
        return _half(self.n) if self.kind is FftKind.R2C else self.n

    @property
    def input_layout(self) -> FftLayout:
        """The input side's resolved layout."""
        return FftLayout.of(self.inembed, self.istride, self.idist, self.input_shape)

    @property
    def output_layout(self) -> FftLayout:
        """The output side's resolved layout."""
        return FftLayout.of(self.onembed, self.ostride, self.odist, self.output_shape)

    def validate(self) -> None:
        """Raise ``InvalidArgument`` unless kind, sizes, layouts and buffer lengths fit."""
        kind, n = self.kind, self.n
        if not isinstance(kind, FftKind):
            raise InvalidArgument(f"kind must be an FftKind, got {kind!r}")
        _require_rank(self.rank)
        if not (isinstance(n, tuple) and len(n) == self.rank):
            raise InvalidArgument(f"n must be a tuple of rank ({self.rank}) sizes, got {n!r}")
        _require_sizes("n", n)
        require_positive(batch=self.batch, istride=self.istride, ostride=self.ostride)
        require_nonneg(idist=self.idist, odist=self.odist)
        _require_inverse(self.inverse)
        _require_sides(kind, self.is_inverse, self.input, self.output)
        _require_embed("inembed", self.inembed, self.input_shape, "input")
        _require_embed("onembed", self.onembed, self.output_shape, "output")
        source, target = self.input_layout, self.output_layout
        if same_buffer(self.input, self.output):
            require(kind is FftKind.C2C,
                    f"{kind.name} transforms cannot run in place; use separate buffers")
            require(source == target, "an in-place transform needs one layout on both sides")
        require_len(self.input, source.extent(self.input_shape, self.batch), "input")
        require_len(self.output, target.extent(self.output_shape, self.batch), "output")


def r2c_output_len(n: int) -> int:
    """Complex values an R2C transform of ``n`` real values makes: ``n // 2 + 1``.

    Raises ``InvalidArgument`` unless ``n`` is an int >= 1.
    """
    require_positive(n=n)
    return int(n // 2 + 1)


def r2c_output_len_2d(nx: int, ny: int) -> int:
    """Complex values a 2-D R2C transform of ``nx x ny`` makes: ``nx * (ny // 2 + 1)``.

    Raises ``InvalidArgument`` unless both sizes are ints >= 1.
    """
    require_positive(nx=nx, ny=ny)
    return int(nx * (ny // 2 + 1))


def r2c_output_len_3d(nx: int, ny: int, nz: int) -> int:
    """Complex values a 3-D R2C transform of ``nx x ny x nz`` makes: ``nx * ny * (nz // 2 + 1)``.

    Raises ``InvalidArgument`` unless every size is an int >= 1.
    """
    require_positive(nx=nx, ny=ny, nz=nz)
    return int(nx * ny * (nz // 2 + 1))


def r2c_output_len_many(rank: int, n: tuple[int, ...] | list[int], batch: int = 1,
                        odist: int = 0) -> int:
    """Complex values to allocate for ``batch`` R2C items of size ``n``, ``odist`` apart.

    ``max(natural, odist) * batch``, where ``natural`` (``prod(n[:-1]) *
    (n[-1] // 2 + 1)``) is one tight item and an ``odist`` of 0 means it.
    Raises ``InvalidArgument`` for a rank outside 1..3, ``len(n) != rank``, a
    size below 1, ``batch < 1`` or a negative ``odist``.
    """
    _require_rank(rank)
    if not (isinstance(n, tuple | list) and len(n) == rank):
        raise InvalidArgument(f"n must hold rank ({rank}) sizes, got {n!r}")
    _require_sizes("n", tuple(n))
    require_positive(batch=batch)
    require_nonneg(odist=odist)
    natural = math.prod(_half(tuple(n)))
    return int(max(natural, odist) * batch)
