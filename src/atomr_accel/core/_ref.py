"""Generation-checked handles: device buffers, kernels and graphs."""

from __future__ import annotations

from dataclasses import dataclass, field

from atomr_accel.core._dtype import DType
from atomr_accel.core._fields import PickleByFields

__all__ = ["GpuRef", "GraphRef", "KernelRef", "same_buffer"]


@dataclass(frozen=True, slots=True, weakref_slot=True)
class GpuRef(PickleByFields):
    """A handle to one device buffer: plain data, picklable, hashable.

    ``generation`` is the generation of the context that allocated the buffer;
    the context refuses the handle with ``GpuRefStale`` once it is rebuilt.
    ``owner`` is a token unique to the device instance, so two devices that
    share an id (two CPU devices 0, say) never accept each other's buffers.
    """

    device_id: int
    buffer_id: int
    dtype: DType
    length: int
    generation: int
    owner: int = 0
    managed: bool = field(default=False, compare=False)
    """CUDA managed memory (``allocate(managed=True)``)."""
    mapped: bool = field(default=False, compare=False)
    """Memory of another buffer, mapped by ``IpcOpenHandle``, or of another library's array
    (``AdoptArray``): it holds none of its own, and freeing it only unmaps it."""

    @property
    def nbytes(self) -> int:
        """Size of the buffer in bytes."""
        return self.length * self.dtype.itemsize

    def __repr__(self) -> str:
        return (
            f"GpuRef(dev={self.device_id}, id={self.buffer_id}, {self.dtype.value}"
            f"[{self.length}], gen={self.generation})"
        )


def same_buffer(a: GpuRef, b: GpuRef) -> bool:
    """Whether ``a`` and ``b`` name one buffer: the same buffer id on the same device."""
    return a.buffer_id == b.buffer_id and a.device_id == b.device_id


@dataclass(frozen=True, slots=True)
class KernelRef(PickleByFields):
    """A handle to a compiled or loaded kernel of one context generation.

    ``library`` is the kernel actor that made it (``"nvrtc"`` or ``"module"``) and
    runs its launches. A launch with a handle of an older generation raises
    ``GpuRefStale``; ``cache_hit`` says whether the compiled image came from the
    disk cache.
    """

    device_id: int
    kernel_id: int
    name: str
    generation: int
    owner: int = 0
    library: str = "nvrtc"
    cache_hit: bool = field(default=False, compare=False)

    def __repr__(self) -> str:
        return (f"KernelRef(dev={self.device_id}, id={self.kernel_id}, {self.name!r}, "
                f"gen={self.generation})")


@dataclass(frozen=True, slots=True)
class GraphRef(PickleByFields):
    """A handle to a recorded sequence of ops (a CUDA graph on CUDA) of one generation.

    ``buffers`` are every buffer the graph touches and ``written`` those it
    writes, so a replay is checked and ordered like the ops it records.
    """

    device_id: int
    graph_id: int
    generation: int
    owner: int
    buffers: tuple[GpuRef, ...]
    written: tuple[GpuRef, ...]
    op_count: int

    def __repr__(self) -> str:
        return (f"GraphRef(dev={self.device_id}, id={self.graph_id}, {self.op_count} ops, "
                f"gen={self.generation})")
