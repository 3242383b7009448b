"""The ``train`` library's ops on NumPy (written on ``backend.xp``, so CuPy runs them too).

Arithmetic runs in the buffers' dtype (f32 or f64). Gradient ops add into
their ``grads`` spans; losses write ``loss[0]`` and their gradient. A label
outside ``[0, classes)`` counts as no class (only the smoothing term), the
same on every backend. No handler reads a device value back to the host, but
the gated updates here read their flag (``gate[2]``): CUDA runs its own fused
update kernels, which test the flag on the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import shared
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._train import (
    HYPER_LENGTH,
    AdamUpdate,
    FillZeros,
    GradCheck,
    LayerNormBackward,
    LayerNormForward,
    LinearBackward,
    LinearForward,
    MseLoss,
    SgdUpdate,
    SoftmaxCrossEntropy,
    hyper_values,
)

__all__ = [
    "adam_update",
    "check_gradients",
    "fill_zeros",
    "grad_check",
    "layer_norm_backward",
    "layer_norm_forward",
    "linear_backward",
    "linear_forward",
    "mse_loss",
    "sgd_update",
    "softmax_cross_entropy",
    "span",
]

Array = Any  # a NumPy or CuPy array, whichever ``backend.xp`` makes


def span(backend: ArrayBackend, ref: GpuRef, offset: int, count: int,
         shape: tuple[int, ...] | None = None) -> Array:
    """A writable view of ``count`` elements of ``ref``'s buffer from ``offset`` (in
    ``shape`` when given)."""
    view = backend.array(ref.buffer_id)[offset: offset + count]
    return view if shape is None else view.reshape(shape)


def _weight(backend: ArrayBackend, op: LinearForward | LinearBackward, ref: GpuRef) -> Array:
    return span(backend, ref, op.weight_offset, op.out_features * op.in_features,
                (op.out_features, op.in_features))


@shared.handles(LinearForward, quiet=True)
def linear_forward(backend: ArrayBackend, op: LinearForward) -> None:
    """``y = x @ W.T (+ b)``."""
    xp = backend.xp
    x = span(backend, op.x, 0, op.rows * op.in_features, (op.rows, op.in_features))
    y = span(backend, op.y, 0, op.rows * op.out_features, (op.rows, op.out_features))
    xp.matmul(x, _weight(backend, op, op.params).T, out=y)
    if op.bias_offset is not None:
        y += span(backend, op.params, op.bias_offset, op.out_features)


@shared.handles(LinearBackward, quiet=True)
def linear_backward(backend: ArrayBackend, op: LinearBackward) -> None:
    """``dW += dy.T @ x``, ``db += sum_rows dy``, ``dx = dy @ W``."""
    xp = backend.xp
    x = span(backend, op.x, 0, op.rows * op.in_features, (op.rows, op.in_features))
    dy = span(backend, op.dy, 0, op.rows * op.out_features, (op.rows, op.out_features))
    grad_w = _weight(backend, op, op.grads)
    grad_w += dy.T @ x
    if op.bias_offset is not None:
        grad_b = span(backend, op.grads, op.bias_offset, op.out_features)
        grad_b += dy.sum(axis=0)
    if op.dx is not None:
        dx = span(backend, op.dx, 0, op.rows * op.in_features, (op.rows, op.in_features))
        xp.matmul(dy, _weight(backend, op, op.params), out=dx)


def _norm_views(backend: ArrayBackend, op: LayerNormForward | LayerNormBackward
                ) -> tuple[Array, Array, Array, Array]:
    rows, n = op.rows, op.features
    x = span(backend, op.x, 0, rows * n, (rows, n))
    w = span(backend, op.params, op.weight_offset, n)
    mean = span(backend, op.mean, 0, rows, (rows, 1))
    rstd = span(backend, op.rstd, 0, rows, (rows, 1))
    return x, w, mean, rstd


@shared.handles(LayerNormForward, quiet=True)
def layer_norm_forward(backend: ArrayBackend, op: LayerNormForward) -> None:
    """``y = (x - mean) * rstd * w + b`` per row; the row statistics saved."""
    xp = backend.xp
    x, w, mean, rstd = _norm_views(backend, op)
    mean[...] = x.mean(axis=1, keepdims=True)
    centred = x - mean
    rstd[...] = 1.0 / xp.sqrt((centred * centred).mean(axis=1, keepdims=True) + op.epsilon)
    y = span(backend, op.y, 0, op.rows * op.features, (op.rows, op.features))
    y[...] = centred * rstd * w + span(backend, op.params, op.bias_offset, op.features)


@shared.handles(LayerNormBackward, quiet=True)
def layer_norm_backward(backend: ArrayBackend, op: LayerNormBackward) -> None:
    """``dw += sum dy xhat``, ``db += sum dy``; ``dx = rstd (g - mean g - xhat mean(g
    xhat))`` with ``g = dy w``."""
    x, w, mean, rstd = _norm_views(backend, op)
    rows, n = op.rows, op.features
    dy = span(backend, op.dy, 0, rows * n, (rows, n))
    xhat = (x - mean) * rstd
    span(backend, op.grads, op.weight_offset, n)[...] += (dy * xhat).sum(axis=0)
    span(backend, op.grads, op.bias_offset, n)[...] += dy.sum(axis=0)
    if op.dx is not None:
        g = dy * w
        dx = span(backend, op.dx, 0, rows * n, (rows, n))
        dx[...] = rstd * (g - g.mean(axis=1, keepdims=True)
                          - xhat * (g * xhat).mean(axis=1, keepdims=True))


@shared.handles(SoftmaxCrossEntropy, quiet=True)
def softmax_cross_entropy(backend: ArrayBackend, op: SoftmaxCrossEntropy) -> None:
    """Mean softmax cross-entropy with label smoothing into ``loss[0]``; its gradient."""
    xp = backend.xp
    rows, classes, s = op.rows, op.classes, op.label_smoothing
    logits = span(backend, op.logits, 0, rows * classes, (rows, classes))
    labels = span(backend, op.labels, 0, rows)
    valid = (labels >= 0) & (labels < classes)
    index = xp.where(valid, labels, 0).astype(xp.int64)
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - xp.log(xp.exp(z).sum(axis=1, keepdims=True))
    picked = xp.take_along_axis(logp, index[:, None], axis=1)[:, 0] * valid
    per_row = -(1.0 - s) * picked - (s / classes) * logp.sum(axis=1)
    span(backend, op.loss, 0, 1)[...] = per_row.mean(keepdims=True)
    if op.grad is not None:
        grad = span(backend, op.grad, 0, rows * classes, (rows, classes))
        grad[...] = xp.exp(logp) - s / classes
        rows_index = xp.arange(rows)
        grad[rows_index, index] -= (1.0 - s) * valid
        grad *= op.grad_scale / rows


@shared.handles(MseLoss, quiet=True)
def mse_loss(backend: ArrayBackend, op: MseLoss) -> None:
    """``loss[0] = mean((p - t)^2)``; ``grad = 2 (p - t) grad_scale / count``."""
    diff = span(backend, op.pred, 0, op.count) - span(backend, op.target, 0, op.count)
    span(backend, op.loss, 0, 1)[...] = (diff * diff).mean(keepdims=True)
    if op.grad is not None:
        span(backend, op.grad, 0, op.count)[...] = diff * (2.0 * op.grad_scale / op.count)


def _open(backend: ArrayBackend, gate: GpuRef | None) -> bool:
    """Whether an update applies: no gate, or a gate whose flag (``gate[2]``) is not 0."""
    return gate is None or bool(span(backend, gate, 2, 1)[0] != 0)


def _scalars(backend: ArrayBackend, op: SgdUpdate | AdamUpdate
             ) -> tuple[float, float, float]:
    """The update's learning rate and Adam's two bias corrections (``hyper_values``):
    read from ``hyper`` when it has one, else from its own ``lr`` (and ``step``)."""
    if op.hyper is not None:
        lr, correction1, root2 = span(backend, op.hyper, 0, HYPER_LENGTH).tolist()
        return float(lr), float(correction1), float(root2)
    if isinstance(op, AdamUpdate):
        return hyper_values(op.lr, op.step, op.beta1, op.beta2)
    return op.lr, 1.0, 1.0


@shared.handles(SgdUpdate, quiet=True)
def sgd_update(backend: ArrayBackend, op: SgdUpdate) -> None:
    """torch's SGD over the span (see ``SgdUpdate``); nothing when its gate is closed."""
    if not _open(backend, op.gate):
        return
    lr, _, _ = _scalars(backend, op)
    p = span(backend, op.params, op.offset, op.length)
    g = span(backend, op.grads, op.offset, op.length) * op.grad_scale
    if op.weight_decay:
        g = g + op.weight_decay * p
    if op.momentum_buffer is not None:
        buf = span(backend, op.momentum_buffer, op.offset, op.length)
        if op.first_step:
            buf[...] = g
        else:
            buf *= op.momentum
            buf += g
        g = g + op.momentum * buf if op.nesterov else buf
    p -= lr * g


@shared.handles(AdamUpdate, quiet=True)
def adam_update(backend: ArrayBackend, op: AdamUpdate) -> None:
    """torch's Adam / AdamW over the span (see ``AdamUpdate``); nothing when its gate is
    closed."""
    if not _open(backend, op.gate):
        return
    lr, correction1, root2 = _scalars(backend, op)
    xp = backend.xp
    p = span(backend, op.params, op.offset, op.length)
    m = span(backend, op.exp_avg, op.offset, op.length)
    v = span(backend, op.exp_avg_sq, op.offset, op.length)
    g = span(backend, op.grads, op.offset, op.length) * op.grad_scale
    if op.decoupled:
        p *= 1.0 - lr * op.weight_decay
    elif op.weight_decay:
        g = g + op.weight_decay * p
    m *= op.beta1
    m += (1.0 - op.beta1) * g
    v *= op.beta2
    v += (1.0 - op.beta2) * g * g
    p -= (lr / correction1) * m / (xp.sqrt(v) / root2 + op.eps)


@shared.handles(FillZeros, quiet=True)
def fill_zeros(backend: ArrayBackend, op: FillZeros) -> None:
    """Zero the span."""
    flat = backend.array(op.ref.buffer_id)
    end = len(flat) if op.length is None else op.offset + op.length
    flat[op.offset: end] = 0


@shared.handles(GradCheck, quiet=True)
def grad_check(backend: ArrayBackend, op: GradCheck) -> None:
    """``stats[1] = sum of g^2`` over every gradient buffer, ``stats[2] = 1`` when
    ``stats[0]`` and ``stats[1]`` are finite else 0 (``check_gradients`` with a 1-D
    ``dot`` a buffer)."""
    check_gradients(backend, op, lambda g: backend.xp.dot(g, g))


def check_gradients(backend: ArrayBackend, op: GradCheck,
                    sum_of_squares: Callable[[Array], Array]) -> None:
    """``GradCheck`` with ``sum_of_squares(g)`` (a 1-element array on the backend) for
    each gradient buffer: array ops only, so on CuPy it all stays on the device."""
    stats = span(backend, op.stats, 0, 3)
    total = stats[1:2]
    total[...] = 0  # quiet: an overflow to infinity warns nothing, it makes the flag 0
    for ref in op.grads:
        total += sum_of_squares(span(backend, ref, 0, ref.length))
    stats[2:3] = backend.xp.isfinite(stats[0:2]).all().astype(stats.dtype)
