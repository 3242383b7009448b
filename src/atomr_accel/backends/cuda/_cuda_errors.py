"""How CUDA's errors become the package's: the sticky faults that poison a context, and
the classification of a CuPy/CUDA exception raised by an op."""

from __future__ import annotations

import cupy as cp

from atomr_accel.core._errors import (
    ContextPoisoned,
    GpuRuntimeError,
    LibraryError,
    OutOfMemory,
)
from atomr_accel.core._op import Op

__all__ = ["STICKY_ERRORS", "STICKY_TEXTS", "classified", "translate_cuda_error"]

STICKY_ERRORS = frozenset({700, 710, 714, 715, 716, 717, 719, 999})
"""CUDA runtime errors after which the context is unusable (illegal address, ...)."""

STICKY_TEXTS = (
    "an illegal memory access was encountered", "unspecified launch failure",
    "misaligned address", "an illegal instruction was encountered",
    "device-side assert triggered", "hardware stack error",
    "operation not supported on global/shared address space", "CUDA error: unknown error",
)
"""How torch words the errors of ``STICKY_ERRORS`` ("CUDA error: <text>")."""


def classified(exc: BaseException, op: Op, probe: bool = False) -> BaseException:
    """``exc`` as the error of ``op``: a package error as it is, else translated."""
    return exc if isinstance(exc, GpuRuntimeError) else translate_cuda_error(exc, op, probe)


def translate_cuda_error(exc: BaseException, op: Op, probe: bool = False) -> GpuRuntimeError:
    """Classify a CuPy/CUDA exception: sticky faults poison the context. With ``probe`` (on
    the thread that queued ``op``, never in a CUDA callback), a library's own error is
    checked against the context's state (``_unless_sticky``)."""
    if isinstance(exc, cp.cuda.memory.OutOfMemoryError):
        return OutOfMemory(str(exc))
    status = getattr(exc, "status", None)
    kind = type(exc).__name__
    if kind in ("CUDARuntimeError", "CUDADriverError"):  # runtime and driver codes agree here
        if status in STICKY_ERRORS:
            return ContextPoisoned(f"CUDA error {status} during {type(op).__name__}: {exc}")
        if status == 2:  # cudaErrorMemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY
            return OutOfMemory(str(exc))
        error = LibraryError("cuda", status, str(exc))
    else:
        error = LibraryError(op.library, status if status is not None else type(exc).__name__,
                             str(exc))
    return _unless_sticky(error, op) if probe else error


def _unless_sticky(error: LibraryError, op: Op) -> GpuRuntimeError:
    """``error``, unless the context holds a sticky fault: a library call caught by one (a
    kernel of another stream stored through a bad address) may report it in its own words,
    such as cuBLAS's ``CUBLAS_STATUS_INTERNAL_ERROR``; then it is ``ContextPoisoned``.
    Querying the null stream tells without waiting: it answers the sticky error, if any
    (CuPy returns the status, or raises it)."""
    try:
        status = cp.cuda.runtime.streamQuery(0)
    except Exception as exc:
        status = getattr(exc, "status", None)
    if status not in STICKY_ERRORS:
        return error
    poisoned = ContextPoisoned(f"{error} during {type(op).__name__}; the context holds the "
                               f"sticky CUDA error {status}")
    poisoned.__cause__ = error
    return poisoned
