"""Direct calls into the CUDA libraries CuPy has loaded, where CuPy's wrappers fall short.

* Stream capture: CuPy refuses every cuBLAS call while a stream captures (its
  ``setStream`` guard), though cuBLAS supports capture. So a gemm or gemv recorded into
  a graph calls cuBLAS directly, on a handle bound to the capturing stream before the
  capture.
* Missing wrappers: CuPy 14 wraps no rot, swap or copy, so those are called here too.
* Managed memory: CuPy's ``memPrefetchAsync``/``memAdvise`` take a device ordinal,
  which CUDA 13 no longer accepts for the host; the driver's ``cuMemPrefetchAsync_v2``
  and ``cuMemAdvise_v2`` take a location (device or host) on every CUDA 12.2+ driver.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

from atomr_accel.core._errors import LibraryError

__all__ = [
    "advise",
    "call_cublas",
    "cublas_function",
    "loaded_library",
    "prefetch",
]


@functools.cache
def loaded_library(stem: str) -> ctypes.CDLL:
    """The shared library named ``stem`` (``"libcublas"``) that this process has loaded."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.rstrip("\n").split(maxsplit=5)[-1]
            if os.path.basename(path).startswith(f"{stem}.so"):
                return ctypes.CDLL(path)
    raise LibraryError(stem, "not loaded", f"{stem} is not loaded in this process")


_P = ctypes.c_void_p
_I = ctypes.c_int
_L = ctypes.c_longlong
_S = ctypes.c_size_t
_GEMM = [_P, _I, _I, _I, _I, _I, _P, _P, _I, _P, _I, _P, _P, _I]
_GEMM_STRIDED = [_P, _I, _I, _I, _I, _I, _P, _P, _I, _L, _P, _I, _L, _P, _P, _I, _L, _I]
_TWO_VECTORS = [_P, _I, _P, _I, _P, _I]  # handle, n, x, incx, y, incy
_ARGTYPES = {  # routine name suffix -> argument types
    "gemm_v2": _GEMM,
    "gemmStridedBatched": _GEMM_STRIDED,
    # handle, trans, m, n, alpha, A, lda, x, incx, beta, y, incy
    "gemv_v2": [_P, _I, _I, _I, _P, _P, _I, _P, _I, _P, _P, _I],
    "rot_v2": [*_TWO_VECTORS, _P, _P],  # ..., c, s (host pointers)
    "swap_v2": _TWO_VECTORS,
    "copy_v2": _TWO_VECTORS,
}


@functools.cache
def cublas_function(name: str) -> Any:
    """A cuBLAS entry point (``"cublasSgemm_v2"``, ``"cublasDrot_v2"``, ...) with its
    argument types."""
    for suffix, types in _ARGTYPES.items():
        if name.endswith(suffix):
            function = getattr(loaded_library("libcublas"), name)
            function.argtypes = types
            function.restype = _I
            return function
    raise LibraryError("cublas", "unsupported", f"{name} is not called directly here (no "
                       "argument types are declared for it)")


def call_cublas(name: str, *args: Any) -> None:
    """Call a cuBLAS entry point and raise ``LibraryError`` for a non-zero status."""
    status = cublas_function(name)(*args)
    if status != 0:
        raise LibraryError("cublas", int(status), f"{name} failed with status {int(status)}")


class _Location(ctypes.Structure):
    """``CUmemLocation``: a device (type 1) or the host (type 2)."""

    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


def _location(device: int | None) -> _Location:
    return _Location(2, 0) if device is None else _Location(1, device)


@functools.cache
def _driver(name: str, *argtypes: Any) -> Any:
    """A CUDA driver entry point with its argument types."""
    function = getattr(loaded_library("libcuda"), name)
    function.argtypes = list(argtypes)
    function.restype = _I
    return function


def _check_driver(status: int) -> None:
    if status != 0:
        from cupy_backends.cuda.api.driver import CUDADriverError

        raise CUDADriverError(status)  # classified like any CUDA error (sticky, OOM, ...)


def prefetch(pointer: int, nbytes: int, device: int | None, stream: int) -> None:
    """Migrate managed memory to ``device`` (None: the host), in ``stream`` order."""
    function = _driver("cuMemPrefetchAsync_v2", _P, _S, _Location, ctypes.c_uint, _P)
    _check_driver(function(pointer, nbytes, _location(device), 0, stream))


def advise(pointer: int, nbytes: int, advice: int, device: int | None) -> None:
    """``cuMemAdvise_v2`` with a location: ``device`` (None: the host)."""
    function = _driver("cuMemAdvise_v2", _P, _S, _I, _Location)
    _check_driver(function(pointer, nbytes, advice, _location(device)))
