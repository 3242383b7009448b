"""The shards of one tensor-parallel model: a replica of each segment on every rank,
and the calls that run a forward, a backward or an update across all of them."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any

from atomr_accel.facade import Collective
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.train._grad_norm import gradient_norm
from atomr_accel.train._model import Array, Sequential
from atomr_accel.train._replica import ModelReplica
from atomr_accel.train._replica_state import STEP_KEY
from atomr_accel.train._tp_split import Segment, merge_parameters
from atomr_accel.train._trainer_args import first_error

__all__ = ["Shards"]


class Shards:
    """The replicas: ``replicas[segment][rank]``, and the world that joins the ranks."""

    def __init__(self, model: Sequential, parts: list[Segment],
                 replicas: list[list[ModelReplica]], world: Collective | None) -> None:
        self.model = model
        self.parts = parts
        self.replicas = replicas
        self.world = world
        self.last: tuple[Array, Array] | None = None
        """The last training forward's input and target (for ``backward``)."""

    async def all_reduce(self, buffers: list[GpuBuffer]) -> None:
        """Sum ``buffers`` (one a rank) in place on every rank (nothing with one rank)."""
        if self.world is not None:
            await self.world.all_reduce_async(buffers)

    async def each(self, calls: Sequence[Coroutine[Any, Any, Any]]) -> list[Any]:
        """Await one call a rank together; the first typed error is raised."""
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(c) for c in calls]
        except ExceptionGroup as error:
            raise first_error(error) from None
        return [t.result() for t in tasks]

    async def forward(self, x: Array, train: bool) -> list[GpuBuffer]:
        """Every rank's whole output of the model for ``x`` (tag 0)."""
        current: list[Any] = [x] * len(self.replicas[0])
        shape: tuple[int, ...] | None = None
        for part, replicas in zip(self.parts, self.replicas, strict=True):
            outs = await self.each([r.forward_async(c, train=train, shape=shape)
                                    for r, c in zip(replicas, current, strict=True)])
            if part.sharded:
                await self.all_reduce(outs)
            current, shape = outs, replicas[0].output_shape(0)
        return current

    async def loss(self, y: Array, scale: float = 1.0) -> float:
        """The loss of the last forward against ``y`` on every rank (rank 0's answered);
        its gradient, times ``scale``, is left ready on every rank."""
        losses = await self.each([r.loss_async(y, grad_scale=scale)
                                  for r in self.replicas[-1]])
        return float(losses[0])

    async def backward(self, grad_out: Array | None) -> None:
        """Backpropagate (from the loss when ``grad_out`` is None), every rank."""
        current: list[Any] = [grad_out] * len(self.replicas[0])
        for index in reversed(range(len(self.parts))):
            part, replicas = self.parts[index], self.replicas[index]
            want = index > 0
            grads = await self.each([r.backward_async(g, want_input_grad=want)
                                     for r, g in zip(replicas, current, strict=True)])
            if want and part.sharded:
                await self.all_reduce(grads)
            current = grads

    async def update(self) -> None:
        """One optimizer update on every replica."""
        await self.each([r.optimizer_step_async() for rs in self.replicas for r in rs])

    async def zero_grad(self) -> None:
        """Zero every gradient."""
        await self.each([r.zero_grad_async() for rs in self.replicas for r in rs])

    async def grad_norm(self) -> float:
        """The L2 norm of the whole model's gradient (shards once each, replicated
        segments once), computed on the devices."""
        return await gradient_norm(r for part, replicas in zip(self.parts, self.replicas,
                                                                strict=True)
                                   for r in (replicas if part.sharded else replicas[:1]))

    async def state_dict(self) -> dict[str, Array]:
        """The whole model's parameters and optimizer state, shards merged."""
        out: dict[str, Array] = {}
        for part, replicas in zip(self.parts, self.replicas, strict=True):
            states = [await r.state_dict_async() for r in replicas]
            out[STEP_KEY] = states[0].pop(STEP_KEY)
            patterns = ["{}", *(f"optimizer.{{}}.{kind}" for kind in replicas[0].optimizer_state)]
            for pattern in patterns:
                shards = [{n: s[pattern.format(n)] for n in r.parameter_layout}
                          for s, r in zip(states, replicas, strict=True)]
                merged = merge_parameters(self.model, part, shards)
                out.update({pattern.format(k): v for k, v in merged.items()})
        return out
