"""CPU FFTs with ``scipy.fft``, which keeps single precision single."""

from __future__ import annotations

from typing import TYPE_CHECKING

import scipy.fft

from atomr_accel.backends._base import Handler
from atomr_accel.core._op import Op
from atomr_accel.core.ops._fft import Fft, FftKind

if TYPE_CHECKING:
    from atomr_accel.backends.cpu._backend import CpuBackend

__all__ = ["HANDLERS", "fft"]


def fft(backend: CpuBackend, op: Fft) -> None:
    """Transform each item of a ``(batch, *shape)`` view into ``output``; inverse unnormalized."""
    src = backend.array(op.input.buffer_id)
    dst = backend.array(op.output.buffer_id)
    in_shape = op.complex_shape if op.kind is FftKind.C2R else op.shape
    x = src[: op.input_count].reshape(op.batch, *in_shape)
    axes = tuple(range(1, len(op.shape) + 1))
    if op.kind is FftKind.R2C:
        y = scipy.fft.rfftn(x, axes=axes)
    elif op.kind is FftKind.C2R:
        y = scipy.fft.irfftn(x, s=op.shape, axes=axes, norm="forward")
    elif op.is_inverse:
        y = scipy.fft.ifftn(x, axes=axes, norm="forward")
    else:
        y = scipy.fft.fftn(x, axes=axes)
    dst[: op.output_count] = y.reshape(-1)


HANDLERS: dict[type[Op], Handler] = {Fft: fft}
