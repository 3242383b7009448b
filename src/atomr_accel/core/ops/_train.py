"""The ``train`` library: the layer, loss and optimizer ops a model replica runs.

Parameters, their gradients and an optimizer's state live in a few flat
buffers (one per parametrized layer: its weight, then its bias); the ops
address a parameter by its **offset** in such a buffer, which the existing
matmul and normalization ops (whole buffers only, gradients written rather
than accumulated) cannot. Gradient buffers share the layout of the parameter
buffers: a parameter at offset ``o`` of ``params`` has its gradient at offset
``o`` of ``grads``. Every gradient op **adds** to ``grads`` (micro-batches
accumulate); ``FillZeros`` clears them.

Activations are dense row-major ``rows x features`` matrices at offset 0 of
their buffers. Float buffers of one op share one dtype: f32, or f64 (float64
references and gradient checks). Labels are i32.

=====================  =====================================================
``LinearForward``      ``y = x @ W.T (+ b)``
``LinearBackward``     ``dW += dy.T @ x``, ``db += sum_rows dy``, ``dx = dy @ W``
``LayerNormForward``   ``y = (x - mean) * rstd * w + b`` per row; saves mean and rstd
``LayerNormBackward``  ``dw += sum(dy * xhat)``, ``db += sum(dy)``, ``dx`` written
``SoftmaxCrossEntropy``  mean softmax cross-entropy to ``loss[0]``; its gradient to ``grad``
``MseLoss``            ``mean((p - t)^2)`` to ``loss[0]``; ``2 (p - t) / count`` to ``grad``
``SgdUpdate``          torch's SGD (momentum, nesterov, weight decay) over a span
``AdamUpdate``         torch's Adam / AdamW (bias-corrected) over a span
``FillZeros``          zero a span of a buffer
``GradCheck``          ``stats[1] = sum of g^2`` over gradient buffers; ``stats[2]`` = finite?
=====================  =====================================================

Loss gradients are multiplied by ``grad_scale``, and the optimizer updates
multiply the gradient by their ``grad_scale`` first (a data-parallel trainer
passes ``1 / replicas`` there, or un-scales a loss scale). An update given a
``gate`` (a step's stats buffer, see ``GradCheck``) applies only where
``gate[2] != 0``, a flag the device computed: nothing is read back to decide.
Every handler queues its work on the op's stream and answers None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._catalogue import declare
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import (
    Op,
    is_int,
    positive_ints,
    require,
    require_dtype,
    require_len,
    require_nonneg,
    require_positive,
    require_shared_dtype,
)
from atomr_accel.core._ref import GpuRef

__all__ = [
    "HYPER_LENGTH",
    "STATS_LENGTH",
    "TRAIN_OP_DTYPES",
    "AdamUpdate",
    "FillZeros",
    "GradCheck",
    "LayerNormBackward",
    "LayerNormForward",
    "LinearBackward",
    "LinearForward",
    "MseLoss",
    "SgdUpdate",
    "SoftmaxCrossEntropy",
    "hyper_values",
]

declare("train", "Train",
        "Layer, loss and optimizer ops of model replicas (``atomr_accel.train``).",
        rank=17)

TRAIN_OP_DTYPES = (DType.F32, DType.F64)
"""The float dtypes of the train ops."""

STATS_LENGTH = 3
"""The elements of a step's stats buffer: ``[loss_sum, grad_sumsq, apply_flag]``."""
HYPER_LENGTH = 3
"""The elements of an update's ``hyper`` buffer (f64), as ``hyper_values`` gives them."""


def hyper_values(lr: float, step: int, beta1: float = 0.9, beta2: float = 0.999
                 ) -> tuple[float, float, float]:
    """What an update's ``hyper`` buffer holds for a step: ``[lr, 1 - beta1^step,
    sqrt(1 - beta2^step)]`` (Adam's bias corrections of 1-based ``step``; SGD reads
    ``lr`` alone)."""
    return lr, 1.0 - beta1 ** step, math.sqrt(1.0 - beta2 ** step)


def _floats(**refs: GpuRef | None) -> DType:
    """Every given buffer holds one dtype of ``TRAIN_OP_DTYPES``; answer it."""
    given = {name: ref for name, ref in refs.items() if ref is not None}
    return require_shared_dtype(TRAIN_OP_DTYPES, **given)


def _distinct(outputs: dict[str, GpuRef | None], inputs: dict[str, GpuRef | None]) -> None:
    """No output shares a buffer with an input or another output."""
    seen: dict[tuple[int, int], str] = {}
    for name, ref in inputs.items():
        if ref is not None:
            seen.setdefault((ref.device_id, ref.buffer_id), name)
    for name, ref in outputs.items():
        if ref is None:
            continue
        key = (ref.device_id, ref.buffer_id)
        if key in seen:
            raise InvalidArgument(f"{name} must not share a buffer with {seen[key]}")
        seen[key] = name


def _span(ref: GpuRef, offset: int, count: int, name: str) -> None:
    """``ref`` holds ``count`` elements from ``offset``."""
    require_len(ref, offset + count, name)


def _real(name: str, value: object, *, least: float | None = None,
          below: float | None = None) -> None:
    if (not isinstance(value, int | float) or isinstance(value, bool)
            or not math.isfinite(value) or (least is not None and value < least)
            or (below is not None and value >= below)):
        raise InvalidArgument(f"{name} must be a finite number"
                              f"{'' if least is None else f' >= {least}'}"
                              f"{'' if below is None else f' and < {below}'}, got {value!r}")


class _TrainOp(Op):
    """An op of the train library (the library, declared once for all of them)."""

    __slots__ = ()
    library: ClassVar[str] = "train"
    replayable: ClassVar[bool] = True


class _Linear(_TrainOp):
    """The checks both linear ops share (a mixin of field-typed dataclass ops)."""

    __slots__ = ()
    x: GpuRef
    params: GpuRef
    rows: int
    in_features: int
    out_features: int
    weight_offset: int
    bias_offset: int | None

    def _check_params(self) -> None:
        rows, fin, fout = self.rows, self.in_features, self.out_features
        if not positive_ints(rows, fin, fout):
            require_positive(rows=rows, in_features=fin, out_features=fout)
        require_nonneg(weight_offset=self.weight_offset)
        _span(self.x, 0, rows * fin, "x")
        _span(self.params, self.weight_offset, fout * fin, "params")
        if self.bias_offset is not None:
            require_nonneg(bias_offset=self.bias_offset)
            _span(self.params, self.bias_offset, fout, "params")


@dataclass(frozen=True, slots=True)
class LinearForward(_Linear):
    """``y = x @ W.T + b`` for the row-major ``rows x in_features`` ``x``.

    ``W`` (``out_features x in_features``, row-major) is at ``weight_offset`` of
    ``params``, ``b`` (``out_features``) at ``bias_offset`` (None: no bias);
    ``y`` receives ``rows x out_features``.
    """

    outputs: ClassVar[tuple[str, ...]] = ("y",)
    x: GpuRef
    params: GpuRef
    y: GpuRef
    rows: int
    in_features: int
    out_features: int
    weight_offset: int = 0
    bias_offset: int | None = None

    def validate(self) -> None:
        _floats(x=self.x, params=self.params, y=self.y)
        self._check_params()
        _span(self.y, 0, self.rows * self.out_features, "y")
        _distinct({"y": self.y}, {"x": self.x, "params": self.params})


@dataclass(frozen=True, slots=True)
class LinearBackward(_Linear):
    """The gradients of ``LinearForward``: ``dW += dy.T @ x`` at ``weight_offset`` of
    ``grads``, ``db += dy``'s column sums at ``bias_offset``, and ``dx = dy @ W``
    (written; None: not wanted). ``dy`` is ``rows x out_features``; ``grads`` has the
    layout of ``params``."""

    outputs: ClassVar[tuple[str, ...]] = ("grads", "dx")
    x: GpuRef
    params: GpuRef
    dy: GpuRef
    grads: GpuRef
    dx: GpuRef | None
    rows: int
    in_features: int
    out_features: int
    weight_offset: int = 0
    bias_offset: int | None = None

    def validate(self) -> None:
        _floats(x=self.x, params=self.params, dy=self.dy, grads=self.grads, dx=self.dx)
        self._check_params()
        _span(self.dy, 0, self.rows * self.out_features, "dy")
        _span(self.grads, self.weight_offset, self.out_features * self.in_features, "grads")
        if self.bias_offset is not None:
            _span(self.grads, self.bias_offset, self.out_features, "grads")
        if self.dx is not None:
            _span(self.dx, 0, self.rows * self.in_features, "dx")
        _distinct({"grads": self.grads, "dx": self.dx},
                  {"x": self.x, "params": self.params, "dy": self.dy})


class _Norm(_TrainOp):
    """The checks both layer-norm ops share."""

    __slots__ = ()
    x: GpuRef
    params: GpuRef
    mean: GpuRef
    rstd: GpuRef
    rows: int
    features: int
    weight_offset: int
    bias_offset: int

    def _check_norm(self) -> None:
        if not positive_ints(self.rows, self.features):
            require_positive(rows=self.rows, features=self.features)
        require_nonneg(weight_offset=self.weight_offset, bias_offset=self.bias_offset)
        _span(self.x, 0, self.rows * self.features, "x")
        _span(self.params, self.weight_offset, self.features, "params")
        _span(self.params, self.bias_offset, self.features, "params")
        _span(self.mean, 0, self.rows, "mean")
        _span(self.rstd, 0, self.rows, "rstd")


@dataclass(frozen=True, slots=True)
class LayerNormForward(_Norm):
    """Normalize each row of the ``rows x features`` ``x``: ``y = (x - mean) * rstd * w +
    b`` with ``rstd = 1 / sqrt(var + epsilon)`` (biased variance); ``w`` and ``b`` at
    their offsets of ``params``; each row's mean and rstd go to ``mean`` / ``rstd``."""

    outputs: ClassVar[tuple[str, ...]] = ("y", "mean", "rstd")
    x: GpuRef
    params: GpuRef
    y: GpuRef
    mean: GpuRef
    rstd: GpuRef
    rows: int
    features: int
    weight_offset: int = 0
    bias_offset: int = 0
    epsilon: float = 1e-5

    def validate(self) -> None:
        _floats(x=self.x, params=self.params, y=self.y, mean=self.mean, rstd=self.rstd)
        self._check_norm()
        _real("epsilon", self.epsilon)
        require(self.epsilon > 0, f"epsilon must be > 0, got {self.epsilon!r}")
        _span(self.y, 0, self.rows * self.features, "y")
        _distinct({"y": self.y, "mean": self.mean, "rstd": self.rstd},
                  {"x": self.x, "params": self.params})


@dataclass(frozen=True, slots=True)
class LayerNormBackward(_Norm):
    """The gradients of ``LayerNormForward`` from its saved ``mean`` and ``rstd``:
    ``dw += sum_rows dy * xhat``, ``db += sum_rows dy`` (at the offsets of ``grads``), and
    ``dx = rstd * (dy w - mean(dy w) - xhat * mean(dy w xhat))`` written (None: not
    wanted)."""

    outputs: ClassVar[tuple[str, ...]] = ("grads", "dx")
    x: GpuRef
    params: GpuRef
    dy: GpuRef
    mean: GpuRef
    rstd: GpuRef
    grads: GpuRef
    dx: GpuRef | None
    rows: int
    features: int
    weight_offset: int = 0
    bias_offset: int = 0

    def validate(self) -> None:
        _floats(x=self.x, params=self.params, dy=self.dy, mean=self.mean, rstd=self.rstd,
                grads=self.grads, dx=self.dx)
        self._check_norm()
        _span(self.dy, 0, self.rows * self.features, "dy")
        _span(self.grads, self.weight_offset, self.features, "grads")
        _span(self.grads, self.bias_offset, self.features, "grads")
        if self.dx is not None:
            _span(self.dx, 0, self.rows * self.features, "dx")
        _distinct({"grads": self.grads, "dx": self.dx},
                  {"x": self.x, "params": self.params, "dy": self.dy, "mean": self.mean,
                   "rstd": self.rstd})


@dataclass(frozen=True, slots=True)
class SoftmaxCrossEntropy(_TrainOp):
    """Softmax cross-entropy of the ``rows x classes`` ``logits`` against i32 ``labels``.

    ``loss[0]`` receives the mean over rows of ``-sum_c t_c log softmax(logits)_c``
    with ``t = (1 - label_smoothing) * onehot(label) + label_smoothing / classes``;
    ``grad`` (None: not wanted) receives its gradient ``(softmax - t) * grad_scale /
    rows``. Labels should lie in ``[0, classes)`` (the replica checks them on the
    host); every backend counts another label as no class (only the smoothing term).
    """

    outputs: ClassVar[tuple[str, ...]] = ("loss", "grad")
    logits: GpuRef
    labels: GpuRef
    loss: GpuRef
    grad: GpuRef | None
    rows: int
    classes: int
    label_smoothing: float = 0.0
    grad_scale: float = 1.0

    def validate(self) -> None:
        _floats(logits=self.logits, loss=self.loss, grad=self.grad)
        if not positive_ints(self.rows, self.classes):
            require_positive(rows=self.rows, classes=self.classes)
        require_dtype(self.labels, (DType.I32,), "labels")
        _real("label_smoothing", self.label_smoothing, least=0.0, below=1.0)
        _real("grad_scale", self.grad_scale)
        _span(self.logits, 0, self.rows * self.classes, "logits")
        _span(self.labels, 0, self.rows, "labels")
        _span(self.loss, 0, 1, "loss")
        if self.grad is not None:
            _span(self.grad, 0, self.rows * self.classes, "grad")
        _distinct({"loss": self.loss, "grad": self.grad},
                  {"logits": self.logits, "labels": self.labels})


@dataclass(frozen=True, slots=True)
class MseLoss(_TrainOp):
    """Mean squared error of the first ``count`` elements of ``pred`` against ``target``:
    ``loss[0] = mean((pred - target)^2)``; ``grad`` (None: not wanted) receives ``2 *
    (pred - target) * grad_scale / count``."""

    outputs: ClassVar[tuple[str, ...]] = ("loss", "grad")
    pred: GpuRef
    target: GpuRef
    loss: GpuRef
    grad: GpuRef | None
    count: int
    grad_scale: float = 1.0

    def validate(self) -> None:
        _floats(pred=self.pred, target=self.target, loss=self.loss, grad=self.grad)
        require_positive(count=self.count)
        _real("grad_scale", self.grad_scale)
        _span(self.pred, 0, self.count, "pred")
        _span(self.target, 0, self.count, "target")
        _span(self.loss, 0, 1, "loss")
        if self.grad is not None:
            _span(self.grad, 0, self.count, "grad")
        _distinct({"loss": self.loss, "grad": self.grad},
                  {"pred": self.pred, "target": self.target})


class _Update(_TrainOp):
    """The checks both optimizer updates share."""

    __slots__ = ()
    params: GpuRef
    grads: GpuRef
    offset: int
    length: int
    lr: float
    weight_decay: float
    grad_scale: float
    gate: GpuRef | None
    hyper: GpuRef | None

    def _check_update(self, **state: GpuRef | None) -> None:
        _floats(params=self.params, grads=self.grads, gate=self.gate, **state)
        if self.hyper is not None:
            require_dtype(self.hyper, (DType.F64,), "hyper")
            _span(self.hyper, 0, HYPER_LENGTH, "hyper")
        require_nonneg(offset=self.offset)
        require_positive(length=self.length)
        _real("lr", self.lr, least=0.0)
        _real("weight_decay", self.weight_decay, least=0.0)
        _real("grad_scale", self.grad_scale)
        for name, ref in (("params", self.params), ("grads", self.grads), *state.items()):
            if ref is not None:
                _span(ref, self.offset, self.length, name)
        if self.gate is not None:
            _span(self.gate, 0, STATS_LENGTH, "gate")
        _distinct({"params": self.params, **state},
                  {"grads": self.grads, "gate": self.gate, "hyper": self.hyper})


@dataclass(frozen=True, slots=True)
class SgdUpdate(_Update):
    """One ``torch.optim.SGD`` update of ``params[offset : offset + length]``.

    ``g = grad_scale * grads + weight_decay * p``; with ``momentum > 0``
    ``buf = g`` when ``first_step`` else ``momentum * buf + g`` (in
    ``momentum_buffer``), then ``g = g + momentum * buf`` (``nesterov``) or
    ``buf``; ``p -= lr * g``. One fused element-wise kernel on CUDA. With ``gate``
    (None: always) nothing changes unless ``gate[2] != 0``. With ``hyper`` (an f64
    buffer, ``hyper_values``), ``lr`` is ``hyper[0]`` as the update runs, in place of
    the op's own: an op whose learning rate changes every step is then the same op every
    step, so a sequence holding it is replayed as one recorded CUDA graph.
    """

    outputs: ClassVar[tuple[str, ...]] = ("params", "momentum_buffer")
    params: GpuRef
    grads: GpuRef
    momentum_buffer: GpuRef | None
    offset: int
    length: int
    lr: float
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    grad_scale: float = 1.0
    first_step: bool = False
    gate: GpuRef | None = None
    hyper: GpuRef | None = None

    def validate(self) -> None:
        self._check_update(momentum_buffer=self.momentum_buffer)
        _real("momentum", self.momentum, least=0.0)
        require((self.momentum > 0) == (self.momentum_buffer is not None),
                "pass momentum_buffer exactly when momentum > 0")
        require(not self.nesterov or self.momentum > 0, "nesterov needs momentum > 0")


@dataclass(frozen=True, slots=True)
class AdamUpdate(_Update):
    """One ``torch.optim.Adam`` (``decoupled=False``) or ``AdamW`` (``decoupled=True``)
    update of ``params[offset : offset + length]`` at 1-based ``step``.

    ``g = grad_scale * grads`` (``+ weight_decay * p`` for Adam; AdamW first does
    ``p *= 1 - lr * weight_decay``); ``m = beta1 m + (1 - beta1) g``; ``v = beta2 v +
    (1 - beta2) g^2``; ``p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 -
    beta2^step) + eps)``. One fused element-wise kernel on CUDA. With ``gate`` (None:
    always) nothing changes unless ``gate[2] != 0``. With ``hyper`` (an f64 buffer
    holding ``hyper_values(lr, step, beta1, beta2)``), the learning rate and the bias
    corrections are read there as the update runs, in place of the op's own ``lr`` and
    ``step``: the op is then the same every step, so a sequence holding it is replayed
    as one recorded CUDA graph.
    """

    outputs: ClassVar[tuple[str, ...]] = ("params", "exp_avg", "exp_avg_sq")
    params: GpuRef
    grads: GpuRef
    exp_avg: GpuRef
    exp_avg_sq: GpuRef
    offset: int
    length: int
    lr: float
    step: int
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = False
    grad_scale: float = 1.0
    gate: GpuRef | None = None
    hyper: GpuRef | None = None

    def validate(self) -> None:
        self._check_update(exp_avg=self.exp_avg, exp_avg_sq=self.exp_avg_sq)
        require(is_int(self.step) and self.step >= 1, f"step must be an int >= 1, got "
                                                      f"{self.step!r}")
        _real("beta1", self.beta1, least=0.0, below=1.0)
        _real("beta2", self.beta2, least=0.0, below=1.0)
        _real("eps", self.eps, least=0.0)
        require(self.eps > 0, f"eps must be > 0, got {self.eps!r}")


@dataclass(frozen=True, slots=True)
class FillZeros(_TrainOp):
    """Zero ``length`` elements of ``ref`` from ``offset`` (None: to its end)."""

    outputs: ClassVar[tuple[str, ...]] = ("ref",)
    ref: GpuRef
    offset: int = 0
    length: int | None = None

    def validate(self) -> None:
        require_nonneg(offset=self.offset)
        if self.length is None:
            require(self.offset <= self.ref.length,
                    f"offset {self.offset} is past the buffer's {self.ref.length} elements")
        else:
            require_nonneg(length=self.length)
            _span(self.ref, self.offset, self.length, "ref")


@dataclass(frozen=True, slots=True)
class GradCheck(_TrainOp):
    """The check before a step's update, on the device: ``stats[1]`` receives the sum of
    the squares of every element of every ``grads`` buffer (whole buffers), and
    ``stats[2]`` 1 when ``stats[0]`` (the step's loss sum) and ``stats[1]`` are both
    finite, else 0; the gated updates (``gate=stats``) read that flag. A sum of squares
    that overflows the dtype counts as not finite."""

    outputs: ClassVar[tuple[str, ...]] = ("stats",)
    grads: tuple[GpuRef, ...]
    stats: GpuRef

    def refs(self) -> tuple[GpuRef, ...]:
        """Every gradient buffer (a tuple field, which ``Op.refs`` skips), then ``stats``."""
        return (*self.grads, self.stats)

    def validate(self) -> None:
        grads = self.grads
        if not isinstance(grads, tuple) or not all(isinstance(g, GpuRef) for g in grads):
            raise InvalidArgument(f"grads must be a tuple of buffers, got {grads!r:.80}")
        named: dict[str, GpuRef | None] = {f"grads[{i}]": g for i, g in enumerate(grads)}
        _floats(stats=self.stats, **named)
        _span(self.stats, 0, STATS_LENGTH, "stats")
        _distinct({"stats": self.stats}, named)
