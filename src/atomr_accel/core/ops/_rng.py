"""Random-number ops (cuRAND / CuPy on CUDA, NumPy and SciPy on CPU).

Fills are stateless: the numbers depend only on ``(seed, offset, distribution,
params, length, generator)`` (and the weights of a DISCRETE fill), so a journal
can replay them. Element ``i`` of a fill is element ``offset + i`` of the stream
named by ``seed`` and ``generator``; to continue a stream, advance ``offset`` by
the number of elements drawn so far. Filling ``n`` at offset 0 and ``n`` at
offset ``n`` gives exactly the numbers of one fill of ``2n`` on the same
backend. Streams differ between backends; only the unscrambled Sobol kinds draw
the same words on both.

Each element is drawn from one 64-bit word of its stream (see ``Generator``),
by an inverse CDF where the distribution is not the plain word: so every
distribution continues exactly with every generator. The default generator on
CUDA keeps cuRAND's own transforms for the distributions it has (see the CUDA
backend's ``_rng.py``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from atomr_accel.core._api import REQUIRED, Form, Param
from atomr_accel.core._catalogue import declare
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import pickle_by_name
from atomr_accel.core._op import Op, require_dtype, require_len, require_nonneg
from atomr_accel.core._ref import GpuRef

__all__ = ["Distribution", "Generator", "RngFill", "fill_param"]

declare("rng", "Rng",
        "cuRAND-shaped random fills.",
        rank=3, handle="RngGenerator", capturable=True)

_FLOATS = (DType.F32, DType.F64)
_MAX_SEED = 1 << 64
_MAX_LAMBDA = float(1 << 30)
_LARGEST_INDEX = {DType.F32: 1 << 24, DType.F64: 1 << 53, DType.I32: (1 << 31) - 1,
                  DType.U32: (1 << 32) - 1}
"""The largest DISCRETE index each output dtype holds exactly."""


class Distribution(enum.Enum):
    """Name the distribution a fill draws from; ``RngFill.params`` follow ``param_names``.

    UNIFORM (low, high): any finite bounds ``low < high``. The CPU and the words
    path of CUDA (see ``Generator``) draw from ``[low, high)`` (bounds rounded to
    the buffer's precision); cuRAND's default generator draws from ``(0, 1]``
    scaled to ``(low, high]``; all stay within ``[low, high]``.
    NORMAL (mean, stddev). LOG_NORMAL (mean, stddev) of the underlying normal.
    POISSON (lam,) into i32/u32 (or f32/f64: the counts as floats).
    EXPONENTIAL (scale,), the mean. BITS ():
    32-bit words into u32, like ``curandGenerate`` (the high half of each
    element's word off the default CUDA path).
    BETA (alpha, beta) on ``[0, 1]``: ``betaincinv(alpha, beta, u)``.
    CAUCHY (loc, scale): ``loc + scale * tan(pi * (u - 1/2))``.
    GAMMA (shape, scale), mean ``shape * scale``: ``scale * gammaincinv(shape, u)``.
    DISCRETE (): an index ``i`` in ``0 .. len(weights) - 1`` drawn with
    probability ``weights[i] / sum(weights)`` (``RngFill.weights``: f32 or f64,
    finite, non-negative, not all zero), the first ``i`` whose cumulative
    normalized weight exceeds ``u``. i32/u32 buffers hold the index as an integer
    and f32/f64 buffers as a float (the original's ``discrete_f32``).
    ``u`` is the element's uniform: in ``(0, 1)`` for the inverse CDFs, in
    ``[0, 1)`` for DISCRETE.
    """

    UNIFORM = "uniform"
    NORMAL = "normal"
    LOG_NORMAL = "log_normal"
    POISSON = "poisson"
    EXPONENTIAL = "exponential"
    BITS = "bits"
    BETA = "beta"
    CAUCHY = "cauchy"
    GAMMA = "gamma"
    DISCRETE = "discrete"

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
        if self is Distribution.POISSON:  # counts; as floats too (the original's poisson_f32)
            return (DType.I32, DType.U32, DType.F32, DType.F64)
        if self is Distribution.BITS:
            return (DType.U32,)
        if self is Distribution.DISCRETE:
            return (DType.I32, DType.U32, DType.F32, DType.F64)
        return _FLOATS


_PARAM_NAMES: dict[Distribution, tuple[str, ...]] = {
    Distribution.UNIFORM: ("low", "high"),
    Distribution.NORMAL: ("mean", "stddev"),
    Distribution.LOG_NORMAL: ("mean", "stddev"),
    Distribution.POISSON: ("lam",),
    Distribution.EXPONENTIAL: ("scale",),
    Distribution.BITS: (),
    Distribution.BETA: ("alpha", "beta"),
    Distribution.CAUCHY: ("loc", "scale"),
    Distribution.GAMMA: ("shape", "scale"),
    Distribution.DISCRETE: (),
}
_DEFAULTS: dict[Distribution, tuple[float, ...]] = {
    Distribution.UNIFORM: (0.0, 1.0),
    Distribution.NORMAL: (0.0, 1.0),
    Distribution.LOG_NORMAL: (0.0, 1.0),
    Distribution.POISSON: (1.0,),
    Distribution.EXPONENTIAL: (1.0,),
    Distribution.BITS: (),
    Distribution.BETA: (1.0, 1.0),
    Distribution.CAUCHY: (0.0, 1.0),
    Distribution.GAMMA: (1.0, 1.0),
    Distribution.DISCRETE: (),
}
_POSITIVE: dict[Distribution, tuple[int, ...]] = {
    Distribution.NORMAL: (1,),
    Distribution.LOG_NORMAL: (1,),
    Distribution.EXPONENTIAL: (0,),
    Distribution.BETA: (0, 1),
    Distribution.CAUCHY: (1,),
    Distribution.GAMMA: (0, 1),
}
"""The positions in ``params`` that must be positive, by distribution."""


class Generator(enum.Enum):
    """Name the stream of 64-bit words a fill draws from (cuRAND's generator types).

    Element ``k`` of a stream is drawn from word ``k`` alone. Per kind, on each
    backend (the CPU's streams are its own: cuRAND's are not reproduced, but
    for the unscrambled Sobol kinds, which are the same sequence on both):

    * DEFAULT: the backend's default, PHILOX4_32_10, with today's streams.
    * PHILOX4_32_10: CPU: word ``k`` of NumPy's Philox-4x64 keyed by ``seed``.
      CUDA: cuRAND Philox4_32_10, with cuRAND's own transforms for UNIFORM,
      NORMAL, LOG_NORMAL, POISSON and BITS and EXPONENTIAL from its uniforms;
      the other distributions take words as XORWOW does.
    * XORWOW, MRG32K3A: word ``k`` joins 32-bit outputs ``2k`` (high half)
      and ``2k + 1`` of the generator keyed by ``seed``. CPU: the generator
      itself (Marsaglia's xorwow, L'Ecuyer's MRG32k3a) in vectorized NumPy with
      skip-ahead, seeded through NumPy's ``SeedSequence``; MRG32k3a's outputs
      lie in ``[0, 4294967087)``. CUDA: cuRAND's generator of that type.
    * MTGP32: neither backend can skip ahead, so the stream comes in blocks of
      ``2**16`` elements: element ``k`` joins 32-bit outputs ``2j`` and
      ``2j + 1`` (``j = k mod 2**16``) of a generator keyed by a mix of
      ``seed`` and the block ``k // 2**16``. CPU: NumPy's MT19937, the
      documented equivalent. CUDA: cuRAND MTGP32, one fresh generator a block.
    * SOBOL32, SOBOL64: point ``k`` of the one-dimensional Sobol sequence
      (base-2 van der Corput in Gray-code order, the first dimension of
      cuRAND's and SciPy's Sobol sequences), 32 bits in the word's high half, or
      all 64; ``seed`` is not used. A 32-bit sequence has ``2**32`` points.
    * SCRAMBLED_SOBOL32, SCRAMBLED_SOBOL64: those points with a digital shift
      (an XOR) made from ``seed``. CUDA shifts the points of cuRAND's scrambled
      generators (its own fixed scrambling), the CPU the plain points.
    """

    DEFAULT = "default"
    PHILOX4_32_10 = "philox4_32_10"
    XORWOW = "xorwow"
    MRG32K3A = "mrg32k3a"
    MTGP32 = "mtgp32"
    SOBOL32 = "sobol32"
    SCRAMBLED_SOBOL32 = "scrambled_sobol32"
    SOBOL64 = "sobol64"
    SCRAMBLED_SOBOL64 = "scrambled_sobol64"

    __reduce_ex__ = pickle_by_name

    @classmethod
    def parse(cls, name: str | Generator) -> Generator:
        """Return the kind for one of the original package's names, in any case.

        Takes default, pseudo_default (this package's default, Philox; not
        cuRAND's CURAND_RNG_PSEUDO_DEFAULT), philox, philox4_32_10,
        philox_4_32_10, xorwow, mrg32k3a, mtgp32, sobol32, scrambled_sobol32,
        sobol64 and scrambled_sobol64, or a member. Raises ``InvalidArgument``
        naming the choices for anything else.
        """
        try:
            return cls(name)
        except ValueError:
            raise InvalidArgument(
                f"unknown generator {name!r}; choose one of {', '.join(_ALIASES)}"
            ) from None

    @classmethod
    def _missing_(cls, value: object) -> Generator | None:
        """Look up the original package's names, case-insensitively."""
        return _ALIASES.get(value.lower()) if isinstance(value, str) else None

    @property
    def resolved(self) -> Generator:
        """The kind DEFAULT stands for (PHILOX4_32_10); any other kind itself."""
        return Generator.PHILOX4_32_10 if self is Generator.DEFAULT else self

    @property
    def points(self) -> int:
        """How many elements the stream has: ``2**32`` for the 32-bit Sobol kinds, else
        ``2**64`` (offsets of the pseudo-random kinds wrap around)."""
        if self is Generator.SOBOL32 or self is Generator.SCRAMBLED_SOBOL32:
            return 1 << 32
        return _MAX_SEED


_ALIASES: dict[str, Generator] = {
    "default": Generator.DEFAULT,
    "pseudo_default": Generator.DEFAULT,
    "philox": Generator.PHILOX4_32_10,
    "philox4_32_10": Generator.PHILOX4_32_10,
    "philox_4_32_10": Generator.PHILOX4_32_10,
    **{kind.value: kind for kind in Generator if kind is not Generator.DEFAULT},
}
"""The original package's generator names (lower case) and the kinds they parse to."""


# ------------------------------------------------------------- the facade's fills

_HANDLE_SETS: dict[str, object] = {"seed": 0, "offset": 0, "generator": Generator.DEFAULT}
"""Fields a fill's handle (``RngGenerator``) sets itself: its seed, the offset it reserves
and its generator kind."""


def fill_param(name: str, default: object = REQUIRED,
               parse: Callable[[Any], Any] | None = None) -> Param:
    """A distribution parameter: one entry of ``RngFill.params``."""
    return Param(name, default, to=("params",), parse=parse, annotation="float")


def _fill(name: str, distribution: Distribution, ours: tuple[Param, ...], what: str) -> Form:
    """Our ``name(out, ...)`` for one distribution of ``RngFill``."""
    fixed: dict[str, object] = {"distribution": distribution, **_HANDLE_SETS}
    if distribution is not Distribution.DISCRETE:
        fixed["weights"] = None
    if not ours:
        fixed["params"] = ()
    return Form(name, ("out", *ours), fixed=fixed, doc=f"Fill ``out`` {what}.")


@dataclass(frozen=True, slots=True)
class RngFill(Op):
    """Fill ``out[:length]`` (all of it when None) with draws from ``distribution``.

    ``seed`` and ``offset`` are ints in ``[0, 2**64)``; ``offset`` counts
    elements of the stream, so successive fills that advance it by ``length``
    continue one stream exactly. ``params`` follow
    ``distribution.param_names``; empty means ``distribution.default_params``.
    Valid parameters: ``high > low``, ``stddev > 0``, ``0 < lam <= 2**30``,
    ``scale > 0``, ``alpha > 0``, ``beta > 0``, ``shape > 0``, all finite.
    ``generator`` picks the stream (``Generator`` says what each backend draws;
    the default keeps the streams of earlier releases); a 32-bit Sobol kind
    refuses a fill past its ``2**32`` points. ``weights`` is the DISCRETE
    fill's buffer of weights (f32 or f64, not ``out``) and must be None
    otherwise; the backend refuses negative, non-finite or all-zero weights
    with ``InvalidArgument`` before it writes anything.
    """

    library: ClassVar[str] = "rng"
    outputs: ClassVar[tuple[str, ...]] = ("out",)
    api = (
        _fill("uniform", Distribution.UNIFORM, (fill_param("low", 0.0), fill_param("high", 1.0)),
              "uniformly in ``[low, high)`` (``(low, high]`` on cuRAND's default path)"),
        _fill("normal", Distribution.NORMAL, (fill_param("mean", 0.0), fill_param("stddev", 1.0)),
              "from a normal distribution"),
        _fill("log_normal", Distribution.LOG_NORMAL,
              (fill_param("mean", 0.0), fill_param("stddev", 1.0)), "with ``exp`` of normal draws"),
        _fill("poisson", Distribution.POISSON, (fill_param("lam"),),
              "with Poisson counts of mean ``lam`` (i32/u32, or counts as floats)"),
        _fill("exponential", Distribution.EXPONENTIAL, (fill_param("scale", 1.0),),
              "from an exponential distribution of mean ``scale`` (the original's form takes "
              "the rate ``lam``)"),
        _fill("beta", Distribution.BETA, (fill_param("alpha"), fill_param("beta")),
              "from a beta distribution"),
        _fill("cauchy", Distribution.CAUCHY, (fill_param("loc", 0.0), fill_param("scale", 1.0)),
              "from a Cauchy distribution"),
        _fill("gamma", Distribution.GAMMA, (fill_param("shape"), fill_param("scale", 1.0)),
              "from a gamma distribution"),
        _fill("discrete", Distribution.DISCRETE, (Param("weights"),),
              "with indices drawn by ``weights`` (f32/f64; indices as i32/u32 or floats)"),
        _fill("bits", Distribution.BITS, (), "with raw 32-bit words (u32)"),
    )
    out: GpuRef
    distribution: Distribution
    seed: int
    offset: int = 0
    params: tuple[float, ...] = ()
    length: int | None = None
    generator: Generator = Generator.DEFAULT
    weights: GpuRef | None = None

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
        if not isinstance(self.generator, Generator):
            raise InvalidArgument(f"generator must be a Generator, got {self.generator!r}")
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
        self._check_points()
        self._check_params()
        self._check_weights()

    def _check_points(self) -> None:
        """Refuse a fill that runs past the end of a finite (Sobol) sequence."""
        points = self.generator.points
        if points < _MAX_SEED and self.offset + self.count > points:
            raise InvalidArgument(
                f"{self.generator.value} has {points} points; offset {self.offset} + "
                f"{self.count} elements runs past them"
            )

    def _check_params(self) -> None:
        """Check the number, the finiteness and the ranges of the parameters."""
        dist = self.distribution
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
        for index in _POSITIVE.get(dist, ()):
            if not params[index] > 0:
                raise InvalidArgument(f"{names[index]} must be positive, got {params[index]}")
        if dist is Distribution.UNIFORM:
            low, high = params
            if not high > low:
                raise InvalidArgument(f"high ({high}) must exceed low ({low})")
            if not math.isfinite(high - low):
                raise InvalidArgument(f"high - low overflows: [{low}, {high})")
        elif dist is Distribution.POISSON and not 0 < params[0] <= _MAX_LAMBDA:
            raise InvalidArgument(f"lam must be in (0, 2**30], got {params[0]}")

    def _check_weights(self) -> None:
        """Require weights for DISCRETE alone: f32/f64, not ``out``, indices that fit."""
        weights = self.weights
        if self.distribution is not Distribution.DISCRETE:
            if weights is not None:
                raise InvalidArgument(
                    f"weights are for DISCRETE fills only, not {self.distribution.name}")
            return
        if not isinstance(weights, GpuRef):
            raise InvalidArgument(f"a DISCRETE fill needs a GpuRef of weights, got {weights!r}")
        require_dtype(weights, _FLOATS, "weights")
        if weights.length < 1:
            raise InvalidArgument("weights must hold at least one element")
        if weights.buffer_id == self.out.buffer_id and weights.owner == self.out.owner:
            raise InvalidArgument("out and weights must be different buffers")
        largest = _LARGEST_INDEX[self.out.dtype]
        if weights.length - 1 > largest:
            raise InvalidArgument(
                f"{weights.length} weights give indices that {self.out.dtype.value} cannot "
                f"hold exactly (at most {largest + 1} weights)"
            )


def _is_finite_real(value: object) -> bool:
    """Say whether ``value`` is a finite int or float (not a bool)."""
    if type(value) is float or type(value) is int:
        return math.isfinite(value)
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    )
