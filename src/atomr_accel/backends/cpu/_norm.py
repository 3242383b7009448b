"""cuDNN-shaped normalizations: batch, layer, instance, group and RMS, on NumPy or CuPy.

The handlers are written on ``backend.xp``, so the CUDA backend runs them too
where it has no cuDNN graph (its composed path); each answers the array
module's name (``"numpy"`` or ``"cupy"``). Every normalization is one shape
rule (``norm_layout``): ``x`` viewed so that its statistics reduce fixed
axes, with scale and bias broadcast along the others. Arithmetic runs in f64
on NumPy; on CuPy in f32 (f64 for f64 data); results are cast to the
buffers' dtypes. ``saved_var`` and ``NormBwd.var`` hold the inverse standard
deviation (see ``core.ops._norm``).
"""

from __future__ import annotations

from typing import Any

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cpu
from atomr_accel.core._dtype import DType
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._norm import (
    BatchNorm,
    GroupNorm,
    InstanceNorm,
    LayerNorm,
    NormBwd,
    NormLayout,
    NormMode,
    NormPhase,
    RmsNorm,
)

__all__ = [
    "affine_norm",
    "batch_norm",
    "compute_type",
    "norm_bwd",
    "normalize",
    "rms_norm",
    "statistics",
    "view",
]

Array = Any  # a NumPy or CuPy array, whichever ``backend.xp`` makes
AnyNorm = LayerNorm | InstanceNorm | GroupNorm


def compute_type(backend: ArrayBackend, dtype: DType) -> Any:
    """The arithmetic's dtype: f64 on NumPy; on CuPy f64 for f64 data, else f32."""
    xp = backend.xp
    return xp.float64 if xp.__name__ == "numpy" or dtype is DType.F64 else xp.float32


def view(backend: ArrayBackend, ref: GpuRef, shape: tuple[int, ...]) -> Array:
    """A writable view of the first ``prod(shape)`` elements of ``ref``'s buffer as ``shape``."""
    count = 1
    for n in shape:
        count *= n
    return backend.array(ref.buffer_id)[:count].reshape(shape)


def statistics(xp: Any, x: Array, layout: NormLayout, epsilon: float,
               rms: bool) -> tuple[Array | None, Array]:
    """``(mean, inverse standard deviation)`` of ``x`` (in ``layout.view``) over its
    statistics' axes; for RMS ``(None, 1 / sqrt(mean(x**2) + epsilon))``."""
    if rms:
        return None, 1.0 / xp.sqrt(xp.mean(x * x, axis=layout.reduce, keepdims=True) + epsilon)
    mean = xp.mean(x, axis=layout.reduce, keepdims=True)
    centred = x - mean
    var = xp.mean(centred * centred, axis=layout.reduce, keepdims=True)
    return mean, 1.0 / xp.sqrt(var + epsilon)


def _read(backend: ArrayBackend, ref: GpuRef | None, shape: tuple[int, ...],
          compute: Any) -> Array | None:
    return None if ref is None else view(backend, ref, shape).astype(compute)


def _write(backend: ArrayBackend, ref: GpuRef | None, shape: tuple[int, ...],
           value: Array) -> None:
    if ref is not None:
        out = view(backend, ref, shape)
        out[...] = value.astype(out.dtype)


def normalize(backend: ArrayBackend, layout: NormLayout, x_ref: GpuRef, y_ref: GpuRef,
              scale_ref: GpuRef, bias_ref: GpuRef | None, epsilon: float, *, rms: bool = False,
              saved_mean: GpuRef | None = None, saved_var: GpuRef | None = None,
              given: tuple[Array, Array] | None = None) -> tuple[Array | None, Array]:
    """Write ``y = (x - mean) * inv * scale + bias`` (``x * inv * scale + bias`` for RMS);
    the statistics are ``given`` as ``(mean, inv)`` or taken from ``x`` and written to
    ``saved_mean`` / ``saved_var``. Answers ``(mean, inv)``."""
    xp = backend.xp
    compute = compute_type(backend, x_ref.dtype)
    x = view(backend, x_ref, layout.view).astype(compute)
    mean, inv = given if given is not None else statistics(xp, x, layout, epsilon, rms)
    xhat = (x if mean is None else x - mean) * inv
    y = xhat * _read(backend, scale_ref, layout.param_shape, compute)
    bias = _read(backend, bias_ref, layout.param_shape, compute)
    _write(backend, y_ref, layout.view, y if bias is None else y + bias)
    if given is None:
        if mean is not None:
            _write(backend, saved_mean, layout.stat_shape, mean)
        _write(backend, saved_var, layout.stat_shape, inv)
    return mean, inv


@cpu.handles(BatchNorm)
def batch_norm(backend: ArrayBackend, op: BatchNorm) -> str:
    """Batch norm forward: training (batch statistics; running ones updated) or inference."""
    layout = op.layout
    compute = compute_type(backend, op.x.dtype)
    shape = layout.stat_shape
    if op.phase is NormPhase.INFERENCE:
        assert op.running_mean is not None and op.running_var is not None  # validate says so
        mean = view(backend, op.running_mean, shape).astype(compute)
        var = view(backend, op.running_var, shape).astype(compute)
        normalize(backend, layout, op.x, op.y, op.scale, op.bias, op.epsilon,
                  given=(mean, 1.0 / backend.xp.sqrt(var + op.epsilon)))
        return str(backend.xp.__name__)
    xp = backend.xp
    x = view(backend, op.x, layout.view).astype(compute)
    mean = xp.mean(x, axis=layout.reduce, keepdims=True)
    var = xp.mean((x - mean) ** 2, axis=layout.reduce, keepdims=True)
    inv = 1.0 / xp.sqrt(var + op.epsilon)
    normalize(backend, layout, op.x, op.y, op.scale, op.bias, op.epsilon, given=(mean, inv))
    _write(backend, op.saved_mean, shape, mean)
    _write(backend, op.saved_var, shape, inv)
    n, f = layout.group_size, op.exp_avg_factor
    for ref, batch in ((op.running_mean, mean), (op.running_var, var * (n / (n - 1)))):
        if ref is not None:
            running = view(backend, ref, shape)
            running[...] = ((1 - f) * running.astype(compute) + f * batch).astype(running.dtype)
    return str(xp.__name__)


@cpu.handles(LayerNorm, InstanceNorm, GroupNorm)
def affine_norm(backend: ArrayBackend, op: AnyNorm) -> str:
    """Layer, instance or group norm forward: statistics from ``x``, saved where asked."""
    normalize(backend, op.layout, op.x, op.y, op.scale, op.bias, op.epsilon,
              saved_mean=op.saved_mean, saved_var=op.saved_var)
    return str(backend.xp.__name__)


@cpu.handles(RmsNorm)
def rms_norm(backend: ArrayBackend, op: RmsNorm) -> str:
    """RMS norm forward; ``saved_var`` receives ``1 / rms``."""
    normalize(backend, op.layout, op.x, op.y, op.scale, op.bias, op.epsilon, rms=True,
              saved_var=op.saved_var)
    return str(backend.xp.__name__)


@cpu.handles(NormBwd)
def norm_bwd(backend: ArrayBackend, op: NormBwd) -> str:
    """``dx``, ``dscale`` and ``dbias`` of any normalization.

    With ``xhat`` the normalized input and ``g = dy * scale``, each statistics
    group gives ``dx = inv * (g - mean(g) - xhat * mean(g * xhat))`` (RMS: no
    ``mean(g)`` term); ``dscale = sum(dy * xhat)``, ``dbias = sum(dy)`` over
    the axes scale is broadcast along.
    """
    xp = backend.xp
    layout = op.layout
    rms = op.mode is NormMode.RMS
    compute = compute_type(backend, op.x.dtype)
    x = view(backend, op.x, layout.view).astype(compute)
    dy = view(backend, op.dy, layout.view).astype(compute)
    if op.var is None:
        mean, inv = statistics(xp, x, layout, op.epsilon, rms)
    else:
        mean = _read(backend, op.mean, layout.stat_shape, compute)
        inv = view(backend, op.var, layout.stat_shape).astype(compute)
    xhat = (x if mean is None else x - mean) * inv
    g = dy * view(backend, op.scale, layout.param_shape).astype(compute)
    inner = g - xhat * xp.mean(g * xhat, axis=layout.reduce, keepdims=True)
    if not rms:
        inner = inner - xp.mean(g, axis=layout.reduce, keepdims=True)
    _write(backend, op.dx, layout.view, inv * inner)
    shape = layout.param_shape
    if op.dscale is not None:
        _write(backend, op.dscale, shape,
               xp.sum(dy * xhat, axis=layout.param_reduce, keepdims=True))
    if op.dbias is not None:
        _write(backend, op.dbias, shape, xp.sum(dy, axis=layout.param_reduce, keepdims=True))
    return str(xp.__name__)
