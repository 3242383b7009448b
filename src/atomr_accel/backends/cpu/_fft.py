"""FFTs over the live buffers; runs on NumPy/SciPy or CuPy/cupyx.

The handlers call ``backend.scipy_fft``: ``scipy.fft`` on CPU (which keeps
single precision single) and ``cupyx.scipy.fft`` on CUDA, whose ``fftn``,
``ifftn``, ``rfftn`` and ``irfftn`` take the same ``s``, ``axes`` and ``norm``
and run cuFFT. CuPy keeps the cuFFT plans it makes in a per-thread, per-device
LRU cache keyed by transform size, type and batch, so repeated transforms of
one geometry reuse their plan without any bookkeeping here.

``FftMany`` gathers its items by the input layout, transforms them and
scatters the result by the output layout, so only addressed output elements
are written. The CUDA backend replaces that handler with cuFFT's own plan-many
transform on the buffers (``backends/cuda/_fft.py``).
"""

from __future__ import annotations

from typing import Any

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import shared
from atomr_accel.core.ops._fft import Fft, FftKind, FftLayout, FftMany

__all__ = ["fft", "fft_many"]


def _transform(transforms: Any, x: Any, kind: FftKind, inverse: bool,
               shape: tuple[int, ...]) -> Any:
    """Transform ``x`` (``(batch, *items)``) over its item axes; the inverse unnormalized."""
    axes = tuple(range(1, len(shape) + 1))
    # norm="forward" puts the 1/n on the forward side, so the inverse is unnormalized.
    if kind is FftKind.R2C:
        return transforms.rfftn(x, axes=axes)
    if kind is FftKind.C2R:
        return transforms.irfftn(x, s=shape, axes=axes, norm="forward")
    if inverse:
        return transforms.ifftn(x, axes=axes, norm="forward")
    return transforms.fftn(x, axes=axes)


@shared.handles(Fft)
def fft(backend: ArrayBackend, op: Fft) -> None:
    """Transform each item of a ``(batch, *shape)`` view into ``output``; inverse unnormalized."""
    src = backend.array(op.input.buffer_id)
    dst = backend.array(op.output.buffer_id)
    in_shape = op.complex_shape if op.kind is FftKind.C2R else op.shape
    x = src[: op.input_count].reshape(op.batch, *in_shape)
    y = _transform(backend.scipy_fft, x, op.kind, op.is_inverse, op.shape)
    dst[: op.output_count] = y.reshape(-1)


def _indices(xp: Any, layout: FftLayout, shape: tuple[int, ...], batch: int) -> Any:
    """Flat buffer index of every element of ``batch`` items of ``shape``: ``(batch, *shape)``."""
    rank = len(shape)
    index = (xp.arange(batch) * layout.dist).reshape((batch,) + (1,) * rank)
    for axis, (size, pitch) in enumerate(zip(shape, layout.pitches, strict=True)):
        along = [1] * (rank + 1)
        along[axis + 1] = size
        index = index + (xp.arange(size) * pitch).reshape(along)
    return index


@shared.handles(FftMany)
def fft_many(backend: ArrayBackend, op: FftMany) -> None:
    """Gather the items by the input layout, transform, scatter by the output layout."""
    src = backend.array(op.input.buffer_id)
    dst = backend.array(op.output.buffer_id)
    xp = backend.xp
    x = src[_indices(xp, op.input_layout, op.input_shape, op.batch)]
    y = _transform(backend.scipy_fft, x, op.kind, op.is_inverse, op.n)
    dst[_indices(xp, op.output_layout, op.output_shape, op.batch)] = y
