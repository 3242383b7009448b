"""cuDNN-shaped convolutions, pooling, softmax, activations, LRN and dropout on the cpu backend."""

from __future__ import annotations

from atomr_accel.backends._base import Handler
from atomr_accel.core._op import Op

__all__ = ["HANDLERS"]

HANDLERS: dict[type[Op], Handler] = {}
