"""The replica a data-parallel trainer drives: what it needs of one (``Replica``), how it
makes one for a model description or a ``TorchModule``, and how it tells a broken one."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from atomr_accel.facade import Device
from atomr_accel.facade._buffers import GpuBuffer

__all__ = ["Replica", "Slot"]

Array = np.ndarray[Any, Any]


class Replica(Protocol):
    """What the trainer calls on a replica: ``ModelReplica``, or ``TorchReplica`` for a
    ``TorchModule`` (the same methods and meanings; see ``ModelReplica``)."""

    @property
    def device(self) -> Device:
        """The device the replica lives on."""

    @property
    def gradient_buckets(self) -> list[GpuBuffer]:
        """The gradient buffers, in the order backward fills them (last layer first)."""

    async def zero_grad_async(self) -> None:
        """Zero every gradient."""

    async def forward_async(self, x: Any, *, train: bool = True, micro_batch: int = 0) -> Any:
        """Run the model on ``x``."""

    async def loss_async(self, y: Any, *, micro_batch: int = 0,
                         grad_scale: float = 1.0) -> float:
        """The mean loss against ``y``; leaves its gradient times ``grad_scale``."""

    async def backward_async(self, grad_out: Any = None, *, micro_batch: int = 0,
                             want_input_grad: bool = False,
                             bucket_ready: Callable[[int], None] | None = None) -> Any:
        """Add the gradients into the buckets; ``bucket_ready(i)`` once bucket ``i`` is
        complete for every op submitted after that call."""

    async def gradient_step_async(self, x: Any, y: Any, *, grad_scale: float = 1.0,
                                  zero: bool = True, micro_batch: int = 0,
                                  bucket_ready: Callable[[int], None] | None = None,
                                  ) -> float:
        """Zero (when ``zero``), forward, loss and backward of one batch; the loss."""

    async def optimizer_step_async(self, *, grad_scale: float = 1.0) -> None:
        """Apply the optimizer to every parameter."""

    async def predict_async(self, x: Any) -> Array:
        """The model's output on ``x`` (evaluation mode)."""

    async def state_dict_async(self) -> dict[str, Array]:
        """Parameters, optimizer state and step."""

    async def load_state_dict_async(self, state: Mapping[str, Any]) -> None:
        """Take ``state`` (as ``state_dict_async`` answers it)."""


@dataclass(slots=True)
class Slot:
    """One replica of the trainer and the context generation of its device it was built
    on (its buffers die with that context)."""

    device: Device
    replica: Replica
    generation: int
