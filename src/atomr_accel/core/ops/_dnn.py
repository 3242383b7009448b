"""cuDNN-shaped convolutions, pooling, softmax, activations, LRN and dropout.

Conventions shared by every op here:

* Image shapes are always the logical ``(N, C, H, W)``, whatever the layout;
  ``layout`` says how the buffer stores them: ``"NCHW"`` (row-major N, C, H,
  W) or ``"NHWC"`` (channels last). Filters are given as the logical
  ``(K, C / groups, R, S)``; a ``"NCHW"`` filter is stored KCRS, an
  ``"NHWC"`` one KRSC (cuDNN's two filter formats).
* ``alpha`` and ``beta`` blend as in cuDNN: ``out = alpha * result + beta *
  out``; with ``beta == 0`` the output is only written.
* Data are f16, bf16, f32 or f64 (one dtype for every float buffer of an op;
  the dropout mask is u8). The CPU computes f16/bf16 in f32; the CUDA backend
  runs f16/bf16/f32 convolutions through cuDNN graphs with f32 accumulation.
* Each handler answers the name of the path that ran: ``"cudnn-graph"`` for
  cuDNN frontend graphs, ``"cupy"`` for the composed CUDA path, ``"numpy"`` on
  the CPU.

The ``_f32`` forms keep the original package's names, argument order, option
strings and defaults (``conv2d_fwd_f32(x, w, y, x_shape, w_shape, y_shape,
pad=(0, 0), stride=(1, 1), dilation=(1, 1), groups=1, alpha=1.0, beta=0.0,
timeout_secs=60.0)``); the unsuffixed forms take any of the four dtypes.

The library is declared here, with pooling, softmax, activations, dropout and
LRN; the convolutions live in ``_dnn_conv`` and what the ops share (dtypes,
layouts, modes, shape checks) in ``_dnn_common``. This module names them all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._api import Form, Param
from atomr_accel.core._catalogue import declare
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import (
    is_int,
    require,
    require_dtype,
    require_len,
    require_numbers,
)
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._dnn_common import (
    _TIMEOUT,
    DNN_DTYPES,
    Activation,
    Layout,
    PoolMode,
    SoftmaxMode,
    _activation,
    _check_buffers,
    _data,
    _dims,
    _distinct,
    _DnnOp,
    _nchw,
    _pair,
    _pool_mode,
    _softmax_mode,
    image_dims,
)
from atomr_accel.core.ops._dnn_conv import (
    Conv2dBackwardData,
    Conv2dBackwardFilter,
    Conv2dForward,
    ConvGeometry,
    conv_output_shape,
)

__all__ = [
    "DNN_DTYPES",
    "Activation",
    "ActivationBackward",
    "ActivationForward",
    "Conv2dBackwardData",
    "Conv2dBackwardFilter",
    "Conv2dForward",
    "ConvGeometry",
    "DropoutBackward",
    "DropoutForward",
    "Layout",
    "LrnForward",
    "Pool2dBackward",
    "Pool2dForward",
    "PoolMode",
    "SoftmaxBackward",
    "SoftmaxForward",
    "SoftmaxMode",
    "conv_output_shape",
    "image_dims",
    "pool_output_shape",
]

declare("cudnn", "Cudnn",
        "cuDNN-shaped deep-learning ops: convolutions, pooling, normalizations, RNNs, ...",
        rank=10, handle="Cudnn")


# ---------------------------------------------------------------------- pooling


def pool_output_shape(x_shape: tuple[int, ...], kernel: tuple[int, ...] = (2, 2),
                      stride: tuple[int, ...] = (2, 2), pad: tuple[int, ...] = (0, 0),
                      ) -> tuple[int, int, int, int]:
    """The logical output shape of 2-D pooling: ``(N, C, (H + 2 * pad_h - kernel_h) //
    stride_h + 1, ...)``."""
    n, c, h, w = x_shape
    return (n, c, (h + 2 * pad[0] - kernel[0]) // stride[0] + 1,
            (w + 2 * pad[1] - kernel[1]) // stride[1] + 1)


def _pool_geometry(x_shape: tuple[int, ...], y_shape: tuple[int, ...], kernel: tuple[int, ...],
                   stride: tuple[int, ...], pad: tuple[int, ...]) -> tuple[int, int]:
    """Check a pooling's shapes and window; answer the elements of x and of y."""
    x = _nchw("x_shape", x_shape)
    k = _pair("kernel", kernel, 1)
    _pair("stride", stride, 1)
    p = _pair("pad", pad, 0)
    require(p[0] < k[0] and p[1] < k[1], f"pad {pad!r} must be smaller than the kernel {kernel!r}")
    want = pool_output_shape(x, k, stride, p)
    require(want[2] >= 1 and want[3] >= 1, f"the {k[0]}x{k[1]} window does not fit the image")
    if tuple(y_shape) != want:
        raise InvalidArgument(f"y_shape is {y_shape!r} but this pooling's is {want!r}")
    return math.prod(x), math.prod(want)


_POOL_OPTIONS = ("kernel", "stride", "pad", Param("mode", "max", parse=_pool_mode,
                                                   annotation="str"), "alpha", "beta")


def _forms(name: str, params: tuple[str | Param, ...]) -> tuple[Form]:
    """An op's unsuffixed form, with the original's 60 s timeout."""
    return (Form(name, params, timeout=_TIMEOUT, returns="str", timeout_last=True),)


@dataclass(frozen=True)
class _PoolImages:
    """The leading fields of the forward pooling: the image ``x`` and the output ``y``."""

    __slots__ = ()
    x: GpuRef
    y: GpuRef


@dataclass(frozen=True)
class _PoolGrads(_PoolImages):
    """The leading fields of the backward pooling: the forward's, then ``dy`` and ``dx``."""

    __slots__ = ()
    dy: GpuRef
    dx: GpuRef


@dataclass(frozen=True)
class _Pool2d:
    """The fields both poolings end with, after their buffers (``_PoolImages`` or
    ``_PoolGrads``, named after it among an op's bases), and their checks: ``_roles``
    names each buffer field, in field order, with the image (``"x"``) or output (``"y"``)
    whose size it has. A mixin, before ``_DnnOp``."""

    __slots__ = ()
    outputs: ClassVar[tuple[str, ...]]
    _roles: ClassVar[tuple[tuple[str, str], ...]]
    x_shape: tuple[int, ...]
    y_shape: tuple[int, ...]
    kernel: tuple[int, ...] = (2, 2)
    stride: tuple[int, ...] = (2, 2)
    pad: tuple[int, ...] = (0, 0)
    mode: PoolMode = PoolMode.MAX
    alpha: float = 1.0
    beta: float = 0.0
    layout: Layout = Layout.NCHW

    def validate(self) -> None:
        """Check the geometry, then the buffers' dtypes and lengths."""
        nx, ny = _pool_geometry(self.x_shape, self.y_shape, self.kernel, self.stride, self.pad)
        _check_buffers(self, self._roles, {"x": nx, "y": ny}, self.alpha, self.beta)


@dataclass(frozen=True, slots=True)
class Pool2dForward(_Pool2d, _PoolImages, _DnnOp):
    """Pool each channel's image over ``kernel`` windows ``stride`` apart, after ``pad``:
    ``y = alpha * pool(x) + beta * y``.

    ``mode`` is ``"max"`` (padding never wins), ``"avg"`` / ``"average"`` /
    ``"AverageInclude"`` (the window's sum over kernel_h * kernel_w, padding
    counted as zeros) or ``"avg_exclude_padding"`` (the mean of the in-bounds
    elements). ``y_shape`` must be ``pool_output_shape(x_shape, kernel, stride,
    pad)``; ``pad`` must be smaller than ``kernel``. Answers ``"cupy"`` on CUDA
    (the frontend has no pooling node) and ``"numpy"`` on the CPU.
    """

    outputs: ClassVar[tuple[str, ...]] = ("y",)
    _roles = (("x", "x"), ("y", "y"))
    api = _forms("pool2d_fwd", ("x", "y", "x_shape", "y_shape", *_POOL_OPTIONS))


@dataclass(frozen=True, slots=True)
class Pool2dBackward(_Pool2d, _PoolGrads, _DnnOp):
    """The gradient of ``Pool2dForward``: ``dx = alpha * pool^T(dy) + beta * dx``.

    Max pooling sends each window's gradient to the first maximum of the
    window (row-major order), recomputed from ``x``; ``y`` (the forward
    output, as cuDNN's signature has it) must hold ``y_shape`` elements but is
    not read. Averages spread ``dy`` evenly over the window (over its
    in-bounds elements for ``"avg_exclude_padding"``). Answers ``"cupy"`` or
    ``"numpy"``.
    """

    outputs: ClassVar[tuple[str, ...]] = ("dx",)
    _roles = (("x", "x"), ("y", "y"), ("dy", "y"), ("dx", "x"))
    api = _forms("pool2d_bwd", ("x", "y", "dy", "dx", "x_shape", "y_shape", *_POOL_OPTIONS))


# ---------------------------------------------------------------------- softmax

_SOFTMAX_OPTIONS = (Param("mode", "channel", parse=_softmax_mode, annotation="str"),
                    "alpha", "beta")


@dataclass(frozen=True, slots=True)
class SoftmaxForward(_DnnOp):
    """Softmax (or log-softmax with ``log=True``): ``y = alpha * softmax(x) + beta * y``.

    ``dims`` is ``(N, C)``, ``(N, C, H)`` or ``(N, C, H, W)`` (missing sizes
    are 1). ``mode="channel"`` normalizes over C for each (n, h, w);
    ``"instance"`` over C*H*W for each n. Computed stably (the maximum is
    subtracted first). ``y`` may be ``x``. Answers ``"cupy"`` or ``"numpy"``.
    """

    outputs: ClassVar[tuple[str, ...]] = ("y",)
    api = _forms("softmax_fwd", ("x", "y", "dims", *_SOFTMAX_OPTIONS))
    x: GpuRef
    y: GpuRef
    dims: tuple[int, ...]
    mode: SoftmaxMode = SoftmaxMode.CHANNEL
    alpha: float = 1.0
    beta: float = 0.0
    log: bool = False
    layout: Layout = Layout.NCHW

    def validate(self) -> None:
        count = math.prod(image_dims(self.dims))
        _data(self.alpha, self.beta, x=self.x, y=self.y)
        require_len(self.x, count, "x")
        require_len(self.y, count, "y")


@dataclass(frozen=True, slots=True)
class SoftmaxBackward(_DnnOp):
    """The gradient of ``SoftmaxForward`` from its output ``y``: ``dx = alpha * (y * (dy -
    sum(dy * y)))`` (``log=True``: ``dy - exp(y) * sum(dy)``) ``+ beta * dx``, the sums over
    the mode's axes. Answers ``"cupy"`` or ``"numpy"``."""

    outputs: ClassVar[tuple[str, ...]] = ("dx",)
    api = _forms("softmax_bwd", ("y", "dy", "dx", "dims", *_SOFTMAX_OPTIONS))
    y: GpuRef
    dy: GpuRef
    dx: GpuRef
    dims: tuple[int, ...]
    mode: SoftmaxMode = SoftmaxMode.CHANNEL
    alpha: float = 1.0
    beta: float = 0.0
    log: bool = False
    layout: Layout = Layout.NCHW

    def validate(self) -> None:
        count = math.prod(image_dims(self.dims))
        _data(self.alpha, self.beta, y=self.y, dy=self.dy, dx=self.dx)
        for name, ref in (("y", self.y), ("dy", self.dy), ("dx", self.dx)):
            require_len(ref, count, name)
        _distinct(("dx", self.dx), ("y", self.y))


# ------------------------------------------------------------------ activations

_ACTIVATION_OPTIONS = (Param("kind", "relu", parse=_activation, annotation="str"),
                       "alpha", "beta")


def _coef(kind: Activation, coef: float) -> None:
    if not (isinstance(coef, int | float) and not isinstance(coef, bool) and math.isfinite(coef)):
        raise InvalidArgument(f"coef must be a finite number, got {coef!r}")
    if kind is Activation.CLIPPED_RELU and coef <= 0:
        raise InvalidArgument(f"clipped_relu's coef (its ceiling) must be > 0, got {coef!r}")


@dataclass(frozen=True, slots=True)
class ActivationForward(_DnnOp):
    """Apply an activation element-wise: ``y = alpha * f(x) + beta * y``.

    ``kind``: ``relu``; ``clipped_relu`` (``min(max(x, 0), coef)``, cuDNN's
    CLIPPED_RELU); ``sigmoid``; ``tanh``; ``gelu`` (exact, with erf);
    ``gelu_approx`` (the tanh approximation); ``swish`` / ``silu`` (``x *
    sigmoid(coef * x)``, cuDNN's swish beta); ``elu`` (``x`` for x > 0, else
    ``coef * (exp(x) - 1)``, cuDNN's ELU alpha); ``softplus`` (``log(1 +
    exp(x))``); ``identity``. ``coef`` defaults to 1. ``dims`` are any 1 to 8
    sizes (only their product matters). ``y`` may be ``x``. Answers ``"cupy"``
    or ``"numpy"``.
    """

    replayable: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("y",)
    api = _forms("activation_fwd", ("x", "y", "dims", *_ACTIVATION_OPTIONS))
    x: GpuRef
    y: GpuRef
    dims: tuple[int, ...]
    kind: Activation = Activation.RELU
    alpha: float = 1.0
    beta: float = 0.0
    coef: float = 1.0

    def validate(self) -> None:
        count = _dims("dims", self.dims)
        _coef(self.kind, self.coef)
        _data(self.alpha, self.beta, x=self.x, y=self.y)
        require_len(self.x, count, "x")
        require_len(self.y, count, "y")


@dataclass(frozen=True, slots=True)
class ActivationBackward(_DnnOp):
    """The gradient of ``ActivationForward`` from its input: ``dx = alpha * f'(x) * dy +
    beta * dx`` (relu's derivative at 0 is 0). ``dx`` may be ``dy``. Answers ``"cupy"`` or
    ``"numpy"``."""

    replayable: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("dx",)
    api = _forms("activation_bwd", ("x", "dy", "dx", "dims", *_ACTIVATION_OPTIONS))
    x: GpuRef
    dy: GpuRef
    dx: GpuRef
    dims: tuple[int, ...]
    kind: Activation = Activation.RELU
    alpha: float = 1.0
    beta: float = 0.0
    coef: float = 1.0

    def validate(self) -> None:
        count = _dims("dims", self.dims)
        _coef(self.kind, self.coef)
        _data(self.alpha, self.beta, x=self.x, dy=self.dy, dx=self.dx)
        for name, ref in (("x", self.x), ("dy", self.dy), ("dx", self.dx)):
            require_len(ref, count, name)
        _distinct(("dx", self.dx), ("x", self.x))


# ---------------------------------------------------------------------- dropout


def _probability(p: float) -> None:
    if not (isinstance(p, int | float) and not isinstance(p, bool) and 0.0 <= p < 1.0):
        raise InvalidArgument(f"probability must be a number in [0, 1), got {p!r}")


@dataclass(frozen=True, slots=True)
class DropoutForward(_DnnOp):
    """Drop each element with ``probability`` and scale the kept ones by ``1 / (1 -
    probability)``: ``y = x * mask / (1 - p)``; ``mask`` (u8) gets 1 where kept, 0 where
    dropped.

    The mask is a function of ``(seed, index)`` alone: element ``i`` is kept
    when the top 24 bits of ``splitmix64(splitmix64(seed) + i)`` are at least
    ``round(p * 2**24)``. The same seed gives the same mask, bit for bit, on
    the CPU and on CUDA. Answers ``"cupy"`` or ``"numpy"``.

    With ``seeds`` (a u64 buffer), the seed is ``seeds[seed]`` as the op runs,
    not ``seed`` itself: a training step writes each step's seeds there, so its
    ops are the same every step (and a CUDA graph recorded once replays them).
    """

    replayable: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("y", "mask")
    api = _forms("dropout_fwd", ("x", "y", "mask", "dims", "probability", "seed"))
    x: GpuRef
    y: GpuRef
    mask: GpuRef
    dims: tuple[int, ...]
    probability: float = 0.5
    seed: int = 0
    seeds: GpuRef | None = None

    def validate(self) -> None:
        count = _dims("dims", self.dims)
        _probability(self.probability)
        require(is_int(self.seed) and 0 <= self.seed < 2**64,
                f"seed must be an int in [0, 2**64), got {self.seed!r}")
        _data(0.0, 0.0, x=self.x, y=self.y)
        require_dtype(self.mask, (DType.U8,), "mask")
        for name, ref in (("x", self.x), ("y", self.y), ("mask", self.mask)):
            require_len(ref, count, name)
        if self.seeds is not None:
            require_dtype(self.seeds, (DType.U64,), "seeds")
            require_len(self.seeds, self.seed + 1, "seeds")  # a u64 buffer: none of the others


@dataclass(frozen=True, slots=True)
class DropoutBackward(_DnnOp):
    """The gradient of ``DropoutForward``: ``dx = dy * mask / (1 - probability)``, with the
    u8 ``mask`` the forward pass wrote. Answers ``"cupy"`` or ``"numpy"``."""

    replayable: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("dx",)
    api = _forms("dropout_bwd", ("dy", "mask", "dx", "dims", "probability"))
    dy: GpuRef
    mask: GpuRef
    dx: GpuRef
    dims: tuple[int, ...]
    probability: float = 0.5

    def validate(self) -> None:
        count = _dims("dims", self.dims)
        _probability(self.probability)
        _data(0.0, 0.0, dy=self.dy, dx=self.dx)
        require_dtype(self.mask, (DType.U8,), "mask")
        for name, ref in (("dy", self.dy), ("mask", self.mask), ("dx", self.dx)):
            require_len(ref, count, name)


# -------------------------------------------------------------------------- LRN

LRN_MAX_N = 16
"""cuDNN's largest LRN window."""


@dataclass(frozen=True, slots=True)
class LrnForward(_DnnOp):
    """Cross-channel local response normalization, as cuDNN defines it:
    ``y = alpha * x / (lrn_k + lrn_alpha / n * sum(x_j ** 2))^lrn_beta + beta * y``.

    The sum runs over the channels ``j`` in ``[c - floor((n - 1) / 2), c + n -
    1 - floor((n - 1) / 2)]`` that exist (cuDNN's lookBehind / lookAhead), at
    the same (n, h, w). As in cuDNN, ``1 <= n <= 16``, ``lrn_k >= 1e-5`` and
    ``lrn_beta >= 0.01``. ``dims`` as for softmax. Answers ``"cupy"`` or
    ``"numpy"``.
    """

    outputs: ClassVar[tuple[str, ...]] = ("y",)
    api = _forms("lrn_fwd", ("x", "y", "dims", "n", "lrn_alpha", "lrn_beta", "lrn_k", "alpha",
                             "beta"))
    x: GpuRef
    y: GpuRef
    dims: tuple[int, ...]
    n: int = 5
    lrn_alpha: float = 1e-4
    lrn_beta: float = 0.75
    lrn_k: float = 2.0
    alpha: float = 1.0
    beta: float = 0.0
    layout: Layout = Layout.NCHW

    def validate(self) -> None:
        count = math.prod(image_dims(self.dims))
        require(is_int(self.n) and 1 <= self.n <= LRN_MAX_N,
                f"n must be an int in [1, {LRN_MAX_N}], got {self.n!r}")
        dtype = _data(self.alpha, self.beta, x=self.x, y=self.y)
        require_numbers(dtype, lrn_alpha=self.lrn_alpha, lrn_beta=self.lrn_beta,
                        lrn_k=self.lrn_k)
        require(self.lrn_k >= 1e-5, f"lrn_k must be >= 1e-5, got {self.lrn_k!r}")
        require(self.lrn_beta >= 0.01, f"lrn_beta must be >= 0.01, got {self.lrn_beta!r}")
        require_len(self.x, count, "x")
        require_len(self.y, count, "y")
        _distinct(("y", self.y), ("x", self.x))
