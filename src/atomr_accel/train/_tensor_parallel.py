"""TensorParallelTrainer: a model's Linear pairs split across devices, Megatron style.

The model is cut into segments (``_tp_split``): a *sharded* segment is a
``Linear``, element-wise activations, then a ``Linear``; the first is split
column-parallel and the second row-parallel over the ``n`` devices; every
other layer is *replicated*. Each (segment, device) is one ``ModelReplica``
(the device's shard of the segment), so forward, backward and the optimizer
update are the training core's device ops.

The collectives (one communicator world over the devices, ``System.nccl_world``:
NCCL on GPUs, the host collective on CPU devices):

* forward: a sharded segment leaves a partial sum on every device; it is
  **all-reduced** (sum) in place, so every device holds the whole output (the
  row-parallel bias lives on device 0 only, so it is added once) and the next
  segment, or the loss, takes it there;
* backward: the gradient reaching a sharded segment is whole on every device;
  the row-parallel backward gives each device the gradient of its own columns
  (no communication), and the column-parallel backward a partial input
  gradient, which is **all-reduced** before it goes on.

Replicated segments compute the same values on every device (one seed, so
Dropout draws the same mask), so their parameters stay equal without
communication. The whole-output all-reduce plays the role of Megatron's
all-gather of a column-parallel output: no output stays split between
segments. The result equals the unsplit model's step (float32 round-off).
Inputs are ``(rows, features)`` batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

from atomr_accel.actor import Props
from atomr_accel.blueprint import (
    require_system,
    require_timeout,
    twin,
)
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.facade import Device, System
from atomr_accel.train._model import Array, Linear, Sequential
from atomr_accel.train._optim import Loss, Optimizer, require_loss, require_optimizer
from atomr_accel.train._recovery import KeptState, settled_generation
from atomr_accel.train._replica import ModelReplica
from atomr_accel.train._replica_state import checked_parameters
from atomr_accel.train._step_result import StepResult
from atomr_accel.train._tp_shards import Shards
from atomr_accel.train._tp_split import (
    Segment,
    segments,
    shard_model,
    shard_parameters,
)
from atomr_accel.train._trainer_args import (
    ANSWER_MARGIN,
    STEP_TIMEOUT,
    ModelParallelActor,
    ModelParallelClient,
    StateDictRequest,
    TrainStep,
    checked_batch,
    checked_devices,
    deadline,
    require_count,
)
from atomr_accel.train._transfer import free_replicas

__all__ = ["ModelSource", "TensorParallelTrainer"]

ModelSource: TypeAlias = Sequential | Callable[[int], Sequential]
"""A model, or what makes one from the width of the first batch's rows."""


@dataclass
class _Forward:
    x: Array
    y: Array | None
    train: bool
    timeout: float


@dataclass
class _Backward:
    grad: Array | float
    timeout: float


@dataclass
class _Kept(KeptState):
    """``KeptState`` with the shards (``replicas`` stays unused)."""

    shards: Shards | None = None


class _TensorParallelActor(ModelParallelActor[ModelSource, _Kept]):
    """Owns the shards; answers steps, forwards, backwards and state downloads, and
    recovers from a lost context (``_recovery``)."""

    async def _ready(self, features: int) -> Shards:
        if self._s.shards is not None:
            return self._s.shards
        model = self._model if isinstance(self._model, Sequential) else self._model(features)
        full = (dict(self._parameters) if self._parameters is not None
                else model.init_parameters(self._seed))
        n = len(self._devices)
        parts = segments(model)
        self._s.generations = [d.generation for d in self._devices]
        ranks = [await self._make_rank(model, parts, rank, {
            k: v for part in parts for k, v in shard_parameters(model, part, rank, n,
                                                                 full).items()})
            for rank in range(n)]
        world = (await self._system.nccl_world_async(self._devices)
                 if n > 1 and any(p.sharded for p in parts) else None)
        replicas = [[ranks[rank][i] for rank in range(n)] for i in range(len(parts))]
        self._s.shards = Shards(model, parts, replicas, world)
        return self._s.shards

    async def _save(self) -> list[dict[str, Array]]:
        assert self._s.shards is not None
        return [await r.state_dict_async() for rs in self._s.shards.replicas for r in rs]

    async def _restore(self, states: list[dict[str, Array]]) -> None:
        """Rebuild the ranks whose context was rebuilt; load ``states`` into every
        replica."""
        shards = self._s.shards
        assert shards is not None
        n = len(self._devices)
        for rank, device in enumerate(self._devices):
            generation = await settled_generation(device)
            if generation != self._s.generations[rank]:
                mine = [states[i * n + rank] for i in range(len(shards.parts))]
                full = {k: v for state in mine for k, v in state.items()}
                rebuilt = await self._make_rank(shards.model, shards.parts, rank, full)
                for i, replica in enumerate(rebuilt):
                    shards.replicas[i][rank] = replica
                self._s.generations[rank] = generation
        for state, replica in zip(states, (r for rs in shards.replicas for r in rs),
                                  strict=True):
            await replica.load_state_dict_async(state)

    async def _make_rank(self, model: Sequential, parts: list[Segment], rank: int,
                         values: Mapping[str, Array]) -> list[ModelReplica]:
        """Rank ``rank``'s replicas (one a segment) from the values of its shards."""
        n, device = len(self._devices), self._devices[rank]
        out = []
        for part in parts:
            shard = shard_model(model, part, rank, n)
            out.append(await ModelReplica.create_async(
                device, shard, loss=self._loss, optimizer=self._optimizer, seed=self._seed,
                parameters={k: values[k] for k in shard.parameter_shapes()}))
        return out

    async def _step(self, x: Array, y: Array | None) -> tuple[float, float]:
        """Zero, forward, loss, backward, update; answers the loss and gradient norm."""
        shards = await self._ready(x.shape[-1])
        await shards.zero_grad()
        await shards.forward(x, True)
        loss = await shards.loss(x if y is None else y)
        await shards.backward(None)
        await shards.update()
        return loss, await shards.grad_norm()

    async def _forward(self, x: Array, y: Array | None, train: bool,
                       ) -> tuple[Array, float | None]:
        shards = await self._ready(x.shape[-1])
        outs = await shards.forward(x, train)
        shape = shards.replicas[-1][0].output_shape(0)
        device = shards.replicas[-1][0].device
        out = await device.copy_to_numpy_async(outs[0], 0, math.prod(shape))
        target = x if y is None else y
        shards.last = (x, target) if train else None
        value = await shards.loss(target) if train else None
        return out.reshape(shape), value

    async def _backward(self, x: Array, target: Array, grad: Array | float) -> float:
        """Forward ``x`` again (the same tape, so a replay redoes it exactly), backpropagate
        ``grad`` (the output's gradient, or a scale of the loss's against ``target``) and
        update once; answers the gradient's norm."""
        shards = await self._ready(x.shape[-1])
        await shards.zero_grad()
        await shards.forward(x, True)
        if isinstance(grad, float):
            await shards.loss(target, grad)
            await shards.backward(None)
        else:
            await shards.backward(grad)
        await shards.update()
        return await shards.grad_norm()

    async def post_stop(self) -> None:
        """Stop the trainer's communicator world and free the shards' parameters,
        gradients and optimizer state."""
        shards = self._s.shards
        if shards is not None:
            await free_replicas([r for rs in shards.replicas for r in rs])
        if shards is not None and shards.world is not None:
            world = shards.world
            if world in self._system.worlds:
                self._system.worlds.remove(world)
            self._system.actors.stop(world.ref)

    async def handle(self, message: Any) -> Any:
        """Answer a step, a forward, a backward or a state download, each within its
        time-out (``AskTimeout`` past it; the next call then recovers the state first)."""
        if type(message) not in (TrainStep, _Forward, _Backward, StateDictRequest):
            return await super().handle(message)
        async with deadline(f"tensor-parallel {type(message).__name__[1:].lower()}",
                            message.timeout):
            return await self._answer(message)

    async def _answer(self, message: Any) -> Any:
        if type(message) is TrainStep:
            await self._ready(message.x.shape[-1])
            return await self._train(message)
        if type(message) is _Forward:
            await self._ready(message.x.shape[-1])
            request = message
            return await self._s.journal.read(
                lambda: self._forward(request.x, request.y, request.train))
        if type(message) is _Backward:
            last = None if self._s.shards is None else self._s.shards.last
            if last is None:
                raise InvalidArgument("backward needs a forward (train=True) first")
            norm, _ = await self._s.journal.run(self._backward, *last, message.grad)
            return norm
        if type(message) is StateDictRequest:
            if self._s.shards is None and not isinstance(self._model, Sequential):
                raise InvalidArgument("the model is made at the first forward (from its width)")
            shards = await self._ready(0)  # the model is known by now
            return await self._s.journal.read(shards.state_dict)
        raise AssertionError(f"unexpected {message!r}")


class TensorParallelTrainer(ModelParallelClient):
    """A ``Sequential`` whose ``Linear`` pairs are split over several devices.

    See the module for the split and the collectives. ``step(x, y)`` answers a
    ``StepResult`` (a float, the mean loss, that unpacks as ``(loss,
    grad_norm, step_micros)``); the original's ``forward(x) -> (output, loss)``
    and ``backward(grad) -> grad_norm`` work on every trainer. Every method has
    an ``_async`` twin.
    """

    _in_features: int | None = None
    _out_features: int | None = None

    @classmethod
    def spawn(cls, system: Any, model: Sequential, devices: Sequence[Device], *,
              loss: Loss, optimizer: Optimizer, seed: int = 0,
              parameters: Mapping[str, Any] | None = None,
              name: str | None = None) -> TensorParallelTrainer:
        """Start a tensor-parallel trainer in the facade ``system``.

        ``spawn(system, model, devices, *, loss, optimizer, seed=0,
        parameters=None, name=None)``: ``model`` a ``Sequential``, split over
        ``devices`` (distinct devices of the system); ``parameters`` the whole
        model's by name (default: ``model.init_parameters(seed)``).

        Raises ``InvalidArgument`` for bad settings.
        """
        facade = require_system(system)
        if not isinstance(model, Sequential):
            raise InvalidArgument(f"model must be a Sequential, got {model!r}")
        if not isinstance(devices, Sequence) or not devices:
            raise InvalidArgument(f"devices must be a non-empty list of Device, got "
                                  f"{devices!r}")
        placed = checked_devices(facade, devices, len(devices), "devices")
        if len({id(d) for d in placed}) != len(placed):
            raise InvalidArgument("devices must be distinct (one shard a device)")
        if len({d.backend for d in placed}) > 1:
            raise InvalidArgument("devices must share one backend (their collectives do)")
        in_features = model.in_features()
        if in_features is None:
            raise InvalidArgument("the model must start with a Linear or LayerNorm")
        out_features = model.features_out(in_features)
        for part in segments(model):
            if part.sharded:
                first = model[part.start]
                assert isinstance(first, Linear)
                if first.out_features < len(placed):
                    raise InvalidArgument(f"{first!r} has fewer outputs than there are "
                                          f"devices ({len(placed)}) to split them over")
        full = (None if parameters is None
                else checked_parameters(parameters, model.parameter_shapes(), DType.F32))
        client = cls._launch(facade, model, placed, loss, optimizer, seed, full, name)
        client._in_features, client._out_features = in_features, out_features
        return client

    @classmethod
    def _launch(cls, system: System, model: ModelSource, devices: list[Device],
                loss: Loss, optimizer: Optimizer, seed: int,
                parameters: Mapping[str, Array] | None, name: str | None,
                ) -> TensorParallelTrainer:
        require_loss(loss)
        require_optimizer(optimizer)
        require_count("seed", seed, least=0)
        props = Props(_TensorParallelActor, system, model, devices, loss, optimizer, seed,
                      parameters, _Kept())
        return cls._launch_actor(system, props, name, devices, loss)

    def _batch(self, x: Any, y: Any, *, labels: bool | None = None,
               ) -> tuple[Array, Array | None]:
        if self._in_features is None:  # a model made from the first batch: its width
            try:
                shape = np.shape(x)
            except ValueError as exc:
                raise InvalidArgument(f"x must be a batch of numbers: {exc}") from exc
            if not shape or shape[-1] < 1:
                raise InvalidArgument(f"x must hold at least one number, got shape {shape}")
            self._in_features = self._out_features = int(shape[-1])
        features = self._in_features
        data, target = checked_batch(x, y, features,
                                     self._classes if labels is None else labels)
        if data.ndim != 2:
            raise InvalidArgument(f"x must be a (rows, features) batch, got {data.shape}")
        if target is None and labels is None and self._out_features != features:
            raise InvalidArgument("y=None trains the model to reproduce x, which needs as "
                                  "many outputs as inputs")
        return data, target

    def step_async(self, x: Any, y: Any = None, timeout_secs: float = STEP_TIMEOUT,
                   ) -> Coroutine[Any, Any, StepResult]:
        """One training step on the batch ``x`` against ``y`` (``y=None``: reproduce ``x``):
        zero, forward, loss, backward, update. Answers the ``StepResult``."""
        data, target = self._batch(x, y)
        timeout = require_timeout(timeout_secs)
        return self._call(TrainStep(data, target, timeout), timeout + ANSWER_MARGIN, "step")

    step = twin(step_async)

    async def _forward(self, x: Any, data: Array, target: Array | None, train: bool,
                       timeout: float) -> tuple[Any, float | None]:
        out, loss = await self._call(_Forward(data, target, train, timeout),
                                     timeout + ANSWER_MARGIN, "forward")
        if isinstance(x, np.ndarray):
            return out, loss
        return (out[0].tolist() if len(np.shape(x)) == 1 else out.tolist()), loss

    def forward_async(self, x: Any, y: Any = None, timeout_secs: float = STEP_TIMEOUT,
                      ) -> Coroutine[Any, Any, tuple[Any, float | None]]:
        """The original's ``forward``: the model's output for ``x`` (a list of numbers is one
        sample, a list of lists a batch; lists answer lists, arrays arrays) and the loss
        against ``y`` (None: against ``x``), its gradient kept for ``backward``."""
        data, target = self._batch(x, y)
        return self._forward(x, data, target, True, require_timeout(timeout_secs))

    forward = twin(forward_async)

    def backward_async(self, grad: Any = 1.0, timeout_secs: float = STEP_TIMEOUT,
                       ) -> Coroutine[Any, Any, float]:
        """The original's ``backward``: backpropagate the last ``forward`` and update once;
        ``grad`` is the gradient of the output (shaped like it) or a number scaling the
        loss's own gradient (1.0: the loss's). Answers the gradient's L2 norm."""
        if isinstance(grad, int | float) and not isinstance(grad, bool):
            if not math.isfinite(grad):
                raise InvalidArgument(f"grad must be finite, got {grad!r}")
            value: Array | float = float(grad)
        else:
            value = np.atleast_2d(np.asarray(grad, dtype=np.float32))
            if not np.all(np.isfinite(value)):
                raise InvalidArgument("grad holds a NaN or an infinity")
        timeout = require_timeout(timeout_secs)
        return self._call(_Backward(value, timeout), timeout + ANSWER_MARGIN, "backward")

    backward = twin(backward_async)

    async def _predict(self, data: Array, timeout: float) -> Array:
        out, _ = await self._call(_Forward(data, None, False, timeout),
                                  timeout + ANSWER_MARGIN, "predict")
        result: Array = out
        return result

    def predict_async(self, x: Any, timeout_secs: float = STEP_TIMEOUT,
                      ) -> Coroutine[Any, Any, Array]:
        """The model's output for the batch ``x`` (evaluation mode), as a host array."""
        data, _ = self._batch(x, None, labels=False)
        return self._predict(data, require_timeout(timeout_secs))

    predict = twin(predict_async)
