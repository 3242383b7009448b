"""cuDNN-shaped convolutions, pooling, softmax, activations, LRN and dropout on array views.

Every handler here is written against ``backend.xp``, so one implementation
serves NumPy on the CPU and CuPy on CUDA; each answers that module's name
(``"numpy"`` or ``"cupy"``). The CUDA backend registers these for everything
but the convolutions, which it runs as cuDNN graphs.

Data are viewed as logical ``(N, C, H, W)`` arrays over the stored layout
(an NHWC buffer is a transposed view), computed in f64 for f64 data and in
f32 otherwise, and written back through the same view with ``alpha`` and
``beta``. Pooling and convolutions loop over the window's offsets, each a
strided slice of the padded image, so no im2col matrix is built.

Dropout's mask is a counter-based hash: element ``i`` is kept when the top 24
bits of ``splitmix64(splitmix64(seed) + i)`` reach ``round(p * 2**24)``. It
uses only wrapping 64-bit integer arithmetic, so NumPy and CuPy give the
same bits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from atomr_accel.backends._base import ArrayBackend, Handler
from atomr_accel.backends._handlers import cpu
from atomr_accel.core._dtype import DType
from atomr_accel.core._op import Op
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._dnn import (
    Activation,
    ActivationBackward,
    ActivationForward,
    Conv2dBackwardData,
    Conv2dBackwardFilter,
    Conv2dForward,
    ConvGeometry,
    DropoutBackward,
    DropoutForward,
    Layout,
    LrnForward,
    Pool2dBackward,
    Pool2dForward,
    PoolMode,
    SoftmaxBackward,
    SoftmaxForward,
    SoftmaxMode,
    image_dims,
)

__all__ = ["SHARED", "dropout_keep", "image", "splitmix64"]

Array = Any  # a NumPy or CuPy array, whichever ``backend.xp`` makes

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def image(backend: ArrayBackend, ref: GpuRef, shape: tuple[int, ...], layout: Layout) -> Array:
    """A writable ``(N, C, H, W)`` view of a buffer stored in ``layout`` (filters too:
    ``(K, C, R, S)`` over KCRS or KRSC storage)."""
    n, c, h, w = shape
    flat = backend.array(ref.buffer_id)[: n * c * h * w]
    if layout is Layout.NCHW:
        return flat.reshape(n, c, h, w)
    return flat.reshape(n, h, w, c).transpose(0, 3, 1, 2)


def _compute(dtype: DType) -> str:
    """The dtype arithmetic runs in: f64 for f64 data, f32 otherwise."""
    return "float64" if dtype is DType.F64 else "float32"


def _store(out: Array, value: Array, alpha: float, beta: float) -> None:
    """``out = alpha * value + beta * out`` (``out`` only written when ``beta == 0``)."""
    result = value if alpha == 1 else alpha * value
    if beta != 0:
        result = result + beta * out.astype(value.dtype)
    out[...] = result.astype(out.dtype)


def _name(backend: ArrayBackend) -> str:
    return str(backend.xp.__name__)


# ----------------------------------------------------------------- convolutions


def _offsets(geo: ConvGeometry) -> Iterator[tuple[int, int, tuple[slice, slice, slice, slice]]]:
    """Each filter tap ``(r, s)`` and the slice of the padded image it meets."""
    _, _, p, q = geo.y_shape
    (sh, sw), (dh, dw) = geo.stride, geo.dilation
    for r in range(geo.w_shape[2]):
        for s in range(geo.w_shape[3]):
            rows = slice(r * dh, r * dh + sh * (p - 1) + 1, sh)
            cols = slice(s * dw, s * dw + sw * (q - 1) + 1, sw)
            yield r, s, (slice(None), slice(None), rows, cols)


def _padded(xp: Any, x: Array, pad: tuple[int, int], fill: float = 0.0) -> Array:
    (ph, pw) = pad
    if ph == 0 and pw == 0:
        return x
    return xp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)


def conv_forward(xp: Any, x: Array, w: Array, geo: ConvGeometry) -> Array:
    """``conv2d(x, w)`` of logical arrays (any xp), in their dtype."""
    n, k, p, q = geo.y_shape
    g, cg = geo.groups, geo.w_shape[1]
    xpad = _padded(xp, x, geo.pad)
    wg = w.reshape(g, k // g, cg, *geo.w_shape[2:])
    y = xp.zeros((n, g, k // g, p, q), dtype=x.dtype)
    for r, s, window in _offsets(geo):
        patch = xpad[window].reshape(n, g, cg, p, q)
        y += xp.einsum("ngchw,gkc->ngkhw", patch, wg[..., r, s], optimize=True)
    return y.reshape(n, k, p, q)


def conv_backward_data(xp: Any, dy: Array, w: Array, geo: ConvGeometry) -> Array:
    """The image gradient of ``conv_forward`` for ``dy``."""
    n, c, h, wd = geo.x_shape
    _, k, p, q = geo.y_shape
    g, cg = geo.groups, geo.w_shape[1]
    ph, pw = geo.pad
    dxpad = xp.zeros((n, c, h + 2 * ph, wd + 2 * pw), dtype=dy.dtype)
    wg = w.reshape(g, k // g, cg, *geo.w_shape[2:])
    dyg = dy.reshape(n, g, k // g, p, q)
    for r, s, window in _offsets(geo):
        part = xp.einsum("ngkhw,gkc->ngchw", dyg, wg[..., r, s], optimize=True)
        dxpad[window] += part.reshape(n, c, p, q)
    return dxpad[:, :, ph:ph + h, pw:pw + wd]


def conv_backward_filter(xp: Any, x: Array, dy: Array, geo: ConvGeometry) -> Array:
    """The filter gradient of ``conv_forward`` for ``dy``."""
    n, _, _, _ = geo.x_shape
    _, k, p, q = geo.y_shape
    g, cg = geo.groups, geo.w_shape[1]
    xpad = _padded(xp, x, geo.pad)
    dyg = dy.reshape(n, g, k // g, p, q)
    dw = xp.zeros((g, k // g, cg, *geo.w_shape[2:]), dtype=x.dtype)
    for r, s, window in _offsets(geo):
        patch = xpad[window].reshape(n, g, cg, p, q)
        dw[..., r, s] = xp.einsum("ngchw,ngkhw->gkc", patch, dyg, optimize=True)
    return dw.reshape(geo.w_shape)


_GRADIENTS: dict[type[Op], Callable[[Any, Array, Array, ConvGeometry], Array]] = {
    Conv2dForward: conv_forward,
    Conv2dBackwardData: conv_backward_data,
    Conv2dBackwardFilter: conv_backward_filter,
}
"""What each convolution op computes from its two inputs."""


@cpu.handles(Conv2dForward, Conv2dBackwardData, Conv2dBackwardFilter)
def conv2d(backend: ArrayBackend,
           op: Conv2dForward | Conv2dBackwardData | Conv2dBackwardFilter) -> str:
    """Write ``alpha * f(a, b) + beta * out`` into the op's output, ``f`` the convolution
    (``y`` from x and w) or its gradient (``dx`` from dy and w, ``dw`` from x and dy)."""
    geo = op.geometry
    a, b, out = op.images(geo)
    ct = _compute(a.ref.dtype)
    first = image(backend, a.ref, a.shape, op.layout).astype(ct)
    second = image(backend, b.ref, b.shape, op.layout).astype(ct)
    target = image(backend, out.ref, out.shape, op.layout)
    _store(target, _GRADIENTS[type(op)](backend.xp, first, second, geo), op.alpha, op.beta)
    return _name(backend)


# ---------------------------------------------------------------------- pooling


def _pool_windows(op: Pool2dForward | Pool2dBackward) -> Iterator[tuple[slice, ...]]:
    """The slice of the padded image each window offset meets, in row-major order."""
    _, _, p, q = op.y_shape
    sh, sw = op.stride
    for i in range(op.kernel[0]):
        for j in range(op.kernel[1]):
            yield (slice(None), slice(None), slice(i, i + sh * (p - 1) + 1, sh),
                   slice(j, j + sw * (q - 1) + 1, sw))


def _divisor(xp: Any, op: Pool2dForward | Pool2dBackward, ct: str) -> Array | float:
    """What each window's sum is divided by: the window's size, or (excluding padding)
    the count of its in-bounds elements, shaped ``(P, Q)``."""
    if op.mode is PoolMode.AVG_INCLUDE_PADDING:
        return float(op.kernel[0] * op.kernel[1])
    _, _, h, w = op.x_shape
    ones = _padded(xp, xp.ones((1, 1, h, w), dtype=ct), (op.pad[0], op.pad[1]))
    count = sum(ones[window] for window in _pool_windows(op))
    return count[0, 0]


def _pool_max(xp: Any, xpad: Array, op: Pool2dForward | Pool2dBackward) -> Array:
    best = None
    for window in _pool_windows(op):
        best = xpad[window] if best is None else xp.maximum(best, xpad[window])
    return best


def pool2d_forward(backend: ArrayBackend, op: Pool2dForward) -> str:
    """Write ``alpha * pool(x) + beta * y`` into ``y``."""
    xp, ct = backend.xp, _compute(op.x.dtype)
    x = image(backend, op.x, op.x_shape, op.layout).astype(ct)
    y = image(backend, op.y, op.y_shape, op.layout)
    pad = (op.pad[0], op.pad[1])
    if op.mode is PoolMode.MAX:
        result = _pool_max(xp, _padded(xp, x, pad, -math.inf), op)
    else:
        xpad = _padded(xp, x, pad)
        result = sum(xpad[window] for window in _pool_windows(op)) / _divisor(xp, op, ct)
    _store(y, result, op.alpha, op.beta)
    return _name(backend)


def pool2d_backward(backend: ArrayBackend, op: Pool2dBackward) -> str:
    """Write ``alpha * dL/dx + beta * dx`` into ``dx``."""
    xp, ct = backend.xp, _compute(op.x.dtype)
    n, c, h, w = op.x_shape
    ph, pw = op.pad
    dy = image(backend, op.dy, op.y_shape, op.layout).astype(ct)
    dxpad = xp.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=ct)
    if op.mode is PoolMode.MAX:
        xpad = _padded(xp, image(backend, op.x, op.x_shape, op.layout).astype(ct), (ph, pw),
                       -math.inf)
        best = _pool_max(xp, xpad, op)
        taken = xp.zeros(best.shape, dtype=bool)
        for window in _pool_windows(op):
            hit = (xpad[window] == best) & ~taken
            dxpad[window] += xp.where(hit, dy, 0)
            taken |= hit
    else:
        share = dy / _divisor(xp, op, ct)
        for window in _pool_windows(op):
            dxpad[window] += share
    dx = image(backend, op.dx, op.x_shape, op.layout)
    _store(dx, dxpad[:, :, ph:ph + h, pw:pw + w], op.alpha, op.beta)
    return _name(backend)


# ---------------------------------------------------------------------- softmax


def _softmax_axes(mode: SoftmaxMode) -> tuple[int, ...]:
    return (1,) if mode is SoftmaxMode.CHANNEL else (1, 2, 3)


def softmax_forward(backend: ArrayBackend, op: SoftmaxForward) -> str:
    """Write ``alpha * softmax(x) + beta * y`` (or log-softmax) into ``y``."""
    xp, dims = backend.xp, image_dims(op.dims)
    x = image(backend, op.x, dims, op.layout).astype(_compute(op.x.dtype))
    axes = _softmax_axes(op.mode)
    shifted = x - x.max(axis=axes, keepdims=True)
    e = xp.exp(shifted)
    total = e.sum(axis=axes, keepdims=True)
    result = shifted - xp.log(total) if op.log else e / total
    _store(image(backend, op.y, dims, op.layout), result, op.alpha, op.beta)
    return _name(backend)


def softmax_backward(backend: ArrayBackend, op: SoftmaxBackward) -> str:
    """Write ``alpha * dL/dx + beta * dx`` into ``dx`` from the forward output ``y``."""
    xp, dims, ct = backend.xp, image_dims(op.dims), _compute(op.y.dtype)
    y = image(backend, op.y, dims, op.layout).astype(ct)
    dy = image(backend, op.dy, dims, op.layout).astype(ct)
    axes = _softmax_axes(op.mode)
    if op.log:
        result = dy - xp.exp(y) * dy.sum(axis=axes, keepdims=True)
    else:
        result = y * (dy - (dy * y).sum(axis=axes, keepdims=True))
    _store(image(backend, op.dx, dims, op.layout), result, op.alpha, op.beta)
    return _name(backend)


# ------------------------------------------------------------------ activations


def _erf(xp: Any) -> Any:
    """``erf`` for the array module: SciPy's or CuPy's special function."""
    if xp.__name__ == "numpy":
        import scipy.special

        return scipy.special.erf
    import cupyx.scipy.special

    return cupyx.scipy.special.erf


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715


def _sigmoid(xp: Any, x: Array) -> Array:
    return 0.5 * (1.0 + xp.tanh(0.5 * x))  # no overflow for large |x|


def activate(xp: Any, kind: Activation, x: Array, coef: float) -> Array:
    """``f(x)`` for one activation (``x`` in its compute dtype)."""
    if kind is Activation.RELU:
        return xp.maximum(x, 0)
    if kind is Activation.CLIPPED_RELU:
        return xp.clip(x, 0, coef)
    if kind is Activation.SIGMOID:
        return _sigmoid(xp, x)
    if kind is Activation.TANH:
        return xp.tanh(x)
    if kind is Activation.GELU:
        return 0.5 * x * (1.0 + _erf(xp)(x / math.sqrt(2.0)))
    if kind is Activation.GELU_APPROX:
        return 0.5 * x * (1.0 + xp.tanh(_SQRT_2_OVER_PI * (x + _GELU_C * x**3)))
    if kind is Activation.SWISH:
        return x * _sigmoid(xp, coef * x)
    if kind is Activation.ELU:
        return xp.where(x > 0, x, coef * xp.expm1(xp.minimum(x, 0)))
    if kind is Activation.SOFTPLUS:
        return xp.logaddexp(0, x)
    return x.copy()


def derivative(xp: Any, kind: Activation, x: Array, coef: float) -> Array:
    """``f'(x)`` for one activation."""
    if kind is Activation.RELU:
        return (x > 0).astype(x.dtype)
    if kind is Activation.CLIPPED_RELU:
        return ((x > 0) & (x < coef)).astype(x.dtype)
    if kind is Activation.SIGMOID:
        s = _sigmoid(xp, x)
        return s * (1.0 - s)
    if kind is Activation.TANH:
        return 1.0 - xp.tanh(x) ** 2
    if kind is Activation.GELU:
        cdf = 0.5 * (1.0 + _erf(xp)(x / math.sqrt(2.0)))
        return cdf + x * xp.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    if kind is Activation.GELU_APPROX:
        t = xp.tanh(_SQRT_2_OVER_PI * (x + _GELU_C * x**3))
        inner = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_C * x * x)
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * inner
    if kind is Activation.SWISH:
        s = _sigmoid(xp, coef * x)
        return s + coef * x * s * (1.0 - s)
    if kind is Activation.ELU:
        return xp.where(x > 0, 1.0, coef * xp.exp(xp.minimum(x, 0))).astype(x.dtype)
    if kind is Activation.SOFTPLUS:
        return _sigmoid(xp, x)
    return xp.ones_like(x)


def _flat(backend: ArrayBackend, ref: GpuRef, count: int) -> Array:
    return backend.array(ref.buffer_id)[:count]


def activation_forward(backend: ArrayBackend, op: ActivationForward) -> str:
    """Write ``alpha * f(x) + beta * y`` into ``y``."""
    count = math.prod(op.dims)
    x = _flat(backend, op.x, count).astype(_compute(op.x.dtype))
    _store(_flat(backend, op.y, count), activate(backend.xp, op.kind, x, op.coef), op.alpha,
           op.beta)
    return _name(backend)


def activation_backward(backend: ArrayBackend, op: ActivationBackward) -> str:
    """Write ``alpha * f'(x) * dy + beta * dx`` into ``dx``."""
    count, ct = math.prod(op.dims), _compute(op.x.dtype)
    x = _flat(backend, op.x, count).astype(ct)
    dy = _flat(backend, op.dy, count).astype(ct)
    result = derivative(backend.xp, op.kind, x, op.coef) * dy
    _store(_flat(backend, op.dx, count), result, op.alpha, op.beta)
    return _name(backend)


# ---------------------------------------------------------------------- dropout


def splitmix64(xp: Any, z: Array) -> Array:
    """SplitMix64's output function of ``z + gamma`` on uint64 arrays (wrapping)."""
    u = xp.uint64
    z = z + u(_GAMMA)
    z = (z ^ (z >> u(30))) * u(_MIX1)
    z = (z ^ (z >> u(27))) * u(_MIX2)
    return z ^ (z >> u(31))


def _splitmix64_int(z: int) -> int:
    z = (z + _GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def dropout_keep(xp: Any, key: Any, count: int, probability: float) -> Array:
    """Which of ``count`` elements dropout keeps (a bool array), from ``(key, index)``;
    ``key`` is ``splitmix64(seed)``, a uint64 scalar or one-element array."""
    index = xp.arange(count, dtype=xp.uint64)
    bits = splitmix64(xp, index + key)
    return (bits >> xp.uint64(40)) >= xp.uint64(round(probability * (1 << 24)))


def _dropout_key(backend: ArrayBackend, op: DropoutForward) -> Any:
    """``splitmix64`` of the op's seed: of ``seed`` itself, or made on the device from
    ``seeds[seed]`` (nothing read back, so a graph may record it)."""
    xp = backend.xp
    if op.seeds is None:
        return xp.uint64(_splitmix64_int(op.seed))
    return splitmix64(xp, backend.array(op.seeds.buffer_id)[op.seed: op.seed + 1])


def dropout_forward(backend: ArrayBackend, op: DropoutForward) -> str:
    """Write ``x * keep / (1 - p)`` into ``y`` and ``keep`` (0/1) into ``mask``."""
    xp, count = backend.xp, math.prod(op.dims)
    keep = dropout_keep(xp, _dropout_key(backend, op), count, op.probability)
    x = _flat(backend, op.x, count).astype(_compute(op.x.dtype))
    y = _flat(backend, op.y, count)
    y[...] = (xp.where(keep, x, 0) * (1.0 / (1.0 - op.probability))).astype(y.dtype)
    _flat(backend, op.mask, count)[...] = keep.astype(xp.uint8)
    return _name(backend)


def dropout_backward(backend: ArrayBackend, op: DropoutBackward) -> str:
    """Write ``dy * mask / (1 - p)`` into ``dx``."""
    count = math.prod(op.dims)
    dy = _flat(backend, op.dy, count).astype(_compute(op.dy.dtype))
    mask = _flat(backend, op.mask, count)
    dx = _flat(backend, op.dx, count)
    dx[...] = (dy * mask * (1.0 / (1.0 - op.probability))).astype(dx.dtype)
    return _name(backend)


# -------------------------------------------------------------------------- LRN


def lrn_forward(backend: ArrayBackend, op: LrnForward) -> str:
    """Write ``alpha * x / (k + lrn_alpha / n * window_sum(x^2))^lrn_beta + beta * y``."""
    xp, dims = backend.xp, image_dims(op.dims)
    x = image(backend, op.x, dims, op.layout).astype(_compute(op.x.dtype))
    c = dims[1]
    behind = (op.n - 1) // 2
    ahead = op.n - 1 - behind
    squares = xp.pad(x * x, ((0, 0), (behind, ahead), (0, 0), (0, 0)))
    window = sum(squares[:, j:j + c] for j in range(op.n))
    result = x / (op.lrn_k + (op.lrn_alpha / op.n) * window) ** op.lrn_beta
    _store(image(backend, op.y, dims, op.layout), result, op.alpha, op.beta)
    return _name(backend)


SHARED: dict[type[Op], Handler] = {
    Pool2dForward: pool2d_forward,
    Pool2dBackward: pool2d_backward,
    SoftmaxForward: softmax_forward,
    SoftmaxBackward: softmax_backward,
    ActivationForward: activation_forward,
    ActivationBackward: activation_backward,
    DropoutForward: dropout_forward,
    DropoutBackward: dropout_backward,
    LrnForward: lrn_forward,
}
"""The handlers CUDA shares (on CuPy, each behind its cuDNN check); convolutions are its own."""
cpu.register_all(SHARED, quiet=True)  # the element-wise layers of training
