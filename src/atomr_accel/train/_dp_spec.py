"""A data-parallel trainer's settings, checked before anything starts, and what follows
from them: the model (the original form's default one included), replicas, metrics."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import is_int
from atomr_accel.facade import Device
from atomr_accel.train._dp_replica import Replica
from atomr_accel.train._model import Array, Linear, Sequential, train_dtype
from atomr_accel.train._optim import (
    SGD,
    CrossEntropyLoss,
    Loss,
    MSELoss,
    Optimizer,
    require_loss,
    require_optimizer,
)
from atomr_accel.train._torch_module import TorchModule

__all__ = ["Model", "TrainerSpec", "default_model", "original_spec"]

Model = Sequential | TorchModule
"""What a data-parallel trainer trains: a model description or a wrapped torch module."""
ISOLATIONS = ("thread", "process")


def default_model(features: int) -> Sequential:
    """The original form's model: one ``Linear(features, 1)`` (trained by ``MSELoss``
    toward each row's sum, so it learns ``w = 1, b = 0``)."""
    return Sequential(Linear(features, 1))


@dataclass(frozen=True, slots=True)
class TrainerSpec:
    """Everything a ``DataParallelTrainer`` was spawned with (see its ``spawn``).

    ``model`` None is the original form: a ``default_model`` as wide as the
    first batch's rows, trained by ``MSELoss`` toward each row's sum
    (``default_targets``) with ``SGD(lr)``.
    """

    model: Model | None
    loss: Loss
    optimizer: Optimizer
    devices: tuple[Device, ...] | None
    n_replicas: int
    mock: bool | None
    isolation: str
    standby: int
    seed: int
    dtype: str
    micro_batch: int | None
    checkpoint_every: int
    max_retries: int
    collective_timeout: float

    @classmethod
    def checked(cls, model: object, loss: object, optimizer: object, devices: object,
                n_replicas: object, mock: object, isolation: object, standby: object,
                seed: object, dtype: object, micro_batch: object, checkpoint_every: object,
                max_retries: object, collective_timeout: object) -> TrainerSpec:
        """The settings, every one checked (``InvalidArgument`` for a bad one)."""
        if model is not None and not isinstance(model, Sequential | TorchModule):
            raise InvalidArgument(f"model must be a Sequential or a TorchModule, got "
                                  f"{type(model).__name__}")
        loss = require_loss(loss)
        optimizer = require_optimizer(optimizer)
        device_tuple = _devices(devices)
        count = _int("n_replicas", n_replicas, 1)
        if device_tuple is not None:
            count = len(device_tuple)
        if mock is not None and not isinstance(mock, bool):
            raise InvalidArgument(f"mock must be a bool or None, got {mock!r}")
        if isolation not in ISOLATIONS:
            raise InvalidArgument(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
        micro = None if micro_batch is None else _int("micro_batch", micro_batch, 1)
        every = _int("checkpoint_every", checkpoint_every, 0) if checkpoint_every is not None \
            else (50 if count == 1 else 0)
        if (not isinstance(collective_timeout, int | float) or isinstance(collective_timeout, bool)
                or not math.isfinite(collective_timeout) or collective_timeout <= 0):
            raise InvalidArgument(f"collective_timeout must be a positive number of seconds, "
                                  f"got {collective_timeout!r}")
        return cls(model, loss, optimizer, device_tuple, count, mock, str(isolation),
                   _int("standby", standby, 0), _int("seed", seed, 0),
                   train_dtype(dtype).value, micro, every, _int("max_retries", max_retries, 0),
                   float(collective_timeout))

    @property
    def isolation_mode(self) -> Literal["thread", "process"]:
        """``isolation`` as ``spawn_device`` types it."""
        return "process" if self.isolation == "process" else "thread"

    @property
    def default_targets(self) -> bool:
        """Whether ``step(batch)`` without targets trains toward each row's sum."""
        return self.model is None

    @property
    def classification(self) -> bool:
        """Whether the targets are integer class labels (``CrossEntropyLoss``)."""
        return isinstance(self.loss, CrossEntropyLoss)

    def model_for(self, features: int | None) -> Model:
        """The model to instantiate (the default one needs the first batch's width)."""
        if self.model is not None:
            return self.model
        if features is None:
            raise InvalidArgument("the default model takes its width from the first batch")
        return default_model(features)

    @staticmethod
    def features_of(model: Model) -> int | None:
        """The row width the model takes (None when it does not fix one)."""
        return model.in_features()

    async def create_replica(self, device: Device, model: Model, index: int) -> Replica:
        """A fresh replica ``index`` of ``model`` on ``device``: the same initial state on
        every device (parameters drawn from ``seed``, or the torch module's own), and for
        a ``Sequential`` its own Dropout stream (``seed + index``)."""
        if isinstance(model, TorchModule):
            from atomr_accel.train._torch_replica import TorchReplica

            return await TorchReplica.create_async(device, model, loss=self.loss,
                                                   optimizer=self.optimizer)
        from atomr_accel.train._replica import ModelReplica

        replica: Replica = await ModelReplica.create_async(
            device, model, loss=self.loss, optimizer=self.optimizer,
            parameters=model.init_parameters(self.seed, self.dtype), seed=self.seed + index,
            dtype=self.dtype)
        return replica

    def metrics(self, outputs: Array, targets: Array) -> dict[str, float]:
        """``loss`` (this trainer's loss, computed on the host in float64), ``samples``,
        and for ``CrossEntropyLoss`` ``accuracy`` (the share of rows whose largest
        output is the label)."""
        out = np.asarray(outputs, dtype=np.float64).reshape(len(targets), -1)
        if isinstance(self.loss, CrossEntropyLoss):
            labels = np.asarray(targets).astype(np.int64).reshape(-1)
            classes = out.shape[1]
            if labels.min() < 0 or labels.max() >= classes:
                raise InvalidArgument(f"labels must be in [0, {classes}), got "
                                      f"{labels.min()}..{labels.max()}")
            shifted = out - out.max(axis=1, keepdims=True)
            log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
            smooth = self.loss.label_smoothing
            nll = -log_p[np.arange(len(labels)), labels]
            loss = (1.0 - smooth) * nll - smooth * log_p.mean(axis=1)
            accuracy = float(np.mean(out.argmax(axis=1) == labels))
            return {"loss": float(loss.mean()), "accuracy": accuracy,
                    "samples": float(len(labels))}
        assert isinstance(self.loss, MSELoss)
        wanted = np.asarray(targets, dtype=np.float64).reshape(out.shape)
        return {"loss": float(np.mean((out - wanted) ** 2)), "samples": float(len(out))}


def original_spec(n_replicas: object, batch_size_per_device: object, lr: object,
                  ) -> TrainerSpec:
    """The original form's settings: ``n_replicas`` CPU-or-GPU devices spawned by the
    trainer, the default model, ``SGD(lr)``, each replica's share in micro-batches of
    ``batch_size_per_device`` rows."""
    if not isinstance(lr, int | float) or isinstance(lr, bool) or not lr > 0:
        raise InvalidArgument(f"lr must be a positive number, got {lr!r}")
    return TrainerSpec.checked(None, MSELoss(), SGD(float(lr)), None, n_replicas, None,
                               "thread", 0, 0, "f32", batch_size_per_device, None, 2, 60.0)


def _int(name: str, value: object, least: int) -> int:
    if not is_int(value) or int(value) < least:
        raise InvalidArgument(f"{name} must be an int >= {least}, got {value!r}")
    return int(value)


def _devices(devices: object) -> tuple[Device, ...] | None:
    if devices is None:
        return None
    if not isinstance(devices, Sequence) or isinstance(devices, str | bytes):
        raise InvalidArgument(f"devices must be a list of Devices or None, got "
                              f"{type(devices).__name__}")
    if not devices:
        raise InvalidArgument("devices must hold at least one Device")
    for index, device in enumerate(devices):
        if not isinstance(device, Device):
            raise InvalidArgument(f"devices[{index}] must be a Device (system.spawn_device), "
                                  f"got {type(device).__name__}")
    if len({id(d) for d in devices}) != len(devices):
        raise InvalidArgument("devices must be distinct devices (one replica each)")
    return tuple(devices)
