"""Tensor contractions on CUDA: cuTENSOR through ``cupyx.cutensor`` where it applies.

``contract`` runs cuTENSOR's contraction when CuPy has cuTENSOR here and the
contraction has the form cuTENSOR takes; otherwise it runs the shared handler,
which is ``cupy.einsum``. Either way it answers the name of what ran:
``"cutensor"`` or ``"cupy.einsum"``.
"""

from __future__ import annotations

import functools
from typing import Any

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cuda
from atomr_accel.backends.cpu import _tensor as shared_tensor
from atomr_accel.core.ops._tensor import Contract

__all__ = ["contract", "cutensor_module", "is_plain_contraction"]


@functools.cache
def cutensor_module() -> Any:
    """Return ``cupyx.cutensor`` when CuPy can use cuTENSOR in this process, else None.

    ``cupy.cuda.cutensor.available`` says whether the cuTENSOR library loaded;
    importing ``cupyx.cutensor`` fails when it is missing. Any failure of
    either counts as "not available": the caller then uses ``cupy.einsum``.
    """
    try:
        from cupy.cuda import cutensor as library
        from cupyx import cutensor
    except Exception:  # ImportError, or a loader error when libcutensor is absent
        return None
    return cutensor if library.available else None


def is_plain_contraction(op: Contract) -> bool:
    """True when each label of A or B also appears in another operand, and C has a label.

    That is the binary contraction cuTENSOR runs (contracted, free and batch
    modes). A label summed inside one operand alone and a 0-d result are left
    to ``einsum``, which handles every case.
    """
    a, b, c = set(op.a_modes), set(op.b_modes), set(op.c_modes)
    return bool(c) and a <= b | c and b <= a | c


@cuda.handles(Contract)
def contract(backend: ArrayBackend, op: Contract) -> str:
    """Write ``alpha * contract(A, B) + beta * C`` into ``C``; answer the implementation's name."""
    cutensor = cutensor_module()
    if cutensor is None or not is_plain_contraction(op):
        return shared_tensor.contract(backend, op)
    a, b, c = shared_tensor.operands(backend, op)
    alpha, beta = shared_tensor.scalars(op)
    if beta == 0:
        c.fill(0)  # C is write-only when beta is 0: leave no NaN for cuTENSOR to scale by 0
    cutensor.contraction(
        alpha, a, tuple(op.a_modes), b, tuple(op.b_modes), beta, c, tuple(op.c_modes)
    )
    return "cutensor"
