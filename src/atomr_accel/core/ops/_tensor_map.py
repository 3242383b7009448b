"""Tensor-map (TMA) descriptors: a tiled view of a buffer that Hopper's copy engine reads.

A ``TensorMap`` is plain data: the buffer's ``GpuRef`` plus the view's shape,
strides, box and options, checked here against every rule the CUDA driver
states for ``cuTensorMapEncodeTiled`` (typed ``InvalidArgument`` before any
device is touched). The CUDA backend encodes the 128-byte ``CUtensorMap`` at
each launch from the buffer's current address, so a descriptor never holds a
stale address; a buffer of an older context generation is refused like any
other buffer argument (``GpuRefStale``).

Shapes, boxes and strides are in NumPy order (outermost first, the last
dimension contiguous); the driver, and ``cp.async.bulk.tensor``'s coordinates
in a kernel, count dimensions innermost first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import is_int
from atomr_accel.core._ref import GpuRef

__all__ = ["INTERLEAVES", "L2_PROMOTIONS", "OOB_FILLS", "SWIZZLES", "TMA_DTYPES", "TensorMap"]

MAX_RANK = 5
MAX_BOX = 256
MAX_ELEMENT_STRIDE = 8
MAX_DIM = 2**32
MAX_STRIDE = 2**40

TMA_DTYPES: dict[DType, str] = {
    DType.U8: "UINT8", DType.U16: "UINT16", DType.U32: "UINT32", DType.I32: "INT32",
    DType.U64: "UINT64", DType.I64: "INT64", DType.F16: "FLOAT16", DType.F32: "FLOAT32",
    DType.F64: "FLOAT64", DType.BF16: "BFLOAT16",
}
"""Element types the copy engine moves, and the name of each in ``CUtensorMapDataType``."""

INTERLEAVES = ("none", "16b", "32b")
"""``interleave`` choices (``CU_TENSOR_MAP_INTERLEAVE_*``)."""
SWIZZLES = {"none": 0, "32b": 32, "64b": 64, "128b": 128}
"""``swizzle`` choices and the span in bytes each swizzles within (``CU_TENSOR_MAP_SWIZZLE_*``)."""
L2_PROMOTIONS = ("none", "64b", "128b", "256b")
"""``l2_promotion`` choices (``CU_TENSOR_MAP_L2_PROMOTION_*``)."""
OOB_FILLS = ("zero", "nan")
"""``oob_fill`` choices: zeros, or a NaN that requests a zero FMA (floating types only)."""


def _ints(value: object, name: str, rank: int | None = None) -> tuple[int, ...]:
    """A tuple of ints from an int or an iterable of ints (``InvalidArgument`` otherwise)."""
    items: tuple[Any, ...]
    if is_int(value):
        items = (value,)
    elif isinstance(value, Iterable) and not isinstance(value, str | bytes):
        items = tuple(value)
    else:
        raise InvalidArgument(f"{name} must be a sequence of ints, got {value!r}")
    if not all(is_int(v) for v in items):
        raise InvalidArgument(f"{name} must be a sequence of ints, got {value!r}")
    if rank is not None and len(items) != rank:
        raise InvalidArgument(f"{name} must have {rank} entries (one per dimension), "
                              f"got {len(items)}: {value!r}")
    return tuple(int(v) for v in items)


def _choice(value: object, name: str, choices: Iterable[str]) -> str:
    options = tuple(choices)
    if value not in options:
        raise InvalidArgument(f"{name} must be one of {options}, got {value!r}")
    return str(value)


@dataclass(frozen=True, slots=True)
class TensorMap:
    """A tiled tensor-map (TMA) descriptor of a buffer, passed to a kernel by value.

    Make one with ``TensorMap.tiled``; pass it as a launch argument (or
    ``KernelArg.tensor_map``) to a kernel parameter declared
    ``const __grid_constant__ CUtensorMap``. Needs a CUDA device of compute
    capability 9.0 or newer to run; it is checked the same on every backend.
    """

    buffer: GpuRef
    dtype: DType
    shape: tuple[int, ...]
    box: tuple[int, ...]
    strides: tuple[int, ...]
    """Byte strides of every dimension but the last (NumPy order)."""
    offset: int = 0
    """Bytes from the start of the buffer to element (0, ..., 0)."""
    element_strides: tuple[int, ...] = ()
    interleave: str = "none"
    swizzle: str = "none"
    l2_promotion: str = "none"
    oob_fill: str = "zero"

    @classmethod
    def tiled(cls, buffer: Any, dtype: DType | str, shape: Iterable[int] | int,
              box: Iterable[int] | int, *, strides: Iterable[int] | None = None,
              offset: int = 0, element_strides: Iterable[int] | None = None,
              swizzle: str = "none", interleave: str = "none", l2_promotion: str = "none",
              oob_fill: str = "zero") -> TensorMap:
        """A checked tiled view of ``buffer`` (a buffer or its ``GpuRef``).

        ``shape`` is the view's size in elements of ``dtype`` and ``box`` the
        tile one copy moves, both outermost first (NumPy order, at most 5
        dimensions). ``strides`` are the byte strides of each dimension, as
        NumPy's ``.strides`` (the last must be the element size; default:
        C-contiguous). ``offset`` is where element (0, ..., 0) lies, in bytes
        from the buffer's start. ``element_strides`` (1 to 8 each, default
        all 1) step through the box. ``swizzle``: ``"none"``, ``"32b"``,
        ``"64b"`` or ``"128b"``; ``interleave``: ``"none"``, ``"16b"``,
        ``"32b"``; ``l2_promotion``: ``"none"``, ``"64b"``, ``"128b"``,
        ``"256b"``; ``oob_fill``: ``"zero"`` or ``"nan"`` (floating types) for
        the elements of a box that fall outside the view. Every rule of
        ``cuTensorMapEncodeTiled`` is checked here (``InvalidArgument``), and
        the view must lie inside the buffer.
        """
        ref = buffer if isinstance(buffer, GpuRef) else getattr(buffer, "ref", None)
        if not isinstance(ref, GpuRef):
            raise InvalidArgument(f"buffer must be a GpuBuffer or GpuRef, got "
                                  f"{type(buffer).__name__}")
        kind = DType.of(dtype)
        dims = _ints(shape, "shape")
        rank = len(dims)
        if not 1 <= rank <= MAX_RANK:
            raise InvalidArgument(f"a tensor map has 1 to {MAX_RANK} dimensions, got shape "
                                  f"{dims}")
        boxes = _ints(box, "box", rank)
        if strides is None:
            full, step = [], kind.itemsize
            for d in reversed(dims):
                full.append(step)
                step *= d
            byte_strides = tuple(reversed(full))
        else:
            byte_strides = _ints(strides, "strides", rank)
            if byte_strides[-1] != kind.itemsize:
                raise InvalidArgument(
                    f"the last dimension of a tensor map is contiguous: its stride must be "
                    f"{kind.itemsize} bytes ({kind.value}), got strides {byte_strides}")
        steps = (1,) * rank if element_strides is None else _ints(
            element_strides, "element_strides", rank)
        view = cls(ref, kind, dims, boxes, byte_strides[:-1],
                   offset, steps, interleave, swizzle, l2_promotion, oob_fill)
        view.validate()
        return view

    @property
    def rank(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    @property
    def box_bytes(self) -> int:
        """Bytes of shared memory one box fills (element strides counted)."""
        size = self.dtype.itemsize
        for b, e in zip(self.box, self.element_strides, strict=True):
            size *= -(-b // e)
        return size

    def validate(self) -> None:
        """Check every rule of ``cuTensorMapEncodeTiled`` and that the view lies in the
        buffer (``InvalidArgument``)."""
        if not isinstance(self.buffer, GpuRef):
            raise InvalidArgument(f"buffer must be a GpuRef, got {type(self.buffer).__name__}")
        if self.dtype not in TMA_DTYPES:
            raise InvalidArgument(
                f"the copy engine moves {', '.join(d.value for d in TMA_DTYPES)}; "
                f"got {self.dtype.value}")
        rank, item = self.rank, self.dtype.itemsize
        interleave = _choice(self.interleave, "interleave", INTERLEAVES)
        swizzle = _choice(self.swizzle, "swizzle", SWIZZLES)
        _choice(self.l2_promotion, "l2_promotion", L2_PROMOTIONS)
        _choice(self.oob_fill, "oob_fill", OOB_FILLS)
        if not 1 <= rank <= MAX_RANK:
            raise InvalidArgument(f"a tensor map has 1 to {MAX_RANK} dimensions, got {rank}")
        if interleave != "none" and rank < 3:
            raise InvalidArgument(f"an interleaved tensor map needs at least 3 dimensions, "
                                  f"got {rank}")
        if len(self.box) != rank or len(self.element_strides) != rank \
                or len(self.strides) != rank - 1:
            raise InvalidArgument("box and element_strides need one entry per dimension and "
                                  "strides one per dimension but the last")
        for d in self.shape:
            if not 1 <= d <= MAX_DIM:
                raise InvalidArgument(f"each dimension must be in [1, 2^32], got shape "
                                      f"{self.shape}")
        align = 32 if interleave == "32b" else 16
        for s in self.strides:
            if s <= 0 or s % align or s >= MAX_STRIDE:
                raise InvalidArgument(
                    f"the byte stride of each dimension but the last must be a positive "
                    f"multiple of {align} below 2^40, got {self.strides}")
        for b in self.box:
            if not 1 <= b <= MAX_BOX:
                raise InvalidArgument(f"each box dimension must be in [1, {MAX_BOX}], got "
                                      f"box {self.box}")
        inner = self.box[-1] * item
        if interleave == "none" and inner % 16:
            raise InvalidArgument(
                f"the box's last dimension must span a multiple of 16 bytes; {self.box[-1]} "
                f"x {item} bytes ({self.dtype.value}) = {inner}")
        span = SWIZZLES[swizzle]
        if interleave == "none" and span and inner > span:
            raise InvalidArgument(
                f"swizzle {swizzle!r} needs the box's last dimension to span at most {span} "
                f"bytes, got {inner}")
        if interleave == "32b" and swizzle != "32b":
            raise InvalidArgument("interleave '32b' needs swizzle '32b'")
        for e in self.element_strides:
            if not 1 <= e <= MAX_ELEMENT_STRIDE:
                raise InvalidArgument(f"each element stride must be in [1, "
                                      f"{MAX_ELEMENT_STRIDE}], got {self.element_strides}")
        if self.oob_fill == "nan" and not self.dtype.is_float:
            raise InvalidArgument(f"oob_fill 'nan' needs a floating type, got "
                                  f"{self.dtype.value}")
        self._check_extent(align)

    def _check_extent(self, align: int) -> None:
        """The view's first and last byte must lie inside the buffer, and its start be
        aligned as the driver needs (the buffer's own start is 256-byte aligned)."""
        if not is_int(self.offset) or self.offset < 0 or self.offset % align:
            raise InvalidArgument(f"offset must be a non-negative multiple of {align} bytes "
                                  f"(the view's start must be {align}-byte aligned), got "
                                  f"{self.offset!r}")
        last = self.offset + (self.shape[-1] - 1) * self.dtype.itemsize + self.dtype.itemsize
        last += sum((d - 1) * s for d, s in zip(self.shape[:-1], self.strides, strict=True))
        if last > self.buffer.nbytes:
            raise InvalidArgument(
                f"the view (shape {self.shape}, offset {self.offset}, strides "
                f"{self.strides}) reaches byte {last} of a {self.buffer.nbytes}-byte buffer")

    def __repr__(self) -> str:
        return (f"TensorMap({self.buffer!r}, {self.dtype.value}, shape={self.shape}, "
                f"box={self.box}, swizzle={self.swizzle!r})")
