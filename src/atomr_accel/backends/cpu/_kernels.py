"""User kernels on the CPU backend: refused with a clear error (NVRTC needs a CUDA device)."""

from __future__ import annotations

from typing import Any

from atomr_accel.backends._handlers import cpu
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import Op
from atomr_accel.core.ops._kernels import CompileKernel, LaunchKernel, LoadKernel

__all__: list[str] = []


@cpu.handles(CompileKernel, LoadKernel, LaunchKernel)
def refuse(backend: Any, op: Op) -> None:
    """Say that CUDA C kernels and modules need the CUDA backend."""
    if isinstance(op, LaunchKernel) and op.uses_hopper():
        raise InvalidArgument(
            "thread-block clusters and tensor maps need a CUDA device of compute capability "
            "9.0 or newer; the cpu backend cannot run them")
    raise InvalidArgument(
        f"{type(op).__name__} needs the CUDA backend: the cpu backend cannot compile, load or "
        "run CUDA kernels (spawn the device with backend='cuda')"
    )
