"""PipelineParallelTrainer: a model's stages on different devices, micro-batches in flight.

Stage ``k`` is one ``ModelReplica`` on ``devices[k]``. A step splits the
global batch into ``micro_batches`` parts (``numpy.array_split``: sizes differ
by at most one) and runs every stage as its own task through its schedule
(``_schedule``: ``"1f1b"`` or ``"gpipe"``). A forward of micro-batch ``i`` on
stage ``k`` copies its output into stage ``k+1``'s input buffer for ``i``
(``System.copy_between``: a peer copy between GPUs of one process, CUDA IPC
between worker processes, staged through the host otherwise) and signals it;
a backward copies the input gradient back into stage ``k-1``'s gradient
buffer for ``i``. The last stage takes micro-batch ``i``'s loss right after
its forward, with the loss gradient scaled by ``rows_i / batch``, so the
gradients accumulated over the micro-batches are exactly the gradient of the
mean loss over the whole batch; one optimizer update per stage ends the step.
The result therefore equals the unsplit model's step on the whole batch (to
float32 round-off; Dropout draws other masks).

Parameters start as ``Sequential(*every stage's layers).init_parameters(seed)``
(or the ``parameters=`` given), cut by stage, and keep the full model's names
in ``state_dict``.

A step that fails cancels the other stages' work. When a context went down
(poisoned, its worker killed), the trainer recovers (``_recovery``): it
rebuilds the stages whose context was rebuilt, loads the last host checkpoint
(every 16 steps) into every stage, replays the steps since and redoes the
failed one; ``StepResult.recovered`` says so. Any other error is raised, and
the parameters change only in the final update, so a step that fails before
it leaves them as they were.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atomr_accel.actor import Props
from atomr_accel.blueprint import require_system, require_timeout, twin
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.facade import Device, System
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.train._grad_norm import gradient_norm
from atomr_accel.train._model import Array, Sequential
from atomr_accel.train._optim import Loss, Optimizer, require_loss, require_optimizer
from atomr_accel.train._recovery import KeptState, settled_generation
from atomr_accel.train._replica import ModelReplica
from atomr_accel.train._replica_state import checked_parameters
from atomr_accel.train._schedule import SCHEDULES, Pass, schedule
from atomr_accel.train._step_result import StepResult
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
    first_error,
    require_count,
)
from atomr_accel.train._transfer import free_replicas, transfer

__all__ = ["PipelineParallelTrainer"]

_PREDICT = 2**61
"""The micro-batch tag ``predict`` uses on every stage."""


@dataclass
class _Predict:
    x: Array
    timeout: float


@dataclass
class _Run:
    """One step's micro-batches, the signals between stages and the losses."""

    xs: list[Array]
    ys: list[Array]
    batch: int
    done: dict[tuple[int, str, int], asyncio.Event] = field(default_factory=dict)
    acts: dict[tuple[int, int], GpuBuffer] = field(default_factory=dict)
    grads: dict[tuple[int, int], GpuBuffer] = field(default_factory=dict)
    losses: dict[int, float] = field(default_factory=dict)

    def event(self, stage: int, kind: str, i: int) -> asyncio.Event:
        """Set once ``stage`` has run pass ``kind`` (``"F"``/``"B"``) of micro-batch ``i``
        and sent on what it made."""
        key = (stage, kind, i)
        if key not in self.done:
            self.done[key] = asyncio.Event()
        return self.done[key]


class _PipelineActor(ModelParallelActor[Sequential, KeptState]):
    """Owns the stage replicas; runs steps, predictions and state downloads."""

    def __init__(self, system: System, model: Sequential, cuts: list[tuple[int, int]],
                 devices: list[Device], loss: Loss, optimizer: Optimizer, micro_batches: int,
                 micro_batch_size: int | None, kind: str, seed: int,
                 parameters: Mapping[str, Array] | None, kept: KeptState) -> None:
        super().__init__(system, model, devices, loss, optimizer, seed, parameters, kept)
        self._cuts = cuts
        self._m = micro_batches
        self._micro_batch_size = micro_batch_size
        self._kind = kind

    async def _replica(self, stage: int, parameters: Mapping[str, Array]) -> ModelReplica:
        """A new replica of stage ``stage`` on its device with ``parameters`` (by name)."""
        start, stop = self._cuts[stage]
        model = self._model[start:stop]
        return await ModelReplica.create_async(
            self._devices[stage], model, loss=self._loss, optimizer=self._optimizer,
            parameters={n: parameters[n] for n in model.parameter_shapes()}, seed=self._seed)

    async def _ready(self) -> list[ModelReplica]:
        if not self._s.replicas:
            full = (dict(self._parameters) if self._parameters is not None
                    else self._model.init_parameters(self._seed))
            generations = [device.generation for device in self._devices]
            replicas = [await self._replica(stage, full) for stage in range(len(self._cuts))]
            self._s.generations, self._s.replicas = generations, replicas
        return self._s.replicas

    async def _save(self) -> list[dict[str, Array]]:
        return [await r.state_dict_async() for r in self._s.replicas]

    async def _restore(self, states: list[dict[str, Array]]) -> None:
        """Rebuild the stages whose context was rebuilt; load ``states`` into every one."""
        for stage, device in enumerate(self._devices):
            generation = await settled_generation(device)
            if generation != self._s.generations[stage]:
                self._s.replicas[stage] = await self._replica(stage, states[stage])
                self._s.generations[stage] = generation
            await self._s.replicas[stage].load_state_dict_async(states[stage])

    async def handle(self, message: Any) -> Any:
        """Answer a step, a prediction or a state download, each within its time-out
        (``AskTimeout`` past it; the next call then recovers the state first)."""
        if type(message) not in (TrainStep, _Predict, StateDictRequest):
            return await super().handle(message)
        async with deadline(f"pipeline {type(message).__name__[1:].lower()}",
                            message.timeout):
            await self._ready()
            return await self._answer(message)

    async def _answer(self, message: TrainStep | _Predict | StateDictRequest) -> Any:
        if isinstance(message, TrainStep):
            return await self._train(message)
        if isinstance(message, _Predict):
            x = message.x
            return await self._s.journal.read(lambda: self._predict(self._s.replicas, x))
        state: dict[str, Array] = {}
        for replica_state in await self._s.journal.read(self._save):
            state.update(replica_state)
        return state

    def _split(self, x: Array) -> list[Array]:
        if self._micro_batch_size is not None:
            size = self._micro_batch_size
            return [x[i:i + size] for i in range(0, len(x), size)]
        if len(x) < self._m:
            raise InvalidArgument(f"a batch of {len(x)} rows cannot make {self._m} "
                                  f"micro-batches")
        return list(np.array_split(x, self._m))

    async def _step(self, x: Array, y: Array | None) -> tuple[float, float]:
        """One step on every stage; answers the mean loss and the gradient's norm."""
        replicas = self._s.replicas
        target = x if y is None else y
        xs = self._split(x)
        ys = self._split(target)
        run = _Run(xs, ys, len(x))
        await asyncio.gather(*(r.zero_grad_async() for r in replicas))
        plan = schedule(self._kind, len(replicas), len(xs))
        try:
            async with asyncio.TaskGroup() as group:
                for stage, passes in enumerate(plan):
                    group.create_task(self._run_stage(replicas, run, stage, passes))
        except ExceptionGroup as group_error:
            raise first_error(group_error) from None
        await asyncio.gather(*(r.optimizer_step_async() for r in replicas))
        loss = sum(run.losses[i] * len(xs[i]) for i in range(len(xs))) / len(x)
        return loss, await gradient_norm(replicas)

    async def _run_stage(self, replicas: list[ModelReplica], run: _Run, stage: int,
                         passes: list[Pass]) -> None:
        last = stage == len(replicas) - 1
        replica = replicas[stage]
        for kind, i in passes:
            if kind == "F":
                if stage == 0:
                    out = await replica.forward_async(run.xs[i], micro_batch=i)
                else:
                    await run.event(stage - 1, "F", i).wait()
                    shape = (len(run.xs[i]), *replicas[stage - 1].output_shape(i)[1:])
                    out = await replica.forward_async(run.acts[stage, i], micro_batch=i,
                                                      shape=shape)
                if last:
                    scale = len(run.xs[i]) / run.batch
                    run.losses[i] = await replica.loss_async(run.ys[i], micro_batch=i,
                                                             grad_scale=scale)
                else:
                    count = math.prod(replica.output_shape(i))
                    dst = await self._s.buffers.get(("act", stage + 1, i),
                                                  replicas[stage + 1].device, count)
                    await transfer(self._system, out, dst, count)
                    run.acts[stage + 1, i] = dst
            else:
                grad_out: GpuBuffer | None = None
                if not last:
                    await run.event(stage + 1, "B", i).wait()
                    grad_out = run.grads[stage, i]
                dx = await replica.backward_async(grad_out, micro_batch=i,
                                                  want_input_grad=stage > 0)
                if dx is not None:
                    count = math.prod(replicas[stage - 1].output_shape(i))
                    dst = await self._s.buffers.get(("grad", stage - 1, i),
                                                  replicas[stage - 1].device, count)
                    await transfer(self._system, dx, dst, count)
                    run.grads[stage - 1, i] = dst
            run.event(stage, kind, i).set()

    async def _predict(self, replicas: list[ModelReplica], x: Array) -> Array:
        current: Array | GpuBuffer = x
        shape: tuple[int, ...] | None = None
        for stage, replica in enumerate(replicas):
            out = await replica.forward_async(current, train=False, micro_batch=_PREDICT,
                                              shape=shape)
            shape = replica.output_shape(_PREDICT)
            count = math.prod(shape)
            if stage == len(replicas) - 1:
                result = await replica.device.copy_to_numpy_async(out, 0, count)
                return result.reshape(shape)
            dst = await self._s.buffers.get(("predict", stage + 1), replicas[stage + 1].device,
                                          count)
            await transfer(self._system, out, dst, count)
            current = dst
        raise AssertionError("a pipeline has at least one stage")

    async def post_stop(self) -> None:
        """Free the transfer buffers and the stages' parameters, gradients and state."""
        await self._s.buffers.close()
        await free_replicas(self._s.replicas)


class PipelineParallelTrainer(ModelParallelClient):
    """A ``Sequential`` cut into stages on several devices, trained with micro-batches.

    See the module for the schedule and how results match the unsplit model.
    ``step`` answers a ``StepResult``: a float (the mean loss of the global
    batch) that also unpacks as the original's ``(loss, grad_norm,
    step_micros)``. Every method has an ``_async`` twin.
    """

    _in_features = 1
    _out_features = 1
    _micro_batches = 1

    @classmethod
    def spawn(cls, system: Any, stages: Sequence[Sequential], devices: Sequence[Device],
              *, loss: Loss, optimizer: Optimizer, micro_batches: int = 1,
              schedule: str = "1f1b", seed: int = 0,
              parameters: Mapping[str, Any] | None = None,
              name: str | None = None) -> PipelineParallelTrainer:
        """Start a pipeline in the facade ``system``.

        ``spawn(system, stages, devices, *, loss, optimizer, micro_batches=1,
        schedule="1f1b", seed=0, parameters=None, name=None)``: ``stages`` is a
        list of ``Sequential`` (stage ``k`` on ``devices[k]``; a device may hold
        several stages), ``schedule`` ``"1f1b"`` or ``"gpipe"``, ``parameters``
        the full model's by name (default: initialised from ``seed``).

        Raises ``InvalidArgument`` for bad settings.
        """
        facade = require_system(system)
        if not isinstance(stages, Sequence) or not stages or not all(
                isinstance(s, Sequential) for s in stages):
            raise InvalidArgument(f"stages must be a non-empty list of Sequential, got "
                                  f"{stages!r}")
        placed = checked_devices(facade, devices, len(stages), "stages")
        require_count("micro_batches", micro_batches)
        return cls._launch(facade, stages, placed, loss, optimizer, micro_batches, None,
                           schedule, seed, parameters, name)

    @classmethod
    def _launch(cls, system: System, stages: Sequence[Sequential], devices: list[Device],
                loss: Loss, optimizer: Optimizer, micro_batches: int,
                micro_batch_size: int | None, kind: str, seed: int,
                parameters: Mapping[str, Any] | None, name: str | None,
                ) -> PipelineParallelTrainer:
        require_loss(loss)
        require_optimizer(optimizer)
        if kind not in SCHEDULES:
            raise InvalidArgument(f"schedule must be one of {SCHEDULES}, got {kind!r}")
        require_count("seed", seed, least=0)
        layers = [layer for stage in stages for layer in stage.layers]
        model = Sequential(*layers)
        in_features = model.in_features()
        if in_features is None:
            raise InvalidArgument("the first stage must start with a Linear or LayerNorm "
                                  "(the pipeline needs its input width)")
        out_features = model.features_out(in_features)  # every stage fits the next
        cuts, start = [], 0
        for stage in stages:
            cuts.append((start, start + len(stage)))
            start += len(stage)
        full = (None if parameters is None
                else checked_parameters(parameters, model.parameter_shapes(), DType.F32))
        props = Props(_PipelineActor, system, model, cuts, devices, loss, optimizer,
                      micro_batches, micro_batch_size, kind, seed, full, KeptState())
        client = cls._launch_actor(system, props, name, devices, loss)
        client._in_features = in_features
        client._out_features = out_features
        client._micro_batches = micro_batches
        return client

    def step_async(self, x: Any, y: Any = None, timeout_secs: float = STEP_TIMEOUT,
                   ) -> Coroutine[Any, Any, StepResult]:
        """One training step on the batch ``x`` (rows = samples) against ``y`` (targets
        shaped like the output for ``MSELoss``, integer labels for ``CrossEntropyLoss``);
        ``y=None`` trains the model to reproduce ``x`` (the original's ``step(microbatch)``:
        a flat list is a batch of one-feature rows). Answers the ``StepResult``."""
        data, target = checked_batch(x, y, self._in_features, self._classes)
        if len(data) < self._micro_batches:
            raise InvalidArgument(f"a batch of {len(data)} rows cannot make "
                                  f"{self._micro_batches} micro-batches")
        if target is None and self._out_features != self._in_features:
            raise InvalidArgument(f"y=None trains the model to reproduce x, which needs as "
                                  f"many outputs as inputs ({self._out_features} outputs, "
                                  f"{self._in_features} inputs)")
        timeout = require_timeout(timeout_secs)
        return self._call(TrainStep(data, target, timeout), timeout + ANSWER_MARGIN, "step")

    step = twin(step_async)

    def predict_async(self, x: Any, timeout_secs: float = STEP_TIMEOUT,
                      ) -> Coroutine[Any, Any, Array]:
        """The model's output for the batch ``x`` (evaluation mode), as a host array."""
        data, _ = checked_batch(x, None, self._in_features, False)
        timeout = require_timeout(timeout_secs)
        return self._call(_Predict(data, timeout), timeout + ANSWER_MARGIN, "predict")

    predict = twin(predict_async)
