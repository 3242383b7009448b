"""CPU random fills from NumPy's counter-based Philox-4x64 generator.

Element ``k`` of the stream named by ``seed`` is computed from the ``k``-th
64-bit word of ``Philox(key=seed)`` alone (one word per element, whatever the
distribution), so a fill at ``offset`` starts by advancing the counter by
``offset // 4`` blocks of four words and dropping ``offset % 4`` words. This
makes fills stateless and continuation exact for every distribution.
Transforms: the top 53 bits of a word give a uniform ``u``; UNIFORM scales it
into ``[low, high)``, NORMAL and LOG_NORMAL use the inverse normal CDF,
EXPONENTIAL ``-scale * log1p(-u)``, POISSON the inverse Poisson CDF, and BITS
keeps the word's high 32 bits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import special

from atomr_accel.backends._base import Handler
from atomr_accel.core._op import Op
from atomr_accel.core.ops._rng import Distribution, RngFill

if TYPE_CHECKING:
    from atomr_accel.backends.cpu._backend import CpuBackend

__all__ = ["HANDLERS", "raw_words", "rng_fill"]

_WORDS_PER_BLOCK = 4  # Philox-4x64 yields four 64-bit words per counter step
_TO_UNIT = 2.0**-53


def raw_words(seed: int, offset: int, count: int) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """Return words ``offset .. offset + count - 1`` of the Philox stream keyed by ``seed``."""
    bit_gen = np.random.Philox(key=seed)
    blocks, skip = divmod(offset, _WORDS_PER_BLOCK)
    bit_gen.advance(blocks)
    words: np.ndarray[Any, np.dtype[np.uint64]] = bit_gen.random_raw(skip + count)
    return words[skip:]


def _unit(words: np.ndarray[Any, np.dtype[np.uint64]], *, open_low: bool) -> np.ndarray[Any, Any]:
    """Map words to float64 in ``[0, 1)``, or ``(0, 1)`` when ``open_low``."""
    top = (words >> np.uint64(11)).astype(np.float64)
    return (top + 0.5) * _TO_UNIT if open_low else top * _TO_UNIT


def _poisson(u: np.ndarray[Any, Any], lam: float) -> np.ndarray[Any, Any]:
    """Return the smallest ``k`` with ``P(X <= k) >= u`` for ``X ~ Poisson(lam)``."""
    k: np.ndarray[Any, Any] = np.ceil(special.pdtrik(u, lam))
    below = np.maximum(k - 1.0, 0.0)
    cdf: np.ndarray[Any, Any] = special.pdtr(below, lam)
    return np.where(cdf >= u, below, k)


def rng_fill(backend: CpuBackend, op: RngFill) -> None:
    """Write ``op.count`` draws of the stream at ``(seed, offset)`` into ``out``."""
    out = backend.array(op.out.buffer_id)[: op.count]
    words = raw_words(op.seed, op.offset, op.count)
    dist = op.distribution
    params = op.resolved_params
    if dist is Distribution.BITS:
        out[:] = (words >> np.uint64(32)).astype(np.uint32)
    elif dist is Distribution.UNIFORM:
        low, high = params
        values = low + (high - low) * _unit(words, open_low=False)
        # Rounding (to f64 here, or to f32 on the store) could reach ``high``.
        top = np.nextafter(out.dtype.type(high), out.dtype.type(low))
        out[:] = np.minimum(values.astype(out.dtype), top)
    elif dist is Distribution.NORMAL:
        mean, stddev = params
        out[:] = mean + stddev * special.ndtri(_unit(words, open_low=True))
    elif dist is Distribution.LOG_NORMAL:
        mean, stddev = params
        out[:] = np.exp(mean + stddev * special.ndtri(_unit(words, open_low=True)))
    elif dist is Distribution.EXPONENTIAL:
        (scale,) = params
        out[:] = -scale * np.log1p(-_unit(words, open_low=False))
    else:
        (lam,) = params
        out[:] = _poisson(_unit(words, open_low=True), lam)


HANDLERS: dict[type[Op], Handler] = {RngFill: rng_fill}
