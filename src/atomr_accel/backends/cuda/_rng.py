"""CUDA random fills from cuRAND's counter-based Philox4_32_10 generator (host API).

Each backend keeps one cuRAND generator. A fill sets its seed, its absolute
offset and the current stream, then generates straight into the output
buffer; where the generator already stands at that seed and offset (the next
piece of a fill, the next fill of a stream) it is not keyed again, which would
cost a set-up pass. For Philox, ``curandSetGeneratorOffset(offset)`` makes a generation
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
from typing import TYPE_CHECKING, Any

import cupy as cp
from cupy.cuda import curand

from atomr_accel.backends._base import Handler
from atomr_accel.core._op import Op
from atomr_accel.core.ops._rng import Distribution, RngFill

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

__all__ = ["HANDLERS", "rng_fill"]

_OFFSETS = 1 << 64  # cuRAND offsets are unsigned 64-bit
_LARGEST = {4: 1 << 24, 8: 1 << 17}
"""Longest single cuRAND call per element size. Past some size cuRAND lays a call's
outputs out differently (seen on an H200 with CUDA 13: an f64 call of 2^18 elements
differs from 2^16-element calls in the last two of them; f64 fills of 2^20 did not
continue fills of 2^19), so longer fills are made of pieces of at most this length.
4-byte calls of up to 2^25 matched 2^16-element pieces on an H100 (CUDA 13). The GPU
tests compare (2^24 + 6)-element fills of every dtype with the same stream drawn in
2^16-element pieces."""

_BLOCK = 4
"""Philox draws 4 numbers per counter: only calls of whole blocks are chained."""
_CHAINED = {4}
"""Element sizes whose calls leave the generator exactly where the next piece starts (seen
on an H100 with CUDA 13 for 4-byte draws of 7 to 2^22 per call; chained f64 calls of 2^17
at an odd offset did not match, so f64 pieces are keyed one by one)."""

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
    """One cuRAND Philox4_32_10 generator, destroyed when its owner goes.

    Keying it (seed and offset) makes cuRAND set its state up again before the
    next call, which costs about as much as generating millions of numbers; a
    call that draws a whole number of Philox blocks leaves the generator at
    exactly ``offset + count``, so the next piece or the next fill of the same
    stream needs no keying (``at`` skips it).
    """

    def __init__(self) -> None:
        self.handle: int = curand.createGenerator(curand.CURAND_RNG_PSEUDO_PHILOX4_32_10)
        self.stream = 0  # the stream the generator is bound to (0: the default stream)
        self.next: tuple[int, int] | None = None  # (seed, offset) the generator stands at
        weakref.finalize(self, _destroy, self.handle)

    def bind(self, stream: int) -> None:
        """Bind the generator to ``stream`` (a CUDA stream pointer) unless it already is."""
        if stream != self.stream:
            curand.setStream(self.handle, stream)
            self.stream = stream

    def at(self, seed: int, offset: int, count: int, chained: bool) -> int:
        """The generator, keyed by ``seed`` and standing at ``offset`` on the current stream,
        for a call that draws ``count``; ``chained``: such a call leaves it at the end."""
        if self.next != (seed, offset):
            curand.setPseudoRandomGeneratorSeed(self.handle, seed)
            curand.setGeneratorOffset(self.handle, offset)
        self.bind(cp.cuda.get_current_stream().ptr)
        self.next = (seed, (offset + count) % _OFFSETS) \
            if chained and count % _BLOCK == 0 else None
        return self.handle


def _destroy(handle: int) -> None:
    with contextlib.suppress(Exception):  # a lost or poisoned context took it already
        curand.destroyGenerator(handle)


_GENERATORS: weakref.WeakKeyDictionary[CudaBackend, _Philox] = weakref.WeakKeyDictionary()


def _generator(backend: CudaBackend) -> _Philox:
    """The backend's generator, created on its first fill."""
    gen = _GENERATORS.get(backend)
    if gen is None:
        gen = _GENERATORS[backend] = _Philox()
    return gen


def _pieces(base: int, itemsize: int, offset: int, count: int) -> Any:
    """``(pointer, count, stream offset)`` of each piece of the ``count`` elements at ``base``,
    no piece longer than ``_LARGEST`` for the dtype (cuRAND's element order changes past it)."""
    step = _LARGEST[itemsize]
    for start in range(0, count, step):
        yield base + start * itemsize, min(step, count - start), (offset + start) % _OFFSETS


def _generate(philox: _Philox, op: RngFill, base: int, itemsize: int, count: int, fill: Any,
              *extra: Any) -> None:
    """Run a cuRAND generation into ``count`` elements at ``base``, piece by piece, at
    ``op``'s stream position."""
    chained = itemsize in _CHAINED
    for pointer, n, offset in _pieces(base, itemsize, op.offset, count):
        fill(philox.at(op.seed, offset, n, chained), pointer, n, *extra)


def _standard_normal(philox: _Philox, op: RngFill, buf: Any, base: int, count: int) -> None:
    """Fill ``buf[:count]`` (f32/f64) with the standard normals of ``op``'s stream."""
    itemsize = buf.itemsize
    fill = curand.generateNormal if itemsize == 4 else curand.generateNormalDouble
    even = count - count % 2
    _generate(philox, op, base, itemsize, even, fill, 0.0, 1.0)  # pieces stay even
    if count % 2:  # cuRAND draws normals in pairs: draw the last one's pair into scratch
        pair = cp.empty(2, dtype=buf.dtype)
        fill(philox.at(op.seed, (op.offset + even) % _OFFSETS, 2, False), pair.data.ptr, 2,
             0.0, 1.0)
        buf[even:count] = pair[:1]


def rng_fill(backend: CudaBackend, op: RngFill) -> None:
    """Write ``op.count`` draws of the stream at ``(seed, offset)`` into ``out``.

    cuRAND writes straight to the buffer's address; only a distribution that
    maps the draws afterwards takes a view of the filled part.
    """
    count = op.count
    if count == 0:
        return
    buffer_id = op.out.buffer_id
    buf = backend.array(buffer_id)
    base = backend.pointer(buffer_id)
    itemsize = buf.itemsize
    philox = _generator(backend)
    dist = op.distribution
    params = op.resolved_params
    if dist in (Distribution.NORMAL, Distribution.LOG_NORMAL):
        _standard_normal(philox, op, buf, base, count)
        kernel = _NORMAL if dist is Distribution.NORMAL else _LOG_NORMAL
        out = buf[:count]
        kernel(out, float(params[0]), float(params[1]), out)
        return
    if dist is Distribution.BITS:
        _generate(philox, op, base, itemsize, count, curand.generate)
    elif dist is Distribution.POISSON:
        _generate(philox, op, base, itemsize, count, curand.generatePoisson, float(params[0]))
    else:  # UNIFORM, and EXPONENTIAL made of uniforms
        uniform = curand.generateUniform if itemsize == 4 else curand.generateUniformDouble
        _generate(philox, op, base, itemsize, count, uniform)
        if dist is Distribution.EXPONENTIAL:
            out = buf[:count]
            _EXPONENTIAL(out, float(params[0]), out)
            return
        low, high = float(params[0]), float(params[1])
        if (low, high) != (0.0, 1.0):  # the identity map would only cost a pass over memory
            out = buf[:count]
            _UNIFORM(out, low, high, out)


HANDLERS: dict[type[Op], Handler] = {RngFill: rng_fill}
"""The random-number op handlers of the CUDA backend."""
