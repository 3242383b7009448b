"""FFT ops (cuFFT on CUDA, ``scipy.fft`` on CPU).

Data are ``batch`` contiguous, row-major (C-order) arrays of ``shape`` laid end
to end in one buffer. Transforms run over every axis of ``shape``; the inverse
is unnormalized as in cuFFT, so ``inverse(forward(x)) == prod(shape) * x``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import pickle_by_name
from atomr_accel.core._op import (
    Op,
    positive_ints,
    require,
    require_dtype,
    require_len,
    require_positive,
)
from atomr_accel.core._ref import GpuRef

__all__ = ["Fft", "FftKind"]

_COMPLEX = (DType.C64, DType.C128)
_REAL = (DType.F32, DType.F64)


class FftKind(enum.Enum):
    """Choose which sides of a transform are complex: C2C, R2C (forward) or C2R (inverse)."""

    C2C = "c2c"
    R2C = "r2c"
    C2R = "c2r"

    __reduce_ex__ = pickle_by_name


@dataclass(frozen=True, slots=True)
class Fft(Op):
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

    library: ClassVar[str] = "fft"
    outputs: ClassVar[tuple[str, ...]] = ("output",)
    input: GpuRef
    output: GpuRef
    shape: tuple[int, ...]
    kind: FftKind
    inverse: bool | None = None
    batch: int = 1

    @property
    def is_inverse(self) -> bool:
        """True when the transform runs in the inverse (unnormalized) direction."""
        if self.inverse is None:
            return self.kind is FftKind.C2R
        return self.inverse

    @property
    def complex_shape(self) -> tuple[int, ...]:
        """Shape of one item on the complex side (halved last axis for R2C/C2R)."""
        if self.kind is FftKind.C2C:
            return self.shape
        return (*self.shape[:-1], self.shape[-1] // 2 + 1)

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
        if not positive_ints(*shape):
            for axis, size in enumerate(shape):
                require_positive(**{f"shape[{axis}]": size})
        require_positive(batch=self.batch)
        if not (self.inverse is None or isinstance(self.inverse, bool)):
            raise InvalidArgument(f"inverse must be a bool or None, got {self.inverse!r}")
        if kind is FftKind.C2C:
            require_dtype(self.input, _COMPLEX, "input")
            require_dtype(self.output, _COMPLEX, "output")
        elif kind is FftKind.R2C:
            require(not self.is_inverse, "an R2C transform only runs forward")
            require_dtype(self.input, _REAL, "input")
            require_dtype(self.output, _COMPLEX, "output")
        else:
            require(self.is_inverse, "a C2R transform only runs inverse")
            require_dtype(self.input, _COMPLEX, "input")
            require_dtype(self.output, _REAL, "output")
        if self.input.dtype.real is not self.output.dtype.real:
            raise InvalidArgument(
                f"input ({self.input.dtype.value}) and output ({self.output.dtype.value}) "
                "must share one precision"
            )
        in_place = (self.input.device_id, self.input.buffer_id) == (
            self.output.device_id,
            self.output.buffer_id,
        )
        if in_place and kind is not FftKind.C2C:
            raise InvalidArgument(
                f"{kind.name} transforms cannot run in place; use separate buffers"
            )
        require_len(self.input, self.input_count, "input")
        require_len(self.output, self.output_count, "output")
