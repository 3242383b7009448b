"""Random-number ops (cuRAND / CuPy on CUDA, NumPy's Philox on CPU).

Fills are stateless: the numbers depend only on ``(seed, offset, distribution,
params, length)``, so a journal can replay them. Element ``i`` of a fill is
element ``offset + i`` of the stream named by ``seed``; to continue a stream,
advance ``offset`` by the number of elements drawn so far. Filling ``n`` at
offset 0 and ``n`` at offset ``n`` gives exactly the numbers of one fill of
``2n`` on the same backend. Streams differ between backends.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import pickle_by_name
from atomr_accel.core._op import Op, require_dtype, require_len, require_nonneg
from atomr_accel.core._ref import GpuRef

__all__ = ["Distribution", "RngFill"]

_FLOATS = (DType.F32, DType.F64)
_MAX_SEED = 1 << 64
_MAX_LAMBDA = float(1 << 30)


class Distribution(enum.Enum):
    """Name the distribution a fill draws from; ``RngFill.params`` follow ``param_names``.

    UNIFORM (low, high): CPU draws from ``[low, high)`` (bounds rounded to the
    buffer's precision); cuRAND's generator draws from ``(0, 1]`` scaled to
    ``(low, high]``; both stay within ``[low, high]``.
    NORMAL (mean, stddev). LOG_NORMAL (mean, stddev) of the underlying normal.
    POISSON (lam,) into i32/u32. EXPONENTIAL (scale,), the mean, drawn by CuPy on
    CUDA (cuRAND's host API has none). BITS (): raw 32-bit words into u32, like
    ``curandGenerate``.
    """

    UNIFORM = "uniform"
    NORMAL = "normal"
    LOG_NORMAL = "log_normal"
    POISSON = "poisson"
    EXPONENTIAL = "exponential"
    BITS = "bits"

    __reduce_ex__ = pickle_by_name

    @property
    def param_names(self) -> tuple[str, ...]:
        """Names of the parameters, in the order ``params`` lists them."""
        return _PARAM_NAMES[self]

    @property
    def default_params(self) -> tuple[float, ...]:
        """Parameters used when ``params`` is empty (standard form of the distribution)."""
        return _DEFAULTS[self]

    @property
    def dtypes(self) -> tuple[DType, ...]:
        """Buffer dtypes the distribution can fill."""
        if self is Distribution.POISSON:
            return (DType.I32, DType.U32)
        if self is Distribution.BITS:
            return (DType.U32,)
        return _FLOATS


_PARAM_NAMES: dict[Distribution, tuple[str, ...]] = {
    Distribution.UNIFORM: ("low", "high"),
    Distribution.NORMAL: ("mean", "stddev"),
    Distribution.LOG_NORMAL: ("mean", "stddev"),
    Distribution.POISSON: ("lam",),
    Distribution.EXPONENTIAL: ("scale",),
    Distribution.BITS: (),
}
_DEFAULTS: dict[Distribution, tuple[float, ...]] = {
    Distribution.UNIFORM: (0.0, 1.0),
    Distribution.NORMAL: (0.0, 1.0),
    Distribution.LOG_NORMAL: (0.0, 1.0),
    Distribution.POISSON: (1.0,),
    Distribution.EXPONENTIAL: (1.0,),
    Distribution.BITS: (),
}


@dataclass(frozen=True, slots=True)
class RngFill(Op):
    """Fill ``out[:length]`` (all of it when None) with draws from ``distribution``.

    ``seed`` and ``offset`` are ints in ``[0, 2**64)``; ``offset`` counts
    elements of the stream, so successive fills that advance it by ``length``
    continue one stream exactly. ``params`` follow
    ``distribution.param_names``; empty means ``distribution.default_params``.
    Valid parameters: ``high > low``, ``stddev > 0``, ``0 < lam <= 2**30``,
    ``scale > 0``, all finite.
    """

    library: ClassVar[str] = "rng"
    outputs: ClassVar[tuple[str, ...]] = ("out",)
    out: GpuRef
    distribution: Distribution
    seed: int
    offset: int = 0
    params: tuple[float, ...] = ()
    length: int | None = None

    @property
    def count(self) -> int:
        """Number of elements drawn."""
        return self.out.length if self.length is None else self.length

    @property
    def resolved_params(self) -> tuple[float, ...]:
        """``params``, or the distribution's defaults when empty."""
        return self.params or self.distribution.default_params

    def validate(self) -> None:
        dist = self.distribution
        if not isinstance(dist, Distribution):
            raise InvalidArgument(f"distribution must be a Distribution, got {dist!r}")
        require_nonneg(seed=self.seed, offset=self.offset)
        if not self.seed < _MAX_SEED:
            raise InvalidArgument(f"seed must be below 2**64, got {self.seed}")
        if not self.offset < _MAX_SEED:
            raise InvalidArgument(f"offset must be below 2**64, got {self.offset}")
        if self.length is not None:
            require_nonneg(length=self.length)
        if self.out.dtype not in dist.dtypes:
            require_dtype(self.out, dist.dtypes, f"out of a {dist.name} fill")
        require_len(self.out, self.count, "out")
        if not isinstance(self.params, tuple):
            raise InvalidArgument(f"params must be a tuple, got {self.params!r}")
        params = self.resolved_params
        names = dist.param_names
        if len(params) != len(names):
            raise InvalidArgument(
                f"{dist.name} takes {len(names)} params {names}, got {len(params)}"
            )
        for name, value in zip(names, params, strict=True):
            if not _is_finite_real(value):
                raise InvalidArgument(f"{name} must be a finite real number, got {value!r}")
        if dist is Distribution.UNIFORM:
            low, high = params
            if not high > low:
                raise InvalidArgument(f"high ({high}) must exceed low ({low})")
            if not math.isfinite(high - low):
                raise InvalidArgument(f"high - low overflows: [{low}, {high})")
        elif dist is Distribution.NORMAL or dist is Distribution.LOG_NORMAL:
            if not params[1] > 0:
                raise InvalidArgument(f"stddev must be positive, got {params[1]}")
        elif dist is Distribution.POISSON:
            if not 0 < params[0] <= _MAX_LAMBDA:
                raise InvalidArgument(f"lam must be in (0, 2**30], got {params[0]}")
        elif dist is Distribution.EXPONENTIAL and not params[0] > 0:
            raise InvalidArgument(f"scale must be positive, got {params[0]}")


def _is_finite_real(value: object) -> bool:
    """Say whether ``value`` is a finite int or float (not a bool)."""
    if type(value) is float or type(value) is int:
        return math.isfinite(value)
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    )
