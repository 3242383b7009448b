"""Generation-checked handles to device buffers."""

from __future__ import annotations

from dataclasses import dataclass

from atomr_accel.core._dtype import DType

__all__ = ["GpuRef"]


@dataclass(frozen=True, slots=True)
class GpuRef:
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

    @property
    def nbytes(self) -> int:
        """Size of the buffer in bytes."""
        return self.length * self.dtype.itemsize

    def __repr__(self) -> str:
        return (
            f"GpuRef(dev={self.device_id}, id={self.buffer_id}, {self.dtype.value}"
            f"[{self.length}], gen={self.generation})"
        )
