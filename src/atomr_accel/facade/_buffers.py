"""Typed buffer handles the facade hands out, and the base of every handle of one context
generation (a buffer, a kernel, a graph)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import DTypeMismatch
from atomr_accel.core._ref import GpuRef

if TYPE_CHECKING:
    from atomr_accel.facade._device import Device

__all__ = [
    "BufferLike",
    "GpuBuffer",
    "GpuBufferBF16",
    "GpuBufferC64",
    "GpuBufferC128",
    "GpuBufferF16",
    "GpuBufferF32",
    "GpuBufferF64",
    "GpuBufferI8",
    "GpuBufferI16",
    "GpuBufferI32",
    "GpuBufferI64",
    "GpuBufferU8",
    "GpuBufferU16",
    "GpuBufferU32",
    "GpuBufferU64",
]


class _HasGeneration(Protocol):
    @property
    def generation(self) -> int: ...


class _Handle(Protocol):
    @property
    def ref(self) -> _HasGeneration: ...

    @property
    def device(self) -> _HasGeneration: ...


class GenerationBound:
    """Base of the handles made in one context generation of their device (its ``ref``
    names the generation); after a rebuild the handle is stale and any use of it raises
    ``GpuRefStale``."""

    __slots__ = ()

    @property
    def generation(self: _Handle) -> int:
        """The context generation the handle was made in."""
        return self.ref.generation

    def is_stale(self: _Handle) -> bool:
        """True once the device's context has been rebuilt since the handle was made."""
        return self.ref.generation != self.device.generation


class GpuBuffer(GenerationBound):
    """A buffer on a device: ``len(buf)`` elements of ``buf.dtype``.

    The handle is only valid for the context generation that allocated it:
    ``is_stale()`` turns True when the device's context is rebuilt, and any op
    on it then raises ``GpuRefStale``. Free it with ``device.free(buf)``; once
    nothing references the buffer or its ``ref`` any more, the memory is freed
    when Python collects them.
    """

    __slots__ = ("_device", "ref")
    dtype_class: ClassVar[DType | None] = None

    def __init__(self, device: Device, ref: GpuRef) -> None:
        self._device = device
        self.ref = ref

    def __len__(self) -> int:
        return self.ref.length

    @property
    def len(self) -> int:
        """Number of elements (``len(buf)``; the original package's property)."""
        return self.ref.length

    @property
    def device(self) -> Device:
        """The device that owns the buffer."""
        return self._device

    @property
    def device_id(self) -> int:
        """Id of the device that owns the buffer."""
        return self.ref.device_id

    @property
    def dtype(self) -> DType:
        """Element type."""
        return self.ref.dtype

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return self.ref.nbytes

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """Export the buffer through DLPack (``torch.from_dlpack(buf)``, ``np.from_dlpack``).

        On the thread host the capsule views the buffer's own memory (no copy:
        the consumer's array and the buffer share it, and it stays valid while
        that array lives, even once the buffer is freed). On the process and
        Ray hosts it holds a host copy made through the worker. A blocking call
        (not on the system's own event loop); ``GpuRefStale`` once stale.
        """
        from atomr_accel.facade._dlpack import export

        return export(self, {"stream": stream, "max_version": max_version,
                             "dl_device": dl_device, "copy": copy})

    def __dlpack_device__(self) -> tuple[int, int]:
        """Where ``__dlpack__`` puts the data: ``(2, gpu)`` for a CUDA buffer on the thread
        host, ``(1, 0)`` (host memory) for the CPU backend and for copies."""
        from atomr_accel.facade._dlpack import export_device

        return export_device(self)

    def __repr__(self) -> str:
        stale = ", stale" if self.is_stale() else ""
        return (f"{type(self).__name__}(len={len(self)}, device={self.device_id}, "
                f"gen={self.generation}{stale})")


BufferLike = GpuBuffer | GpuRef
"""What a method takes for a buffer: a ``GpuBuffer`` or its ``GpuRef``."""


class GpuBufferF16(GpuBuffer):
    """A buffer of float16."""

    dtype_class = DType.F16


class GpuBufferBF16(GpuBuffer):
    """A buffer of bfloat16."""

    dtype_class = DType.BF16


class GpuBufferF32(GpuBuffer):
    """A buffer of float32."""

    dtype_class = DType.F32


class GpuBufferF64(GpuBuffer):
    """A buffer of float64."""

    dtype_class = DType.F64


class GpuBufferI8(GpuBuffer):
    """A buffer of int8."""

    dtype_class = DType.I8


class GpuBufferI16(GpuBuffer):
    """A buffer of int16."""

    dtype_class = DType.I16


class GpuBufferI32(GpuBuffer):
    """A buffer of int32."""

    dtype_class = DType.I32


class GpuBufferI64(GpuBuffer):
    """A buffer of int64."""

    dtype_class = DType.I64


class GpuBufferU8(GpuBuffer):
    """A buffer of uint8."""

    dtype_class = DType.U8


class GpuBufferU16(GpuBuffer):
    """A buffer of uint16."""

    dtype_class = DType.U16


class GpuBufferU32(GpuBuffer):
    """A buffer of uint32."""

    dtype_class = DType.U32


class GpuBufferU64(GpuBuffer):
    """A buffer of uint64."""

    dtype_class = DType.U64


class GpuBufferC64(GpuBuffer):
    """A buffer of complex64."""

    dtype_class = DType.C64


class GpuBufferC128(GpuBuffer):
    """A buffer of complex128."""

    dtype_class = DType.C128


_BY_DTYPE: dict[DType, type[GpuBuffer]] = {
    cls.dtype_class: cls for cls in GpuBuffer.__subclasses__() if cls.dtype_class is not None
}


def typed_ref(ref: GpuRef, name: str, dtypes: Iterable[DType] | None) -> GpuRef:
    """``ref``, if it holds one of ``dtypes`` (any dtype for None); ``DTypeMismatch`` (an
    ``InvalidArgument`` and a ``TypeError``) otherwise."""
    if dtypes is not None and ref.dtype not in (allowed := tuple(dtypes)):
        names = "/".join(d.value for d in allowed)
        raise DTypeMismatch(f"{name} holds {ref.dtype.value}; this call needs {names}")
    return ref


def buffer_for(device: Device, ref: GpuRef) -> GpuBuffer:
    """The buffer of a newly allocated ``ref``, in the class of its dtype: once ``ref`` is
    collected, its memory is freed."""
    device._state.own(ref)
    return _BY_DTYPE[ref.dtype](device, ref)
