"""CUDA random fills from cuRAND's counter-based Philox4_32_10 generator (host API).

Each backend keeps one cuRAND generator. A fill sets its seed, its absolute
offset and the current stream, then generates straight into the output
buffer. For Philox, ``curandSetGeneratorOffset(offset)`` makes a generation
call start at element ``offset`` of that call's own output stream, counted in
outputs whatever the distribution ("if offset = 100, the first random number
generated will be the 100th in the sequence", cuRAND's guide; seen with
cuRAND 10.4 for every generation function used here), and the stream does not
depend on how many elements one call draws, as long as a call draws no more than
``_LARGEST`` (below), so longer fills are split. So the numbers depend only on ``(seed, offset,
distribution, params, length)`` and continuation (``n`` at offset 0, then
``n`` at offset ``n``, equals ``2n`` at offset 0) is exact for every
distribution, as on the CPU. The GPU tests check both for each distribution.

Draws, per buffer precision (f32 or f64):

* UNIFORM: ``curandGenerateUniform(Double)`` gives ``u`` in ``(0, 1]``, scaled
  to ``low + (high - low) * u`` in double precision and clamped to the bounds
  rounded to the buffer's precision, so values lie in ``[low, high]``.
* NORMAL, LOG_NORMAL: ``curandGenerateNormal(Double)`` with mean 0 and
  stddev 1, then ``mean + stddev * z`` (``exp`` of it for LOG_NORMAL) in double
  precision. The parameters are applied here rather than by cuRAND because
  CuPy's wrappers pass them as C floats, which would round f64 parameters.
  cuRAND's normal generators need an even count: an odd fill draws its last
  element as the first of a pair generated at offset ``offset + n - 1`` (the
  same number, see above), so no scratch of the fill's size is needed.
* EXPONENTIAL: ``-scale * log(u)`` from a uniform fill (cuRAND's host API has
  no exponential generator); ``u <= 1`` makes every value finite and ``>= 0``.
* POISSON: ``curandGeneratePoisson`` into the i32/u32 buffer.
* BITS: ``curandGenerate``, raw 32-bit words into the u32 buffer.

CPU and CUDA streams differ: the same arguments give different numbers.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import cupy as cp
from cupy.cuda import curand

from atomr_accel.backends._base import ArrayBackend, Handler
from atomr_accel.core._op import Op
from atomr_accel.core.ops._rng import Distribution, RngFill

__all__ = ["HANDLERS", "rng_fill"]

_OFFSETS = 1 << 64  # cuRAND offsets are unsigned 64-bit
_LARGEST = {4: 1 << 22, 8: 1 << 17}
"""Longest single cuRAND call per element size. Past some size cuRAND lays a call's
outputs out differently (seen on an H200 with CUDA 13: an f64 call of 2^18 elements
differs from 2^16-element calls in the last two of them; f64 fills of 2^20 did not
continue fills of 2^19), so longer fills are made of pieces of at most this length,
each at its own stream offset. The GPU tests compare 2^22-element fills of every
dtype with the same stream drawn in 2^16-element pieces."""

_UNIFORM = cp.ElementwiseKernel(
    "T u, float64 low, float64 high",
    "T x",
    """
    T value = (T)(low + (high - low) * (double)u);
    T lo = (T)low;
    T hi = (T)high;
    x = value < lo ? lo : (value > hi ? hi : value);
    """,
    "atomr_rng_uniform",
)
_NORMAL = cp.ElementwiseKernel(
    "T z, float64 mean, float64 stddev", "T x",
    "x = (T)(mean + stddev * (double)z)", "atomr_rng_normal",
)
_LOG_NORMAL = cp.ElementwiseKernel(
    "T z, float64 mean, float64 stddev", "T x",
    "x = (T)exp(mean + stddev * (double)z)", "atomr_rng_log_normal",
)
_EXPONENTIAL = cp.ElementwiseKernel(
    "T u, float64 scale", "T x",
    "x = (T)(0.0 - scale * log((double)u))",  # 0.0 - ...: u == 1 gives +0.0, not -0.0
    "atomr_rng_exponential",
)


class _Philox:
    """One cuRAND Philox4_32_10 generator, destroyed when its owner goes."""

    def __init__(self) -> None:
        self.handle: int = curand.createGenerator(curand.CURAND_RNG_PSEUDO_PHILOX4_32_10)
        self.stream = 0  # the stream the generator is bound to (0: the default stream)
        weakref.finalize(self, _destroy, self.handle)

    def bind(self, stream: int) -> None:
        """Bind the generator to ``stream`` (a CUDA stream pointer) unless it already is."""
        if stream != self.stream:
            curand.setStream(self.handle, stream)
            self.stream = stream

    def at(self, seed: int, offset: int) -> int:
        """Key the generator by ``seed``, start it at ``offset`` on the current stream."""
        curand.setPseudoRandomGeneratorSeed(self.handle, seed)
        curand.setGeneratorOffset(self.handle, offset)
        self.bind(cp.cuda.get_current_stream().ptr)
        return self.handle


def _destroy(handle: int) -> None:
    with contextlib.suppress(Exception):  # a lost or poisoned context took it already
        curand.destroyGenerator(handle)


_GENERATORS: weakref.WeakKeyDictionary[ArrayBackend, _Philox] = weakref.WeakKeyDictionary()


def _generator(backend: ArrayBackend) -> _Philox:
    """The backend's generator, created on its first fill."""
    gen = _GENERATORS.get(backend)
    if gen is None:
        gen = _GENERATORS[backend] = _Philox()
    return gen


def _pieces(out: Any, offset: int, count: int) -> Any:
    """``(pointer, count, stream offset)`` of each piece of ``out[:count]``, no piece longer
    than ``_LARGEST`` for the dtype (cuRAND's element order changes past it)."""
    step = _LARGEST[out.itemsize]
    for start in range(0, count, step):
        yield (out.data.ptr + start * out.itemsize, min(step, count - start),
               (offset + start) % _OFFSETS)


def _generate(philox: _Philox, op: RngFill, out: Any, fill: Any, *extra: Any) -> None:
    """Run a cuRAND generation into ``out`` piece by piece at ``op``'s stream position."""
    for pointer, count, offset in _pieces(out, op.offset, out.size):
        fill(philox.at(op.seed, offset), pointer, count, *extra)


def _uniform(philox: _Philox, op: RngFill, out: Any) -> None:
    """Fill ``out`` (f32/f64, contiguous) with cuRAND uniforms in ``(0, 1]``."""
    fill = curand.generateUniform if out.dtype == cp.float32 else curand.generateUniformDouble
    _generate(philox, op, out, fill)


def _standard_normal(philox: _Philox, op: RngFill, out: Any) -> None:
    """Fill ``out`` (f32/f64, contiguous) with the standard normals of ``op``'s stream."""
    fill = curand.generateNormal if out.dtype == cp.float32 else curand.generateNormalDouble
    n = out.size
    even = n - n % 2
    for pointer, count, offset in _pieces(out, op.offset, even):  # pieces stay even
        fill(philox.at(op.seed, offset), pointer, count, 0.0, 1.0)
    if n % 2:  # cuRAND draws normals in pairs: draw the last one's pair into scratch
        pair = cp.empty(2, dtype=out.dtype)
        fill(philox.at(op.seed, (op.offset + even) % _OFFSETS), pair.data.ptr, 2, 0.0, 1.0)
        out[even:] = pair[:1]


def rng_fill(backend: ArrayBackend, op: RngFill) -> None:
    """Write ``op.count`` draws of the stream at ``(seed, offset)`` into ``out``."""
    out = backend.array(op.out.buffer_id)[: op.count]
    if out.size == 0:
        return
    philox = _generator(backend)
    dist = op.distribution
    params = op.resolved_params
    if dist in (Distribution.NORMAL, Distribution.LOG_NORMAL):
        _standard_normal(philox, op, out)
        kernel = _NORMAL if dist is Distribution.NORMAL else _LOG_NORMAL
        kernel(out, float(params[0]), float(params[1]), out)
        return
    if dist is Distribution.BITS:
        _generate(philox, op, out, curand.generate)
    elif dist is Distribution.POISSON:
        _generate(philox, op, out, curand.generatePoisson, float(params[0]))
    elif dist is Distribution.UNIFORM:
        _uniform(philox, op, out)
        low, high = float(params[0]), float(params[1])
        if (low, high) != (0.0, 1.0):  # the identity map would only cost a pass over memory
            _UNIFORM(out, low, high, out)
    else:
        _uniform(philox, op, out)
        _EXPONENTIAL(out, float(params[0]), out)


HANDLERS: dict[type[Op], Handler] = {RngFill: rng_fill}
"""The random-number op handlers of the CUDA backend."""
