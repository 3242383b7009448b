"""What the cuDNN-shaped ops share: their base (``_DnnOp``, which names their library once),
their dtypes, layouts and modes (with the option strings that name them) and the checks of
image shapes and operands."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import ClassVar, Protocol

from atomr_accel.core._api import choice
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import pickle_by_name
from atomr_accel.core._op import (
    Op,
    is_int,
    positive_sizes,
    require_len,
    require_numbers,
    require_shared_dtype,
)
from atomr_accel.core._ref import GpuRef, same_buffer

__all__ = [
    "Activation",
    "DNN_DTYPES",
    "Layout",
    "PoolMode",
    "SoftmaxMode",
    "image_dims",
]


DNN_DTYPES = (DType.F16, DType.BF16, DType.F32, DType.F64)
"""The data dtypes these ops take."""


_TIMEOUT = 60.0
"""The original package's ``ts=60.0``."""


class _DnnOp(Op):
    """Base class of the cudnn library's ops (convolutions, pooling, softmax, activations,
    dropout, LRN, normalizations, RNNs and multi-head attention)."""

    __slots__ = ()
    library: ClassVar[str] = "cudnn"


class Layout(enum.Enum):
    """How an image buffer stores its logical ``(N, C, H, W)``: NCHW or NHWC (channels last)."""

    NCHW = "NCHW"
    NHWC = "NHWC"

    __reduce_ex__ = pickle_by_name


class PoolMode(enum.Enum):
    """Max pooling, or the mean over the window counting padding or not (cuDNN's three)."""

    MAX = "max"
    AVG_INCLUDE_PADDING = "avg_include_padding"
    AVG_EXCLUDE_PADDING = "avg_exclude_padding"

    __reduce_ex__ = pickle_by_name


class SoftmaxMode(enum.Enum):
    """Softmax over C for each (n, h, w) (``channel``) or over C*H*W for each n (``instance``)."""

    CHANNEL = "channel"
    INSTANCE = "instance"

    __reduce_ex__ = pickle_by_name


class Activation(enum.Enum):
    """An element-wise activation; ``coef`` sets three of them (see ``ActivationForward``)."""

    RELU = "relu"
    CLIPPED_RELU = "clipped_relu"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    GELU = "gelu"
    GELU_APPROX = "gelu_approx"
    SWISH = "swish"
    ELU = "elu"
    SOFTPLUS = "softplus"
    IDENTITY = "identity"

    __reduce_ex__ = pickle_by_name


_pool_mode = choice("mode", {
    "max": PoolMode.MAX,
    "avg": PoolMode.AVG_INCLUDE_PADDING,
    "average": PoolMode.AVG_INCLUDE_PADDING,
    "averageinclude": PoolMode.AVG_INCLUDE_PADDING,
    "avg_include_padding": PoolMode.AVG_INCLUDE_PADDING,
    "avg_exclude_padding": PoolMode.AVG_EXCLUDE_PADDING,
})
"""The original's pool modes: ``max``; ``avg``, ``average`` and ``AverageInclude`` average
counting the padding (cuDNN's AVERAGE_COUNT_INCLUDE_PADDING); ``avg_exclude_padding``
averages the in-bounds elements only."""


_softmax_mode = choice("mode", {"channel": SoftmaxMode.CHANNEL, "instance": SoftmaxMode.INSTANCE})


_ACTIVATION_NAMES: dict[str | bool, Activation] = {a.value: a for a in Activation}


_activation = choice("kind", _ACTIVATION_NAMES | {"silu": Activation.SWISH})
"""Every activation by name; ``silu`` is ``swish`` (with ``coef`` 1, its default)."""


def _nchw(name: str, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """``shape`` as four positive ints ``(N, C, H, W)`` (``InvalidArgument`` otherwise)."""
    if not (isinstance(shape, tuple) and len(shape) == 4):
        raise InvalidArgument(f"{name} must be 4 sizes (N, C, H, W), got {shape!r}")
    if not positive_sizes(shape):
        raise InvalidArgument(f"{name} must be positive ints, got {shape!r}")
    n, c, h, w = shape
    return n, c, h, w


def _pair(name: str, value: tuple[int, ...], least: int) -> tuple[int, int]:
    """``value`` as two ints >= ``least`` (``InvalidArgument`` otherwise)."""
    if not (isinstance(value, tuple) and len(value) == 2
            and all(is_int(v) and v >= least for v in value)):
        raise InvalidArgument(f"{name} must be two ints >= {least}, got {value!r}")
    return value[0], value[1]


def _dims(name: str, dims: tuple[int, ...]) -> int:
    """Check an element-wise op's ``dims`` (1 to 8 positive sizes); answer their product."""
    if not (isinstance(dims, tuple) and 1 <= len(dims) <= 8):
        raise InvalidArgument(f"{name} must be 1 to 8 sizes, got {dims!r}")
    if not positive_sizes(dims):
        raise InvalidArgument(f"{name} must be positive ints, got {dims!r}")
    return math.prod(dims)


def image_dims(dims: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Softmax's and LRN's ``dims``: ``(N, C)``, ``(N, C, H)`` or ``(N, C, H, W)``, padded
    with 1s to four."""
    if not (isinstance(dims, tuple) and 2 <= len(dims) <= 4):
        raise InvalidArgument(f"dims must be (N, C), (N, C, H) or (N, C, H, W), got {dims!r}")
    return _nchw("dims", (*dims, *(1,) * (4 - len(dims))))


def _distinct(out: tuple[str, GpuRef], *inputs: tuple[str, GpuRef]) -> None:
    """The output must not share a buffer with any input."""
    name, ref = out
    for other, r in inputs:
        if same_buffer(r, ref):
            raise InvalidArgument(f"{name} must not share a buffer with {other}")


def _data(alpha: float, beta: float, **refs: GpuRef) -> DType:
    """Every buffer holds one float dtype of ``DNN_DTYPES``; alpha and beta are real numbers."""
    dtype = require_shared_dtype(DNN_DTYPES, **refs)
    require_numbers(dtype, alpha=alpha, beta=beta)
    return dtype


class _Outputs(Protocol):
    """An op as ``_check_buffers`` reads it: the names of the fields it writes (and, by
    name, its buffer fields)."""

    outputs: ClassVar[tuple[str, ...]]


def _check_buffers(op: _Outputs, roles: tuple[tuple[str, str], ...], counts: Mapping[str, int],
                   alpha: float, beta: float) -> None:
    """Check the buffer fields ``roles`` names, each with the element count of its role in
    ``counts``: ``_data``'s dtypes, their lengths, and that the op's output
    (``outputs[0]``) shares no buffer with the others."""
    refs = {name: getattr(op, name) for name, _ in roles}
    _data(alpha, beta, **refs)
    for name, role in roles:
        require_len(refs[name], counts[role], name)
    out = op.outputs[0]
    _distinct((out, refs[out]), *[(n, r) for n, r in refs.items() if n != out])
