"""``Cudnn`` convolutions, pooling, softmax, activations, dropout and LRN.

CPU tests run a mock device through the public facade and compare each op with
an independent NumPy reference written here (explicit loops over output
positions, not the implementation's loop over filter taps), on random data;
backward ops are also checked by central finite differences of the reference
forward. GPU tests (``-m gpu``) compare the CUDA device with the CPU device run
in float64 on the same (rounded) inputs, and with PyTorch's own ops when
PyTorch imports.

GPU tolerances (normwise relative error): f32 5e-3 (cuDNN may pick TF32
engines for f32 convolutions; PyTorch is run with TF32 off), f16 3e-3, bf16
2e-2 (the output is rounded to 8 bits of mantissa); the composed CuPy ops
compute in f32, so 1e-5 for f32 data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from _splitmix import splitmix64

from atomr_accel import Device, DType, GpuBuffer, InvalidArgument, System
from atomr_accel.core import GpuRef
from atomr_accel.core.ops._dnn import (
    Conv2dForward,
    conv_output_shape,
    pool_output_shape,
)

Arr = np.ndarray[Any, Any]


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("cudnn-conv") as system:
        yield system


@pytest.fixture(scope="module")
def dev(system: System) -> Device:
    return system.spawn_device(mock=True)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def put(dev: Device, array: Arr, dtype: DType) -> GpuBuffer:
    """Upload ``array`` flattened in C order as ``dtype``."""
    data = np.ascontiguousarray(array).reshape(-1).astype(dtype.numpy)
    buf = dev.allocate(data.size, dtype)
    dev.copy_from_numpy(buf, data)
    return buf


def get(dev: Device, buf: GpuBuffer, shape: tuple[int, ...]) -> Arr:
    """Download ``buf`` as float64 of ``shape``."""
    return np.asarray(dev.copy_to_numpy(buf)).astype(np.float64)[: math.prod(shape)] \
        .reshape(shape)


def stored(array: Arr, layout: str) -> Arr:
    """A logical (N, C, H, W) array in its stored order."""
    return array if layout == "NCHW" else array.transpose(0, 2, 3, 1)


def logical(array: Arr, layout: str) -> Arr:
    """A stored array of ``layout`` as logical (N, C, H, W)."""
    return array if layout == "NCHW" else array.transpose(0, 3, 1, 2)


def rounded(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> Arr:
    """Standard normal data rounded to ``dtype``, as float64."""
    return rng.standard_normal(shape).astype(dtype.numpy).astype(np.float64)


def close(got: Arr, want: Arr, tol: float) -> None:
    """Normwise relative error at most ``tol``."""
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert err <= tol, f"relative error {err:.3g} > {tol:g}"


TOL = {DType.F16: 3e-3, DType.F32: 1e-5, DType.F64: 1e-12}


# ------------------------------------------------------------------- references


def conv_ref(x: Arr, w: Arr, pad: tuple[int, int], stride: tuple[int, int],
             dilation: tuple[int, int], groups: int) -> Arr:
    """Convolution by output position: each output pixel is a dot product of its window."""
    n = x.shape[0]
    k, cg, r, s = w.shape
    _, _, p, q = conv_output_shape(x.shape, w.shape, pad, stride, dilation)
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    y = np.zeros((n, k, p, q))
    kg = k // groups
    for g in range(groups):
        for i in range(p):
            for j in range(q):
                top, left = i * stride[0], j * stride[1]
                win = xp[:, g * cg:(g + 1) * cg, top:top + dilation[0] * (r - 1) + 1:dilation[0],
                         left:left + dilation[1] * (s - 1) + 1:dilation[1]]
                y[:, g * kg:(g + 1) * kg, i, j] = np.tensordot(
                    win, w[g * kg:(g + 1) * kg], axes=([1, 2, 3], [1, 2, 3]))
    return y


def numeric_grad(f: Callable[[Arr], float], x: Arr, indices: list[tuple[int, ...]],
                 eps: float = 1e-6) -> list[float]:
    """Central differences of the scalar ``f`` at ``indices`` of ``x``."""
    out = []
    for idx in indices:
        plus, minus = x.copy(), x.copy()
        plus[idx] += eps
        minus[idx] -= eps
        out.append((f(plus) - f(minus)) / (2 * eps))
    return out


def some(rng: np.random.Generator, shape: tuple[int, ...], count: int) -> list[tuple[int, ...]]:
    flat = rng.choice(math.prod(shape), size=count, replace=False)
    return [tuple(int(v) for v in np.unravel_index(i, shape)) for i in flat]


def pool_ref(x: Arr, kernel: tuple[int, int], stride: tuple[int, int], pad: tuple[int, int],
             mode: str) -> Arr:
    """Pooling by output position over explicitly bounded windows."""
    n, c, h, w = x.shape
    _, _, p, q = pool_output_shape(x.shape, kernel, stride, pad)
    y = np.zeros((n, c, p, q))
    for i in range(p):
        for j in range(q):
            top, left = i * stride[0] - pad[0], j * stride[1] - pad[1]
            r0, r1 = max(top, 0), min(top + kernel[0], h)
            c0, c1 = max(left, 0), min(left + kernel[1], w)
            win = x[:, :, r0:r1, c0:c1]
            if mode == "max":
                y[:, :, i, j] = win.max(axis=(2, 3))
            elif mode == "avg_exclude_padding":
                y[:, :, i, j] = win.sum(axis=(2, 3)) / ((r1 - r0) * (c1 - c0))
            else:
                y[:, :, i, j] = win.sum(axis=(2, 3)) / (kernel[0] * kernel[1])
    return y


def softmax_ref(x: Arr, mode: str, log: bool) -> Arr:
    n = x.shape[0]
    if mode == "instance":
        flat = x.reshape(n, -1)
        e = np.exp(flat - flat.max(axis=1, keepdims=True))
        out = e / e.sum(axis=1, keepdims=True)
        return (np.log(out) if log else out).reshape(x.shape)
    out = np.empty_like(x)
    for b in range(n):
        for i in range(x.shape[2]):
            for j in range(x.shape[3]):
                v = x[b, :, i, j]
                e = np.exp(v - v.max())
                out[b, :, i, j] = np.log(e / e.sum()) if log else e / e.sum()
    return out


def _erf(v: Arr) -> Arr:
    return np.vectorize(math.erf)(v)


ACTIVATIONS: dict[str, Callable[[Arr, float], Arr]] = {
    "relu": lambda x, c: np.where(x > 0, x, 0.0),
    "clipped_relu": lambda x, c: np.minimum(np.where(x > 0, x, 0.0), c),
    "sigmoid": lambda x, c: 1 / (1 + np.exp(-x)),
    "tanh": lambda x, c: np.tanh(x),
    "gelu": lambda x, c: x * 0.5 * (1 + _erf(x / np.sqrt(2))),
    "gelu_approx": lambda x, c: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi)
                                                       * (x + 0.044715 * x**3))),
    "swish": lambda x, c: x / (1 + np.exp(-c * x)),
    "silu": lambda x, c: x / (1 + np.exp(-x)),
    "elu": lambda x, c: np.where(x > 0, x, c * (np.exp(x) - 1)),
    "softplus": lambda x, c: np.log(1 + np.exp(x)),
    "identity": lambda x, c: x,
}


def lrn_ref(x: Arr, n: int, a: float, b: float, k: float) -> Arr:
    """cuDNN's LRN: channels [c - floor((n-1)/2), c + n - 1 - floor((n-1)/2)] that exist."""
    out = np.empty_like(x)
    channels = x.shape[1]
    behind = (n - 1) // 2
    for c in range(channels):
        lo, hi = max(0, c - behind), min(channels - 1, c + n - 1 - behind)
        total = (x[:, lo:hi + 1] ** 2).sum(axis=1)
        out[:, c] = x[:, c] / (k + a / n * total) ** b
    return out


# ----------------------------------------------------------------- convolutions

CONV_CASES = [  # x_shape, w_shape, pad, stride, dilation, groups
    ((2, 4, 7, 6), (5, 4, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((2, 4, 8, 7), (6, 2, 3, 2), (1, 0), (2, 1), (1, 1), 2),
    ((1, 3, 9, 9), (4, 3, 3, 3), (2, 1), (1, 2), (2, 1), 1),
    ((2, 6, 5, 5), (6, 1, 3, 3), (1, 1), (1, 1), (1, 1), 6),
]


def _conv_case(case: Any, rng: np.random.Generator, dtype: DType) -> tuple[Any, ...]:
    x_shape, w_shape, pad, stride, dilation, groups = case
    y_shape = conv_output_shape(x_shape, w_shape, pad, stride, dilation)
    x, w = rounded(rng, x_shape, dtype), rounded(rng, w_shape, dtype)
    dy = rounded(rng, y_shape, dtype)
    return x, w, dy, y_shape, dict(pad=pad, stride=stride, dilation=dilation, groups=groups)


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [DType.F32, DType.F64])
def test_conv2d_forward_and_backward(dev: Device, rng: np.random.Generator, case: Any,
                                     layout: str, dtype: DType) -> None:
    x, w, dy, y_shape, opts = _conv_case(case, rng, dtype)
    cudnn = dev.cudnn()
    bx, bw, bdy = (put(dev, stored(a, layout), dtype) for a in (x, w, dy))
    by, bdx, bdw = (dev.allocate(a.size, dtype) for a in (dy, x, w))
    path = cudnn.conv2d_fwd(bx, bw, by, x.shape, w.shape, y_shape, opts["pad"], opts["stride"],
                            opts["dilation"], opts["groups"], layout=layout)
    assert path == "numpy"
    want = conv_ref(x, w, **opts)
    close(logical(get(dev, by, stored(want, layout).shape), layout), want, TOL[dtype])

    cudnn.conv2d_bwd_data(bdy, bw, bdx, y_shape, w.shape, x.shape, **opts, layout=layout)
    dx = logical(get(dev, bdx, stored(x, layout).shape), layout)
    cudnn.conv2d_bwd_filter(bx, bdy, bdw, x.shape, y_shape, w.shape, **opts, layout=layout)
    dw = logical(get(dev, bdw, stored(w, layout).shape), layout)

    def loss_x(v: Arr) -> float:
        return float((conv_ref(v, w, **opts) * dy).sum())

    def loss_w(v: Arr) -> float:
        return float((conv_ref(x, v, **opts) * dy).sum())

    for grad, point, loss in ((dx, x, loss_x), (dw, w, loss_w)):
        where = some(rng, point.shape, 4)
        numeric = numeric_grad(loss, point, where)
        got = [grad[i] for i in where]
        np.testing.assert_allclose(got, numeric, rtol=1e-4 if dtype is DType.F32 else 1e-6,
                                   atol=1e-4 if dtype is DType.F32 else 1e-6)
    # the whole gradients: linearity makes <conv(x, w), dy> = <x, dx> = <w, dw>
    inner = float((want * dy).sum())
    np.testing.assert_allclose([(x * dx).sum(), (w * dw).sum()], [inner, inner],
                               rtol=1e-4 if dtype is DType.F32 else 1e-10)


def test_conv2d_alpha_beta_and_original_form(dev: Device, rng: np.random.Generator) -> None:
    x, w, _, y_shape, opts = _conv_case(CONV_CASES[0], rng, DType.F32)
    old = rounded(rng, y_shape, DType.F32)
    cudnn = dev.cudnn()
    bx, bw, by = put(dev, x, DType.F32), put(dev, w, DType.F32), put(dev, old, DType.F32)
    cudnn.conv2d_fwd_f32(bx, bw, by, x.shape, w.shape, y_shape, (1, 1), (1, 1), (1, 1), 1,
                         0.5, 2.0)
    close(get(dev, by, y_shape), 0.5 * conv_ref(x, w, **opts) + 2.0 * old, 1e-5)
    cudnn.conv2d_fwd_f32(bx, bw, by, x.shape, w.shape, y_shape, (1, 1), autotune=True)
    close(get(dev, by, y_shape), conv_ref(x, w, **opts), 1e-5)  # the CPU ignores autotune


def test_conv2d_backward_data_full_reference(dev: Device, rng: np.random.Generator) -> None:
    """dx against the transposed convolution written as a scatter over output pixels."""
    x, w, dy, y_shape, opts = _conv_case(CONV_CASES[1], rng, DType.F64)
    pad, stride, groups = opts["pad"], opts["stride"], opts["groups"]
    bdy, bw = put(dev, dy, DType.F64), put(dev, w, DType.F64)
    bdx = dev.allocate(x.size, DType.F64)
    dev.cudnn().conv2d_bwd_data(bdy, bw, bdx, y_shape, w.shape, x.shape, **opts)
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    kg = k // groups
    dxp = np.zeros((n, c, h + 2 * pad[0], wd + 2 * pad[1]))
    for g in range(groups):
        for i in range(y_shape[2]):
            for j in range(y_shape[3]):
                top, left = i * stride[0], j * stride[1]
                dxp[:, g * cg:(g + 1) * cg, top:top + r, left:left + s] += np.tensordot(
                    dy[:, g * kg:(g + 1) * kg, i, j], w[g * kg:(g + 1) * kg], axes=(1, 0))
    want = dxp[:, :, pad[0]:pad[0] + h, pad[1]:pad[1] + wd]
    close(get(dev, bdx, x.shape), want, 1e-12)


# ---------------------------------------------------------------------- pooling

POOL_CASES = [  # x_shape, kernel, stride, pad
    ((2, 3, 7, 6), (2, 2), (2, 2), (0, 0)),
    ((2, 3, 7, 7), (3, 3), (2, 2), (1, 1)),
    ((1, 2, 6, 8), (3, 2), (1, 2), (1, 0)),
]


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("mode", ["max", "avg", "average", "AverageInclude",
                                  "avg_exclude_padding"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pool2d(dev: Device, rng: np.random.Generator, case: Any, mode: str,
                layout: str) -> None:
    x_shape, kernel, stride, pad = case
    canonical = mode if mode in ("max", "avg_exclude_padding") else "avg"
    y_shape = pool_output_shape(x_shape, kernel, stride, pad)
    x = rng.standard_normal(x_shape)
    dy = rng.standard_normal(y_shape)
    cudnn = dev.cudnn()
    bx, bdy = put(dev, stored(x, layout), DType.F64), put(dev, stored(dy, layout), DType.F64)
    by, bdx = dev.allocate(dy.size, DType.F64), dev.allocate(x.size, DType.F64)
    assert cudnn.pool2d_fwd(bx, by, x_shape, y_shape, kernel, stride, pad, mode,
                            layout=layout) == "numpy"
    y = logical(get(dev, by, stored(dy, layout).shape), layout)
    close(y, pool_ref(x, kernel, stride, pad, canonical), 1e-12)
    cudnn.pool2d_bwd(bx, by, bdy, bdx, x_shape, y_shape, kernel, stride, pad, mode,
                     layout=layout)
    dx = logical(get(dev, bdx, stored(x, layout).shape), layout)
    where = some(rng, x_shape, 6)
    numeric = numeric_grad(
        lambda v: float((pool_ref(v, kernel, stride, pad, canonical) * dy).sum()), x, where)
    np.testing.assert_allclose([dx[i] for i in where], numeric, rtol=1e-6, atol=1e-6)
    if canonical != "max":  # linear: the adjoint identity checks every element
        np.testing.assert_allclose((x * dx).sum(), (y * dy).sum(), rtol=1e-10)


def test_pool2d_f32_alpha_beta(dev: Device, rng: np.random.Generator) -> None:
    x_shape, kernel, stride, pad = POOL_CASES[1]
    y_shape = pool_output_shape(x_shape, kernel, stride, pad)
    x, old = rng.standard_normal(x_shape), rng.standard_normal(y_shape)
    bx, by = put(dev, x, DType.F32), put(dev, old, DType.F32)
    dev.cudnn().pool2d_fwd_f32(bx, by, x_shape, y_shape, kernel, stride, pad, "max", 2.0, -1.0)
    want = 2.0 * pool_ref(x.astype(np.float32), kernel, stride, pad, "max") \
        - old.astype(np.float32)
    close(get(dev, by, y_shape), want, 1e-6)


# ---------------------------------------------------------------------- softmax


@pytest.mark.parametrize("mode", ["channel", "instance"])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_softmax(dev: Device, rng: np.random.Generator, mode: str, log: bool,
                 layout: str) -> None:
    dims = (2, 5, 3, 2)
    x, dy = rng.standard_normal(dims) * 3, rng.standard_normal(dims)
    cudnn = dev.cudnn()
    bx, bdy = put(dev, stored(x, layout), DType.F64), put(dev, stored(dy, layout), DType.F64)
    by, bdx = dev.allocate(x.size, DType.F64), dev.allocate(x.size, DType.F64)
    assert cudnn.softmax_fwd(bx, by, dims, mode, log=log, layout=layout) == "numpy"
    y = logical(get(dev, by, stored(x, layout).shape), layout)
    close(y, softmax_ref(x, mode, log), 1e-12)
    cudnn.softmax_bwd(by, bdy, bdx, dims, mode, log=log, layout=layout)
    dx = logical(get(dev, bdx, stored(x, layout).shape), layout)
    every = [tuple(int(v) for v in i) for i in np.ndindex(*dims)]
    numeric = numeric_grad(lambda v: float((softmax_ref(v, mode, log) * dy).sum()), x, every)
    np.testing.assert_allclose(dx.reshape(-1), numeric, rtol=1e-6, atol=1e-7)


def test_softmax_f32_on_logits_in_place(dev: Device, rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 10)) * 5
    buf = put(dev, x, DType.F32)
    dev.cudnn().softmax_fwd_f32(buf, buf, (4, 10))
    close(get(dev, buf, (4, 10)), softmax_ref(x.astype(np.float32).reshape(4, 10, 1, 1),
                                              "channel", False).reshape(4, 10), 1e-6)


# ------------------------------------------------------------------ activations


@pytest.mark.parametrize("kind", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [DType.F32, DType.F64])
def test_activation_forward_and_backward(dev: Device, rng: np.random.Generator, kind: str,
                                         dtype: DType) -> None:
    dims = (3, 4, 5)
    x = rng.standard_normal(dims) * 2
    x[np.abs(x) < 1e-2] += 0.1  # keep finite differences off relu's kink
    coef = 0.7 if kind in ("swish", "elu", "clipped_relu") else 1.0
    x = x.astype(dtype.numpy).astype(np.float64)
    if kind == "clipped_relu":
        x[np.abs(x - coef) < 1e-2] += 0.05
    dy = rng.standard_normal(dims)
    cudnn = dev.cudnn()
    bx, bdy = put(dev, x, dtype), put(dev, dy, dtype)
    by, bdx = dev.allocate(x.size, dtype), dev.allocate(x.size, dtype)
    assert cudnn.activation_fwd(bx, by, dims, kind, coef=coef) == "numpy"
    f = ACTIVATIONS[kind]
    close(get(dev, by, dims), f(x, coef), TOL[dtype] * 5)
    cudnn.activation_bwd(bx, bdy, bdx, dims, kind, coef=coef)
    h = 1e-6
    numeric = (f(x + h, coef) - f(x - h, coef)) / (2 * h)
    dy_stored = dy.astype(dtype.numpy).astype(np.float64)
    close(get(dev, bdx, dims), numeric * dy_stored, 1e-5 if dtype is DType.F32 else 1e-8)


def test_activation_alpha_beta_in_place(dev: Device, rng: np.random.Generator) -> None:
    x = rng.standard_normal(50)
    buf = put(dev, x, DType.F64)
    dev.cudnn().activation_fwd(buf, buf, (50,), "tanh", 2.0, 0.5)
    close(get(dev, buf, (50,)), 2.0 * np.tanh(x) + 0.5 * x, 1e-12)


# ---------------------------------------------------------------------- dropout


def test_dropout_is_a_function_of_the_seed(dev: Device, rng: np.random.Generator) -> None:
    count, p = 20000, 0.3
    x = rng.standard_normal(count)
    cudnn = dev.cudnn()
    bx = put(dev, x, DType.F32)
    outs = []
    for seed in (11, 11, 12):
        by, bm = dev.allocate(count, DType.F32), dev.allocate(count, DType.U8)
        assert cudnn.dropout_fwd(bx, by, bm, (count,), p, seed) == "numpy"
        outs.append((get(dev, by, (count,)), np.asarray(dev.copy_to_numpy(bm))))
    (y1, m1), (y2, m2), (_, m3) = outs
    np.testing.assert_array_equal(m1, m2)
    np.testing.assert_array_equal(y1, y2)
    assert (m1 != m3).mean() > 0.3
    assert set(np.unique(m1)) <= {0, 1}
    assert abs(m1.mean() - (1 - p)) < 0.02
    x32 = x.astype(np.float32).astype(np.float64)
    close(y1, x32 * m1 / (1 - p), 1e-6)
    # the documented hash, in plain Python integers
    key = splitmix64(11)
    threshold = round(p * (1 << 24))
    for i in (0, 1, 2, 777, count - 1):
        keep = (splitmix64((key + i) & ((1 << 64) - 1)) >> 40) >= threshold
        assert m1[i] == int(keep)
    dy = rng.standard_normal(count)
    bdy, bdx = put(dev, dy, DType.F32), dev.allocate(count, DType.F32)
    cudnn.dropout_bwd(bdy, bm, bdx, (count,), p)
    close(get(dev, bdx, (count,)), dy.astype(np.float32) * m3 / (1 - p), 1e-6)


# -------------------------------------------------------------------------- LRN


@pytest.mark.parametrize("n", [1, 3, 4, 5])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_lrn(dev: Device, rng: np.random.Generator, n: int, layout: str) -> None:
    dims = (2, 7, 3, 4)
    x = rng.standard_normal(dims) * 2
    bx = put(dev, stored(x, layout), DType.F64)
    by = dev.allocate(x.size, DType.F64)
    args = (n, 0.3, 0.75, 1.5)
    assert dev.cudnn().lrn_fwd(bx, by, dims, *args, layout=layout) == "numpy"
    close(logical(get(dev, by, stored(x, layout).shape), layout), lrn_ref(x, *args), 1e-12)


def test_lrn_original_defaults(dev: Device, rng: np.random.Generator) -> None:
    dims = (2, 6, 2, 2)
    x = rng.standard_normal(dims) * 10
    bx, by = put(dev, x, DType.F32), dev.allocate(x.size, DType.F32)
    dev.cudnn().lrn_fwd_f32(bx, by, dims)
    close(get(dev, by, dims), lrn_ref(x.astype(np.float32), 5, 1e-4, 0.75, 2.0), 1e-6)


# -------------------------------------------------------------------- bad input


def test_bad_input_is_refused_and_the_device_keeps_serving(dev: Device) -> None:
    cudnn = dev.cudnn()
    x, w = dev.allocate(2 * 4 * 7 * 6, DType.F32), dev.allocate(5 * 4 * 9, DType.F32)
    y = dev.allocate(2 * 5 * 7 * 6, DType.F32)
    x64 = dev.allocate(2 * 4 * 7 * 6, DType.F64)
    good = ((2, 4, 7, 6), (5, 4, 3, 3), (2, 5, 7, 6))
    with pytest.raises(InvalidArgument, match="y_shape"):
        cudnn.conv2d_fwd(x, w, y, good[0], good[1], (2, 5, 5, 4), (1, 1))
    with pytest.raises(InvalidArgument, match="channels"):
        cudnn.conv2d_fwd(x, w, y, good[0], (5, 3, 3, 3), good[2], (1, 1))
    with pytest.raises(InvalidArgument, match="dtype"):
        cudnn.conv2d_fwd(x64, w, y, *good, (1, 1))
    with pytest.raises(InvalidArgument):  # DTypeMismatch: the f32 form takes f32 buffers
        cudnn.conv2d_fwd_f32(x64, w, y, *good, (1, 1))
    with pytest.raises(InvalidArgument, match="needs"):
        cudnn.conv2d_fwd(x, w, y, (2, 4, 8, 6), good[1], (2, 5, 8, 6), (1, 1))
    with pytest.raises(InvalidArgument, match="layout"):
        cudnn.conv2d_fwd(x, w, y, *good, (1, 1), layout="NWHC")
    with pytest.raises(InvalidArgument, match="share"):
        cudnn.conv2d_fwd(x, w, x, (2, 4, 7, 6), (4, 4, 3, 3), (2, 4, 7, 6), (1, 1))
    with pytest.raises(InvalidArgument, match="mode"):
        cudnn.pool2d_fwd(x, y, (2, 4, 7, 6), (2, 4, 3, 3), mode="median")
    with pytest.raises(InvalidArgument, match="y_shape"):
        cudnn.pool2d_fwd(x, y, (2, 4, 7, 6), (2, 4, 4, 3))
    with pytest.raises(InvalidArgument, match="kind"):
        cudnn.activation_fwd(x, y, (10,), "leaky")
    with pytest.raises(InvalidArgument, match="mode"):
        cudnn.softmax_fwd(x, y, (2, 4), "spatial")
    with pytest.raises(InvalidArgument, match="probability"):
        cudnn.dropout_fwd(x, y, dev.allocate(8, DType.U8), (8,), 1.0)
    with pytest.raises(InvalidArgument, match="mask"):
        cudnn.dropout_fwd(x, y, dev.allocate(8, DType.F32), (8,), 0.5)
    with pytest.raises(InvalidArgument, match="n must"):
        cudnn.lrn_fwd(x, y, (2, 4, 7, 6), 17)
    with pytest.raises(InvalidArgument, match="options"):
        cudnn.conv2d_fwd(x, w, y, *good, (1, 1), padding=(1, 1))
    # still serving
    xs = np.arange(8, dtype=np.float32) - 4
    buf = put(dev, xs, DType.F32)
    cudnn.activation_fwd_f32(buf, buf, (8,))
    np.testing.assert_array_equal(dev.copy_to_numpy(buf), np.maximum(xs, 0))


def test_op_is_checked_when_built_directly() -> None:
    ref = GpuRef(0, 1, DType.F32, 1000, 0)
    op = Conv2dForward(ref, GpuRef(0, 2, DType.F32, 1000, 0), GpuRef(0, 3, DType.F32, 1000, 0),
                       (1, 2, 5, 5), (3, 2, 3, 3), (1, 3, 3, 3))
    op.validate()
    with pytest.raises(InvalidArgument, match="stride"):
        Conv2dForward(ref, ref, ref, (1, 2, 5, 5), (3, 2, 3, 3), (1, 3, 3, 3),
                      stride=(0, 1)).validate()


# ========================================================================= GPU


@pytest.fixture(scope="module")
def gpu(system: System) -> Device:
    return system.spawn_device(mock=False)


def torch_or_none() -> Any:
    """PyTorch on CUDA with TF32 off, or None where it does not import."""
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch


def twin(gpu: Device, dev: Device, dtype: DType, inputs: list[Arr], outputs: list[int],
         call: Callable[..., str], out_dtypes: list[DType] | None = None,
         ) -> tuple[str, list[Arr], list[Arr]]:
    """Run ``call(cudnn, *inputs, *outputs)`` on the GPU in ``dtype`` and on the CPU in f64
    (same rounded inputs); answer the GPU's path and both devices' outputs in float64."""
    results = []
    path = ""
    for device, kind in ((gpu, dtype), (dev, DType.F64)):
        bufs = [put(device, a, kind) for a in inputs]
        kinds = out_dtypes or [kind] * len(outputs)
        outs = [device.allocate(n, kind if k is not DType.U8 else k)
                for n, k in zip(outputs, kinds, strict=True)]
        answer = call(device.cudnn(), *bufs, *outs)
        if device is gpu:
            path = answer
        results.append([np.asarray(device.copy_to_numpy(b)).astype(np.float64) for b in outs])
    return path, results[0], results[1]


GPU_TOL = {DType.F32: 5e-3, DType.F16: 3e-3, DType.BF16: 2e-2}
GPU_EW_TOL = {DType.F32: 1e-5, DType.F16: 2e-3, DType.BF16: 1.5e-2}
GPU_CONV = [(0, "NCHW", DType.F32), (1, "NCHW", DType.F32), (2, "NCHW", DType.F32),
            (3, "NCHW", DType.F32), (0, "NHWC", DType.F32), (1, "NHWC", DType.F32),
            (2, "NHWC", DType.F32), (3, "NHWC", DType.F32), (0, "NHWC", DType.F16),
            (1, "NHWC", DType.F16), (0, "NHWC", DType.BF16), (1, "NHWC", DType.BF16),
            (3, "NHWC", DType.BF16), (2, "NCHW", DType.BF16)]


@pytest.mark.gpu
@pytest.mark.parametrize(("case", "layout", "dtype"), GPU_CONV)
def test_gpu_conv2d_against_cpu_and_torch(gpu: Device, dev: Device, case: int, layout: str,
                                          dtype: DType) -> None:
    rng = np.random.default_rng(case)
    x, w, dy, y_shape, opts = _conv_case(CONV_CASES[case], rng, dtype)
    sx, sw, sdy = stored(x, layout), stored(w, layout), stored(dy, layout)
    tol = GPU_TOL[dtype]

    def fwd(c: Any, bx: Any, bw: Any, by: Any) -> str:
        return str(c.conv2d_fwd(bx, bw, by, x.shape, w.shape, y_shape, **opts, layout=layout))

    def dgrad(c: Any, bdy: Any, bw: Any, bdx: Any) -> str:
        return str(c.conv2d_bwd_data(bdy, bw, bdx, y_shape, w.shape, x.shape, **opts,
                                     layout=layout))

    def wgrad(c: Any, bx: Any, bdy: Any, bdw: Any) -> str:
        return str(c.conv2d_bwd_filter(bx, bdy, bdw, x.shape, y_shape, w.shape, **opts,
                                       layout=layout))

    got = {}
    for name, inputs, size, call, shape in (
        ("y", [sx, sw], dy.size, fwd, sdy.shape),
        ("dx", [sdy, sw], x.size, dgrad, sx.shape),
        ("dw", [sx, sdy], w.size, wgrad, sw.shape),
    ):
        path, (on_gpu,), (on_cpu,) = twin(gpu, dev, dtype, inputs, [size], call)
        assert path == "cudnn-graph"
        close(on_gpu, on_cpu, tol)
        got[name] = logical(on_gpu.reshape(shape), layout)
    torch = torch_or_none()
    if torch is None:
        return
    tx = torch.tensor(x, dtype=torch.float32, device="cuda", requires_grad=True)
    tw = torch.tensor(w, dtype=torch.float32, device="cuda", requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tw, stride=opts["stride"], padding=opts["pad"],
                                    dilation=opts["dilation"], groups=opts["groups"])
    ty.backward(torch.tensor(dy, dtype=torch.float32, device="cuda"))
    for name, t in (("y", ty), ("dx", tx.grad), ("dw", tw.grad)):
        close(got[name], t.detach().double().cpu().numpy(), tol)


@pytest.mark.gpu
def test_gpu_conv2d_blend_and_refusals(gpu: Device) -> None:
    rng = np.random.default_rng(3)
    x, w, _, y_shape, opts = _conv_case(CONV_CASES[0], rng, DType.F32)
    old = rounded(rng, y_shape, DType.F32)
    bx, bw, by = put(gpu, x, DType.F32), put(gpu, w, DType.F32), put(gpu, old, DType.F32)
    cudnn = gpu.cudnn()
    assert cudnn.is_available()
    assert cudnn.conv2d_fwd_f32(bx, bw, by, x.shape, w.shape, y_shape, (1, 1), (1, 1), (1, 1),
                                1, 0.5, 2.0) == "cudnn-graph+cupy"
    close(get(gpu, by, y_shape), 0.5 * conv_ref(x, w, **opts) + 2.0 * old, 5e-3)
    x64 = put(gpu, x, DType.F64)
    with pytest.raises(InvalidArgument, match="f16, bf16 or f32"):
        cudnn.conv2d_fwd(x64, put(gpu, w, DType.F64), gpu.allocate(old.size, DType.F64),
                         x.shape, w.shape, y_shape, (1, 1))
    with pytest.raises(InvalidArgument, match="y_shape"):
        cudnn.conv2d_fwd(bx, bw, by, x.shape, w.shape, (2, 5, 6, 6), (1, 1))
    assert cudnn.conv2d_fwd(bx, bw, by, x.shape, w.shape, y_shape, (1, 1)) == "cudnn-graph"
    close(get(gpu, by, y_shape), conv_ref(x, w, **opts), 5e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_gpu_conv2d_awaited_again_computes_each_calls_data(gpu: Device, alpha: float) -> None:
    """A convolution that ran once is launched from the caller's event loop (its graph is
    built): 4 ops in flight at a time, each on its own image, three rounds with new images
    each round, plain and blended, each against the reference in float64."""
    import asyncio

    rng = np.random.default_rng(8)
    x, w, _, y_shape, opts = _conv_case(CONV_CASES[0], rng, DType.F32)
    bw = put(gpu, w, DType.F32)
    bxs = [gpu.allocate(x.size, DType.F32) for _ in range(4)]
    bys = [gpu.allocate(math.prod(y_shape), DType.F32) for _ in range(4)]
    cudnn = gpu.cudnn()

    async def one_round() -> list[str]:
        return await asyncio.gather(*(cudnn.conv2d_fwd_async(
            bx, bw, by, x.shape, w.shape, y_shape, **opts, alpha=alpha, beta=1.0 - alpha)
            for bx, by in zip(bxs, bys, strict=True)))

    for _ in range(3):
        images = [rounded(rng, x.shape, DType.F32) for _ in bxs]
        olds = [rounded(rng, y_shape, DType.F32) for _ in bys]
        for buf, data in (*zip(bxs, images, strict=True), *zip(bys, olds, strict=True)):
            gpu.copy_from_numpy(buf, data.reshape(-1).astype(np.float32))
        paths = asyncio.run(one_round())
        assert set(paths) == {"cudnn-graph" if alpha == 1.0 else "cudnn-graph+cupy"}
        for image, old, by in zip(images, olds, bys, strict=True):
            want = alpha * conv_ref(image, w, **opts) + (1.0 - alpha) * old
            close(get(gpu, by, y_shape), want, 5e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16])
@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_gpu_conv2d_autotune(gpu: Device, dev: Device, dtype: DType, alpha: float) -> None:
    """The timed plan choice computes what the heuristic one does, in all three passes,
    plain and blended."""
    rng = np.random.default_rng(21)
    x, w, dy, y_shape, opts = _conv_case(CONV_CASES[1], rng, dtype)
    sx, sw, sdy = stored(x, "NHWC"), stored(w, "NHWC"), stored(dy, "NHWC")
    common = dict(**opts, layout="NHWC", autotune=True, alpha=alpha)

    def fwd(c: Any, bx: Any, bw: Any, by: Any) -> str:
        return str(c.conv2d_fwd(bx, bw, by, x.shape, w.shape, y_shape, **common))

    def dgrad(c: Any, bdy: Any, bw: Any, bdx: Any) -> str:
        return str(c.conv2d_bwd_data(bdy, bw, bdx, y_shape, w.shape, x.shape, **common))

    def wgrad(c: Any, bx: Any, bdy: Any, bdw: Any) -> str:
        return str(c.conv2d_bwd_filter(bx, bdy, bdw, x.shape, y_shape, w.shape, **common))

    for inputs, size, call in (([sx, sw], dy.size, fwd), ([sdy, sw], x.size, dgrad),
                               ([sx, sdy], w.size, wgrad)):
        path, (on_gpu,), (on_cpu,) = twin(gpu, dev, dtype, inputs, [size], call)
        assert path == ("cudnn-graph" if alpha == 1.0 else "cudnn-graph+cupy")
        close(on_gpu, on_cpu, GPU_TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["max", "avg", "avg_exclude_padding"])
@pytest.mark.parametrize(("layout", "dtype"), [("NCHW", DType.F32), ("NHWC", DType.BF16)])
def test_gpu_pool2d(gpu: Device, dev: Device, mode: str, layout: str, dtype: DType) -> None:
    rng = np.random.default_rng(5)
    x_shape, kernel, stride, pad = (2, 8, 9, 9), (3, 3), (2, 2), (1, 1)
    y_shape = pool_output_shape(x_shape, kernel, stride, pad)
    x, dy = rounded(rng, x_shape, dtype), rounded(rng, y_shape, dtype)
    sx, sdy = stored(x, layout), stored(dy, layout)

    def fwd(c: Any, bx: Any, by: Any) -> str:
        return str(c.pool2d_fwd(bx, by, x_shape, y_shape, kernel, stride, pad, mode,
                                layout=layout))

    path, (y_gpu,), (y_cpu,) = twin(gpu, dev, dtype, [sx], [dy.size], fwd)
    assert path == "cupy"
    close(y_gpu, y_cpu, GPU_EW_TOL[dtype])

    def bwd(c: Any, bx: Any, by: Any, bdy: Any, bdx: Any) -> str:
        return str(c.pool2d_bwd(bx, by, bdy, bdx, x_shape, y_shape, kernel, stride, pad, mode,
                                layout=layout))

    _, (dx_gpu,), (dx_cpu,) = twin(gpu, dev, dtype, [sx, y_cpu, sdy], [x.size], bwd)
    close(dx_gpu, dx_cpu, GPU_EW_TOL[dtype])
    torch = torch_or_none()
    if torch is None:
        return
    tx = torch.tensor(x, dtype=torch.float64, device="cuda", requires_grad=True)
    f = torch.nn.functional
    ty = (f.max_pool2d(tx, kernel, stride, pad) if mode == "max" else
          f.avg_pool2d(tx, kernel, stride, pad, count_include_pad=mode == "avg"))
    ty.backward(torch.tensor(dy, dtype=torch.float64, device="cuda"))
    close(logical(y_gpu.reshape(sdy.shape), layout), ty.detach().cpu().numpy(),
          GPU_EW_TOL[dtype])
    close(logical(dx_gpu.reshape(sx.shape), layout), tx.grad.cpu().numpy(), GPU_EW_TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["channel", "instance"])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dtype", [DType.F32, DType.F16])
def test_gpu_softmax(gpu: Device, dev: Device, mode: str, log: bool, dtype: DType) -> None:
    rng = np.random.default_rng(9)
    dims = (3, 10, 4, 5)
    x, dy = rounded(rng, dims, dtype), rounded(rng, dims, dtype)

    def fwd(c: Any, bx: Any, by: Any) -> str:
        return str(c.softmax_fwd(bx, by, dims, mode, log=log))

    path, (y_gpu,), (y_cpu,) = twin(gpu, dev, dtype, [x], [x.size], fwd)
    assert path == "cupy"
    close(y_gpu, y_cpu, GPU_EW_TOL[dtype])
    y = y_cpu.reshape(dims)  # the same y on both, so backward compares like for like

    def bwd(c: Any, by: Any, bdy: Any, bdx: Any) -> str:
        return str(c.softmax_bwd(by, bdy, bdx, dims, mode, log=log))

    _, (dx_gpu,), (dx_cpu,) = twin(gpu, dev, dtype, [y.astype(dtype.numpy).astype(np.float64),
                                                     dy], [x.size], bwd)
    close(dx_gpu, dx_cpu, GPU_EW_TOL[dtype] * 4)
    torch = torch_or_none()
    if torch is None:
        return
    t = torch.tensor(x, dtype=torch.float64, device="cuda")
    flat = t if mode == "channel" else t.reshape(dims[0], -1)
    out = (torch.log_softmax if log else torch.softmax)(flat, dim=1).reshape(dims)
    close(y_gpu.reshape(dims), out.cpu().numpy(), GPU_EW_TOL[dtype])


TORCH_ACT: dict[str, Callable[[Any, Any, float], Any]] = {
    "relu": lambda t, f, c: f.relu(t),
    "clipped_relu": lambda t, f, c: f.hardtanh(t, 0.0, c),
    "sigmoid": lambda t, f, c: t.sigmoid(),
    "tanh": lambda t, f, c: t.tanh(),
    "gelu": lambda t, f, c: f.gelu(t),
    "gelu_approx": lambda t, f, c: f.gelu(t, approximate="tanh"),
    "swish": lambda t, f, c: t * (c * t).sigmoid(),
    "silu": lambda t, f, c: f.silu(t),
    "elu": lambda t, f, c: f.elu(t, c),
    "softplus": lambda t, f, c: f.softplus(t),
    "identity": lambda t, f, c: t,
}


@pytest.mark.gpu
@pytest.mark.parametrize("kind", list(TORCH_ACT))
@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16])
def test_gpu_activation(gpu: Device, dev: Device, kind: str, dtype: DType) -> None:
    rng = np.random.default_rng(11)
    dims = (4, 16, 33)
    x, dy = rounded(rng, dims, dtype) * 2, rounded(rng, dims, dtype)
    x = x.astype(dtype.numpy).astype(np.float64)
    coef = 0.7 if kind in ("swish", "elu", "clipped_relu") else 1.0

    def fwd(c: Any, bx: Any, by: Any) -> str:
        return str(c.activation_fwd(bx, by, dims, kind, coef=coef))

    def bwd(c: Any, bx: Any, bdy: Any, bdx: Any) -> str:
        return str(c.activation_bwd(bx, bdy, bdx, dims, kind, coef=coef))

    path, (y_gpu,), (y_cpu,) = twin(gpu, dev, dtype, [x], [x.size], fwd)
    assert path == "cupy"
    close(y_gpu, y_cpu, GPU_EW_TOL[dtype])
    _, (dx_gpu,), (dx_cpu,) = twin(gpu, dev, dtype, [x, dy], [x.size], bwd)
    close(dx_gpu, dx_cpu, GPU_EW_TOL[dtype])
    torch = torch_or_none()
    if torch is None:
        return
    t = torch.tensor(x, dtype=torch.float64, device="cuda", requires_grad=True)
    out = TORCH_ACT[kind](t, torch.nn.functional, coef)
    out.backward(torch.tensor(dy, dtype=torch.float64, device="cuda"))
    close(y_gpu.reshape(dims), out.detach().cpu().numpy(), GPU_EW_TOL[dtype])
    close(dx_gpu.reshape(dims), t.grad.cpu().numpy(), GPU_EW_TOL[dtype])


@pytest.mark.gpu
def test_gpu_dropout_mask_is_the_cpu_mask(gpu: Device, dev: Device) -> None:
    rng = np.random.default_rng(13)
    count, p = 1 << 20, 0.4
    x = rounded(rng, (count,), DType.F32)

    def fwd(c: Any, bx: Any, by: Any, bm: Any) -> str:
        return str(c.dropout_fwd(bx, by, bm, (count,), p, 2024))

    path, (y_gpu, m_gpu), (y_cpu, m_cpu) = twin(gpu, dev, DType.F32, [x], [count, count], fwd,
                                                out_dtypes=[DType.F32, DType.U8])
    assert path == "cupy"
    np.testing.assert_array_equal(m_gpu, m_cpu)
    assert abs(m_gpu.mean() - (1 - p)) < 0.005
    close(y_gpu, y_cpu, 3e-7)


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "layout"), [(5, "NCHW"), (3, "NHWC"), (4, "NCHW")])
def test_gpu_lrn(gpu: Device, dev: Device, n: int, layout: str) -> None:
    rng = np.random.default_rng(17)
    dims = (2, 12, 5, 6)
    x = rounded(rng, dims, DType.F32) * 3
    args = (n, 0.5, 0.75, 1.0)

    def fwd(c: Any, bx: Any, by: Any) -> str:
        return str(c.lrn_fwd(bx, by, dims, *args, layout=layout))

    path, (y_gpu,), (y_cpu,) = twin(gpu, dev, DType.F32, [stored(x, layout)], [x.size], fwd)
    assert path == "cupy"
    close(y_gpu, y_cpu, 1e-5)
    torch = torch_or_none()
    if torch is None or n % 2 == 0:  # torch centres an even window one channel earlier
        return
    t = torch.tensor(x, dtype=torch.float64, device="cuda")
    want = torch.nn.functional.local_response_norm(t, n, 0.5, 0.75, 1.0).cpu().numpy()
    close(logical(y_gpu.reshape(stored(x, layout).shape), layout), want, 1e-5)
