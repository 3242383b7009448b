"""cuDNN-shaped normalizations: batch, layer, instance, group and RMS on the cuda backend."""

from __future__ import annotations

from atomr_accel.backends._base import Handler
from atomr_accel.core._op import Op

__all__ = ["HANDLERS"]

HANDLERS: dict[type[Op], Handler] = {}
