"""CUDA random fills from cuRAND's generators (host API).

The default generator, Philox4_32_10, fills UNIFORM, NORMAL, LOG_NORMAL, POISSON,
EXPONENTIAL and BITS with cuRAND's own transforms, as in earlier releases.
Each backend keeps one cuRAND generator per kind. A fill sets its seed, its absolute
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

Draws on that path, per buffer precision (f32 or f64):

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
* POISSON: ``curandGeneratePoisson`` into the i32/u32 buffer (counts into an f32/f64
  buffer take the word path below, with the CPU backend's inverse CDF).
* BITS: ``curandGenerate``, raw 32-bit words into the u32 buffer.

Every other fill (BETA, CAUCHY, GAMMA and DISCRETE, and every distribution with
another generator) takes one 64-bit word per element, made on the GPU, and maps
it with the CPU backend's transforms (``draws``) run on CuPy with cupyx's
``special`` (``ndtri``, ``betaincinv``, ``gammaincinv``), in pieces of at most
``_CHUNK`` elements. The words, per kind (``Generator`` says what they are):

* PHILOX4_32_10, XORWOW, MRG32K3A: ``curandGenerate`` of 32-bit outputs
  ``2 * offset ..``, joined in pairs. Seen with cuRAND 10.4 on an H100:
  ``curandGenerate`` at an offset continues exactly for XORWOW and MRG32K3A
  too, for calls of 7 to 2^22 outputs (XORWOW's uniform doubles and every
  pseudo-random kind's normals did not, so they are not used here).
* MTGP32: cuRAND refuses an offset for it, and a new seed on a used MTGP32
  generator does not restart its stream (seen with cuRAND 10.4), so each
  block of ``MT_BLOCK`` elements is drawn whole by a fresh generator keyed by
  ``block_key(seed, block)``, destroyed once its stream has caught up.
* The Sobol kinds: ``curandGenerate`` (32-bit) or ``curandGenerateLongLong``
  (64-bit) of points ``offset ..`` of dimension 1 (cuRAND's default number of
  dimensions); the scrambled kinds XOR them with ``sobol_shift(seed)``. The
  unscrambled points equal the CPU's (seen with cuRAND 10.4).

POISSON off cuRAND's path finds the smallest ``k`` with ``pdtr(k, lam) >= u`` by
bisection (CuPy has no ``pdtrik``), a fixed number of rounds. A DISCRETE fill reads
one flag back to refuse bad weights and an MTGP32 fill waits for its stream, so
those fills do more than queue work (``queues_only``).

CPU and CUDA streams differ: the same arguments give different numbers, but for the
unscrambled Sobol kinds, whose words are the same on both (the values then agree up to
the rounding of each backend's special functions).
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import cupy as cp
from cupy.cuda import curand

from atomr_accel.backends._handlers import cuda
from atomr_accel.backends._lazy import lazy_module
from atomr_accel.backends._state import per_backend
from atomr_accel.backends.cpu._bitgen import MT_BLOCK, block_key, sobol_shift
from atomr_accel.backends.cpu._rng import cumulative, draws
from atomr_accel.core.ops._rng import Distribution, Generator, RngFill

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

cupyx_special = lazy_module("cupyx.scipy.special")

__all__ = ["queues_only", "rng_fill"]

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
"""Element sizes whose Philox calls leave the generator exactly where the next piece
starts (seen on an H100 with CUDA 13 for 4-byte draws of 7 to 2^22 per call; chained
f64 calls of 2^17 at an odd offset did not match, so f64 pieces are keyed one by one).
Other kinds are keyed before every call."""

_CHUNK = 1 << 22
"""Most elements one pass of the words path maps at a time (bounds its scratch)."""

_RNG_TYPES = {
    Generator.PHILOX4_32_10: curand.CURAND_RNG_PSEUDO_PHILOX4_32_10,
    Generator.XORWOW: curand.CURAND_RNG_PSEUDO_XORWOW,
    Generator.MRG32K3A: curand.CURAND_RNG_PSEUDO_MRG32K3A,
    Generator.MTGP32: curand.CURAND_RNG_PSEUDO_MTGP32,
    Generator.SOBOL32: curand.CURAND_RNG_QUASI_SOBOL32,
    Generator.SCRAMBLED_SOBOL32: curand.CURAND_RNG_QUASI_SCRAMBLED_SOBOL32,
    Generator.SOBOL64: curand.CURAND_RNG_QUASI_SOBOL64,
    Generator.SCRAMBLED_SOBOL64: curand.CURAND_RNG_QUASI_SCRAMBLED_SOBOL64,
}
_QUASI = frozenset({Generator.SOBOL32, Generator.SCRAMBLED_SOBOL32, Generator.SOBOL64,
                    Generator.SCRAMBLED_SOBOL64})
_SCRAMBLED = frozenset({Generator.SCRAMBLED_SOBOL32, Generator.SCRAMBLED_SOBOL64})
_WIDE = frozenset({Generator.SOBOL64, Generator.SCRAMBLED_SOBOL64})
_CURAND_DRAWS = frozenset({Distribution.UNIFORM, Distribution.NORMAL, Distribution.LOG_NORMAL,
                           Distribution.POISSON, Distribution.EXPONENTIAL, Distribution.BITS})
"""The distributions the default generator draws with cuRAND's own transforms."""

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


class _Curand:
    """One cuRAND generator of one kind, destroyed when its owner goes.

    Keying it (seed and offset) makes cuRAND set its state up again before the
    next call, which costs about as much as generating millions of numbers; a
    Philox call that draws a whole number of Philox blocks leaves the generator at
    exactly ``offset + count``, so the next piece or the next fill of the same
    stream needs no keying (``at`` skips it). Sobol generators take no seed.
    """

    def __init__(self, kind: Generator) -> None:
        self.kind = kind
        self.handle: int = curand.createGenerator(_RNG_TYPES[kind])
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
            if self.kind not in _QUASI:
                curand.setPseudoRandomGeneratorSeed(self.handle, seed)
            curand.setGeneratorOffset(self.handle, offset)
        self.bind(cp.cuda.get_current_stream().ptr)
        self.next = (seed, (offset + count) % _OFFSETS) \
            if chained and count % _BLOCK == 0 else None
        return self.handle


def _destroy(handle: int) -> None:
    with contextlib.suppress(Exception):  # a lost or poisoned context took it already
        curand.destroyGenerator(handle)


_generators: Callable[[Any], dict[Generator, _Curand]] = per_backend(dict)
"""A backend's cuRAND generators, by kind."""


def _generator(backend: CudaBackend, kind: Generator) -> _Curand:
    """The backend's generator of ``kind``, created on its first fill."""
    kinds = _generators(backend)
    gen = kinds.get(kind)
    if gen is None:
        gen = kinds[kind] = _Curand(kind)
    return gen


def _pieces(base: int, itemsize: int, offset: int, count: int) -> Iterator[tuple[int, int, int]]:
    """``(pointer, count, stream offset)`` of each piece of the ``count`` elements at ``base``,
    no piece longer than ``_LARGEST`` for the dtype (cuRAND's element order changes past it)."""
    step = _LARGEST[itemsize]
    for start in range(0, count, step):
        yield base + start * itemsize, min(step, count - start), (offset + start) % _OFFSETS


def _generate(gen: _Curand, seed: int, offset: int, base: int, itemsize: int, count: int,
              fill: Any, *extra: Any) -> None:
    """Run a cuRAND generation into ``count`` elements at ``base``, piece by piece, from
    stream position ``offset`` of ``seed``."""
    chained = gen.kind is Generator.PHILOX4_32_10 and itemsize in _CHAINED
    for pointer, n, position in _pieces(base, itemsize, offset, count):
        fill(gen.at(seed, position, n, chained), pointer, n, *extra)


def _standard_normal(philox: _Curand, op: RngFill, buf: Any, base: int, count: int) -> None:
    """Fill ``buf[:count]`` (f32/f64) with the standard normals of ``op``'s stream."""
    itemsize = buf.itemsize
    fill = curand.generateNormal if itemsize == 4 else curand.generateNormalDouble
    even = count - count % 2
    _generate(philox, op.seed, op.offset, base, itemsize, even, fill, 0.0, 1.0)  # pieces even
    if count % 2:  # cuRAND draws normals in pairs: draw the last one's pair into scratch
        pair = cp.empty(2, dtype=buf.dtype)
        fill(philox.at(op.seed, (op.offset + even) % _OFFSETS, 2, False), pair.data.ptr, 2,
             0.0, 1.0)
        buf[even:count] = pair[:1]


def _curand_fill(backend: CudaBackend, op: RngFill, buf: Any) -> None:
    """Fill with the default generator and cuRAND's own transforms (``_CURAND_DRAWS``).

    cuRAND writes straight to the buffer's address; only a distribution that
    maps the draws afterwards takes a view of the filled part.
    """
    count = op.count
    base = backend.pointer(op.out.buffer_id)
    itemsize = buf.itemsize
    philox = _generator(backend, Generator.PHILOX4_32_10)
    dist = op.distribution
    params = op.resolved_params
    if dist in (Distribution.NORMAL, Distribution.LOG_NORMAL):
        _standard_normal(philox, op, buf, base, count)
        kernel = _NORMAL if dist is Distribution.NORMAL else _LOG_NORMAL
        out = buf[:count]
        kernel(out, float(params[0]), float(params[1]), out)
        return
    if dist is Distribution.BITS:
        _generate(philox, op.seed, op.offset, base, itemsize, count, curand.generate)
    elif dist is Distribution.POISSON:
        _generate(philox, op.seed, op.offset, base, itemsize, count, curand.generatePoisson,
                  float(params[0]))
    else:  # UNIFORM, and EXPONENTIAL made of uniforms
        uniform = curand.generateUniform if itemsize == 4 else curand.generateUniformDouble
        _generate(philox, op.seed, op.offset, base, itemsize, count, uniform)
        if dist is Distribution.EXPONENTIAL:
            out = buf[:count]
            _EXPONENTIAL(out, float(params[0]), out)
            return
        low, high = float(params[0]), float(params[1])
        if (low, high) != (0.0, 1.0):  # the identity map would only cost a pass over memory
            out = buf[:count]
            _UNIFORM(out, low, high, out)


def _pairs(outputs: Any) -> Any:
    """Join 32-bit outputs ``2k`` (high half) and ``2k + 1`` into 64-bit word ``k``."""
    return (outputs[0::2].astype(cp.uint64) << cp.uint64(32)) | outputs[1::2].astype(cp.uint64)


def _pseudo_words(gen: _Curand, seed: int, offset: int, count: int) -> Any:
    """Words of Philox, XORWOW or MRG32k3a: 32-bit outputs ``2 * offset ..`` in pairs."""
    outputs = cp.empty(2 * count, dtype=cp.uint32)
    _generate(gen, seed, 2 * offset % _OFFSETS, outputs.data.ptr, 4, outputs.size,
              curand.generate)
    return _pairs(outputs)


def _mtgp_words(seed: int, offset: int, count: int) -> Any:
    """Words of MTGP32: each block of ``MT_BLOCK`` elements drawn whole by a fresh generator."""
    outputs = cp.empty(2 * count, dtype=cp.uint32)
    block_outputs = cp.empty(2 * MT_BLOCK, dtype=cp.uint32)
    stream = cp.cuda.get_current_stream()
    done = 0
    while done < count:
        block, start = divmod(offset + done, MT_BLOCK)
        take = min(MT_BLOCK - start, count - done)
        handle = curand.createGenerator(_RNG_TYPES[Generator.MTGP32])
        try:
            curand.setPseudoRandomGeneratorSeed(handle, block_key(seed, block))
            curand.setStream(handle, stream.ptr)
            curand.generate(handle, block_outputs.data.ptr, block_outputs.size)
            outputs[2 * done : 2 * (done + take)] = block_outputs[2 * start : 2 * (start + take)]
            stream.synchronize()  # the generator's state outlives its last generation
        finally:
            curand.destroyGenerator(handle)
        done += take
    return _pairs(outputs)


def _sobol_words(gen: _Curand, seed: int, offset: int, count: int) -> Any:
    """Words of a Sobol kind: points ``offset ..``, 32-bit ones in the high half, XOR the
    seed's shift when scrambled."""
    wide = gen.kind in _WIDE
    shift = cp.uint64(sobol_shift(seed, 64 if wide else 32) if gen.kind in _SCRAMBLED else 0)
    points = cp.empty(count, dtype=cp.uint64 if wide else cp.uint32)
    fill = curand.generateLongLong if wide else curand.generate
    _generate(gen, seed, offset, points.data.ptr, points.itemsize, count, fill)
    if wide:
        return points ^ shift
    return (points.astype(cp.uint64) << cp.uint64(32)) ^ shift


def _words(backend: CudaBackend, kind: Generator, seed: int, offset: int, count: int) -> Any:
    """Words ``offset .. offset + count - 1`` of the ``kind`` stream named by ``seed``."""
    if kind is Generator.MTGP32:
        return _mtgp_words(seed, offset, count)
    gen = _generator(backend, kind)
    if kind in _QUASI:
        return _sobol_words(gen, seed, offset, count)
    return _pseudo_words(gen, seed, offset, count)


def _poisson(u: Any, lam: float) -> Any:
    """The smallest ``k`` with ``pdtr(k, lam) >= u``: a bisection of ``[0, top]``, ``top =
    lam + 10 sqrt(lam) + 30`` (past it ``pdtr`` rounds to 1), in a fixed number of rounds."""
    top = math.ceil(lam + 10.0 * math.sqrt(lam) + 30.0)
    low = cp.full(u.shape, -1.0)  # pdtr(low) < u <= pdtr(high) throughout
    high = cp.full(u.shape, float(top))
    for _ in range(top.bit_length() + 1):
        middle = cp.floor((low + high) / 2)
        enough = cupyx_special.pdtr(middle, lam) >= u
        high = cp.where(enough, middle, high)
        low = cp.where(enough, low, middle)
    return high


@cuda.handles(RngFill)
def rng_fill(backend: CudaBackend, op: RngFill) -> None:
    """Write ``op.count`` draws of the stream at ``(seed, offset)`` into ``out``.

    An empty fill reads nothing, not even a DISCRETE fill's weights.
    """
    count = op.count
    if count == 0:
        return
    buf = backend.array(op.out.buffer_id)
    kind = op.generator.resolved
    counts_as_floats = op.distribution is Distribution.POISSON and op.out.dtype.is_float
    if kind is Generator.PHILOX4_32_10 and op.distribution in _CURAND_DRAWS \
            and not counts_as_floats:  # curandGeneratePoisson writes integers only
        _curand_fill(backend, op, buf)
        return
    cdf = None if op.weights is None else cumulative(cp, backend.array(op.weights.buffer_id))
    for start in range(0, count, _CHUNK):
        n = min(_CHUNK, count - start)
        raw = _words(backend, kind, op.seed, (op.offset + start) % _OFFSETS, n)
        buf[start : start + n] = draws(cp, cupyx_special, raw, op, buf.dtype, cdf, _poisson)


def queues_only(op: RngFill) -> bool:
    """Whether the fill only queues device work: not a DISCRETE fill (it reads a flag back)
    nor an MTGP32 one (it waits for its stream before destroying a generator)."""
    return op.distribution is not Distribution.DISCRETE and \
        op.generator is not Generator.MTGP32
