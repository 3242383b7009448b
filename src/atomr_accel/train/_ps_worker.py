"""ParameterServerWorker: an actor on a device that trains a model through a parameter server.

The server holds the model's parameters as one flat vector
(``flatten_parameters``: every parameter of ``model.parameter_shapes()``, in
that order, flattened). Each step of a worker:

1. pulls the weights and their version (``pull_weights``);
2. loads them into its ``ModelReplica`` (on its own device);
3. runs forward, the loss and backward on its next mini-batch there;
4. downloads the gradient, flattens it and pushes it with the pulled version.

A push the server refuses as too stale (``StaleGradient``) is counted and the
worker goes on with a fresh pull. When the worker's own context is lost
(poisoned, its process killed), it makes its replica again on the rebuilt
context and computes that step's gradient once more (a worker keeps no state
of its own between steps). Workers on several devices run at the same
time; the server applies their gradients one after another with its staleness
rule. The replica's own optimizer is never stepped: the server updates.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atomr_accel.actor import Props
from atomr_accel.blueprint import (
    BlueprintActor,
    BlueprintClient,
    require_system,
    require_timeout,
    twin,
)
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.facade import Device
from atomr_accel.train._model import Array, Sequential
from atomr_accel.train._optim import SGD, Loss, MSELoss, require_loss
from atomr_accel.train._parameter_server import AsyncParameterServer
from atomr_accel.train._recovery import RECOVERABLE, settled_generation
from atomr_accel.train._replica import ModelReplica
from atomr_accel.train._replica_state import STEP_KEY
from atomr_accel.train._staleness import StaleGradient
from atomr_accel.train._trainer_args import checked_batch, require_count
from atomr_accel.train._transfer import free_replicas

__all__ = ["ParameterServerWorker", "WorkerReport", "flatten_parameters",
           "unflatten_parameters"]

TRAIN_TIMEOUT = 300.0
"""The default ``timeout_secs`` of ``train``, seconds."""


def flatten_parameters(model: Sequential, parameters: Mapping[str, Any]) -> Array:
    """``parameters`` (by name) as one float32 vector, in ``model.parameter_shapes()`` order:
    what a parameter server holds for ``model``."""
    shapes = model.parameter_shapes()
    missing = [name for name in shapes if name not in parameters]
    if missing:
        raise InvalidArgument(f"parameters lack {missing}")
    parts = []
    for name, shape in shapes.items():
        value = np.asarray(parameters[name], dtype=np.float32)
        if value.shape != shape:
            raise InvalidArgument(f"parameter {name} has shape {value.shape}, expected {shape}")
        parts.append(value.reshape(-1))
    return np.concatenate(parts)


def unflatten_parameters(model: Sequential, flat: Any) -> dict[str, Array]:
    """The named parameters of ``model`` from a flat vector (``flatten_parameters``
    inverted)."""
    data = np.asarray(flat, dtype=np.float32).reshape(-1)
    shapes = model.parameter_shapes()
    total = sum(int(np.prod(s)) for s in shapes.values())
    if data.size != total:
        raise InvalidArgument(f"the model has {total} parameters, the vector {data.size}")
    out, offset = {}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape))
        out[name] = data[offset:offset + size].reshape(shape).copy()
        offset += size
    return out


@dataclass
class WorkerReport:
    """What one ``train`` call did."""

    steps: int = 0
    """Gradients computed."""
    applied: int = 0
    """Pushes the server applied."""
    rejected: int = 0
    """Pushes refused as too stale (``StaleGradient``)."""
    losses: list[float] = field(default_factory=list)
    """Each step's mini-batch loss, in order."""
    version: int = 0
    """The server's version after this worker's last applied push."""
    rebuilds: int = 0
    """Times the worker's replica was made again after its context was lost."""


@dataclass
class _Train:
    x: Array
    y: Array | None
    steps: int
    batch_size: int
    seed: int


@dataclass
class _Kept:
    """The worker's replica, shared by its actor's incarnations (a restart keeps it)."""

    replica: ModelReplica | None = None
    rebuilds: int = 0
    """Times the replica was made again after its context was rebuilt."""


class _WorkerActor(BlueprintActor):
    """Owns the replica on its device; runs ``train`` requests."""

    def __init__(self, server: AsyncParameterServer, model: Sequential, device: Device,
                 loss: Loss, worker_id: int, kept: _Kept) -> None:
        super().__init__()
        self._server = server
        self._model = model
        self._device = device
        self._loss = loss
        self._worker_id = worker_id
        self._kept = kept

    async def _ready(self) -> ModelReplica:
        if self._kept.replica is None:
            self._kept.replica = await ModelReplica.create_async(
                self._device, self._model, loss=self._loss, optimizer=SGD(0.0))
        return self._kept.replica

    async def pre_restart(self, exc: BaseException, message: Any) -> None:
        """Keep the replica for the next incarnation."""

    async def post_stop(self) -> None:
        """Free the replica's parameters and gradients."""
        if self._kept.replica is not None:
            await free_replicas([self._kept.replica])

    async def handle(self, message: Any) -> Any:
        """Run a ``train`` request."""
        if type(message) is _Train:
            return await self._train(message)
        return await super().handle(message)

    async def _gradient(self, x: Array, y: Array) -> tuple[float, Array, int]:
        """Pull, load, and compute the gradient of ``x``, ``y``: ``(loss, gradient,
        version)``. A context rebuild of the worker's device (its replica's buffers gone)
        makes the replica again and computes once more."""
        try:
            return await self._compute(await self._ready(), x, y)
        except RECOVERABLE:
            await settled_generation(self._device)
            self._kept.replica = None
            self._kept.rebuilds += 1
            return await self._compute(await self._ready(), x, y)

    async def _compute(self, replica: ModelReplica, x: Array, y: Array,
                       ) -> tuple[float, Array, int]:
        weights, version = await self._server.pull_weights_async(self._worker_id)
        state: dict[str, Any] = unflatten_parameters(self._model, weights)
        state[STEP_KEY] = np.array(0, np.int64)
        await replica.load_state_dict_async(state)
        loss = await replica.gradient_step_async(x, y)  # zero, forward, loss, backward
        gradient = flatten_parameters(self._model, await replica.gradients_async())
        return loss, gradient, version

    async def _train(self, request: _Train) -> WorkerReport:
        report, before = WorkerReport(), self._kept.rebuilds
        rng = np.random.default_rng(request.seed)
        rows = len(request.x)
        for _ in range(request.steps):
            pick = rng.choice(rows, size=min(request.batch_size, rows), replace=False)
            x = request.x[pick]
            y = x if request.y is None else request.y[pick]
            loss, gradient, version = await self._gradient(x, y)
            report.losses.append(loss)
            report.steps += 1
            try:
                report.version = await self._server.push_gradient_async(
                    self._worker_id, version, gradient)
            except StaleGradient:
                report.rejected += 1
                continue
            report.applied += 1
        report.rebuilds = self._kept.rebuilds - before
        return report


class ParameterServerWorker(BlueprintClient):
    """A worker actor that trains ``model`` on its device through an
    ``AsyncParameterServer`` (see the module for one step)."""

    _in_features = 1
    _classes = False

    @classmethod
    def spawn(cls, system: Any, server: AsyncParameterServer, model: Sequential,
              device: Device, *, loss: Loss, worker_id: int,
              name: str | None = None) -> ParameterServerWorker:
        """Start a worker of ``server`` for ``model`` on ``device`` (a device of the facade
        ``system``), pushing as ``worker_id`` and taking ``loss``. The server must hold
        ``flatten_parameters(model, ...)``: as many weights as the model has parameters
        (``InvalidArgument`` otherwise)."""
        facade = require_system(system)
        if not isinstance(server, AsyncParameterServer):
            raise InvalidArgument(f"server must be an AsyncParameterServer, got {server!r}")
        if not isinstance(model, Sequential):
            raise InvalidArgument(f"model must be a Sequential, got {model!r}")
        if not isinstance(device, Device) or all(d is not device for d in facade.devices):
            raise InvalidArgument(f"device must be a Device of this system, got {device!r}")
        require_loss(loss)
        require_count("worker_id", worker_id, least=0)
        total = sum(int(np.prod(s)) for s in model.parameter_shapes().values())
        if server.size != total:
            raise InvalidArgument(f"the server holds {server.size} weights; the model has "
                                  f"{total} parameters")
        in_features = model.in_features()
        if in_features is None:
            raise InvalidArgument("the model must start with a Linear or LayerNorm")
        client = cls._start(facade, Props(_WorkerActor, server, model, device, loss,
                                             int(worker_id), _Kept()), name)
        client._in_features = in_features
        client._classes = not isinstance(loss, MSELoss)
        return client

    def train_async(self, x: Any, y: Any, *, steps: int, batch_size: int = 32, seed: int = 0,
                    timeout_secs: float = TRAIN_TIMEOUT) -> Coroutine[Any, Any, WorkerReport]:
        """Run ``steps`` steps on mini-batches of ``batch_size`` rows drawn (without
        replacement within a batch, from ``numpy.random.default_rng(seed)``) from the
        training set ``x``, ``y``; answers the ``WorkerReport``."""
        data, target = checked_batch(x, y, self._in_features, self._classes)
        require_count("steps", steps)
        require_count("batch_size", batch_size)
        require_count("seed", seed, least=0)
        return self._call(_Train(data, target, int(steps), int(batch_size), int(seed)),
                          require_timeout(timeout_secs), "train")

    train = twin(train_async)
