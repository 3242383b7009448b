"""The ``count`` largest values of each row of a CuPy matrix, for small ``count``: two kernels
and one download.

Every warp keeps its best entries as a list sorted best first, ``32 * R`` slots spread
over its lanes (slot ``r * 32 + lane`` in the lane's register ``r``; ``R`` up to 4,
so ``count`` up to ``LIMIT``). A value enters only if it beats the list's
``count``-th: a float compare first, ``!(v < threshold)``, then the exact compare
of order keys (the float's bits made unsigned-ordered, every NaN the largest key,
as ``argpartition`` and ``torch.topk`` rank NaN), so after the first reads almost
every value is dismissed by one compare. The few that beat it go in one at a
time; when many do, they are sorted (bitonic, across the lanes) and merged in
(a bitonic merge). Stage one (``select_chunks``): the warps of ``blocks`` blocks a
row read its 16-byte vectors, each warp a contiguous run, and each block merges
its warps' lists in a tree. Stage two (``merge_rows``): one block a row merges
those and writes the row's ``count`` candidates as int64 (the values' float64 bits,
the columns, then ``keys[column]`` or the column), downloaded into pinned memory.

Keys order the values totally, so each list's first ``count`` entries are values
no other value it was offered exceeds: the shared handler's candidates
(``backends.cpu._topk.select``), ties at the ``count``-th value taken in any order,
as there.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

__all__ = ["LIMIT", "candidates", "fits"]

LIMIT = 128
"""Most candidates a row the kernels keep (``32 * R`` entries a warp, ``R`` up to 4)."""
_THREADS = 256
_MIN_VECTORS = 64
"""Fewest 16-byte vectors a warp reads in stage one."""
_WARPS_WANTED = 32768
"""Warps stage one aims at over the whole matrix (a few waves of a large GPU)."""
_TYPES = {np.dtype(np.float16): "unsigned short", np.dtype(np.float32): "float",
          np.dtype(np.float64): "double"}
_KEYS = {np.dtype(np.float16): np.uint32, np.dtype(np.float32): np.uint32,
         np.dtype(np.float64): np.uint64}
"""The kernels' order keys of each dtype."""

_SOURCE = r"""
#define FULL 0xffffffffu
#define THREADS __THREADS__
#define WARPS (THREADS / 32)
#define SERIAL 4  // entries a merge inserts one at a time; more go in by a bitonic merge

template <typename T> struct Traits;

template <> struct Traits<unsigned short> {  // f16, read as its bits
    typedef unsigned int Key;
    typedef float Real;
    static __device__ Real real(unsigned short h) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
    static __device__ Key key(unsigned short h) {
        unsigned int b = h;
        if ((b & 0x7fffu) > 0x7c00u) return 0xffffu;
        return (b & 0x8000u) ? (~b & 0xffffu) : (b | 0x8000u);
    }
    static __device__ Real from_key(Key k) {
        return real((unsigned short)((k & 0x8000u) ? (k ^ 0x8000u) : (~k & 0xffffu)));
    }
    static __device__ double to_double(unsigned short h) { return (double)real(h); }
};

template <> struct Traits<float> {
    typedef unsigned int Key;
    typedef float Real;
    static __device__ Real real(float v) { return v; }
    static __device__ Key key(float v) {
        unsigned int b = __float_as_uint(v);
        if ((b & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;
        return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    }
    static __device__ Real from_key(Key k) {
        return __uint_as_float((k & 0x80000000u) ? (k ^ 0x80000000u) : ~k);
    }
    static __device__ double to_double(float v) { return (double)v; }
};

template <> struct Traits<double> {
    typedef unsigned long long Key;
    typedef double Real;
    static __device__ Real real(double v) { return v; }
    static __device__ Key key(double v) {
        unsigned long long b = (unsigned long long)__double_as_longlong(v);
        if ((b & 0x7fffffffffffffffull) > 0x7ff0000000000000ull) return ~0ull;
        return (b & 0x8000000000000000ull) ? ~b : (b | 0x8000000000000000ull);
    }
    static __device__ Real from_key(Key k) {
        return __longlong_as_double((long long)((k & 0x8000000000000000ull)
                                                ? (k ^ 0x8000000000000000ull) : ~k));
    }
    static __device__ double to_double(double v) { return v; }
};

// A warp's best entries, best first, over C = 32 * R slots (entry r * 32 + lane in k[r] and
// c[r] of that lane); key 0 (below every value) marks an empty slot. The first `count` are
// the best `count` the warp has taken; the slots past them hold entries it has let go.
template <typename T, int R> struct Top {
    typedef typename Traits<T>::Key Key;
    typedef typename Traits<T>::Real Real;
    Key k[R];
    int c[R];
    Key thr;          // key of the count-th entry
    Real thr_real;    // its value (NaN while empty: every value passes the float compare)
    int last;         // count - 1

    __device__ Top(int count) : last(count - 1) {
        #pragma unroll
        for (int r = 0; r < R; ++r) { k[r] = 0; c[r] = -1; }
        threshold();
    }

    __device__ void threshold() {
        Key t = 0;
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            const Key s = __shfl_sync(FULL, k[r], last & 31);
            if (r == (last >> 5)) t = s;
        }
        thr = t;
        thr_real = Traits<T>::from_key(t);
    }

    // One entry (every lane's copy of it), which beats the count-th.
    __device__ void insert(Key nk, int nc) {
        const int lane = threadIdx.x & 31;
        int p = 0;
        #pragma unroll
        for (int r = 0; r < R; ++r) p += __popc(__ballot_sync(FULL, k[r] >= nk));
        Key prev_k = nk;
        int prev_c = nc;
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            Key up_k = __shfl_up_sync(FULL, k[r], 1);
            int up_c = __shfl_up_sync(FULL, c[r], 1);
            const Key end_k = __shfl_sync(FULL, k[r], 31);
            const int end_c = __shfl_sync(FULL, c[r], 31);
            if (lane == 0) { up_k = prev_k; up_c = prev_c; }
            const int i = r * 32 + lane;
            if (i == p) { k[r] = nk; c[r] = nc; }
            else if (i > p) { k[r] = up_k; c[r] = up_c; }
            prev_k = end_k;
            prev_c = end_c;
        }
        threshold();
    }

    // The entries of the lanes in `pending` that still beat the count-th, one at a time.
    __device__ void insert_each(unsigned int pending, Key key, int col) {
        while (pending) {
            const int src = __ffs(pending) - 1;
            insert(__shfl_sync(FULL, key, src), __shfl_sync(FULL, col, src));
            pending = __ballot_sync(FULL, key > thr) & ((~0u << src) << 1);
        }
    }

    // Merge C entries sorted best first (bk, bc, laid out as k, c): a bitonic merge.
    __device__ void merge(const Key (&bk)[R], const int (&bc)[R]) {
        const int lane = threadIdx.x & 31;
        #pragma unroll
        for (int r = 0; r < R; ++r) {  // the better of entry i and the other's C - 1 - i
            const Key rk = __shfl_sync(FULL, bk[R - 1 - r], 31 - lane);
            const int rc = __shfl_sync(FULL, bc[R - 1 - r], 31 - lane);
            if (rk > k[r]) { k[r] = rk; c[r] = rc; }
        }
        #pragma unroll
        for (int s = R / 2; s >= 1; s >>= 1) {
            #pragma unroll
            for (int r = 0; r < R; ++r) {
                if ((r & s) == 0 && k[r | s] > k[r]) {
                    const Key tk = k[r]; k[r] = k[r | s]; k[r | s] = tk;
                    const int tc = c[r]; c[r] = c[r | s]; c[r | s] = tc;
                }
            }
        }
        #pragma unroll
        for (int s = 16; s >= 1; s >>= 1) {
            #pragma unroll
            for (int r = 0; r < R; ++r) {
                const Key pk = __shfl_xor_sync(FULL, k[r], s);
                const int pc = __shfl_xor_sync(FULL, c[r], s);
                if ((lane & s) == 0 ? pk > k[r] : pk < k[r]) { k[r] = pk; c[r] = pc; }
            }
        }
        threshold();
    }

    // Each lane may offer one entry (`has`): those beating the count-th go in, one by one
    // when they are few, else sorted (bitonic, 32 lanes) and merged.
    __device__ void offer(bool has, Key key, int col) {
        const bool beats = has && key > thr;
        const unsigned int pending = __ballot_sync(FULL, beats);
        if (__popc(pending) <= SERIAL) {
            insert_each(pending, beats ? key : 0, col);
            return;
        }
        const int lane = threadIdx.x & 31;
        Key bk[R];
        int bc[R];
        bk[0] = beats ? key : 0;
        bc[0] = col;
        #pragma unroll
        for (int r = 1; r < R; ++r) { bk[r] = 0; bc[r] = -1; }
        #pragma unroll
        for (int size = 2; size <= 32; size <<= 1) {
            #pragma unroll
            for (int s = size >> 1; s >= 1; s >>= 1) {
                const Key pk = __shfl_xor_sync(FULL, bk[0], s);
                const int pc = __shfl_xor_sync(FULL, bc[0], s);
                const bool first = (lane & s) == 0, best_first = (lane & size) == 0;
                if (first == best_first ? pk > bk[0] : pk < bk[0]) { bk[0] = pk; bc[0] = pc; }
            }
        }
        merge(bk, bc);
    }

    // Another list laid out as this one, sorted best first.
    __device__ void absorb(const Key (&bk)[R], const int (&bc)[R]) {
        int beating = 0;
        #pragma unroll
        for (int r = 0; r < R; ++r) beating += __popc(__ballot_sync(FULL, bk[r] > thr));
        if (beating > SERIAL) { merge(bk, bc); return; }
        #pragma unroll
        for (int r = 0; r < R; ++r) insert_each(__ballot_sync(FULL, bk[r] > thr), bk[r], bc[r]);
    }

    __device__ void offer_value(bool valid, T v, long long col) {
        const bool has = valid && !(Traits<T>::real(v) < thr_real);
        if (__any_sync(FULL, has)) offer(has, Traits<T>::key(v), (int)col);
    }

    // Entries 0 .. n-1 to `keys`, `cols`; entries up to C-1 past n read as empty.
    __device__ void store(Key* keys, int* cols, int n) const {
        const int lane = threadIdx.x & 31;
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            const int i = r * 32 + lane;
            if (i < n) { keys[i] = k[r]; cols[i] = c[r]; }
        }
    }

    __device__ static void load(const Key* keys, const int* cols, int n, Key (&bk)[R],
                                int (&bc)[R]) {
        const int lane = threadIdx.x & 31;
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            const int i = r * 32 + lane;
            bk[r] = i < n ? keys[i] : 0;
            bc[r] = i < n ? cols[i] : -1;
        }
    }
};

// Warp 0 ends with the best of the block's warps' lists (a tree of merges).
template <typename T, int R>
__device__ void merge_block(Top<T, R>& top, typename Traits<T>::Key* sk, int* sc) {
    typedef typename Traits<T>::Key Key;
    const int warp = threadIdx.x >> 5;
    for (int s = 1; s < WARPS; s <<= 1) {
        if ((warp & (2 * s - 1)) == s) top.store(sk + (warp >> 1) * 32 * R,
                                                 sc + (warp >> 1) * 32 * R, 32 * R);
        __syncthreads();
        if ((warp & (2 * s - 1)) == 0) {
            Key bk[R];
            int bc[R];
            Top<T, R>::load(sk + ((warp + s) >> 1) * 32 * R, sc + ((warp + s) >> 1) * 32 * R,
                            32 * R, bk, bc);
            top.absorb(bk, bc);
        }
        __syncthreads();
    }
}

template <typename T, int R>
__global__ void __launch_bounds__(THREADS)
select_chunks(const T* x, long long n, int count, long long per, int blocks,
              typename Traits<T>::Key* out_k, int* out_c) {
    typedef typename Traits<T>::Key Key;
    const int vec = 16 / sizeof(T);
    __shared__ Key sk[WARPS / 2 * 32 * R];
    __shared__ int sc[WARPS / 2 * 32 * R];
    const long long row = blockIdx.x / blocks;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const T* p = x + row * n;
    long long head = (long long)((16 - ((size_t)p & 15)) & 15) / (long long)sizeof(T);
    if (head > n) head = n;
    const long long vectors = (n - head) / vec, tail = head + vectors * vec;
    Top<T, R> top(count);
    const long long gw = (long long)(blockIdx.x % blocks) * WARPS + warp;
    if (gw == 0) {
        top.offer_value(lane < head, lane < head ? p[lane] : T(0), lane);
        const bool valid = tail + lane < n;
        top.offer_value(valid, valid ? p[tail + lane] : T(0), tail + lane);
    }
    const uint4* pv = reinterpret_cast<const uint4*>(p + head);
    const long long start = gw * per, end = start + per < vectors ? start + per : vectors;
    for (long long first = start; first < end; first += 32) {
        const long long v = first + lane;
        const bool valid = v < end;
        const uint4 u = valid ? __ldg(pv + v) : make_uint4(0, 0, 0, 0);
        const T* e = reinterpret_cast<const T*>(&u);
        bool hit = false;
        #pragma unroll
        for (int s = 0; s < vec; ++s) hit |= !(Traits<T>::real(e[s]) < top.thr_real);
        if (!__any_sync(FULL, valid && hit)) continue;
        #pragma unroll
        for (int s = 0; s < vec; ++s) top.offer_value(valid, e[s], head + v * vec + s);
    }
    merge_block(top, sk, sc);
    if (warp == 0) top.store(out_k + (long long)blockIdx.x * count,
                             out_c + (long long)blockIdx.x * count, count);
}

template <typename T, int R>
__global__ void __launch_bounds__(THREADS)
merge_rows(const T* x, long long n, int count, int blocks,
           const typename Traits<T>::Key* in_k, const int* in_c,
           const long long* keys, long long* out) {
    typedef typename Traits<T>::Key Key;
    __shared__ Key sk[WARPS / 2 * 32 * R];
    __shared__ int sc[WARPS / 2 * 32 * R];
    const long long row = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const Key* row_k = in_k + row * blocks * count;
    const int* row_c = in_c + row * blocks * count;
    Top<T, R> top(count);
    Key nk[R];
    int nc[R];
    if (warp < blocks) Top<T, R>::load(row_k + warp * count, row_c + warp * count, count, nk, nc);
    for (int list = warp; list < blocks; list += WARPS) {
        Key bk[R];
        int bc[R];
        #pragma unroll
        for (int r = 0; r < R; ++r) { bk[r] = nk[r]; bc[r] = nc[r]; }
        if (list + WARPS < blocks) {  // the next list's loads under this one's merge
            Top<T, R>::load(row_k + (long long)(list + WARPS) * count,
                            row_c + (long long)(list + WARPS) * count, count, nk, nc);
        }
        top.absorb(bk, bc);
    }
    merge_block(top, sk, sc);
    if (warp != 0) return;
    long long* o = out + row * 3 * count;
    #pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = r * 32 + lane;
        if (i < count) {
            const int col = top.c[r];
            o[i] = __double_as_longlong(Traits<T>::to_double(x[row * n + col]));
            o[count + i] = col;
            o[2 * count + i] = keys ? keys[col] : col;
        }
    }
}
""".replace("__THREADS__", str(_THREADS))


@functools.cache
def _kernels(xp: Any, dtype: np.dtype[Any], registers: int) -> tuple[Any, Any]:
    """Stage one and stage two (CuPy ``xp``'s) for ``dtype`` and lists of ``32 * registers``
    entries, compiled once a process."""
    names = [f"{kernel}<{_TYPES[dtype]}, {registers}>"
             for kernel in ("select_chunks", "merge_rows")]
    module = xp.RawModule(code=_SOURCE, name_expressions=names)
    return module.get_function(names[0]), module.get_function(names[1])


def fits(x: Any, count: int) -> bool:
    """Whether the kernels take ``count`` candidates a row of the matrix ``x``."""
    return count <= LIMIT and x.dtype in _TYPES and x.shape[1] < 2**31


def candidates(xp: Any, x: Any, keys: Any | None, count: int) -> np.ndarray[Any, Any]:
    """The ``count`` largest of each row of the matrix ``x`` of CuPy ``xp`` (``fits``), on
    the current stream, downloaded together into pinned memory: ``m x 3 count`` int64, the
    values' float64 bits, their columns, then ``keys[column]`` (the column without keys)."""
    x = xp.ascontiguousarray(x)
    m, n = x.shape
    vec = 16 // x.itemsize
    vectors = -(-n // vec)
    per = max(_MIN_VECTORS, -(-m * vectors // _WARPS_WANTED))
    per = -(-per // 32) * 32
    blocks = -(-vectors // (per * (_THREADS // 32)))
    select_chunks, merge_rows = _kernels(xp, x.dtype, -(-count // 32) if count <= 64 else 4)
    found = m * blocks * count
    size = m * 3 * count * 8
    key_size = np.dtype(_KEYS[x.dtype]).itemsize
    scratch = xp.empty(size + found * (key_size + 4), dtype=np.uint8)
    out = scratch.data.ptr  # the answer, then stage one's keys and columns
    found_keys, found_columns = out + size, out + size + found * key_size
    select_chunks((m * blocks,), (_THREADS,),
                  (x, np.int64(n), np.int32(count), np.int64(per), np.int32(blocks),
                   np.uint64(found_keys), np.uint64(found_columns)))
    merge_rows((m,), (_THREADS,),
               (x, np.int64(n), np.int32(count), np.int32(blocks), np.uint64(found_keys),
                np.uint64(found_columns), np.uint64(0) if keys is None else keys,
                np.uint64(out)))  # a null pointer for keys: the columns are their keys
    host = xp.cuda.alloc_pinned_memory(size)
    stream = xp.cuda.get_current_stream()
    xp.cuda.runtime.memcpyAsync(host.ptr, out, size, xp.cuda.runtime.memcpyDeviceToHost,
                                stream.ptr)
    stream.synchronize()
    return np.ndarray((m, 3 * count), np.int64, host)
