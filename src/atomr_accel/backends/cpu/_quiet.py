"""Handlers that compute through NaN and infinities without NumPy's warnings, as a GPU does.

Training data may hold NaN or infinities (a trainer refuses such a step from its
loss and gradient norm afterwards); a CUDA kernel computes through them without
a word, so the CPU backend's training-path handlers do too. Elsewhere NumPy's
warnings stay as they are.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from atomr_accel.backends._base import Handler
from atomr_accel.core._op import Op

__all__ = ["quieted"]


def _quiet(handler: Handler) -> Handler:
    @functools.wraps(handler)
    def run(backend: Any, op: Any) -> Any:
        with np.errstate(all="ignore"):
            return handler(backend, op)

    return run


def quieted(handlers: Mapping[type[Op], Handler]) -> dict[type[Op], Handler]:
    """``handlers``, each running with NumPy's floating-point warnings off."""
    return {op: _quiet(handler) for op, handler in handlers.items()}
