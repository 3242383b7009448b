"""The realtime filter chain on CUDA: NVRTC kernels, one thread an element, on the op's
stream. Statistics and blends are the shared CuPy handlers (``backends.cpu._realtime_frames``).

A chain is lowered to passes: a ``Correlate`` (and a ``BoxBlur`` of at most 5x5)
is one 2-D pass, a ``GaussianBlur`` (and a larger box) a row pass then a column
pass, a ``SobelMagnitude`` one pass; a ``Threshold`` is fused into the pass
before it (a pass of its own only when it comes first). The first pass reads the
source frame's type, the last writes the destination's (rounded to nearest and
saturated for u8), and passes in between go through two float32 scratch frames
kept per stream. Borders read the nearest edge pixel (``mode="nearest"``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import cupy as cp

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cuda
from atomr_accel.backends._state import Lru, per_backend
from atomr_accel.backends.cuda._realtime_nvrtc import Source
from atomr_accel.core._dtype import DType
from atomr_accel.core.ops._realtime_frames import (
    BoxBlur,
    Correlate,
    FilterFrames,
    GaussianBlur,
    SobelMagnitude,
    Stage,
    Threshold,
)

__all__ = ["Pass", "filter_frames", "passes_of"]

_SOURCE = r"""
template <typename T> __device__ __forceinline__ float load(const T* p, long long i) {
    return (float)p[i];
}
__device__ __forceinline__ void store(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void store(unsigned char* p, long long i, float v) {
    int r = __float2int_rn(v);
    p[i] = (unsigned char)(r < 0 ? 0 : (r > 255 ? 255 : r));
}
__device__ __forceinline__ float finish(float v, int thr, float level, float low, float high) {
    return thr ? (v > level ? high : low) : v;
}
__device__ __forceinline__ int clampi(int v, int hi) { return v < 0 ? 0 : (v > hi ? hi : v); }

#define ELEMENT                                                              \
    int xc = blockIdx.x * blockDim.x + threadIdx.x;                          \
    int y = blockIdx.y * blockDim.y + threadIdx.y;                           \
    if (xc >= W * C || y >= H) return;                                       \
    int x = xc / C, c = xc - x * C;                                          \
    long long frame = (long long)blockIdx.z * H * W * C;                     \
    src += frame;                                                            \
    dst += frame;                                                            \
    long long out = (long long)y * W * C + xc;

template <typename Tin, typename Tout>
__global__ void corr2d(const Tin* __restrict__ src, Tout* __restrict__ dst,
                       const float* __restrict__ w, int H, int W, int C,
                       int kh, int kw, int thr, float level, float low, float high) {
    ELEMENT
    float acc = 0.0f;
    for (int dy = 0; dy < kh; ++dy) {
        long long row = (long long)clampi(y + dy - kh / 2, H - 1) * W;
        for (int dx = 0; dx < kw; ++dx) {
            int xx = clampi(x + dx - kw / 2, W - 1);
            acc += w[dy * kw + dx] * load(src, (row + xx) * C + c);
        }
    }
    store(dst, out, finish(acc, thr, level, low, high));
}

template <typename Tin, typename Tout>
__global__ void corr_rows(const Tin* __restrict__ src, Tout* __restrict__ dst,
                       const float* __restrict__ w, int H, int W, int C,
                          int r, int thr, float level, float low, float high) {
    ELEMENT
    float acc = 0.0f;
    long long row = (long long)y * W;
    for (int d = -r; d <= r; ++d)
        acc += w[d + r] * load(src, (row + clampi(x + d, W - 1)) * C + c);
    store(dst, out, finish(acc, thr, level, low, high));
}

template <typename Tin, typename Tout>
__global__ void corr_cols(const Tin* __restrict__ src, Tout* __restrict__ dst,
                       const float* __restrict__ w, int H, int W, int C,
                          int r, int thr, float level, float low, float high) {
    ELEMENT
    float acc = 0.0f;
    for (int d = -r; d <= r; ++d)
        acc += w[d + r] * load(src, ((long long)clampi(y + d, H - 1) * W + x) * C + c);
    store(dst, out, finish(acc, thr, level, low, high));
}

template <typename Tin, typename Tout>
__global__ void sobel(const Tin* __restrict__ src, Tout* __restrict__ dst,
                      int H, int W, int C,
                      int thr, float level, float low, float high) {
    ELEMENT
    long long r0 = (long long)clampi(y - 1, H - 1) * W, r1 = (long long)y * W,
              r2 = (long long)clampi(y + 1, H - 1) * W;
    int x0 = clampi(x - 1, W - 1), x2 = clampi(x + 1, W - 1);
    float a = load(src, (r0 + x0) * C + c), b = load(src, (r0 + x) * C + c),
          d = load(src, (r0 + x2) * C + c), e = load(src, (r1 + x0) * C + c),
          f = load(src, (r1 + x2) * C + c), g = load(src, (r2 + x0) * C + c),
          h = load(src, (r2 + x) * C + c), k = load(src, (r2 + x2) * C + c);
    float gx = (d - a) + 2.0f * (f - e) + (k - g);
    float gy = (g - a) + 2.0f * (h - b) + (k - d);
    store(dst, out, finish(sqrtf(gx * gx + gy * gy), thr, level, low, high));
}

template <typename Tin, typename Tout>
__global__ void point(const Tin* __restrict__ src, Tout* __restrict__ dst,
                      int H, int W, int C,
                      int thr, float level, float low, float high) {
    ELEMENT
    store(dst, out, finish(load(src, out), thr, level, low, high));
}
"""

_TYPES = {DType.U8: "unsigned char", DType.F32: "float"}
_KINDS = ("corr2d", "corr_rows", "corr_cols", "sobel", "point")
_BLOCK = (64, 4, 1)
"""Threads a block: 64 values of a row by 4 rows (neighbouring rows share the cache)."""
_BOX_2D_MAX = 5
"""The largest box blur run as one 2-D pass; larger ones go row then column."""


def _expression(kind: str, src: DType, dst: DType) -> str:
    return f"{kind}<{_TYPES[src]}, {_TYPES[dst]}>"


_KERNELS = Source(_SOURCE, names=tuple(
    _expression(k, a, b) for k in _KINDS for a in _TYPES for b in _TYPES))
"""The filter kernels, every type pair instantiated."""


@dataclass(frozen=True, slots=True)
class Pass:
    """One kernel launch of a lowered chain: its kind, weights, sizes and the threshold
    fused after it (``(level, low, high)``, or None)."""

    kind: str
    weights: tuple[float, ...] = ()
    size: tuple[int, int] = (0, 0)
    threshold: tuple[float, float, float] | None = None

    def with_threshold(self, stage: Threshold) -> Pass:
        """This pass with ``stage`` fused after it."""
        return Pass(self.kind, self.weights, self.size,
                    (float(stage.level), float(stage.low), float(stage.high)))


def _separable(taps: tuple[float, ...]) -> list[Pass]:
    r = len(taps) // 2
    return [Pass("corr_rows", taps, (1, r)), Pass("corr_cols", taps, (1, r))]


def _lowered(stage: Stage) -> list[Pass]:
    if isinstance(stage, Correlate):
        return [Pass("corr2d", tuple(float(w) for w in stage.weights), stage.size)]
    if isinstance(stage, GaussianBlur):
        return _separable(stage.taps())
    if isinstance(stage, BoxBlur):
        if stage.size <= _BOX_2D_MAX:
            count = stage.size * stage.size
            return [Pass("corr2d", (1.0 / count,) * count, (stage.size, stage.size))]
        return _separable((1.0 / stage.size,) * stage.size)
    if isinstance(stage, SobelMagnitude):
        return [Pass("sobel")]
    raise AssertionError(stage)  # a Threshold: fused by passes_of


@functools.lru_cache(maxsize=256)
def passes_of(stages: tuple[Stage, ...]) -> tuple[Pass, ...]:
    """The kernel passes of a chain, each threshold fused into the pass before it."""
    passes: list[Pass] = []
    for stage in stages:
        if isinstance(stage, Threshold):
            if not passes or passes[-1].threshold is not None:
                passes.append(Pass("point"))
            passes[-1] = passes[-1].with_threshold(stage)
        else:
            passes.extend(_lowered(stage))
    return tuple(passes)


class _Held:
    """A backend's float32 scratch frames (by stream and size) and weight arrays."""

    def __init__(self) -> None:
        self.scratch: Lru[tuple[Any, ...]] = Lru(8)
        self.weights: Lru[Any] = Lru(64)


_held = per_backend(_Held)


def _scratch(held: _Held, stream: Any, n: int) -> tuple[Any, Any]:
    """Two float32 frames of ``n`` elements for passes on ``stream``."""
    key = (stream.ptr, n)
    pair = held.scratch.get(key, lambda: (cp.empty(n, cp.float32), cp.empty(n, cp.float32)))
    return pair[0], pair[1]


def _weights(held: _Held, weights: tuple[float, ...]) -> Any:
    return held.weights.get(weights, lambda: cp.asarray(weights, dtype=cp.float32))


@cuda.handles(FilterFrames)
def filter_frames(backend: ArrayBackend, op: FilterFrames) -> None:
    """Launch the chain's passes on the current stream; nothing waits for them."""
    n = op.frames * op.height * op.width * op.channels
    held = _held(backend)
    stream = cp.cuda.get_current_stream()
    passes = passes_of(op.stages)
    scratch = _scratch(held, stream, n) if len(passes) > 1 else ()
    src, src_type = backend.array(op.src.buffer_id), op.src.dtype
    grid = (-(-op.width * op.channels // _BLOCK[0]), -(-op.height // _BLOCK[1]), op.frames)
    shape = (cp.int32(op.height), cp.int32(op.width), cp.int32(op.channels))
    for i, step in enumerate(passes):
        last = i == len(passes) - 1
        dst, dst_type = ((backend.array(op.dst.buffer_id), op.dst.dtype) if last
                         else (scratch[i % 2], DType.F32))
        level, low, high = step.threshold or (0.0, 0.0, 0.0)
        epilogue = (cp.int32(step.threshold is not None), cp.float32(level), cp.float32(low),
                    cp.float32(high))
        if step.kind == "corr2d":
            sizes: tuple[Any, ...] = (cp.int32(step.size[0]), cp.int32(step.size[1]))
        elif step.kind in ("corr_rows", "corr_cols"):
            sizes = (cp.int32(step.size[1]),)
        else:
            sizes = ()
        weights = (_weights(held, step.weights),) if step.weights else ()
        _KERNELS.kernel(_expression(step.kind, src_type, dst_type))(
            grid, _BLOCK, (src, dst, *weights, *shape, *sizes, *epilogue), stream=stream)
        src, src_type = dst, dst_type
