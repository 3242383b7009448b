"""CPU bit generators: one 64-bit word per stream element, for every ``Generator`` kind.

Each function answers words ``offset .. offset + count - 1`` of its stream without
drawing the words before ``offset`` (skip-ahead), so fills are stateless and
continue exactly whatever the offset:

* PHILOX4_32_10: NumPy's Philox-4x64 keyed by ``seed``, four words a counter step;
  a fill advances the counter by ``offset // 4`` and drops ``offset % 4`` words.
* XORWOW and MRG32K3A: the generators themselves (Marsaglia 2003; L'Ecuyer 1999),
  word ``k`` joining 32-bit outputs ``2k`` (high half) and ``2k + 1``. Both are
  linear recurrences, so the state ``n`` steps on is a matrix power applied to
  the seeded state: over GF(2) for xorwow's 160-bit xorshift part (its Weyl
  counter is ``d0 + 362437 n``), modulo m1 and m2 for MRG32k3a's two components.
  NumPy steps ``_LANE``-long lanes of the output side by side, each started by
  those powers. The seeded states come from NumPy's ``SeedSequence(seed)``.
* MTGP32: NumPy's MT19937 in blocks of ``MT_BLOCK`` elements, block ``b`` keyed by
  ``block_key(seed, b)`` (neither MT19937 nor cuRAND's MTGP32 can skip ahead).
* The Sobol kinds: the point of index ``k`` computed directly, the bit reversal
  of its Gray code ``k ^ (k >> 1)`` (the first dimension of every Sobol
  sequence); the scrambled kinds XOR it with ``sobol_shift(seed, bits)``.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from atomr_accel.core.ops._rng import Generator

__all__ = [
    "MT_BLOCK", "block_key", "mrg32k3a_outputs", "sobol_shift", "words", "xorwow_outputs",
]

U64 = np.ndarray[Any, np.dtype[np.uint64]]
Ints = np.ndarray[Any, np.dtype[np.int64]]

MT_BLOCK = 1 << 16
"""Elements per MTGP32 (MT19937 on the CPU) block; each is drawn by its own generator."""

_LANE = 1024  # outputs each lane of a vectorized recurrence steps through (a power of 2)
_PHILOX_WORDS = 4  # Philox-4x64 yields four 64-bit words per counter step
_M1, _M2 = 4294967087, 4294944443  # MRG32k3a's moduli
_MRG_A1 = ((0, 1, 0), (0, 0, 1), (_M1 - 810728, 1403580, 0))
_MRG_A2 = ((0, 1, 0), (0, 0, 1), (_M2 - 1370589, 0, 527612))
_WEYL = 362437  # xorwow's Weyl increment
_XORWOW_BITS = 160  # five 32-bit words of xorshift state


def words(kind: Generator, seed: int, offset: int, count: int) -> U64:
    """Return words ``offset .. offset + count - 1`` of the ``kind`` stream named by ``seed``."""
    kind = kind.resolved
    if kind is Generator.PHILOX4_32_10:
        return _philox(seed, offset, count)
    if kind is Generator.XORWOW:
        return _pairs(_xorwow(seed, 2 * offset, 2 * count))
    if kind is Generator.MRG32K3A:
        return _pairs(_mrg32k3a(seed, 2 * offset, 2 * count))
    if kind is Generator.MTGP32:
        return _mt_blocks(seed, offset, count)
    return _sobol(kind, seed, offset, count)


def block_key(seed: int, block: int) -> int:
    """The 64-bit key of MTGP32 block ``block`` of the stream named by ``seed``."""
    state = np.random.SeedSequence(seed, spawn_key=(block,)).generate_state(1, np.uint64)
    return int(state[0])


def sobol_shift(seed: int, bits: int) -> int:
    """The digital shift (an XOR) of the scrambled Sobol kinds: ``bits`` high bits of a word."""
    shift = int(np.random.SeedSequence(seed).generate_state(1, np.uint64)[0])
    return shift >> (64 - bits) << (64 - bits)


def _pairs(outputs: U64) -> U64:
    """Join 32-bit outputs ``2k`` (high half) and ``2k + 1`` into word ``k``."""
    joined: U64 = (outputs[0::2] << np.uint64(32)) | outputs[1::2]
    return joined


def _philox(seed: int, offset: int, count: int) -> U64:
    bit_gen = np.random.Philox(key=seed)
    blocks, skip = divmod(offset, _PHILOX_WORDS)
    bit_gen.advance(blocks)
    raw: U64 = bit_gen.random_raw(skip + count)
    return raw[skip:]


def _mt_blocks(seed: int, offset: int, count: int) -> U64:
    out = np.empty(count, dtype=np.uint64)
    done = 0
    while done < count:
        block, start = divmod(offset + done, MT_BLOCK)
        take = min(MT_BLOCK - start, count - done)
        raw = np.random.MT19937(block_key(seed, block)).random_raw(2 * (start + take))
        out[done : done + take] = _pairs(raw[2 * start :])
        done += take
    return out


def _sobol(kind: Generator, seed: int, offset: int, count: int) -> U64:
    index = np.arange(count, dtype=np.uint64) + np.uint64(offset)
    point = _reverse_bits(index ^ (index >> np.uint64(1)))
    if kind is Generator.SCRAMBLED_SOBOL32 or kind is Generator.SCRAMBLED_SOBOL64:
        bits = 32 if kind is Generator.SCRAMBLED_SOBOL32 else 64
        point ^= np.uint64(sobol_shift(seed, bits))
    return point


def _reverse_bits(x: U64) -> U64:
    """Reverse the 64 bits of each word (an index below ``2**32`` lands in the high half)."""
    for shift, mask in ((1, 0x5555555555555555), (2, 0x3333333333333333),
                        (4, 0x0F0F0F0F0F0F0F0F), (8, 0x00FF00FF00FF00FF),
                        (16, 0x0000FFFF0000FFFF), (32, 0x00000000FFFFFFFF)):
        s, m = np.uint64(shift), np.uint64(mask)
        x = ((x >> s) & m) | ((x & m) << s)
    return x


def _lanes(count: int) -> tuple[int, int]:
    """``(lanes, steps)``: how a recurrence's ``count`` outputs are stepped side by side."""
    steps = min(count, _LANE)
    return (-(-count // steps) if steps else 0), steps


# ------------------------------------------------------------------- MRG32k3a


def _mat_mul(a: Any, b: Any, m: int) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(sum(a[i][k] * b[k][j] for k in range(3)) % m for j in range(3))
                 for i in range(3))


def _mat_pow(a: Any, n: int, m: int) -> Any:
    """``a ** n`` modulo ``m`` for a 3x3 matrix of Python ints."""
    result: Any = ((1, 0, 0), (0, 1, 0), (0, 0, 1))
    while n:
        if n & 1:
            result = _mat_mul(result, a, m)
        a = _mat_mul(a, a, m)
        n >>= 1
    return result


def _mat_vec(a: Any, v: tuple[int, ...], m: int) -> tuple[int, ...]:
    return tuple(sum(a[i][k] * v[k] for k in range(3)) % m for i in range(3))


def _mrg_seed(seed: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Seeded component states, each element in ``[1, m)`` (never all zero)."""
    raw = [int(v) for v in np.random.SeedSequence(seed).generate_state(6, np.uint64)]
    return (tuple(v % (_M1 - 1) + 1 for v in raw[:3]),
            tuple(v % (_M2 - 1) + 1 for v in raw[3:]))


def mrg32k3a_outputs(state: tuple[tuple[int, ...], tuple[int, ...]], position: int,
                     count: int) -> U64:
    """Outputs ``position ..`` of MRG32k3a from component states ``(x1, x2)``, each
    ``(x[n-3], x[n-2], x[n-1])``; output ``j`` is ``(x1 - x2) mod m1`` after step ``j + 1``."""
    lanes, steps = _lanes(count)
    if lanes == 0:
        return np.empty(0, dtype=np.uint64)
    jump1, jump2 = _mat_pow(_MRG_A1, steps, _M1), _mat_pow(_MRG_A2, steps, _M2)
    s1 = _mat_vec(_mat_pow(_MRG_A1, position, _M1), state[0], _M1)
    s2 = _mat_vec(_mat_pow(_MRG_A2, position, _M2), state[1], _M2)
    starts = np.empty((6, lanes), dtype=np.int64)
    for lane in range(lanes):
        if lane:
            s1, s2 = _mat_vec(jump1, s1, _M1), _mat_vec(jump2, s2, _M2)
        starts[:, lane] = s1 + s2
    a0, a1, a2, b0, b1, b2 = starts
    out = np.empty((lanes, steps), dtype=np.int64)
    for step in range(steps):
        p1 = (1403580 * a1 - 810728 * a0) % _M1
        p2 = (527612 * b2 - 1370589 * b0) % _M2
        a0, a1, a2 = a1, a2, p1
        b0, b1, b2 = b1, b2, p2
        out[:, step] = (p1 - p2) % _M1
    return out.reshape(-1)[:count].astype(np.uint64)


def _mrg32k3a(seed: int, position: int, count: int) -> U64:
    return mrg32k3a_outputs(_mrg_seed(seed), position, count)


# --------------------------------------------------------------------- xorwow


def _xorshift(x: Any, y: Any, z: Any, w: Any, v: Any) -> tuple[Any, ...]:
    """One step of xorwow's xorshift part on uint32 arrays: the new ``(x, y, z, w, v)``."""
    t = x ^ (x >> np.uint32(2))
    return y, z, w, v, (v ^ (v << np.uint32(4))) ^ (t ^ (t << np.uint32(1)))


def _to_bits(state: Any) -> Any:
    """``(5, L)`` uint32 words as ``(160, L)`` bits, bit ``32 i + b`` = bit ``b`` of word ``i``."""
    shifts = np.arange(32, dtype=np.uint32)[None, :, None]
    return ((state[:, None, :] >> shifts) & np.uint32(1)).reshape(_XORWOW_BITS, -1)


def _from_bits(bits: Any) -> Any:
    shifts = np.arange(32, dtype=np.uint64)[None, :, None]
    grouped = bits.astype(np.uint64).reshape(5, 32, -1) << shifts
    return grouped.sum(axis=1).astype(np.uint32)


@functools.cache
def _xorwow_powers() -> tuple[Any, ...]:
    """The xorshift step's matrix over GF(2) raised to ``2**i``, for ``i`` in ``0 .. 65``."""
    basis = _from_bits(np.eye(_XORWOW_BITS, dtype=np.uint8))
    step = _to_bits(np.stack(_xorshift(*basis))).astype(np.float32)
    powers = [step]
    for _ in range(65):
        powers.append((powers[-1] @ powers[-1]) % 2)
    return tuple(power.astype(np.uint8) for power in powers)


def _xorwow_jump(bits: Any, n: int) -> Any:
    """Bits of the xorshift state ``n`` steps on (``n < 2**66``)."""
    powers = _xorwow_powers()
    vector = bits.astype(np.float32)
    for i in range(n.bit_length()):
        if n >> i & 1:
            vector = (powers[i] @ vector) % 2
    return vector


def _xorwow_seed(seed: int) -> tuple[Any, int]:
    """The seeded xorshift state (five uint32, not all zero) and Weyl counter."""
    raw = np.random.SeedSequence(seed).generate_state(6, np.uint32)
    state = raw[:5].copy()
    if not state.any():
        state[4] = 1
    return state, int(raw[5])


def xorwow_outputs(state: Any, weyl: int, position: int, count: int) -> U64:
    """Outputs ``position ..`` of xorwow from its xorshift state (five uint32) and Weyl
    counter ``d``: output ``j`` is ``v + d + 362437 (j + 1)`` after step ``j + 1``."""
    lanes, steps = _lanes(count)
    if lanes == 0:
        return np.empty(0, dtype=np.uint64)
    start = _xorwow_jump(_to_bits(np.asarray(state, dtype=np.uint32)[:, None])[:, 0], position)
    jump = _xorwow_powers()[_LANE.bit_length() - 1]  # lanes after the first are _LANE long
    starts = np.empty((_XORWOW_BITS, lanes), dtype=np.float32)
    for lane in range(lanes):
        if lane:
            start = (jump @ start) % 2
        starts[:, lane] = start
    x, y, z, w, v = _from_bits(starts)
    out = np.empty((lanes, steps), dtype=np.uint32)
    for step in range(steps):
        x, y, z, w, v = _xorshift(x, y, z, w, v)
        out[:, step] = v
    index = (np.arange(count, dtype=np.uint64) + np.uint64(position % (1 << 32) + 1))
    counter = (np.uint64(weyl) + np.uint64(_WEYL) * index) & np.uint64(0xFFFFFFFF)
    return (out.reshape(-1)[:count].astype(np.uint64) + counter) & np.uint64(0xFFFFFFFF)


def _xorwow(seed: int, position: int, count: int) -> U64:
    state, weyl = _xorwow_seed(seed)
    return xorwow_outputs(state, weyl, position, count)
