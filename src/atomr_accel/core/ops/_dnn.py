"""cuDNN-shaped convolutions, pooling, softmax, activations, LRN and dropout."""

from __future__ import annotations

__all__: list[str] = []
