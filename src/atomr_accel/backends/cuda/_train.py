"""The ``train`` library's ops on CUDA: the shared handlers on CuPy, fused optimizer updates.

The layer and loss handlers of ``backends/cpu/_train.py`` are written on
``backend.xp`` and run here on CuPy, on the op's stream (the backend runs
each handler inside ``with stream:``): matmuls through cuBLAS, the rest as
CuPy element-wise and reduction kernels. Nothing is read back to the host.

Each optimizer update is ONE fused ``ElementwiseKernel`` over its span
(parameters, gradient and state read and written once): SGD without
momentum, SGD with momentum (plain or Nesterov), and Adam/AdamW. Scalars are
passed as float64 and the arithmetic runs in the buffers' dtype; the
bias corrections are computed on the host from the step. Each kernel has a
gated twin for an op with a ``gate`` (a step's stats buffer): the same body
inside ``if (gate[2] != 0)``, so the flag ``GradCheck`` wrote is tested on the
device (an ungated op runs the plain kernel: no flag buffer to make).
``GradCheck`` runs the shared check (``check_gradients``) with one fused sum-of-squares
reduction kernel a gradient buffer (CuPy's 1-D ``dot`` would first multiply
into a temporary of the buffer's size when its CUB accelerator is on).
"""

from __future__ import annotations

import math
from typing import Any

import cupy as cp

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cuda
from atomr_accel.backends.cpu import _train as shared
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._train import AdamUpdate, GradCheck, SgdUpdate

__all__ = ["adam_update", "grad_check", "sgd_update"]


def _kernels(inputs: str, outputs: str, body: str, name: str) -> tuple[Any, Any]:
    """The plain kernel and its gated twin (one more input, ``raw T gate``, last; the
    body runs only where ``gate[2] != 0``)."""
    return (cp.ElementwiseKernel(inputs, outputs, body, name),
            cp.ElementwiseKernel(f"{inputs}, raw T gate", outputs,
                                 f"if (gate[2] != (T)0) {{\n{body}\n}}", f"{name}_gated"))


_SGD = _kernels(
    "T g, float64 lr, float64 wd, float64 scale",
    "T p",
    "p = p - (T)lr * (g * (T)scale + (T)wd * p);",
    "atomr_train_sgd",
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
)
_ADAM = _kernels(
    "T g, float64 lr, float64 beta1, float64 beta2, float64 eps, float64 wd, float64 scale, "
    "float64 correction1, float64 root2, bool decoupled",
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
)


def _launch(kernels: tuple[Any, Any], backend: ArrayBackend, gate: GpuRef | None,
            inputs: tuple[Any, ...], outputs: tuple[Any, ...]) -> None:
    """Run the plain kernel, or with ``gate`` its gated twin (the gate's first 3
    elements after the inputs)."""
    plain, gated = kernels
    if gate is None:
        plain(*inputs, *outputs)
    else:
        gated(*inputs, shared.span(backend, gate, 0, 3), *outputs)


@cuda.handles(SgdUpdate)
def sgd_update(backend: ArrayBackend, op: SgdUpdate) -> None:
    """torch's SGD over the span, one fused kernel (gated: only where ``gate[2] != 0``)."""
    p = shared.span(backend, op.params, op.offset, op.length)
    g = shared.span(backend, op.grads, op.offset, op.length)
    if op.momentum_buffer is None:
        _launch(_SGD, backend, op.gate, (g, op.lr, op.weight_decay, op.grad_scale), (p,))
        return
    buf = shared.span(backend, op.momentum_buffer, op.offset, op.length)
    _launch(_SGD_MOMENTUM, backend, op.gate, (g, op.lr, op.momentum, op.weight_decay,
            op.grad_scale, op.first_step, op.nesterov), (p, buf))


@cuda.handles(AdamUpdate)
def adam_update(backend: ArrayBackend, op: AdamUpdate) -> None:
    """torch's Adam / AdamW over the span, one fused kernel (gated: only where ``gate[2]
    != 0``)."""
    p = shared.span(backend, op.params, op.offset, op.length)
    g = shared.span(backend, op.grads, op.offset, op.length)
    m = shared.span(backend, op.exp_avg, op.offset, op.length)
    v = shared.span(backend, op.exp_avg_sq, op.offset, op.length)
    _launch(_ADAM, backend, op.gate, (g, op.lr, op.beta1, op.beta2, op.eps, op.weight_decay,
            op.grad_scale, 1.0 - op.beta1 ** op.step, math.sqrt(1.0 - op.beta2 ** op.step),
            op.decoupled), (p, m, v))


_SUMSQ = cp.ReductionKernel("T x", "T y", "x * x", "a + b", "y = a", "0", "atomr_train_sumsq")


@cuda.handles(GradCheck)
def grad_check(backend: ArrayBackend, op: GradCheck) -> None:
    """``GradCheck`` with one sum-of-squares reduction kernel a buffer, all on the
    device."""
    shared.check_gradients(backend, op, _SUMSQ)
