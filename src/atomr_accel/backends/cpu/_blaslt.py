"""cuBLASLt-shaped matmuls with fused epilogues on the cpu backend, in NumPy.

The product is computed in float32 for f16/bf16/f32 data (float64 for f64),
the epilogue applied in that precision, and the results cast back to the
buffer's dtype, as cuBLASLt accumulates and applies epilogues in its compute
type. GELU is the tanh approximation cuBLASLt uses. The auxiliary buffer is
written and read in cuBLASLt's layout (``core.ops._blaslt``): a ReLU bit mask
of ``relu_aux_ld(n)`` bytes per row, bit ``j % 8`` of byte ``j // 8``
(little-endian bit order), or the GELU input with ``gelu_aux_ld(n)`` elements
per row. Handlers answer ``"numpy"``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr_accel.backends._handlers import cpu
from atomr_accel.core._dtype import DType
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._blaslt import (
    Epilogue,
    FusedMatmul,
    FusedMatmulGrad,
    gelu_aux_ld,
    relu_aux_ld,
)

__all__ = ["fused_matmul", "fused_matmul_grad", "gelu", "gelu_grad"]

Array = np.ndarray[Any, Any]
_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))
_GELU_C = 0.044715


def gelu(x: Array) -> Array:
    """The tanh approximation of GELU: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + _GELU_C * x**3)))


def gelu_grad(x: Array) -> Array:
    """The derivative of ``gelu`` at ``x``."""
    t = np.tanh(_SQRT_2_OVER_PI * (x + _GELU_C * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _SQRT_2_OVER_PI * (
        1.0 + 3.0 * _GELU_C * x * x)


def _compute_dtype(dtype: DType) -> type:
    return np.float64 if dtype is DType.F64 else np.float32


def _matrix(backend: Any, ref: GpuRef, rows: int, cols: int, trans: bool, wide: type) -> Array:
    """The ``rows x cols`` operand ``op(X)`` in the compute precision (the buffer holds its
    transpose when ``trans``)."""
    flat = backend.array(ref.buffer_id)[: rows * cols]
    x = flat.reshape(cols, rows).T if trans else flat.reshape(rows, cols)
    out: Array = x.astype(wide)
    return out


def _product(backend: Any, op: FusedMatmul | FusedMatmulGrad) -> tuple[Array, Array, Array]:
    """``(alpha * op(A) @ op(B) + beta * C, op(A), op(B))`` in the compute precision."""
    wide = _compute_dtype(op.d.dtype)
    a = _matrix(backend, op.a, op.m, op.k, op.trans_a, wide)
    b = _matrix(backend, op.b, op.k, op.n, op.trans_b, wide)
    p = wide(op.alpha) * (a @ b)
    if op.beta != 0:
        c = backend.array(op.d.buffer_id)[: op.m * op.n].reshape(op.m, op.n).astype(wide)
        p = p + wide(op.beta) * c
    return p, a, b


def _store(backend: Any, ref: GpuRef, values: Array) -> None:
    flat = backend.array(ref.buffer_id)
    flat[: values.size] = values.reshape(-1).astype(flat.dtype)


def _aux_rows(backend: Any, ref: GpuRef, rows: int, ld: int) -> Array:
    """The ``rows x ld`` row-major view of an aux buffer."""
    rows_view: Array = backend.array(ref.buffer_id)[: rows * ld].reshape(rows, ld)
    return rows_view


def _write_aux(backend: Any, op: FusedMatmul, z: Array) -> None:
    assert op.aux is not None
    m, n = op.m, op.n
    if op.epilogue.activation == "relu":
        bits = np.packbits(z > 0, axis=1, bitorder="little")
        rows = _aux_rows(backend, op.aux, m, relu_aux_ld(n))
        rows[:, : bits.shape[1]] = bits
        rows[:, bits.shape[1]:] = 0
    else:
        rows = _aux_rows(backend, op.aux, m, gelu_aux_ld(n))
        rows[:, :n] = z.astype(rows.dtype)


def _read_aux(backend: Any, op: FusedMatmulGrad, wide: type) -> Array:
    """The forward's ``Z`` (GELU) or its ``Z > 0`` mask (ReLU) as an ``m x n`` array."""
    assert op.aux is not None
    m, n = op.m, op.n
    if op.epilogue.activation == "relu":
        rows = _aux_rows(backend, op.aux, m, relu_aux_ld(n))
        mask: Array = np.unpackbits(rows, axis=1, count=n, bitorder="little").astype(bool)
        return mask
    z: Array = _aux_rows(backend, op.aux, m, gelu_aux_ld(n))[:, :n].astype(wide)
    return z


@cpu.handles(FusedMatmul)
def fused_matmul(backend: Any, op: FusedMatmul) -> str:
    """Write ``epilogue(alpha * op(A) @ op(B) + beta * C [+ bias])`` into ``d`` (and ``aux``)."""
    p, _, _ = _product(backend, op)
    if op.epilogue.has_bias:
        assert op.bias is not None
        p = p + backend.array(op.bias.buffer_id)[: op.n].astype(p.dtype)
    if op.aux is not None:
        _write_aux(backend, op, p)
    kind = op.epilogue.activation
    if kind == "relu":
        p = np.maximum(p, 0)
    elif kind == "gelu":
        p = gelu(p)
    _store(backend, op.d, p)
    return "numpy"


@cpu.handles(FusedMatmulGrad)
def fused_matmul_grad(backend: Any, op: FusedMatmulGrad) -> str:
    """Write ``alpha * op(A) @ op(B) + beta * C`` times the activation's gradient into ``d``,
    and the bias gradient into ``bias_grad``, as the backward epilogue says."""
    p, a, b = _product(backend, op)
    epilogue = op.epilogue
    kind = epilogue.activation
    if kind == "relu":
        p = np.where(_read_aux(backend, op, p.dtype.type), p, 0)
    elif kind == "gelu":
        p = p * gelu_grad(_read_aux(backend, op, p.dtype.type))
    _store(backend, op.d, p)
    if op.bias_grad is not None:
        if epilogue is Epilogue.BGRADA:
            grad = a.sum(axis=1)
        elif epilogue is Epilogue.BGRADB:
            grad = b.sum(axis=0)
        else:  # the gradient of the bias feeding D: D's column sums
            grad = p.sum(axis=0)
        _store(backend, op.bias_grad, grad)
    return "numpy"
