"""Moving activations and gradients between the devices of a model-parallel trainer."""

from __future__ import annotations

import contextlib

from atomr_accel.core._errors import GpuRuntimeError
from atomr_accel.facade import Device, System
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.train._replica import ModelReplica

__all__ = ["WorkBuffers", "free_replicas", "transfer"]


async def transfer(system: System, src: GpuBuffer, dst: GpuBuffer, count: int) -> None:
    """Copy the first ``count`` elements of ``src`` into ``dst``: a peer copy
    (``System.copy_between``: peer, IPC or staged through the host) between two devices,
    ``Device.copy`` within one. Returns once the copy has finished."""
    if src.device is dst.device:
        await src.device.copy_async(src, dst, count)
    else:
        await system.copy_between_async(src, dst, count)


class WorkBuffers:
    """Device buffers kept by key and reused from step to step (made again, the old one
    freed, when the length a step needs changes; made again when a context rebuild took
    it)."""

    def __init__(self) -> None:
        self._held: dict[tuple[object, ...], GpuBuffer] = {}

    async def get(self, key: tuple[object, ...], device: Device, length: int) -> GpuBuffer:
        """The float32 buffer ``key`` of exactly ``length`` (>= 1) elements on ``device``."""
        held = self._held.get(key)
        if held is not None and held.is_stale():  # a context rebuild took its memory
            del self._held[key]
            held = None
        if held is not None and len(held) == length and held.device is device:
            return held
        if held is not None:
            await held.device.free_async(held)
        self._held[key] = buffer = await device.allocate_async(max(length, 1))
        return buffer

    async def close(self) -> None:
        """Free every buffer (errors of a device already gone are ignored)."""
        held, self._held = list(self._held.values()), {}
        for buffer in held:
            with contextlib.suppress(GpuRuntimeError):
                await buffer.device.free_async(buffer)


async def free_replicas(replicas: list[ModelReplica]) -> None:
    """Free the parameter, gradient and optimizer-state buffers of ``replicas`` (their
    work buffers stay until the device closes: ``ModelReplica`` does not expose them);
    errors of a device or context already gone are ignored."""
    for replica in replicas:
        buffers = [*replica.params, *replica.grads,
                   *(b for state in replica.optimizer_state.values() for b in state)]
        for buffer in buffers:
            if not buffer.is_stale():
                with contextlib.suppress(GpuRuntimeError):
                    await replica.device.free_async(buffer)
