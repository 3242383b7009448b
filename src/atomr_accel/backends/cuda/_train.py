"""The ``train`` library's ops on CUDA: the shared handlers on CuPy, fused optimizer updates.

The layer and loss handlers of ``backends/cpu/_train.py`` are written on
``backend.xp`` and run here on CuPy, on the op's stream (the backend runs
each handler inside ``with stream:``): matmuls through cuBLAS, the rest as
CuPy element-wise and reduction kernels. Nothing is read back to the host.

Each optimizer update is ONE fused ``ElementwiseKernel`` over its span
(parameters, gradient and state read and written once): SGD without
momentum, SGD with momentum (plain or Nesterov), and Adam/AdamW. Scalars are
passed as float64 and the arithmetic runs in the buffers' dtype; the
bias corrections are computed on the host from the step, or, for an op with a
``hyper`` buffer, read by the kernel from there (``[lr, correction1, root2]``, which
the replica writes each step: a recorded graph replays each step's values). Each kernel has a
gated twin for an op with a ``gate`` (a step's stats buffer): the same body
inside ``if (gate[2] != 0)``, so the flag ``GradCheck`` wrote is tested on the
device (an ungated op runs the plain kernel: no flag buffer to make).
``GradCheck`` runs the shared check (``check_gradients``) with one fused sum-of-squares
reduction kernel a gradient buffer (CuPy's 1-D ``dot`` would first multiply
into a temporary of the buffer's size when its CUB accelerator is on).
"""

from __future__ import annotations

from typing import Any

import cupy as cp

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cuda
from atomr_accel.backends.cpu import _train as shared
from atomr_accel.core.ops._train import (
    HYPER_LENGTH,
    AdamUpdate,
    GradCheck,
    SgdUpdate,
    hyper_values,
)

__all__ = ["adam_update", "grad_check", "sgd_update"]


Kernels = dict[tuple[bool, bool], Any]
"""An update's kernels by (gated, reads ``hyper``)."""


def _kernels(inputs: str, outputs: str, body: str, name: str, hyper_inputs: str,
             hyper_scalars: str) -> Kernels:
    """The plain kernel, its gated twin (one more input, ``raw T gate``, last; the body
    runs only where ``gate[2] != 0``), and the two of them reading the step's scalars from
    ``raw float64 hyper`` (``hyper_inputs`` in place of ``inputs``; ``hyper_scalars``
    defines from ``hyper`` the scalars the body uses)."""
    made: Kernels = {}
    for reads in (False, True):
        params, full = (hyper_inputs, f"{hyper_scalars}\n{body}") if reads else (inputs, body)
        suffix = "_hyper" if reads else ""
        made[False, reads] = cp.ElementwiseKernel(params, outputs, full, f"{name}{suffix}")
        made[True, reads] = cp.ElementwiseKernel(
            f"{params}, raw T gate", outputs, f"if (gate[2] != (T)0) {{\n{full}\n}}",
            f"{name}{suffix}_gated")
    return made


_LR = "const double lr = hyper[0];"
_SGD = _kernels(
    "T g, float64 lr, float64 wd, float64 scale",
    "T p",
    "p = p - (T)lr * (g * (T)scale + (T)wd * p);",
    "atomr_train_sgd",
    "T g, raw float64 hyper, float64 wd, float64 scale",
    _LR,
)
_SGD_MOMENTUM = _kernels(
    "T g, float64 lr, float64 momentum, float64 wd, float64 scale, bool first, bool nesterov",
    "T p, T buf",
    """
    T d = g * (T)scale + (T)wd * p;
    buf = first ? d : (T)momentum * buf + d;
    d = nesterov ? d + (T)momentum * buf : buf;
    p = p - (T)lr * d;
    """,
    "atomr_train_sgd_momentum",
    "T g, raw float64 hyper, float64 momentum, float64 wd, float64 scale, bool first, "
    "bool nesterov",
    _LR,
)
_ADAM_SCALARS = "float64 beta1, float64 beta2, float64 eps, float64 wd, float64 scale"
_ADAM = _kernels(
    f"T g, float64 lr, {_ADAM_SCALARS}, float64 correction1, float64 root2, bool decoupled",
    "T p, T m, T v",
    """
    T d = g * (T)scale;
    if (decoupled) {
        p = p * (T)(1.0 - lr * wd);
    } else {
        d = d + (T)wd * p;
    }
    m = (T)beta1 * m + (T)(1.0 - beta1) * d;
    v = (T)beta2 * v + (T)(1.0 - beta2) * d * d;
    p = p - (T)(lr / correction1) * m / (sqrt(v) / (T)root2 + (T)eps);
    """,
    "atomr_train_adam",
    f"T g, raw float64 hyper, {_ADAM_SCALARS}, bool decoupled",
    f"{_LR}\nconst double correction1 = hyper[1];\nconst double root2 = hyper[2];",
)


def _lr(backend: ArrayBackend, op: SgdUpdate | AdamUpdate) -> Any:
    """The learning-rate argument of the update's kernel: its ``hyper`` buffer when it has
    one (the kernel reads ``hyper_values`` there), else its own ``lr``."""
    if op.hyper is None:
        return op.lr
    return shared.span(backend, op.hyper, 0, HYPER_LENGTH)


def _launch(kernels: Kernels, backend: ArrayBackend, op: SgdUpdate | AdamUpdate,
            inputs: tuple[Any, ...], outputs: tuple[Any, ...]) -> None:
    """Run the update's kernel (gated or not, reading ``hyper`` or not); with a ``gate``,
    its first 3 elements go after ``inputs``."""
    kernel = kernels[op.gate is not None, op.hyper is not None]
    if op.gate is None:
        kernel(*inputs, *outputs)
    else:
        kernel(*inputs, shared.span(backend, op.gate, 0, 3), *outputs)


@cuda.handles(SgdUpdate)
def sgd_update(backend: ArrayBackend, op: SgdUpdate) -> None:
    """torch's SGD over the span, one fused kernel (gated: only where ``gate[2] != 0``)."""
    p = shared.span(backend, op.params, op.offset, op.length)
    g = shared.span(backend, op.grads, op.offset, op.length)
    lr = _lr(backend, op)
    if op.momentum_buffer is None:
        _launch(_SGD, backend, op, (g, lr, op.weight_decay, op.grad_scale), (p,))
        return
    buf = shared.span(backend, op.momentum_buffer, op.offset, op.length)
    _launch(_SGD_MOMENTUM, backend, op, (g, lr, op.momentum, op.weight_decay,
            op.grad_scale, op.first_step, op.nesterov), (p, buf))


@cuda.handles(AdamUpdate)
def adam_update(backend: ArrayBackend, op: AdamUpdate) -> None:
    """torch's Adam / AdamW over the span, one fused kernel (gated: only where ``gate[2]
    != 0``); the bias corrections from the op's step, or in the kernel from ``hyper``."""
    p = shared.span(backend, op.params, op.offset, op.length)
    g = shared.span(backend, op.grads, op.offset, op.length)
    m = shared.span(backend, op.exp_avg, op.offset, op.length)
    v = shared.span(backend, op.exp_avg_sq, op.offset, op.length)
    corrections = () if op.hyper is not None else hyper_values(
        op.lr, op.step, op.beta1, op.beta2)[1:]
    _launch(_ADAM, backend, op, (g, _lr(backend, op), op.beta1, op.beta2, op.eps,
            op.weight_decay, op.grad_scale, *corrections, op.decoupled), (p, m, v))


_SUMSQ = cp.ReductionKernel("T x", "T y", "x * x", "a + b", "y = a", "0", "atomr_train_sumsq")


@cuda.handles(GradCheck)
def grad_check(backend: ArrayBackend, op: GradCheck) -> None:
    """``GradCheck`` with one sum-of-squares reduction kernel a buffer, all on the
    device."""
    shared.check_gradients(backend, op, _SUMSQ)
