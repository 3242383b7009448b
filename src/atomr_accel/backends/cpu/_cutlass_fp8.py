"""The fp8 GEMM on NumPy (the reference the CUDA kernel is checked against).

The operands' bits are decoded with ``ml_dtypes`` (exact in f32), multiplied
and accumulated in f32 (``fast_accum`` changes only the CUDA kernel), scaled
by ``scale_a * scale_b`` (and the epilogue's ``scale``), then the epilogue runs
node by node as for ``CutlassGemm``, with one rounding to D's dtype after the
activation.
"""

from __future__ import annotations

import numpy as np

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cpu
from atomr_accel.backends.cpu._cutlass import _erf, apply_epilogue, ledger
from atomr_accel.core._fp8 import fp8_dtype
from atomr_accel.core.ops._cutlass import Axis, Epilogue, Scale
from atomr_accel.core.ops._cutlass_fp8 import CutlassGemmFp8
from atomr_accel.core.ops._cutlass_plan import KernelPlan, gemm_fp8_plan

__all__ = ["fp8_plan_of", "kernel_epilogue"]


def fp8_plan_of(op: CutlassGemmFp8, arch: str = "sm_90a") -> KernelPlan:
    """The kernel plan an fp8 GEMM runs with on ``arch`` (Hopper only)."""
    bias = op.epilogue.bias_node
    axis = "row" if bias is not None and bias.axis is Axis.ROW else "column"
    return gemm_fp8_plan(op.d.dtype, op.m, op.n, op.k, op.a_format, op.b_format, arch,
                         axis, op.fast_accum)


def kernel_epilogue(op: CutlassGemmFp8) -> Epilogue:
    """The op's epilogue with its scale node replaced by the one scale the kernel applies
    (``scale_a * scale_b * alpha``), first in the chain."""
    rest = tuple(node for node in op.epilogue.nodes if not isinstance(node, Scale))
    return Epilogue((Scale(op.alpha), *rest))


def _operand(backend: ArrayBackend, op: CutlassGemmFp8, which: str) -> np.ndarray:
    ref, fmt, rows = ((op.a, op.a_format, op.m) if which == "a" else (op.b, op.b_format, op.n))
    bits = backend.array(ref.buffer_id)[: rows * op.k]
    return np.ascontiguousarray(bits).view(fp8_dtype(fmt)).astype(np.float32).reshape(rows, op.k)


@cpu.handles(CutlassGemmFp8, quiet=True)
def gemm_fp8(backend: ArrayBackend, op: CutlassGemmFp8) -> None:
    """``D = epilogue(scale_a * scale_b * A @ B)`` in f32 (``b`` holds ``B`` transposed)."""
    a = _operand(backend, op, "a")
    bt = _operand(backend, op, "b")
    out = backend.array(op.d.buffer_id)[: op.m * op.n].reshape(op.m, op.n)
    apply_epilogue(np, a @ bt.T, kernel_epilogue(op), lambda r: backend.array(r.buffer_id),
                   out, _erf)  # run quieted (cpu/_backend.py): silu's exp(-x) may overflow
    ledger(backend).launched(fp8_plan_of(op))
