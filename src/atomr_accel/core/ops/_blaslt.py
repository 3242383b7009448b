"""cuBLASLt-shaped matmuls with fused epilogues."""

from __future__ import annotations

__all__: list[str] = []
