"""cuDNN-shaped normalizations: batch, layer, instance, group and RMS."""

from __future__ import annotations

__all__: list[str] = []
