"""cuDNN-shaped normalizations: batch, layer, instance, group and RMS, and one backward.

Tensors are dense and row-major; ``dims`` is the logical shape of ``x`` (and
of ``y``, ``dy``, ``dx``). For batch, instance and group norm ``dims`` is
``(N, C, *spatial)`` (NCHW-like, at least 2 dims); layer and RMS norm
normalize the last ``norm_axes`` dims of any shape. Statistics are taken:

* batch: per channel, over N and the spatial dims (``C`` statistics);
* instance: per sample and channel, over the spatial dims (``N * C``);
* group: per sample and group of ``C // groups`` channels (``N * groups``);
* layer and RMS: per leading index, over the last ``norm_axes`` dims.

``scale`` and ``bias`` hold one value per channel (batch, instance, group) or
per normalized element (layer, RMS). Parameters and statistics (scale, bias,
running and saved statistics, and their gradients) are f32 for f16, bf16 and
f32 data, and f64 for f64 data, as in cuDNN.

Saved statistics are ``saved_mean`` and ``saved_var``; ``saved_var`` holds the
**inverse standard deviation** ``1 / sqrt(var + epsilon)`` (cuDNN's
``saved_inv_variance``; for RMS norm ``1 / sqrt(mean(x**2) + epsilon)``), and
``NormBwd`` takes them as ``mean`` and ``var``. The running variance a
training batch norm keeps is the unbiased variance, as in cuDNN and PyTorch:
``running = (1 - exp_avg_factor) * running + exp_avg_factor * batch``.
"""

from __future__ import annotations

import abc
import enum
import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from atomr_accel.core._api import Form, Param, choice
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import pickle_by_name
from atomr_accel.core._op import is_int, positive_sizes, require, require_len, require_shared_dtype
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._dnn_common import _DnnOp

__all__ = [
    "BatchNorm",
    "GroupNorm",
    "InstanceNorm",
    "LayerNorm",
    "NormAxes",
    "NormBwd",
    "NormLayout",
    "NormMode",
    "NormPhase",
    "RmsNorm",
    "axes_count",
    "norm_layout",
    "param_dtype",
]

DATA_DTYPES = (DType.F16, DType.BF16, DType.F32, DType.F64)
"""The data dtypes every normalization takes."""


class NormMode(enum.Enum):
    """Which normalization: over the batch, a layer, an instance, a group, or RMS."""

    BATCH = "batch"
    LAYER = "layer"
    INSTANCE = "instance"
    GROUP = "group"
    RMS = "rms"

    __reduce_ex__ = pickle_by_name


class NormPhase(enum.Enum):
    """A batch norm's phase: training (batch statistics) or inference (running ones)."""

    TRAIN = "train"
    INFERENCE = "inference"

    __reduce_ex__ = pickle_by_name


parse_phase = choice("phase", {"train": NormPhase.TRAIN, "training": NormPhase.TRAIN,
                               "persistent": NormPhase.TRAIN,
                               "inference": NormPhase.INFERENCE, "eval": NormPhase.INFERENCE})
"""The original's phases: train, training and persistent (cuDNN's persistent training
kernel: the same arithmetic) train; inference and eval use the running statistics."""

parse_mode = choice("mode", {m.value: m for m in NormMode})
"""The original's norm modes: batch, layer, instance, group, rms."""


def param_dtype(data: DType) -> DType:
    """The dtype of parameters and statistics for data of ``data``: f64 for f64, else f32."""
    return DType.F64 if data is DType.F64 else DType.F32


class NormLayout(NamedTuple):
    """How a normalization sees ``x``: the ``view`` shape, the axes its statistics reduce,
    the broadcast shapes of statistics and of scale/bias in that view, and their counts."""

    view: tuple[int, ...]
    reduce: tuple[int, ...]
    stat_shape: tuple[int, ...]
    param_shape: tuple[int, ...]

    @property
    def stat_count(self) -> int:
        """Elements of ``saved_mean`` / ``saved_var``."""
        return math.prod(self.stat_shape)

    @property
    def param_count(self) -> int:
        """Elements of ``scale`` / ``bias``."""
        return math.prod(self.param_shape)

    @property
    def size(self) -> int:
        """Elements of ``x``."""
        return math.prod(self.view)

    @property
    def group_size(self) -> int:
        """Elements each statistic is taken over."""
        return self.size // self.stat_count

    @property
    def param_reduce(self) -> tuple[int, ...]:
        """The axes ``dscale`` and ``dbias`` sum over."""
        return tuple(i for i, n in enumerate(self.param_shape) if n == 1)


def _require_dims(dims: tuple[int, ...], least: int) -> None:
    if not isinstance(dims, tuple) or len(dims) < least:
        raise InvalidArgument(f"dims must be a tuple of at least {least} sizes, got {dims!r}")
    if not positive_sizes(dims):
        raise InvalidArgument(f"dims must be positive ints, got {dims!r}")


NormAxes = int | tuple[int, ...]
"""The dims a layer or RMS norm normalizes: how many trailing dims (``2``), or which,
as the original package took them (``(1, 2, 3)`` of an NCHW tensor; negative axes count
from the end, ``(-3, -2, -1)``). Either way a trailing run of the dims."""


def axes_count(norm_axes: NormAxes, ndim: int) -> int:
    """How many trailing dims of an ``ndim``-dim tensor ``norm_axes`` names (raises
    ``InvalidArgument`` unless it is a count from 1 to ``ndim`` or the axes of a trailing
    run, in increasing order)."""
    if is_int(norm_axes):
        if 1 <= norm_axes <= ndim:
            return int(norm_axes)
    elif isinstance(norm_axes, tuple | list) and norm_axes and all(map(is_int, norm_axes)):
        axes = [a + ndim if a < 0 else a for a in norm_axes]
        if axes == list(range(ndim - len(axes), ndim)):
            return len(axes)
    raise InvalidArgument(
        f"norm_axes must be a count from 1 to {ndim} or the axes of a trailing run of the "
        f"{ndim} dims (e.g. {list(range(max(ndim - 2, 0), ndim))}), got {norm_axes!r}")


def norm_layout(mode: NormMode, dims: tuple[int, ...], norm_axes: NormAxes = 1,
                groups: int = 1) -> NormLayout:
    """The layout of a ``mode`` normalization of ``x`` of ``dims`` (raises
    ``InvalidArgument`` for dims, ``norm_axes`` or ``groups`` that do not fit)."""
    if mode in (NormMode.LAYER, NormMode.RMS):
        _require_dims(dims, 1)
        count = axes_count(norm_axes, len(dims))
        m, k = math.prod(dims[: len(dims) - count]), math.prod(dims[len(dims) - count:])
        return NormLayout((m, k), (1,), (m, 1), (1, k))
    _require_dims(dims, 2)
    n, c, s = dims[0], dims[1], math.prod(dims[2:])
    if mode is NormMode.BATCH:
        return NormLayout((n, c, s), (0, 2), (1, c, 1), (1, c, 1))
    if mode is NormMode.INSTANCE:
        return NormLayout((n, c, s), (2,), (n, c, 1), (1, c, 1))
    if not (is_int(groups) and groups >= 1 and c % groups == 0):
        raise InvalidArgument(f"groups must be a positive int dividing the {c} channels, "
                              f"got {groups!r}")
    return NormLayout((n, groups, c // groups, s), (2, 3), (n, groups, 1, 1),
                      (1, groups, c // groups, 1))


def _require_epsilon(epsilon: float) -> None:
    if not (isinstance(epsilon, int | float) and not isinstance(epsilon, bool)
            and math.isfinite(epsilon) and epsilon > 0):
        raise InvalidArgument(f"epsilon must be a positive finite number, got {epsilon!r}")


def _require_data(layout: NormLayout, **refs: GpuRef) -> DType:
    """Every data buffer (x, y, dy, dx) shares one dtype of ``DATA_DTYPES`` and holds ``x``."""
    dtype = require_shared_dtype(DATA_DTYPES, **refs)
    for name, ref in refs.items():
        require_len(ref, layout.size, name)
    return dtype


def _require_params(dtype: DType, count: int, **refs: GpuRef | None) -> None:
    """Every given buffer holds ``count`` values of ``param_dtype(dtype)``."""
    want = param_dtype(dtype)
    for name, ref in refs.items():
        if ref is None:
            continue
        if ref.dtype is not want:
            raise InvalidArgument(f"{name} has dtype {ref.dtype.value}; {dtype.value} data "
                                  f"take {want.value} parameters and statistics")
        require_len(ref, count, name)


def _forms(name: str, params: tuple[str | Param, ...], doc: str) -> tuple[Form]:
    """``name`` for any float dtype; it answers the path that ran."""
    return (Form(name, params, timeout=60.0, returns="str", doc=doc,
                 note="Any of f16, bf16, f32 (f64 too); answers the path that ran."),)


_PHASE = Param("phase", "train", parse=parse_phase, annotation="str")
_MODE = Param("mode", "batch", parse=parse_mode, annotation="str")


@dataclass(frozen=True, slots=True)
class BatchNorm(_DnnOp):
    """Batch-normalize ``x`` of ``dims = (N, C, *spatial)`` per channel into ``y``.

    Training (``phase`` train/training/persistent) uses the batch's statistics,
    writes ``saved_mean`` and ``saved_var`` (the inverse standard deviation)
    where given, and updates ``running_mean`` / ``running_var`` (unbiased) by
    ``exp_avg_factor`` where given. Inference (inference/eval) uses the running
    statistics, which it needs, and leaves the saved ones untouched.
    """

    outputs: ClassVar[tuple[str, ...]] = ("y", "running_mean", "running_var", "saved_mean",
                                          "saved_var")
    api = _forms("batch_norm", ("x", "y", "scale", "bias", "dims", "running_mean",
                                "running_var", "saved_mean", "saved_var", _PHASE, "epsilon",
                                "exp_avg_factor"),
                 "Batch normalization forward: training (batch statistics, running ones "
                 "updated) or inference (running statistics).")
    x: GpuRef
    y: GpuRef
    scale: GpuRef
    bias: GpuRef
    dims: tuple[int, ...]
    running_mean: GpuRef | None = None
    running_var: GpuRef | None = None
    saved_mean: GpuRef | None = None
    saved_var: GpuRef | None = None
    phase: NormPhase = NormPhase.TRAIN
    epsilon: float = 1e-5
    exp_avg_factor: float = 0.1

    @property
    def layout(self) -> NormLayout:
        """The layout of this normalization."""
        return norm_layout(NormMode.BATCH, self.dims)

    def validate(self) -> None:
        layout = self.layout
        dtype = _require_data(layout, x=self.x, y=self.y)
        c = layout.param_count
        _require_params(dtype, c, scale=self.scale, bias=self.bias,
                        running_mean=self.running_mean, running_var=self.running_var,
                        saved_mean=self.saved_mean, saved_var=self.saved_var)
        _require_epsilon(self.epsilon)
        factor = self.exp_avg_factor
        require(isinstance(factor, int | float) and not isinstance(factor, bool)
                and 0.0 <= factor <= 1.0,
                f"exp_avg_factor must be a number from 0 to 1, got {factor!r}")
        if self.phase is NormPhase.INFERENCE:
            require(self.running_mean is not None and self.running_var is not None,
                    "an inference batch norm needs running_mean and running_var")
        else:
            require(layout.group_size > 1, "a training batch norm needs more than one value "
                    f"per channel, got dims {self.dims}")


class _NormForward(_DnnOp, abc.ABC):
    """The forward normalizations but batch norm: ``x`` into ``y``, ``scale`` and ``bias``
    of the layout's parameter count, the saved statistics that ``stats`` names of its
    statistic count."""

    __slots__ = ()
    outputs: ClassVar[tuple[str, ...]] = ("y", "saved_mean", "saved_var")
    stats: ClassVar[tuple[str, ...]] = ("saved_mean", "saved_var")
    x: GpuRef
    y: GpuRef
    scale: GpuRef
    bias: GpuRef | None
    epsilon: float

    @property
    @abc.abstractmethod
    def layout(self) -> NormLayout:
        """The layout of this normalization."""

    def validate(self) -> None:
        layout = self.layout
        dtype = _require_data(layout, x=self.x, y=self.y)
        _require_params(dtype, layout.param_count, scale=self.scale, bias=self.bias)
        _require_params(dtype, layout.stat_count, **{n: getattr(self, n) for n in self.stats})
        _require_epsilon(self.epsilon)


@dataclass(frozen=True, slots=True)
class _AffineFields:
    """The leading fields of the forward normalizations that save a mean and a variance
    (layer, instance, group): a field group, before ``_NormForward``."""

    x: GpuRef
    y: GpuRef
    scale: GpuRef
    bias: GpuRef
    dims: tuple[int, ...]


@dataclass(frozen=True)
class _LayerFields(_AffineFields):
    """The leading fields of the layer norm: the affine ones, then how many trailing dims
    it normalizes over."""

    __slots__ = ()
    norm_axes: NormAxes


@dataclass(frozen=True)
class _GroupFields(_AffineFields):
    """The leading fields of the group norm: the affine ones, then how many groups the
    channels form."""

    __slots__ = ()
    groups: int


@dataclass(frozen=True)
class _Saved:
    """The fields the layer, instance and group norms end with: where to save the mean and
    the inverse standard deviation, and epsilon. A field group, first among an op's bases."""

    __slots__ = ()
    saved_mean: GpuRef | None = None
    saved_var: GpuRef | None = None
    epsilon: float = 1e-5


@dataclass(frozen=True, slots=True)
class LayerNorm(_Saved, _LayerFields, _NormForward):
    """Layer-normalize the last ``norm_axes`` dims of ``x`` of ``dims`` into ``y``; write the
    per-row mean and inverse standard deviation to ``saved_mean`` / ``saved_var`` where
    given."""

    api = _forms("layer_norm", ("x", "y", "scale", "bias", "dims", "norm_axes", "saved_mean",
                                "saved_var", "epsilon"),
                 "Layer normalization forward over the last ``norm_axes`` dims.")

    @property
    def layout(self) -> NormLayout:
        """The layout of this normalization."""
        return norm_layout(NormMode.LAYER, self.dims, self.norm_axes)


@dataclass(frozen=True, slots=True)
class InstanceNorm(_Saved, _AffineFields, _NormForward):
    """Instance-normalize ``x`` of ``dims = (N, C, *spatial)`` (per sample and channel, over
    the spatial dims) into ``y``; saved statistics hold ``N * C`` values."""

    api = _forms("instance_norm", ("x", "y", "scale", "bias", "dims", "saved_mean",
                                   "saved_var", "epsilon"),
                 "Instance normalization forward (per sample and channel).")

    @property
    def layout(self) -> NormLayout:
        """The layout of this normalization."""
        return norm_layout(NormMode.INSTANCE, self.dims)

    def validate(self) -> None:
        _NormForward.validate(self)
        require(self.layout.group_size > 1,
                f"an instance norm needs spatial dims, got {self.dims}")


@dataclass(frozen=True, slots=True)
class GroupNorm(_Saved, _GroupFields, _NormForward):
    """Group-normalize ``x`` of ``dims = (N, C, *spatial)`` in ``groups`` groups of channels
    into ``y``; saved statistics hold ``N * groups`` values, scale and bias ``C``."""

    api = _forms("group_norm", ("x", "y", "scale", "bias", "dims", "groups", "saved_mean",
                                "saved_var", "epsilon"),
                 "Group normalization forward (per sample and group of channels).")

    @property
    def layout(self) -> NormLayout:
        """The layout of this normalization."""
        return norm_layout(NormMode.GROUP, self.dims, groups=self.groups)


@dataclass(frozen=True, slots=True)
class RmsNorm(_NormForward):
    """RMS-normalize the last ``norm_axes`` dims of ``x``: ``y = x / rms(x) * scale (+ bias)``
    with ``rms = sqrt(mean(x**2) + epsilon)``; ``saved_var`` receives ``1 / rms`` per row."""

    outputs = ("y", "saved_var")
    stats = ("saved_var",)
    api = _forms("rms_norm", ("x", "y", "scale", "dims", "norm_axes", "saved_var", "epsilon",
                              "bias"),
                 "RMS normalization forward over the last ``norm_axes`` dims (bias optional).")
    x: GpuRef
    y: GpuRef
    scale: GpuRef
    dims: tuple[int, ...]
    norm_axes: NormAxes
    saved_var: GpuRef | None = None
    epsilon: float = 1e-5
    bias: GpuRef | None = None

    @property
    def layout(self) -> NormLayout:
        """The layout of this normalization."""
        return norm_layout(NormMode.RMS, self.dims, self.norm_axes)


@dataclass(frozen=True, slots=True)
class NormBwd(_DnnOp):
    """Backward of any normalization: ``dx`` (and ``dscale``, ``dbias`` where given) from
    ``dy``, ``x``, ``scale`` and the forward's saved statistics.

    ``mode`` is batch, layer, instance, group or rms; ``norm_axes`` (layer, rms)
    and ``groups`` (group) describe the forward as it ran. ``mean`` and ``var``
    are its ``saved_mean`` and ``saved_var`` (the inverse standard deviation);
    pass both as None to have them recomputed from ``x`` with ``epsilon``. RMS
    norm has no mean: ``mean`` must be None. A training batch norm's backward
    is meant (batch statistics); gradients are written, not accumulated.
    """

    outputs: ClassVar[tuple[str, ...]] = ("dx", "dscale", "dbias")
    api = _forms("norm_bwd", ("x", "dy", "scale", "mean", "var", "dx", "dscale", "dbias",
                              "dims", _MODE, "epsilon"),
                 "Normalization backward (batch, layer, instance, group or rms): dx, dscale, "
                 "dbias from the saved mean and inverse standard deviation.")
    x: GpuRef
    dy: GpuRef
    scale: GpuRef
    mean: GpuRef | None
    var: GpuRef | None
    dx: GpuRef
    dscale: GpuRef | None
    dbias: GpuRef | None
    dims: tuple[int, ...]
    mode: NormMode = NormMode.BATCH
    epsilon: float = 1e-5
    norm_axes: NormAxes = 1
    groups: int = 1

    @property
    def layout(self) -> NormLayout:
        """The layout of the forward normalization."""
        return norm_layout(self.mode, self.dims, self.norm_axes, self.groups)

    def validate(self) -> None:
        if self.mode is NormMode.RMS:
            require(self.mean is None, "an rms norm has no mean: pass mean=None")
        else:
            require((self.mean is None) == (self.var is None),
                    "pass both mean and var (the saved statistics), or neither to recompute "
                    "them")
        layout = self.layout
        dtype = _require_data(layout, x=self.x, dy=self.dy, dx=self.dx)
        _require_params(dtype, layout.param_count, scale=self.scale, dscale=self.dscale,
                        dbias=self.dbias)
        _require_params(dtype, layout.stat_count, mean=self.mean, var=self.var)
        _require_epsilon(self.epsilon)
