"""The original package's form of ``DataParallelTrainer.spawn``: its demo model and settings.

``spawn(system, n_replicas=2, batch_size_per_device=4, lr=0.01, name=None)``
trains ``default_model`` (one ``Linear(width, 1)``) by ``MSELoss`` toward each
row's sum with ``SGD(lr)``; ``step(batch, timeout_secs)`` then takes the rows
alone (see ``DataParallelTrainer``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from atomr_accel.blueprint import require_system
from atomr_accel.original._forms import attach_spawn
from atomr_accel.train._data_parallel import DataParallelTrainer
from atomr_accel.train._dp_spec import original_spec
from atomr_accel.train._model import Sequential
from atomr_accel.train._torch_module import TorchModule

__all__ = ["spawn_data_parallel"]


def spawn_data_parallel(spawn: Callable[..., DataParallelTrainer], system: Any,
                        n_replicas: int = 2, batch_size_per_device: int = 4, lr: float = 0.01,
                        name: str | None = None) -> DataParallelTrainer:
    """``n_replicas`` devices spawned by the trainer, the default model, ``SGD(lr)``, each
    replica's share in micro-batches of ``batch_size_per_device`` rows."""
    checked = require_system(system)
    spec = original_spec(n_replicas, batch_size_per_device, lr)
    return DataParallelTrainer._launch(checked, spec, name, original=True)


attach_spawn(DataParallelTrainer, spawn_data_parallel, "model",
             lambda value: isinstance(value, Sequential | TorchModule))
