"""The backend interface every host drives.

A backend owns one device context: the buffers allocated in it and the library
state (generators, plans, handles). Its methods are blocking and are called from
one thread only (the host's), so a backend needs no locks.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import Op
from atomr_accel.core.ops._memory import Allocate, CopyBuffer, Download, Free, Upload

__all__ = ["Backend", "Handler"]

Handler = Callable[[Any, Any], Any]
"""``handler(backend, op) -> result``: runs one op type on one backend."""


class Backend(abc.ABC):
    """One device context. Subclasses fill ``handlers`` with one entry per op type."""

    name: ClassVar[str]
    handlers: ClassVar[dict[type[Op], Handler]]

    def __init__(self, device_id: int) -> None:
        self.device_id = device_id

    @abc.abstractmethod
    def allocate(self, dtype: DType, length: int) -> int:
        """Allocate a zero-filled buffer and return its id."""

    @abc.abstractmethod
    def free(self, buffer_id: int) -> None:
        """Release a buffer."""

    @abc.abstractmethod
    def write(self, buffer_id: int, data: np.ndarray[Any, Any], offset: int) -> None:
        """Copy a 1-D host array into a buffer at element ``offset``."""

    @abc.abstractmethod
    def read(self, buffer_id: int, offset: int, length: int) -> np.ndarray[Any, Any]:
        """Copy ``length`` elements from element ``offset`` into a new host array."""

    @abc.abstractmethod
    def copy(self, src: int, dst: int, length: int, src_offset: int, dst_offset: int) -> None:
        """Copy elements between two buffers of this context."""

    @abc.abstractmethod
    def memory_info(self) -> tuple[int, int]:
        """Return ``(free_bytes, total_bytes)`` of the device."""

    def synchronize(self) -> None:
        """Wait until all work submitted to the device has finished."""

    def close(self) -> None:
        """Release every buffer and library state."""

    def execute(self, op: Op) -> Any:
        """Run one op and return its result (None for in-place ops)."""
        try:
            handler = self.handlers[type(op)]
        except KeyError:
            raise InvalidArgument(
                f"the {self.name} backend has no implementation of {type(op).__name__}"
            ) from None
        return handler(self, op)


def _allocate(backend: Backend, op: Allocate) -> int:
    return backend.allocate(op.dtype, op.length)


def _free(backend: Backend, op: Free) -> None:
    backend.free(op.ref.buffer_id)


def _upload(backend: Backend, op: Upload) -> None:
    backend.write(op.ref.buffer_id, op.data, op.offset)


def _download(backend: Backend, op: Download) -> np.ndarray[Any, Any]:
    return backend.read(op.ref.buffer_id, op.offset, op.count)


def _copy(backend: Backend, op: CopyBuffer) -> None:
    backend.copy(op.src.buffer_id, op.dst.buffer_id, op.length, op.src_offset, op.dst_offset)


MEMORY_HANDLERS: dict[type[Op], Handler] = {
    Allocate: _allocate,
    Free: _free,
    Upload: _upload,
    Download: _download,
    CopyBuffer: _copy,
}
