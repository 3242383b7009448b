"""Tensor contractions on row-major views of the buffers; runs on NumPy or CuPy.

The shared handler ``contract`` runs ``backend.xp.einsum`` and answers the name
of that function, so the backend's array module names the implementation:
``"numpy.einsum"`` on CPU, ``"cupy.einsum"`` on CUDA. The CUDA backend
registers its own handler, which runs cuTENSOR where it can and falls back to
this one.
"""

from __future__ import annotations

import math
from typing import Any

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cpu
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._tensor import Contract

__all__ = ["contract", "operands", "scalars"]

Array = Any  # a NumPy or CuPy array, whichever ``backend.xp`` makes


def operands(backend: ArrayBackend, op: Contract) -> tuple[Array, Array, Array]:
    """Return writable row-major views of ``A``, ``B`` and ``C`` in their buffers."""

    def view(ref: GpuRef, shape: tuple[int, ...]) -> Array:
        return backend.array(ref.buffer_id)[: math.prod(shape)].reshape(shape)

    return view(op.a, op.a_shape), view(op.b, op.b_shape), view(op.c, op.c_shape)


def scalars(op: Contract) -> tuple[complex, complex]:
    """Return ``(alpha, beta)`` in the data's field: real parts only for real data."""
    if op.c.dtype.is_complex:
        return complex(op.alpha), complex(op.beta)
    return complex(op.alpha).real, complex(op.beta).real


@cpu.handles(Contract)
def contract(backend: ArrayBackend, op: Contract) -> str:
    """Write ``alpha * einsum(A, B) + beta * C`` into ``C``; answer ``"<xp>.einsum"``."""
    a, b, c = operands(backend, op)
    xp = backend.xp
    product = xp.einsum(op.subscripts, a, b, optimize=True)
    alpha, beta = scalars(op)
    c[...] = alpha * product if beta == 0 else alpha * product + beta * c
    return f"{xp.__name__}.einsum"
