"""What the model-parallel trainers share: argument checks (``InvalidArgument``), the
messages of a step and of a state download, time-outs and errors of their work inside
the actor, and the base of their actors and of their clients."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Self, TypeVar

import numpy as np

from atomr_accel.actor import Props
from atomr_accel.blueprint import BlueprintActor, BlueprintClient, require_timeout, twin
from atomr_accel.core._errors import AskTimeout, DTypeMismatch, GpuRuntimeError, InvalidArgument
from atomr_accel.facade import Device, System
from atomr_accel.facade._host_arrays import host_array
from atomr_accel.train._model import Array
from atomr_accel.train._optim import Loss, MSELoss, Optimizer
from atomr_accel.train._recovery import KeptState
from atomr_accel.train._step_result import StepResult

__all__ = ["ANSWER_MARGIN", "STEP_TIMEOUT", "ModelParallelActor", "ModelParallelClient",
           "StateDictRequest", "TrainStep", "checked_batch", "checked_devices", "deadline",
           "first_error", "require_count"]

M = TypeVar("M")
K = TypeVar("K", bound=KeptState)

STEP_TIMEOUT = 60.0
"""The default ``timeout_secs`` of a model-parallel trainer's calls (a step, a forward, a
backward, a prediction, a state download), seconds."""

ANSWER_MARGIN = 1.0
"""Seconds a client waits past a request's own time-out, so the trainer's typed
``AskTimeout`` (not the ask's) answers a request that ran too long."""


@dataclass
class TrainStep:
    """A training step on the batch ``x`` against ``y`` (None: reproduce ``x``)."""

    x: Array
    y: Array | None
    timeout: float


@dataclass(frozen=True)
class StateDictRequest:
    """A download of the whole model's state."""

    timeout: float


def require_count(name: str, value: object, least: int = 1) -> int:
    """``value`` as an int >= ``least``."""
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < least:
        raise InvalidArgument(f"{name} must be an int >= {least}, got {value!r}")
    return int(value)


def checked_devices(system: System, devices: object, count: int, what: str) -> list[Device]:
    """``devices`` as a list of ``count`` devices of ``system`` (one per ``what``)."""
    if not isinstance(devices, Sequence) or isinstance(devices, str):
        raise InvalidArgument(f"devices must be a list of Device, got {devices!r}")
    if len(devices) != count:
        raise InvalidArgument(f"devices must name one device per {what[:-1]}: {count} "
                              f"{what}, {len(devices)} devices")
    for device in devices:
        if not isinstance(device, Device) or all(d is not device for d in system.devices):
            raise InvalidArgument(f"devices must be Devices of this system, got {device!r}")
    return list(devices)


def checked_batch(x: Any, y: Any, in_features: int, labels: bool,
                  ) -> tuple[Array, Array | None]:
    """``x`` as a float32 batch (a 1-D ``x`` is rows of ``in_features``) and ``y``: integer
    labels (one a row) when ``labels``, else float32 targets (a 1-D ``y``: one row a
    sample); None stays None (the targets are then ``x``)."""
    try:
        data = host_array(x, "x").astype(np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"x must be a batch of numbers: {exc}") from exc
    if data.ndim == 1:
        if data.size == 0 or data.size % in_features:
            raise InvalidArgument(f"a flat x needs a non-zero multiple of {in_features} "
                                  f"numbers, got {data.size}")
        data = data.reshape(-1, in_features)
    if data.ndim < 2 or data.shape[0] == 0:
        raise InvalidArgument(f"x must be a non-empty batch (rows, features...), got shape "
                              f"{data.shape}")
    if not np.all(np.isfinite(data)):
        raise InvalidArgument("x holds a NaN or an infinity")
    if y is None:
        if labels:
            raise InvalidArgument("CrossEntropyLoss needs the labels y")
        return data, None
    target = host_array(y, "y")
    if labels:
        if target.dtype.kind not in "iu":
            raise DTypeMismatch(f"CrossEntropyLoss takes integer labels, got {target.dtype}")
        if target.shape != (len(data),):
            raise InvalidArgument(f"labels must have shape ({len(data)},), got {target.shape}")
        return data, target.astype(np.int32)
    if target.dtype.kind not in "fiu":
        raise DTypeMismatch(f"MSELoss takes numeric targets, got {target.dtype}")
    target = target.astype(np.float32)
    if target.ndim == 1:
        target = target.reshape(len(data), -1) if target.size % len(data) == 0 else target
    if target.ndim < 2 or target.shape[0] != len(data):
        raise InvalidArgument(f"y must have one row per row of x ({len(data)}), got shape "
                              f"{target.shape}")
    return data, target


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error to raise for a failed group of stage or shard tasks: the first typed
    device error (``GpuRuntimeError``) if any, else the first error."""
    leaves: list[BaseException] = []

    def walk(error: BaseException) -> None:
        if isinstance(error, BaseExceptionGroup):
            for inner in error.exceptions:
                walk(inner)
        else:
            leaves.append(error)

    walk(group)
    typed = [e for e in leaves if isinstance(e, GpuRuntimeError)]
    return (typed or leaves)[0]


@contextlib.asynccontextmanager
async def deadline(what: str, seconds: float) -> AsyncIterator[None]:
    """Bound the work inside to ``seconds``; past it the work is cancelled and ``AskTimeout``
    (a typed error, which leaves the trainer actor serving) is raised naming ``what``."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError as exc:
        raise AskTimeout(what, seconds) from exc


class ModelParallelActor(BlueprintActor, Generic[M, K]):
    """The actor base of the model-parallel trainers: what ``spawn`` gave (the model ``M``,
    the devices, loss, optimizer, seed and initial parameters), the state ``K`` its
    incarnations share (``KeptState``, its journal bound to this incarnation's ``_save``
    and ``_restore``) and the journaled training step (``_step``)."""

    def __init__(self, system: System, model: M, devices: list[Device], loss: Loss,
                 optimizer: Optimizer, seed: int, parameters: Mapping[str, Array] | None,
                 kept: K) -> None:
        super().__init__()
        self._system = system
        self._model = model
        self._devices = devices
        self._loss = loss
        self._optimizer = optimizer
        self._seed = seed
        self._parameters = parameters
        self._s = kept
        kept.bind(self._save, self._restore)

    async def _save(self) -> list[dict[str, Array]]:
        """Every replica's whole state, for the journal's checkpoint."""
        raise NotImplementedError

    async def _restore(self, states: list[dict[str, Array]]) -> None:
        """Rebuild what a lost context took and load ``states`` (``_save``'s) into it."""
        raise NotImplementedError

    async def _step(self, x: Array, y: Array | None) -> tuple[float, float]:
        """One training step; answers the loss and the gradient's norm."""
        raise NotImplementedError

    async def _train(self, step: TrainStep) -> StepResult:
        """Run ``step`` through the journal (recovering first where it must)."""
        started = time.perf_counter()
        (loss, norm), recovered = await self._s.journal.run(self._step, step.x, step.y)
        return StepResult(loss, norm, int((time.perf_counter() - started) * 1e6),
                          int(recovered))

    async def post_restart(self, exc: BaseException) -> None:
        """A new incarnation after a crash: it keeps the replicas (``KeptState``), and the
        next call recovers them from the checkpoint first (the crash may have left a step
        half-made)."""
        self._s.journal.dirty = self._s.journal.checkpoint is not None
        await super().post_restart(exc)

    async def pre_restart(self, exc: BaseException, message: Any) -> None:
        """Keep every buffer (and a world) for the next incarnation (the default would free
        them)."""


class ModelParallelClient(BlueprintClient):
    """The client base of the model-parallel trainers: the devices they run on, whether
    their loss takes class labels (``CrossEntropyLoss``), which the client's batch checks
    need, and the download of the whole model's state."""

    _devices: tuple[Device, ...] = ()
    _classes = False

    @classmethod
    def _launch_actor(cls, system: System, props: Props, name: str | None,
                      devices: Sequence[Device], loss: Loss) -> Self:
        """Spawn the trainer's actor from ``props`` and keep its devices and loss kind."""
        client = cls._start(system, props, name)
        client._devices = tuple(devices)
        client._classes = not isinstance(loss, MSELoss)
        return client

    @property
    def devices(self) -> tuple[Device, ...]:
        """The trainer's devices: a pipeline's one a stage in stage order, a
        tensor-parallel trainer's one a shard in rank order."""
        return self._devices

    def state_dict_async(self, timeout_secs: float = STEP_TIMEOUT,
                         ) -> Coroutine[Any, Any, dict[str, Array]]:
        """The whole model's parameters and optimizer state, gathered from every stage or
        shard, under the model's own names (as ``ModelReplica.state_dict``; one
        ``"optimizer.step"``)."""
        timeout = require_timeout(timeout_secs)
        return self._call(StateDictRequest(timeout), timeout + ANSWER_MARGIN, "state_dict")

    state_dict = twin(state_dict_async)
