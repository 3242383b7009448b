"""ImageFilterPipeline: a chain of filter stages run over frames on a device, in an actor."""

from __future__ import annotations

from collections.abc import Coroutine, Iterable, Sequence
from typing import Any

from atomr_accel.blueprint import require_positive_int, twin
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._realtime_frames import FRAME_DTYPES, Correlate, FilterFrames, Stage
from atomr_accel.facade import Device, System
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.realtime._actor import Placement, RealtimeActor, RealtimeClient
from atomr_accel.realtime._frames import Frame, FrameShape, as_frame, as_stages, frame_shape

__all__ = ["ImageFilterPipeline"]

TIMEOUT = 10.0
"""The default ``timeout_secs`` of ``process``, seconds (the original's)."""


class _PipelineActor(RealtimeActor):
    """Runs the chain (``FilterFrames``) over each frame, in buffers it owns."""

    def __init__(self, system: System, placement: Placement, shape: FrameShape,
                 stages: tuple[Stage, ...]) -> None:
        super().__init__(system, placement)
        self.shape = shape
        self.stages = stages

    def _op(self, device: Device, src: GpuBuffer, dst: GpuBuffer, frames: int = 1,
            ) -> FilterFrames:
        s = self.shape
        return FilterFrames(device.ref_of(src, "src"), device.ref_of(dst, "dst"), s.height,
                            s.width, s.channels, self.stages, frames)

    async def on_process(self, frame: Frame) -> Any:
        device = self.device
        n, dtype = self.shape.size, frame.dtype
        src = await self.upload(f"src-{dtype.value}", frame.data, dtype)
        dst = await self.buffer(f"dst-{dtype.value}", n, dtype)
        await device.run_async(self._op(device, src, dst))
        return frame.answer(await device.copy_to_numpy_async(dst, 0, n))

    async def on_process_buffers(self, src: GpuBuffer, dst: GpuBuffer, frames: int) -> None:
        device = self.device
        await device.run_async(self._op(device, src, dst, frames))


class ImageFilterPipeline(RealtimeClient):
    """A chain of filter stages run over ``height x width x channels`` frames on a device.

    The chain is the 3x3 correlation ``kernel_3x3`` (9 numbers, row by row; None
    for none) followed by ``stages`` (``Correlate``, ``GaussianBlur``, ``BoxBlur``,
    ``SobelMagnitude``, ``Threshold``, from ``atomr_accel.realtime``). Stages work
    on each channel in float32; borders repeat the edge pixel (``scipy.ndimage``
    mode ``"nearest"``); a u8 result is rounded and saturated. ``process`` takes the
    original's list of byte values (and answers one) or a u8/f32 NumPy frame (and
    answers one of the same dtype and shape); ``process_buffers`` filters frames
    already on the device, one or a batch a request. Every method has an ``_async`` twin.
    """

    shape = FrameShape(1, 1, 1)
    chain: tuple[Stage, ...] = ()

    @classmethod
    def spawn(cls, system: Any, width: int, height: int, channels: int,
              kernel_3x3: Sequence[float] | None, name: str | None = None, *,
              device: Device | None = None, stages: Iterable[Stage] = ()) -> ImageFilterPipeline:
        """Start a pipeline for ``width x height x channels`` frames on ``device`` (None:
        the system places it). ``InvalidArgument`` (a ``GpuRuntimeError``) for a kernel
        that is not 9 numbers, a bad size or stage."""
        shape = frame_shape(width, height, channels)
        chain = as_stages(stages)
        if kernel_3x3 is not None:
            try:
                weights = tuple(float(w) for w in kernel_3x3)
            except (TypeError, ValueError):
                raise InvalidArgument(f"kernel_3x3 must be 9 numbers, got {kernel_3x3!r}"
                                      ) from None
            first = Correlate(weights, (3, 3))
            first.validate()
            chain = (first, *chain)
        if not chain:
            raise InvalidArgument("the pipeline needs kernel_3x3 or at least one stage")
        client = cls._spawn(system, _PipelineActor, (shape, chain), name, device)
        client.shape, client.chain = shape, chain
        return client

    @property
    def stages(self) -> tuple[Stage, ...]:
        """The chain, in order (``kernel_3x3`` first when given)."""
        return self.chain

    def process_async(self, frame: Any, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, Any]:
        """The filtered frame, in the form ``frame`` came in (see the class)."""
        return self._run("process", (as_frame(frame, self.shape),), timeout_secs)

    process = twin(process_async)

    def process_buffers_async(self, src: GpuBuffer, dst: GpuBuffer, frames: int = 1,
                              timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, None]:
        """Filter ``frames`` frames held one after another in ``src`` into ``dst``: u8 or
        f32 buffers of the pipeline's device (``device()``), in one device op (a batch
        of frames costs one request); answers when ``dst`` is written."""
        require_positive_int("frames", frames)
        needed = frames * self.shape.size
        for buffer, what in ((src, "src"), (dst, "dst")):
            if not isinstance(buffer, GpuBuffer) or buffer.dtype not in FRAME_DTYPES:
                raise InvalidArgument(f"{what} must be a u8 or f32 GpuBuffer, got {buffer!r}")
            if len(buffer) < needed:
                raise InvalidArgument(f"{what} holds {len(buffer)} values; {frames} frames "
                                      f"need {needed}")
        return self._run("process_buffers", (src, dst, frames), timeout_secs)

    process_buffers = twin(process_buffers_async)
