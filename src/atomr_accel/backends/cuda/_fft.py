"""cuFFT plan-many transforms (``FftMany``) run straight on the buffers.

Each op gets a ``cupy.cuda.cufft.PlanNd`` (``cufftMakePlanMany``) made from its
resolved layouts, so cuFFT itself reads and writes the strided, embedded
items in place of a gather and a scatter; ``PlanNd.fft`` binds the plan to the
current stream (the op's) before it executes. Plans are kept per backend in a
small LRU cache keyed by everything the plan depends on, the stream included:
a plan owns one work area, which two streams must not share.

cuFFT's out-of-place C2R transforms may overwrite their input, which an op
only reads, so C2R runs on a copy of the input's addressed extent.

A CUDA graph cannot record ``FftMany`` (``InvalidArgument``): the plan would
have to be made before the capture and live as long as the graph, which the
cache does not promise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cupy.cuda import cufft

from atomr_accel.backends._handlers import cuda
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._fft import FftKind, FftMany

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

__all__ = ["fft_many"]

_TYPES = {  # (kind, double precision) -> cufftType
    (FftKind.C2C, False): cufft.CUFFT_C2C,
    (FftKind.R2C, False): cufft.CUFFT_R2C,
    (FftKind.C2R, False): cufft.CUFFT_C2R,
    (FftKind.C2C, True): cufft.CUFFT_Z2Z,
    (FftKind.R2C, True): cufft.CUFFT_D2Z,
    (FftKind.C2R, True): cufft.CUFFT_Z2D,
}


def _plan(op: FftMany) -> Any:
    """A cuFFT plan for the op's sizes, kind, precision, batch and both resolved layouts."""
    source, target = op.input_layout, op.output_layout
    double = op.input.dtype.real is DType.F64
    # PlanNd's order, last axis and last size only serve CuPy's own array helpers: unused here.
    return cufft.PlanNd(list(op.n), list(source.embed), source.stride, source.dist,
                        list(target.embed), target.stride, target.dist,
                        _TYPES[op.kind, double], op.batch, "C", -1, None)


@cuda.handles(FftMany)
def fft_many(backend: CudaBackend, op: FftMany) -> None:
    """Run the op's cuFFT plan-many transform on the buffers, on the current stream."""
    if backend.capturing:
        raise InvalidArgument(
            "FftMany cannot be recorded into a CUDA graph: its cuFFT plan would have to be "
            "made before the capture and outlive the graph; run it outside the graph")
    src = backend.array(op.input.buffer_id)
    dst = backend.array(op.output.buffer_id)
    if op.kind is FftKind.C2R:  # cuFFT may overwrite a C2R input: transform a copy
        src = src[: op.input_layout.extent(op.input_shape, op.batch)].copy()
    key = (backend.stream, op.n, op.kind, op.input.dtype.real, op.batch, op.input_layout,
           op.output_layout)
    plan = backend.fft_plans.get(key, lambda: _plan(op))
    plan.fft(src, dst, cufft.CUFFT_INVERSE if op.is_inverse else cufft.CUFFT_FORWARD)
