"""FFTs over the live buffers; runs on NumPy/SciPy or CuPy/cupyx.

The handler calls ``backend.scipy_fft``: ``scipy.fft`` on CPU (which keeps
single precision single) and ``cupyx.scipy.fft`` on CUDA, whose ``fftn``,
``ifftn``, ``rfftn`` and ``irfftn`` take the same ``s``, ``axes`` and ``norm``
and run cuFFT. CuPy keeps the cuFFT plans it makes in a per-thread, per-device
LRU cache keyed by transform size, type and batch, so repeated transforms of
one geometry reuse their plan without any bookkeeping here.
"""

from __future__ import annotations

from atomr_accel.backends._base import ArrayBackend, Handler
from atomr_accel.core._op import Op
from atomr_accel.core.ops._fft import Fft, FftKind

__all__ = ["HANDLERS", "fft"]


def fft(backend: ArrayBackend, op: Fft) -> None:
    """Transform each item of a ``(batch, *shape)`` view into ``output``; inverse unnormalized."""
    src = backend.array(op.input.buffer_id)
    dst = backend.array(op.output.buffer_id)
    in_shape = op.complex_shape if op.kind is FftKind.C2R else op.shape
    x = src[: op.input_count].reshape(op.batch, *in_shape)
    axes = tuple(range(1, len(op.shape) + 1))
    transforms = backend.scipy_fft
    # norm="forward" puts the 1/n on the forward side, so the inverse is unnormalized.
    if op.kind is FftKind.R2C:
        y = transforms.rfftn(x, axes=axes)
    elif op.kind is FftKind.C2R:
        y = transforms.irfftn(x, s=op.shape, axes=axes, norm="forward")
    elif op.is_inverse:
        y = transforms.ifftn(x, axes=axes, norm="forward")
    else:
        y = transforms.fftn(x, axes=axes)
    dst[: op.output_count] = y.reshape(-1)


HANDLERS: dict[type[Op], Handler] = {Fft: fft}
