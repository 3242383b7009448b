"""CPU random fills: one 64-bit word per element (``_bitgen``), mapped by inverse CDFs.

Element ``k`` of a stream is computed from word ``k`` of the ``Generator``'s
stream alone, whatever the distribution, so fills are stateless and
continuation is exact for every distribution and generator. The default
generator's words are those of NumPy's Philox-4x64 keyed by the seed, as in
earlier releases.

Transforms (``draws``; the CUDA backend runs them on CuPy for the fills it does
not leave to cuRAND): the top 53 bits of a word give a uniform ``u``, in
``[0, 1)`` or, offset by half a step, in ``(0, 1)``. UNIFORM scales it into
``[low, high)``, NORMAL and LOG_NORMAL use the inverse normal CDF, EXPONENTIAL
``-scale * log1p(-u)``, POISSON the inverse Poisson CDF, BETA ``betaincinv``,
GAMMA ``gammaincinv``, CAUCHY ``tan``, DISCRETE a search of the normalized
cumulative weights, and BITS keeps the word's high 32 bits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from atomr_accel.backends._handlers import cpu
from atomr_accel.backends._lazy import lazy_module
from atomr_accel.backends.cpu._bitgen import words
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._rng import Distribution, RngFill

if TYPE_CHECKING:
    from atomr_accel.backends.cpu._backend import CpuBackend

special = lazy_module("scipy.special")

__all__ = ["Poisson", "cumulative", "draws", "rng_fill", "unit"]

Array = Any  # a NumPy or CuPy array
Poisson = Callable[[Array, float], Array]
"""Map uniforms in ``(0, 1)`` to Poisson draws of a mean (as floats)."""

_TO_UNIT = 2.0**-53


def unit(xp: Any, raw: Array, *, open_low: bool) -> Array:
    """Map 64-bit words to float64 in ``[0, 1)``, or ``(0, 1)`` when ``open_low``."""
    top = (raw >> xp.uint64(11)).astype(xp.float64)
    return (top + 0.5) * _TO_UNIT if open_low else top * _TO_UNIT


def _poisson(u: Array, lam: float) -> Array:
    """Return the smallest ``k`` with ``P(X <= k) >= u`` for ``X ~ Poisson(lam)``."""
    k: Array = np.ceil(special.pdtrik(u, lam))
    below = np.maximum(k - 1.0, 0.0)
    cdf: Array = special.pdtr(below, lam)
    return np.where(cdf >= u, below, k)


def cumulative(xp: Any, weights: Array) -> Array:
    """The normalized cumulative weights (the last is exactly 1).

    Raises ``InvalidArgument`` unless the weights are finite, non-negative and
    not all zero (one host read on CUDA).
    """
    wide = weights.astype(xp.float64)
    with np.errstate(over="ignore"):  # an infinite sum is refused below
        cdf = xp.cumsum(wide)
    total = cdf[-1]
    if not bool(xp.all(wide >= 0) & xp.isfinite(total) & (total > 0)):
        raise InvalidArgument(
            "DISCRETE weights must be finite and non-negative, and not all zero")
    return cdf / total


def draws(xp: Any, scipy_special: Any, raw: Array, op: RngFill, dtype: Any,
          cdf: Array | None, poisson: Poisson) -> Array:
    """The values of ``op``'s fill, in ``dtype``, from one 64-bit word per element.

    ``xp`` and ``scipy_special`` are NumPy and SciPy's ``special``, or CuPy and
    cupyx's; ``cdf`` is the DISCRETE fill's ``cumulative`` weights.
    """
    dist = op.distribution
    params = op.resolved_params
    if dist is Distribution.BITS:
        return (raw >> xp.uint64(32)).astype(dtype)
    if dist is Distribution.UNIFORM:
        low, high = params
        values = low + (high - low) * unit(xp, raw, open_low=False)
        # Rounding (to f64 here, or to the buffer's precision) could reach ``high``.
        top = np.nextafter(dtype.type(high), dtype.type(low))
        return xp.minimum(values.astype(dtype), top)
    if dist is Distribution.EXPONENTIAL:
        return (-params[0] * xp.log1p(-unit(xp, raw, open_low=False))).astype(dtype)
    if dist is Distribution.DISCRETE:
        assert cdf is not None  # validated: a DISCRETE fill has weights
        return xp.searchsorted(cdf, unit(xp, raw, open_low=False), side="right").astype(dtype)
    return _inverse_cdf(xp, scipy_special, unit(xp, raw, open_low=True), dist, params,
                        poisson).astype(dtype)


def _inverse_cdf(xp: Any, scipy_special: Any, u: Array, dist: Distribution,
                 params: tuple[float, ...], poisson: Poisson) -> Array:
    """Map uniforms in ``(0, 1)`` through the inverse CDF of ``dist``, in float64."""
    if dist is Distribution.NORMAL:
        return params[0] + params[1] * scipy_special.ndtri(u)
    if dist is Distribution.LOG_NORMAL:
        return xp.exp(params[0] + params[1] * scipy_special.ndtri(u))
    if dist is Distribution.POISSON:
        return poisson(u, params[0])
    if dist is Distribution.BETA:
        return scipy_special.betaincinv(params[0], params[1], u)
    if dist is Distribution.GAMMA:
        return params[1] * scipy_special.gammaincinv(params[0], u)
    loc, scale = params  # CAUCHY
    return loc + scale * xp.tan(math.pi * (u - 0.5))


@cpu.handles(RngFill)
def rng_fill(backend: CpuBackend, op: RngFill) -> None:
    """Write ``op.count`` draws of the stream at ``(seed, offset)`` into ``out``.

    An empty fill reads nothing, not even a DISCRETE fill's weights.
    """
    if op.count == 0:
        return
    out = backend.array(op.out.buffer_id)[: op.count]
    cdf = None if op.weights is None else cumulative(np, backend.array(op.weights.buffer_id))
    raw = words(op.generator, op.seed, op.offset, op.count)
    out[:] = draws(np, special, raw, op, out.dtype, cdf, _poisson)
