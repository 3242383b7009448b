"""The parameter server's update of its weight buffer: device ops only.

``"sgd"``: one BLAS axpy, ``w += (-lr * weight) g``. ``"adamw"``: one fused
``AdamUpdate`` op of the ``train`` library (decoupled decay 0, betas 0.9 and
0.999, eps 1e-8: the original's settings), ``grad_scale = weight``, its
moments in two more device buffers, its step the number of updates applied.
"""

from __future__ import annotations

from dataclasses import dataclass

from atomr_accel.core.ops._train import AdamUpdate
from atomr_accel.facade import Device
from atomr_accel.facade._buffers import GpuBuffer

__all__ = ["ServerOptimizer", "make_server_optimizer"]


@dataclass
class ServerOptimizer:
    """Applies the gradient buffer to the weight buffer, scaled by a staleness weight."""

    device: Device
    name: str
    lr: float
    weights: GpuBuffer
    gradient: GpuBuffer
    size: int
    exp_avg: GpuBuffer | None = None
    exp_avg_sq: GpuBuffer | None = None
    steps: int = 0

    @property
    def buffers(self) -> tuple[GpuBuffer, ...]:
        """The optimizer's own device buffers (state), freed with the server's."""
        return tuple(b for b in (self.exp_avg, self.exp_avg_sq) if b is not None)

    async def apply(self, weight: float) -> None:
        """Update the weights with the gradient times ``weight`` (one device op)."""
        if self.exp_avg is None or self.exp_avg_sq is None:
            await self.device.blas().axpy_f32_async(-self.lr * weight, self.gradient,
                                                    self.weights, self.size)
        else:
            await self.device.run_async(AdamUpdate(
                self.weights.ref, self.gradient.ref, self.exp_avg.ref, self.exp_avg_sq.ref, 0,
                self.size, self.lr, self.steps + 1, decoupled=True, grad_scale=weight))
        self.steps += 1


async def make_server_optimizer(device: Device, name: str, lr: float, weights: GpuBuffer,
                                gradient: GpuBuffer, size: int) -> ServerOptimizer:
    """The update for optimizer ``name`` (``"sgd"`` or ``"adamw"``), its state allocated."""
    optimizer = ServerOptimizer(device, name, lr, weights, gradient, size)
    if name == "adamw":
        optimizer.exp_avg = await device.allocate_async(len(weights))
        optimizer.exp_avg_sq = await device.allocate_async(len(weights))
    return optimizer
