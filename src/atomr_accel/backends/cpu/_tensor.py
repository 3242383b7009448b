"""CPU tensor contractions with ``numpy.einsum`` on row-major views of the buffers."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from atomr_accel.backends._base import Handler
from atomr_accel.core._op import Op
from atomr_accel.core.ops._tensor import Contract

if TYPE_CHECKING:
    from atomr_accel.backends.cpu._backend import CpuBackend

__all__ = ["HANDLERS", "contract"]


def _scalar(value: complex, complex_data: bool) -> complex:
    """Return ``value`` in the data's field: its real part for real data (results stay real)."""
    return value if complex_data else complex(value).real


def contract(backend: CpuBackend, op: Contract) -> str:
    """Write ``alpha * einsum(A, B) + beta * C`` into ``C``; answer ``"numpy.einsum"``."""
    a = backend.array(op.a.buffer_id)[: math.prod(op.a_shape)].reshape(op.a_shape)
    b = backend.array(op.b.buffer_id)[: math.prod(op.b_shape)].reshape(op.b_shape)
    c = backend.array(op.c.buffer_id)[: math.prod(op.c_shape)].reshape(op.c_shape)
    product = np.einsum(op.subscripts, a, b, optimize=True)
    alpha = _scalar(op.alpha, op.c.dtype.is_complex)
    beta = _scalar(op.beta, op.c.dtype.is_complex)
    c[...] = alpha * product if beta == 0 else alpha * product + beta * c
    return "numpy.einsum"


HANDLERS: dict[type[Op], Handler] = {Contract: contract}
