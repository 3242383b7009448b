"""The replica a data-parallel trainer drives: what it needs of one (``Replica``), the
micro-batches of its share of a step (``MicroBatch``), and the replica with the context
generation it was built on (``Slot``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from atomr_accel.facade import Device
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.train._model import Array
from atomr_accel.train._replica_state import Thunk, require_real

__all__ = ["MicroBatch", "Replica", "Slot"]


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """Rows ``x`` and targets ``y`` of one micro-batch of a replica's share, its loss
    gradient scaled by ``grad_scale`` (its rows / the global batch's; a finite number,
    else ``InvalidArgument``)."""

    x: Array
    y: Array
    grad_scale: float

    def __post_init__(self) -> None:
        require_real("grad_scale", self.grad_scale)
        object.__setattr__(self, "grad_scale", float(self.grad_scale))


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

    @property
    def step_stats(self) -> GpuBuffer:
        """The step's ``[loss_sum, grad_sumsq, apply_flag]`` (the gradients' dtype), set
        by ``gradient_phase_ops``: the trainer all-reduces it with the last bucket."""

    async def gradient_phase_ops(self, batches: Sequence[MicroBatch], *,
                                 bucket_ready: Callable[[int], None]) -> list[Thunk]:
        """A step's first half, as calls to start in order and await together (nothing
        read back): zero ``step_stats``, then zero the gradients and run forward, loss
        (``rows * loss`` added into ``step_stats[0]``) and backward of each micro-batch,
        accumulating; ``bucket_ready(i)`` once bucket ``i`` is complete, for every bucket
        (also with no micro-batch: the gradients are zeroed)."""

    def finish_step_ops(self) -> list[Thunk]:
        """A step's second half, once the first half has finished and the gradients and
        ``step_stats`` hold their sums over the replicas, as calls to start in order: the
        sum of squares of the gradients and
        the flag (loss sum and sum of squares finite) into ``step_stats``, the optimizer
        update where the flag is set, and ``step_stats``'s download, the last call's
        answer (a host array of 3). A replica whose flag is 0 is as before the step."""

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
