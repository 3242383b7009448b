"""CUDA random fills from cuRAND's counter-based Philox4_32_10 generator (host API).

Each backend keeps one cuRAND generator. A fill sets its seed, its absolute
offset and the current stream, then generates straight into the output
buffer. For Philox, ``curandSetGeneratorOffset(offset)`` makes a generation
call start at element ``offset`` of that call's own output stream, counted in
outputs whatever the distribution ("if offset = 100, the first random number
generated will be the 100th in the sequence", cuRAND's guide; seen with
cuRAND 10.4 for every generation function used here), and the stream does not
depend on how many elements one call draws. So the numbers depend only on ``(seed, offset,
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
        weakref.finalize(self, _destroy, self.handle)

    def at(self, seed: int, offset: int) -> int:
        """Key the generator by ``seed``, start it at ``offset`` on the current stream."""
        curand.setPseudoRandomGeneratorSeed(self.handle, seed)
        curand.setGeneratorOffset(self.handle, offset)
        curand.setStream(self.handle, cp.cuda.get_current_stream().ptr)
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


def _uniform(gen: int, out: Any) -> None:
    """Fill ``out`` (f32/f64, contiguous) with cuRAND uniforms in ``(0, 1]``."""
    fill = curand.generateUniform if out.dtype == cp.float32 else curand.generateUniformDouble
    fill(gen, out.data.ptr, out.size)


def _standard_normal(philox: _Philox, op: RngFill, out: Any) -> None:
    """Fill ``out`` (f32/f64, contiguous) with the standard normals of ``op``'s stream."""
    fill = curand.generateNormal if out.dtype == cp.float32 else curand.generateNormalDouble
    n = out.size
    even = n - n % 2
    if even:
        fill(philox.at(op.seed, op.offset), out.data.ptr, even, 0.0, 1.0)
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
    gen = philox.at(op.seed, op.offset)
    if dist is Distribution.BITS:
        curand.generate(gen, out.data.ptr, out.size)
    elif dist is Distribution.POISSON:
        curand.generatePoisson(gen, out.data.ptr, out.size, float(params[0]))
    elif dist is Distribution.UNIFORM:
        _uniform(gen, out)
        _UNIFORM(out, float(params[0]), float(params[1]), out)
    else:
        _uniform(gen, out)
        _EXPONENTIAL(out, float(params[0]), out)


HANDLERS: dict[type[Op], Handler] = {RngFill: rng_fill}
"""The random-number op handlers of the CUDA backend."""
