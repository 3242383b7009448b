"""The per-dtype twins of ``Device``'s allocate and copies (``allocate_f32``,
``copy_from_numpy_f64``, ``copy_to_numpy_complex64``, ...): the original package's
methods, each a thin call of the general one with its dtype fixed."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import numpy as np

from atomr_accel.core._dtype import DType
from atomr_accel.facade._buffers import BufferLike, GpuBuffer
from atomr_accel.facade._portal import blocking

if TYPE_CHECKING:
    from atomr_accel.facade._device import Device

__all__ = ["typed_allocate", "typed_download", "typed_upload"]

_DEVICE_MODULE = "atomr_accel.facade._device"
"""The module the twins report as theirs: ``Device``'s, whose methods they are (the package
gives its public module to the methods written there)."""

_SUFFIX = {DType.C64: "complex64", DType.C128: "complex128"}
"""The original package's name of a dtype in method names (others: ``f32``, ``u8``, ...)."""


def _typed(name: str, dtype: DType, run_async: Callable[..., Any],
           doc: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """Name and document a per-dtype method; return it and its blocking twin."""
    full = f"{name}_{_SUFFIX.get(dtype, dtype.value)}"
    run_async.__name__ = f"{full}_async"
    run_async.__qualname__ = f"Device.{full}_async"
    run_async.__module__ = _DEVICE_MODULE  # a method of Device, published with it
    run_async.__doc__ = doc
    return run_async, blocking(run_async)


def typed_allocate(dtype: DType) -> tuple[Callable[..., Coroutine[Any, Any, GpuBuffer]],
                                          Callable[..., GpuBuffer]]:
    """``allocate_<dtype>(length, *, managed=False, durable=False, timeout_secs=10.0)``."""
    def allocate_async(self: Device, length: int, *, managed: bool = False,
                       durable: bool = False, timeout_secs: float | None = 10.0,
                       ) -> Coroutine[Any, Any, GpuBuffer]:
        return self.allocate_async(length, dtype, managed=managed, durable=durable,
                                   timeout_secs=timeout_secs)

    return _typed("allocate", dtype, allocate_async,
                  f"Allocate a zero-filled {dtype.value} buffer (see ``allocate``).")


def typed_upload(dtype: DType) -> tuple[Callable[..., Coroutine[Any, Any, None]],
                                        Callable[..., None]]:
    """``copy_from_numpy_<dtype>(dst, src, offset=None, *, timeout_secs=10.0)``."""
    def upload_async(self: Device, dst: BufferLike, src: Any, offset: int | None = None, *,
                     timeout_secs: float | None = 10.0) -> Coroutine[Any, Any, None]:
        self._ref(dst, "dst", (dtype,))
        return self.copy_from_numpy_async(dst, src, offset, timeout_secs=timeout_secs)

    return _typed("copy_from_numpy", dtype, upload_async,
                  f"``copy_from_numpy`` into a {dtype.value} buffer (``DTypeMismatch`` else).")


def typed_download(dtype: DType) -> tuple[Callable[..., Coroutine[Any, Any, Any]],
                                          Callable[..., Any]]:
    """``copy_to_numpy_<dtype>(src, offset=0, length=None, *, timeout_secs=10.0)``."""
    def download_async(self: Device, src: BufferLike, offset: int = 0,
                       length: int | None = None, *, timeout_secs: float | None = 10.0,
                       ) -> Coroutine[Any, Any, np.ndarray[Any, Any]]:
        self._ref(src, "src", (dtype,))
        return self.copy_to_numpy_async(src, offset, length, timeout_secs=timeout_secs)

    return _typed("copy_to_numpy", dtype, download_async,
                  f"``copy_to_numpy`` of a {dtype.value} buffer (``DTypeMismatch`` else).")
