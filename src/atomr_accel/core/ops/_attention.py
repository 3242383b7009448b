"""Scaled-dot-product attention (FlashAttn) and cuDNN's multi-head attention."""

from __future__ import annotations

__all__: list[str] = []
