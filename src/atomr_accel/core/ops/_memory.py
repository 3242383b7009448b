"""Ops the context runs itself: allocation, copies in and out, frees."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from atomr_accel.core._api import Form, Param
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import pickle_by_name
from atomr_accel.core._op import Op, require_len, require_nonneg, require_same_dtype
from atomr_accel.core._ref import GpuRef

__all__ = [
    "Advice",
    "Allocate",
    "Attach",
    "CopyBuffer",
    "Download",
    "Free",
    "Location",
    "MemoryInfo",
    "Prefetch",
    "Upload",
]


def _copy_count(src: GpuRef, dst: GpuRef, src_offset: int, dst_offset: int) -> int:
    """As many elements as fit after both offsets."""
    return min(src.length - src_offset, dst.length - dst_offset)


class Attach(enum.Enum):
    """Which streams may reach a managed buffer at first (``cudaMallocManaged``'s flags)."""

    GLOBAL = "global"
    """Any stream on any device (``cudaMemAttachGlobal``)."""
    HOST = "host"
    """The host; devices without concurrent managed access need the buffer attached to a
    stream first (``cudaMemAttachHost``). Devices with it (Pascal and later on Linux) and
    the CPU backend reach it at once."""

    __reduce_ex__ = pickle_by_name


@dataclass(frozen=True, slots=True)
class Allocate(Op):
    """Allocate a zero-filled buffer of ``length`` elements; answers a ``GpuRef``.

    ``managed=True`` allocates CUDA managed (unified) memory, which migrates
    between host and device on demand and takes ``Prefetch`` and ``Advise``;
    plain device memory is the default. ``attach`` is the managed memory's
    ``cudaMallocManaged`` flag (``Attach.HOST`` needs ``managed=True``); the CPU
    backend keeps every buffer in host memory, so there it only checks it.
    """

    dtype: DType
    length: int
    managed: bool = False
    attach: Attach = Attach.GLOBAL

    def validate(self) -> None:
        if not isinstance(self.dtype, DType):
            raise InvalidArgument(f"dtype must be a DType, got {self.dtype!r}")
        require_nonneg(length=self.length)
        if not isinstance(self.managed, bool):
            raise InvalidArgument(f"managed must be a bool, got {self.managed!r}")
        if not isinstance(self.attach, Attach):
            raise InvalidArgument(f"attach must be an Attach, got {self.attach!r}")
        if self.attach is Attach.HOST and not self.managed:
            raise InvalidArgument("attach='host' is a flag of managed memory; pass managed=True")


class Location(enum.Enum):
    """Where managed memory should live."""

    DEVICE = "device"
    HOST = "host"

    __reduce_ex__ = pickle_by_name


class Advice(enum.Enum):
    """Hints about how managed memory is used (``cudaMemAdvise``)."""

    READ_MOSTLY = "read_mostly"
    """Reads dominate: each processor may keep a read-only copy."""
    UNSET_READ_MOSTLY = "unset_read_mostly"
    PREFERRED_LOCATION_DEVICE = "preferred_location_device"
    """Keep the pages on the device; others map them rather than migrate them."""
    PREFERRED_LOCATION_HOST = "preferred_location_host"
    UNSET_PREFERRED_LOCATION = "unset_preferred_location"
    ACCESSED_BY_DEVICE = "accessed_by_device"
    """Keep the pages mapped for the device wherever they live."""
    UNSET_ACCESSED_BY_DEVICE = "unset_accessed_by_device"
    ACCESSED_BY_HOST = "accessed_by_host"
    """Keep the pages mapped for the host wherever they live."""
    UNSET_ACCESSED_BY_HOST = "unset_accessed_by_host"

    __reduce_ex__ = pickle_by_name


@dataclass(frozen=True, slots=True)
class Prefetch(Op):
    """Migrate a managed buffer to ``location`` ahead of use, in stream order."""

    ref: GpuRef
    location: Location = Location.DEVICE

    def validate(self) -> None:
        if not isinstance(self.location, Location):
            raise InvalidArgument(f"location must be a Location, got {self.location!r}")


@dataclass(frozen=True, slots=True)
class Advise(Op):
    """Give the driver a usage hint for a managed buffer."""

    ref: GpuRef
    advice: Advice

    def validate(self) -> None:
        if not isinstance(self.advice, Advice):
            raise InvalidArgument(f"advice must be an Advice, got {self.advice!r}")


@dataclass(frozen=True, slots=True)
class Free(Op):
    """Release a buffer; later use of its ref is an ``InvalidArgument``."""

    api = (Form("free", (Param("buffer", to=("ref",)),), handle="device"),)

    ref: GpuRef


@dataclass(frozen=True, slots=True)
class Upload(Op):
    """Copy a host array into ``ref`` starting at element ``offset``.

    ``data`` is a 1-D contiguous NumPy array of the buffer's dtype (the facade
    converts); the process host swaps it for a shared-memory slice in transit.
    """

    outputs: ClassVar[tuple[str, ...]] = ("ref",)
    ref: GpuRef
    data: Any
    offset: int = 0

    def validate(self) -> None:
        require_nonneg(offset=self.offset)
        arr = self.data
        if isinstance(arr, np.ndarray):
            if arr.ndim != 1:
                raise InvalidArgument(f"upload data must be 1-D, got shape {arr.shape}")
            if not arr.flags.c_contiguous:  # a host reads its memory as one flat run
                raise InvalidArgument(
                    f"upload data must be contiguous, got strides {arr.strides}; pass "
                    "np.ascontiguousarray(data) (copy_from_numpy does this for you)")
            if arr.dtype != self.ref.dtype.numpy:
                raise InvalidArgument(
                    f"upload data has dtype {arr.dtype} but the buffer holds "
                    f"{self.ref.dtype.value}"
                )
            require_len(self.ref, self.offset + arr.size, "destination buffer")


@dataclass(frozen=True, slots=True)
class Download(Op):
    """Copy ``length`` elements (all when None) from ``ref`` starting at ``offset`` to the host."""

    ref: GpuRef
    offset: int = 0
    length: int | None = None

    def validate(self) -> None:
        require_nonneg(offset=self.offset)
        if self.length is not None:
            require_nonneg(length=self.length)
        elif self.offset > self.ref.length:  # no length: from the offset to the end
            raise InvalidArgument(
                f"offset {self.offset} is past the end of the source buffer of "
                f"{self.ref.length} elements")
        require_len(self.ref, self.offset + self.count, "source buffer")

    @property
    def count(self) -> int:
        """Number of elements copied."""
        return self.ref.length - self.offset if self.length is None else self.length


@dataclass(frozen=True, slots=True)
class CopyBuffer(Op):
    """Copy ``length`` elements from ``src[src_offset:]`` to ``dst[dst_offset:]`` on the device."""

    api = (Form("copy", ("src", "dst", Param("length", None, fill=_copy_count,
                                          uses=("src", "dst", "src_offset", "dst_offset"),
                                          annotation="int | None"), "src_offset", "dst_offset"),
                handle="device", doc="Copy elements between two buffers of this device (as many "
                "as fit after the offsets by default)."),)

    outputs: ClassVar[tuple[str, ...]] = ("dst",)
    queues_only: ClassVar[bool] = True
    capturable: ClassVar[bool] = True
    src: GpuRef
    dst: GpuRef
    length: int
    src_offset: int = 0
    dst_offset: int = 0

    def validate(self) -> None:
        require_nonneg(length=self.length, src_offset=self.src_offset, dst_offset=self.dst_offset)
        require_same_dtype(src=self.src, dst=self.dst)
        require_len(self.src, self.src_offset + self.length, "src")
        require_len(self.dst, self.dst_offset + self.length, "dst")


@dataclass(frozen=True, slots=True)
class MemoryInfo(Op):
    """Ask the context for ``(free_bytes, total_bytes)`` of its device."""

    api = (Form("memory_info", (), handle="device", returns="tuple[int, int]",
                doc="``(free_bytes, total_bytes)`` of the device, read now (``stats()`` "
                "caches it)."),)
