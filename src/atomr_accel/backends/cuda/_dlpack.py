"""DLPack partners on CUDA: ``AdoptArray`` (a buffer over another library's array on this
GPU, no copy) and ``ExternalWrite`` (this device's stream waits for another library's
event before its next work on the buffers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import cupy as cp

from atomr_accel.backends._handlers import cuda
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._dlpack import AdoptArray, ExternalWrite, adoptable, event_handle

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

__all__: list[str] = []


@cuda.handles(AdoptArray)
def _adopt(backend: CudaBackend, op: AdoptArray) -> tuple[int, DType, int]:
    """A buffer over the producer's memory; the op's stream first waits for the legacy
    default stream, which the facade had the producer order the caller's work before."""
    legacy = cp.cuda.Event(disable_timing=True)
    legacy.record(cp.cuda.Stream.null)
    cp.cuda.get_current_stream().wait_event(legacy)
    try:
        array = cp.from_dlpack(op.producer)
    except Exception as exc:  # CuPy's refusals are of several kinds
        raise InvalidArgument(f"CuPy cannot adopt this array: {exc}") from exc
    if array.device.id != backend.device_id:
        raise InvalidArgument(f"the array lives on GPU {array.device.id}, not on this "
                              f"device's GPU {backend.device_id}")
    flat, dtype = adoptable(array)
    return backend.map_in(flat, None), dtype, int(flat.size)


@cuda.handles(ExternalWrite)
def _external_write(backend: CudaBackend, op: ExternalWrite) -> None:
    """The op's stream waits for the event; the backend then records the op's own event
    as the buffers' last write, which later work on other streams waits for."""
    del backend
    cp.cuda.runtime.streamWaitEvent(cp.cuda.get_current_stream().ptr,
                                    event_handle(op.event), 0)
