"""DLPack partners on the CPU backend: ``AdoptArray`` (a buffer over a host array's
memory, no copy) and ``ExternalWrite`` (waited for on the host)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from atomr_accel.backends._handlers import cpu
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._dlpack import AdoptArray, ExternalWrite, adoptable

if TYPE_CHECKING:
    from atomr_accel.backends.cpu._backend import CpuBackend

__all__: list[str] = []


@cpu.handles(AdoptArray)
def _adopt(backend: CpuBackend, op: AdoptArray) -> tuple[int, DType, int]:
    try:
        array = np.from_dlpack(op.producer)
    except (BufferError, RuntimeError, TypeError, ValueError) as exc:
        raise InvalidArgument(f"the cpu backend adopts host memory only: {exc}") from exc
    flat, dtype = adoptable(array)
    return backend.map_in(flat, None), dtype, flat.size


@cpu.handles(ExternalWrite)
def _external_write(backend: CpuBackend, op: ExternalWrite) -> None:
    """The host is this backend's device: wait for the other library's event here."""
    del backend
    op.event.synchronize()
