"""Handlers that compute through NaN, infinities and overflow without NumPy's warnings.

A CUDA kernel computes through them without a word, and so do these CPU
handlers: the training path (training data may hold NaN or infinities; a
trainer refuses such a step from its loss and gradient norm afterwards) and
CUTLASS's epilogues (silu's ``exp(-x)`` overflows to infinity below about -88,
giving -0). Elsewhere NumPy's warnings stay as they are.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from atomr_accel.backends._base import Handler

__all__ = ["quiet"]


def quiet(handler: Handler) -> Handler:
    """``handler``, running with NumPy's floating-point warnings off."""
    @functools.wraps(handler)
    def run(backend: Any, op: Any) -> Any:
        with np.errstate(all="ignore"):
            return handler(backend, op)

    return run

