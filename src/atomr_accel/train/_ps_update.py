"""The parameter server's update of its weight buffer: device ops only."""

from __future__ import annotations

from atomr_accel.facade import Device
from atomr_accel.facade._buffers import GpuBuffer

__all__ = ["ServerOptimizer", "SgdUpdate", "make_server_optimizer"]


class ServerOptimizer:
    """Applies the gradient buffer to the weight buffer, scaled by a staleness weight."""

    buffers: tuple[GpuBuffer, ...] = ()
    """The optimizer's own device buffers (state), freed with the server's."""

    def __init__(self, device: Device, lr: float, weights: GpuBuffer, gradient: GpuBuffer,
                 size: int) -> None:
        self.device = device
        self.lr = lr
        self.weights = weights
        self.gradient = gradient
        self.size = size

    async def apply(self, weight: float) -> None:
        """Update the weights with ``weight * gradient`` (subclasses)."""
        raise NotImplementedError


class SgdUpdate(ServerOptimizer):
    """``w -= lr * weight * g``: one BLAS axpy on the device."""

    async def apply(self, weight: float) -> None:
        """One axpy with ``alpha = -lr * weight``."""
        await self.device.blas().axpy_f32_async(-self.lr * weight, self.gradient, self.weights,
                                                self.size)


async def make_server_optimizer(device: Device, name: str, lr: float, weights: GpuBuffer,
                                gradient: GpuBuffer, size: int) -> ServerOptimizer:
    """The update for optimizer ``name`` (``"sgd"`` or ``"adamw"``), its state allocated."""
    return SgdUpdate(device, lr, weights, gradient, size)
