"""Filling the CUTLASS kernel cache ahead of time, without a GPU."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from atomr_accel.core.ops._cutlass_plan import KernelPlan

__all__ = ["build_kernels"]


def build_kernels(plans: Iterable[KernelPlan], jobs: int | None = None) -> list[Path]:
    """Compile the kernels of ``plans`` into the disk cache with nvcc, ``jobs`` at a time
    (no GPU needed: nvcc and the ``nvidia-cutlass`` package are); answer the cache files.
    Raises ``LibraryUnavailable`` without them, ``KernelCompileError`` on a compiler error."""
    from atomr_accel.backends._cutlass_build import build

    return build(plans, jobs)
