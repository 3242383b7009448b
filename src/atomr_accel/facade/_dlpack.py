"""DLPack both ways: a ``GpuBuffer`` as a DLPack producer, and ``Device.from_dlpack``.

On the thread host the context lives in the caller's process, so no copy is
made: ``torch.from_dlpack(buf)`` (or ``cupy.from_dlpack``, ``np.from_dlpack``)
views the buffer's own memory, and ``dev.from_dlpack(tensor)`` makes a buffer
over the tensor's memory that keeps the tensor alive. On the process and Ray
hosts the memory lives in another process: the export is a host copy
(``copy_to_numpy``), and ``from_dlpack`` copies through the worker
(``allocate`` + ``copy_from_numpy``).

Both are blocking calls (DLPack is a synchronous protocol): never on the
system's own event loop. Both see a buffer as the calls that wrote it left it:
every facade call returns once its device work has finished.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from atomr_accel.core._dtype import DType
from atomr_accel.core.ops._dlpack import AdoptArray, ViewBuffer
from atomr_accel.facade._buffers import buffer_for
from atomr_accel.facade._host_arrays import flat_elements, host_array

if TYPE_CHECKING:
    from atomr_accel.facade._buffers import GpuBuffer
    from atomr_accel.facade._device import Device

__all__ = ["export", "export_device", "from_dlpack_async"]

_CPU, _CUDA = 1, 2
"""DLPack's device types (``kDLCPU``, ``kDLCUDA``)."""


def _in_process(device: Device) -> bool:
    return device.isolation == "thread"


def _source(buffer: GpuBuffer) -> Any:
    """What exports ``buffer``: the context's own array (thread host) or a host copy."""
    device = buffer.device
    if _in_process(device):
        return device.run(ViewBuffer(device.ref_of(buffer)))
    return device.copy_to_numpy(buffer)


def export(buffer: GpuBuffer, options: dict[str, Any]) -> Any:
    """``buffer.__dlpack__(**options)``: a capsule of the buffer's memory (thread host) or
    of a host copy of it (process and Ray hosts)."""
    given = {name: value for name, value in options.items() if value is not None}
    return _source(buffer).__dlpack__(**given)


def export_device(buffer: GpuBuffer) -> tuple[int, int]:
    """``buffer.__dlpack_device__()``: where ``export`` puts the data."""
    if _in_process(buffer.device) and buffer.device.config.capabilities.device_memory:
        kind, index = _source(buffer).__dlpack_device__()
        return int(kind), int(index)
    return (_CPU, 0)


async def from_dlpack_async(device: Device, data: Any,
                            timeout_secs: float | None) -> GpuBuffer:
    """A buffer of ``data``'s elements: adopted without a copy where the memory can be
    shared, copied into a new buffer else (see ``Device.from_dlpack``)."""
    producer = _adoptable(device, data)
    if producer is not None:
        return buffer_for(device, await device.run_async(AdoptArray(producer), timeout_secs))
    flat = flat_elements(host_array(data, "tensor"), "tensor")
    buffer = await device.allocate_async(flat.size, DType.of(flat.dtype),
                                         timeout_secs=timeout_secs)
    await device.copy_from_numpy_async(buffer, flat, timeout_secs=timeout_secs)
    return buffer


class Exported:
    """A CUDA array's DLPack capsule, made on the caller's thread: its library then orders
    the work the caller's current stream queued on it before the legacy default stream
    (``stream=1``), which the adopting handler's stream waits for. Made inside the handler
    instead, the exchange would see the context's stream as the caller's (CuPy's current
    stream is the op's there) and order nothing."""

    __slots__ = ("_capsule", "_device")

    def __init__(self, data: Any) -> None:
        kind, index = data.__dlpack_device__()
        self._device = (int(kind), int(index))
        self._capsule = data.__dlpack__(stream=1)

    def __dlpack__(self, **options: Any) -> Any:
        """The capsule made on the caller's thread (its consumer's ``stream`` is waited for
        by the handler instead)."""
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        """Where the array lives, as its producer said."""
        return self._device


def _adoptable(device: Device, data: Any) -> Any:
    """The producer to adopt for ``data``, or None where it must be copied (another
    process's context, a journal to replay from, memory of another device, a strided,
    conjugate or read-only view, bfloat16 elements)."""
    if not _in_process(device) or device.journal is not None:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(data, torch.Tensor):
        if data.is_conj() or data.is_neg() or not data.is_contiguous() \
                or data.dtype is torch.bfloat16:  # CuPy and NumPy's DLPack lack bfloat16
            return None
        data = data.detach()  # the same memory, without the autograd graph
    if not hasattr(data, "__dlpack__") or not hasattr(data, "__dlpack_device__"):
        return None
    kind, index = data.__dlpack_device__()
    if device.config.capabilities.device_memory:
        flags = getattr(data, "flags", None)
        contiguous = flags is None or bool(flags.c_contiguous)
        if (kind, index) != (_CUDA, device.device_id) or not contiguous:
            return None
        try:
            return Exported(data)
        except (BufferError, RuntimeError, TypeError, ValueError):
            return None  # its library would not export it so: the copy reads it another way
    if kind != _CPU:
        return None
    try:
        view = np.from_dlpack(data)
    except (BufferError, RuntimeError, TypeError, ValueError):
        return None  # NumPy cannot view it (bfloat16, say): the copy reads it another way
    if not (view.flags.c_contiguous and view.flags.writeable):
        return None
    try:
        DType.of(view.dtype)
    except ValueError:
        return None  # the copy says which dtypes buffers hold
    return view
