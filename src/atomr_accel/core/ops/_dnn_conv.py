"""cuDNN-shaped 2-D convolutions: forward, backward data and backward filter, with their
geometry (``conv_output_shape``); the conventions are ``_dnn``'s."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from atomr_accel.core._api import Form
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import (
    is_int,
    require,
)
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._dnn_common import (
    _TIMEOUT,
    Layout,
    _check_buffers,
    _DnnOp,
    _nchw,
    _pair,
)

__all__ = [
    "Conv2dBackwardData",
    "Conv2dBackwardFilter",
    "Conv2dForward",
    "ConvGeometry",
    "ConvImage",
    "conv_output_shape",
]


class ConvGeometry(NamedTuple):
    """A checked 2-D convolution: image, filter and output shapes (logical) and its options."""

    x_shape: tuple[int, int, int, int]
    w_shape: tuple[int, int, int, int]
    y_shape: tuple[int, int, int, int]
    pad: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    groups: int

    @classmethod
    def of(cls, x_shape: tuple[int, ...], w_shape: tuple[int, ...], pad: tuple[int, ...],
           stride: tuple[int, ...], dilation: tuple[int, ...], groups: int,
           x_name: str = "x_shape", w_name: str = "w_shape") -> ConvGeometry:
        """Check the options and shapes (``InvalidArgument``) and derive the output shape."""
        n, c, h, w = _nchw(x_name, x_shape)
        k, cg, r, s = _nchw(w_name, w_shape)
        p = _pair("pad", pad, 0)
        st = _pair("stride", stride, 1)
        d = _pair("dilation", dilation, 1)
        require(is_int(groups) and groups >= 1, f"groups must be a positive int, got {groups!r}")
        if c != cg * groups:
            raise InvalidArgument(f"the image has {c} channels but the filter takes {cg} per "
                                  f"group x {groups} groups = {cg * groups}")
        require(k % groups == 0, f"the filter's {k} outputs do not split into {groups} groups")
        y = conv_output_shape((n, c, h, w), (k, cg, r, s), p, st, d)
        if y[2] < 1 or y[3] < 1:
            raise InvalidArgument(f"the (dilated) {r}x{s} filter does not fit the padded "
                                  f"{h}x{w} image")
        return cls((n, c, h, w), (k, cg, r, s), y, p, st, d, groups)


class ConvImage(NamedTuple):
    """One buffer of a convolution op: its field's name, the buffer and its logical shape."""

    name: str
    ref: GpuRef
    shape: tuple[int, int, int, int]


def conv_output_shape(x_shape: tuple[int, ...], w_shape: tuple[int, ...],
                      pad: tuple[int, ...] = (0, 0), stride: tuple[int, ...] = (1, 1),
                      dilation: tuple[int, ...] = (1, 1)) -> tuple[int, int, int, int]:
    """The logical output shape of a 2-D convolution: ``(N, K, P, Q)`` with
    ``P = (H + 2 * pad_h - dilation_h * (R - 1) - 1) // stride_h + 1`` (and Q alike)."""
    n, _, h, w = x_shape
    k, _, r, s = w_shape
    p = (h + 2 * pad[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1
    q = (w + 2 * pad[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1
    return n, k, p, q


def _same_shape(name: str, given: tuple[int, ...], expected: tuple[int, ...]) -> None:
    if tuple(given) != tuple(expected):
        raise InvalidArgument(f"{name} is {given!r} but this convolution's is {expected!r}")


_CONV_OPTIONS = ("pad", "stride", "dilation", "groups", "alpha", "beta")


def _conv_forms(name: str, params: tuple[str, ...]) -> tuple[Form]:
    """The unsuffixed form (any float dtype)."""
    every = (*params, *_CONV_OPTIONS)
    return (Form(name, every, timeout=_TIMEOUT, returns="str", timeout_last=True),)


class _Conv2d(_DnnOp):
    """The geometry and checks shared by the three convolutions.

    ``_roles`` names each buffer field, in field order, with its role in the
    forward convolution (``"x"`` image, ``"w"`` filter, ``"y"`` output); each
    buffer's shape is the field named after it with ``_shape``. The output
    (``outputs[0]``) must not share a buffer with the others.
    """

    __slots__ = ()
    _roles: ClassVar[tuple[tuple[str, str], ...]]
    pad: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    alpha: float
    beta: float
    layout: Layout
    autotune: bool

    def validate(self) -> None:
        geo = self.geometry
        given = next(f"{name}_shape" for name, role in self._roles if role == "y")
        _same_shape(given, getattr(self, given), geo.y_shape)
        counts = {"x": math.prod(geo.x_shape), "w": math.prod(geo.w_shape),
                  "y": math.prod(geo.y_shape)}
        _check_buffers(self, self._roles, counts, self.alpha, self.beta)

    @property
    def geometry(self) -> ConvGeometry:
        """The checked geometry of the forward convolution (raises ``InvalidArgument``)."""
        shape = {role: f"{name}_shape" for name, role in self._roles}
        return ConvGeometry.of(getattr(self, shape["x"]), getattr(self, shape["w"]), self.pad,
                               self.stride, self.dilation, self.groups, x_name=shape["x"],
                               w_name=shape["w"])

    def images(self, geo: ConvGeometry) -> tuple[ConvImage, ConvImage, ConvImage]:
        """The op's two inputs and its output, in field order, with their shapes in ``geo``
        (its ``geometry``)."""
        shapes = {"x": geo.x_shape, "w": geo.w_shape, "y": geo.y_shape}
        first, second, out = (ConvImage(name, getattr(self, name), shapes[role])
                              for name, role in self._roles)
        return first, second, out


@dataclass(frozen=True, slots=True)
class Conv2dForward(_Conv2d):
    """Convolve: ``y = alpha * conv2d(x, w) + beta * y`` (cross-correlation, as cuDNN and
    PyTorch compute it).

    ``x`` holds the image ``x_shape = (N, C, H, W)``, ``w`` the filter
    ``w_shape = (K, C / groups, R, S)``, ``y`` the output ``y_shape``, which
    must be ``conv_output_shape(x_shape, w_shape, pad, stride, dilation)``.
    ``pad``, ``stride`` and ``dilation`` are (height, width) pairs; ``groups``
    splits the channels into that many independent convolutions. ``layout``
    (``"NCHW"`` or ``"NHWC"``) says how all three buffers are stored. Answers
    ``"cudnn-graph"`` (cuDNN's ``conv_fprop``) on CUDA, ``"numpy"`` on the CPU.

    ``autotune=True`` (CUDA): the first call of a shape times cuDNN's leading
    candidate plans on the op's own buffers and keeps the fastest, as
    ``torch.backends.cudnn.benchmark`` does; that first call waits for its
    stream once. Without it the heuristics' first plan that builds runs. The
    CPU ignores the option.
    """

    outputs: ClassVar[tuple[str, ...]] = ("y",)
    _roles = (("x", "x"), ("w", "w"), ("y", "y"))
    api = _conv_forms("conv2d_fwd", ("x", "w", "y", "x_shape", "w_shape", "y_shape"))
    x: GpuRef
    w: GpuRef
    y: GpuRef
    x_shape: tuple[int, ...]
    w_shape: tuple[int, ...]
    y_shape: tuple[int, ...]
    pad: tuple[int, ...] = (0, 0)
    stride: tuple[int, ...] = (1, 1)
    dilation: tuple[int, ...] = (1, 1)
    groups: int = 1
    alpha: float = 1.0
    beta: float = 0.0
    layout: Layout = Layout.NCHW
    autotune: bool = False


@dataclass(frozen=True, slots=True)
class Conv2dBackwardData(_Conv2d):
    """The gradient of a convolution with respect to its image: ``dx = alpha * conv2d^T(dy,
    w) + beta * dx``.

    ``dx_shape`` is the image's ``(N, C, H, W)``; ``dy_shape`` must be the
    forward convolution's output shape for it (``conv_output_shape(dx_shape,
    w_shape, pad, stride, dilation)``). Options and layouts as for
    ``Conv2dForward``. Answers ``"cudnn-graph"`` (``conv_dgrad``) or ``"numpy"``.
    """

    outputs: ClassVar[tuple[str, ...]] = ("dx",)
    _roles = (("dy", "y"), ("w", "w"), ("dx", "x"))
    api = _conv_forms("conv2d_bwd_data", ("dy", "w", "dx", "dy_shape", "w_shape", "dx_shape"))
    dy: GpuRef
    w: GpuRef
    dx: GpuRef
    dy_shape: tuple[int, ...]
    w_shape: tuple[int, ...]
    dx_shape: tuple[int, ...]
    pad: tuple[int, ...] = (0, 0)
    stride: tuple[int, ...] = (1, 1)
    dilation: tuple[int, ...] = (1, 1)
    groups: int = 1
    alpha: float = 1.0
    beta: float = 0.0
    layout: Layout = Layout.NCHW
    autotune: bool = False


@dataclass(frozen=True, slots=True)
class Conv2dBackwardFilter(_Conv2d):
    """The gradient of a convolution with respect to its filter: ``dw = alpha * sum_n
    x (*) dy + beta * dw``.

    ``dw_shape`` is the filter's ``(K, C / groups, R, S)``; ``dy_shape`` must be
    the forward output shape for ``x_shape`` and ``dw_shape``. Options and
    layouts as for ``Conv2dForward``. Answers ``"cudnn-graph"`` (``conv_wgrad``)
    or ``"numpy"``.
    """

    outputs: ClassVar[tuple[str, ...]] = ("dw",)
    _roles = (("x", "x"), ("dy", "y"), ("dw", "w"))
    api = _conv_forms("conv2d_bwd_filter", ("x", "dy", "dw", "x_shape", "dy_shape", "dw_shape"))
    x: GpuRef
    dy: GpuRef
    dw: GpuRef
    x_shape: tuple[int, ...]
    dy_shape: tuple[int, ...]
    dw_shape: tuple[int, ...]
    pad: tuple[int, ...] = (0, 0)
    stride: tuple[int, ...] = (1, 1)
    dilation: tuple[int, ...] = (1, 1)
    groups: int = 1
    alpha: float = 1.0
    beta: float = 0.0
    layout: Layout = Layout.NCHW
    autotune: bool = False

