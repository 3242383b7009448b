"""The original package's forms of the trainers' ``spawn``: their demo models and settings.

* ``DataParallelTrainer.spawn(system, n_replicas=2, batch_size_per_device=4,
  lr=0.01, name=None)`` trains ``default_model`` (one ``Linear(width, 1)``) by
  ``MSELoss`` toward each row's sum with ``SGD(lr)``; ``step(batch,
  timeout_secs)`` then takes the rows alone.
* ``PipelineParallelTrainer.spawn(system, n_stages=2, micro_batch_size=4,
  lr=0.01, name=None)`` trains ``default_pipeline_model(n_stages)`` to
  reproduce its scalar inputs, 1F1B, stage ``k`` on the system's device ``k``.
* ``TensorParallelTrainer.spawn(system, n_shards=2, lr=0.01, name=None)``
  trains ``default_tensor_parallel_model`` (its width fixed by the first
  batch) to reproduce its input, on the system's first ``n_shards`` devices.

Devices the system lacks are started as CPU devices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from atomr_accel.blueprint import require_system
from atomr_accel.facade import Device, System
from atomr_accel.original._forms import attach_spawn, is_models
from atomr_accel.train._data_parallel import DataParallelTrainer
from atomr_accel.train._dp_spec import original_spec
from atomr_accel.train._model import GELU, Linear, Sequential, Tanh
from atomr_accel.train._optim import SGD, MSELoss
from atomr_accel.train._pipeline import PipelineParallelTrainer
from atomr_accel.train._tensor_parallel import TensorParallelTrainer
from atomr_accel.train._torch_module import TorchModule
from atomr_accel.train._trainer_args import require_count

__all__ = ["DEFAULT_HIDDEN", "default_pipeline_model", "default_tensor_parallel_model",
           "spawn_data_parallel", "spawn_pipeline", "spawn_tensor_parallel"]

DEFAULT_HIDDEN = 16
"""The width of the pipeline's default model."""


def default_pipeline_model(n_stages: int, hidden: int = DEFAULT_HIDDEN) -> list[Sequential]:
    """The original form's model, one stage a device: ``Linear(1, h), Tanh`` on the first
    stage, ``Linear(h, h), Tanh`` on each next one, and ``Linear(h, 1)`` closing the last;
    it learns to reproduce its scalar inputs (MSE against the input)."""
    layers: list[list[Any]] = [[Linear(1 if k == 0 else hidden, hidden), Tanh()]
                               for k in range(n_stages)]
    layers[-1].append(Linear(hidden, 1))
    return [Sequential(*stage) for stage in layers]


def default_tensor_parallel_model(features: int) -> Sequential:
    """The original form's model for inputs of ``features`` numbers: a transformer-style
    MLP block ``Linear(d, 4d), GELU, Linear(4d, d)`` (one sharded segment), trained to
    reproduce its input (MSE against the input)."""
    return Sequential(Linear(features, 4 * features), GELU(), Linear(4 * features, features))


def _devices(system: System, count: int, *, cycle: bool) -> list[Device]:
    """``count`` devices: the system's in order, cycled (``cycle``: one CPU device is
    started first when it has none) or topped up with CPU devices."""
    devices = list(system.devices)
    if cycle:
        devices = devices or [system.spawn_device(mock=True)]
        return [devices[k % len(devices)] for k in range(count)]
    devices = devices[:count]
    while len(devices) < count:
        devices.append(system.spawn_device(mock=True))
    return devices


def spawn_data_parallel(spawn: Callable[..., DataParallelTrainer], system: Any,
                        n_replicas: int = 2, batch_size_per_device: int = 4, lr: float = 0.01,
                        name: str | None = None) -> DataParallelTrainer:
    """``n_replicas`` devices spawned by the trainer, the default model, ``SGD(lr)``, each
    replica's share in micro-batches of ``batch_size_per_device`` rows."""
    checked = require_system(system)
    spec = original_spec(n_replicas, batch_size_per_device, lr)
    return DataParallelTrainer._launch(checked, spec, name, original=True)


def spawn_pipeline(spawn: Callable[..., PipelineParallelTrainer], system: Any,
                   n_stages: int = 2, micro_batch_size: int = 4, lr: float = 0.01,
                   name: str | None = None) -> PipelineParallelTrainer:
    """``default_pipeline_model(n_stages)`` with ``MSELoss`` and ``SGD(lr)``, micro-batches
    of ``micro_batch_size`` rows, 1F1B; ``step(microbatch)`` takes a list of numbers."""
    facade = require_system(system)
    require_count("n_stages", n_stages)
    require_count("micro_batch_size", micro_batch_size)
    optimizer = SGD(lr)
    devices = _devices(facade, n_stages, cycle=True)
    return PipelineParallelTrainer._launch(facade, default_pipeline_model(n_stages), devices,
                                           MSELoss(), optimizer, 1, micro_batch_size, "1f1b",
                                           0, None, name)


def spawn_tensor_parallel(spawn: Callable[..., TensorParallelTrainer], system: Any,
                          n_shards: int = 2, lr: float = 0.01,
                          name: str | None = None) -> TensorParallelTrainer:
    """The default model, its width fixed by the first ``forward``'s input, with
    ``MSELoss`` against the input and ``SGD(lr)``."""
    facade = require_system(system)
    require_count("n_shards", n_shards)
    devices = _devices(facade, n_shards, cycle=False)
    return TensorParallelTrainer._launch(facade, default_tensor_parallel_model, devices,
                                         MSELoss(), SGD(lr), 0, None, name)


attach_spawn(DataParallelTrainer, spawn_data_parallel, "model",
             lambda value: isinstance(value, Sequential | TorchModule))
attach_spawn(PipelineParallelTrainer, spawn_pipeline, "stages", is_models)
attach_spawn(TensorParallelTrainer, spawn_tensor_parallel, "model",
             lambda value: isinstance(value, Sequential))
