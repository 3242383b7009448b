"""Training on our ops: models, losses, optimizers, and the replicas trainers are built of.

``Sequential`` of ``Linear``, ``ReLU``, ``GELU``, ``Tanh``, ``Sigmoid``,
``Dropout``, ``LayerNorm`` and ``Flatten`` describes a model (plain and
picklable, torch's parameter names and initialisation); ``ModelReplica``
instantiates it on one device with a loss (``MSELoss``,
``CrossEntropyLoss``) and an optimizer (``SGD``, ``Adam``, ``AdamW``, with an
optional ``WarmupCosine`` schedule), and runs forward, backward and the fused
optimizer update as device ops of the ``train`` library (NumPy on the CPU
backend, CuPy kernels on CUDA). See ``docs/train.md``.

The trainers are supervised actors built of replicas: ``DataParallelTrainer``
(a replica per device, gradients all-reduced per bucket; ``TorchModule`` puts
a ``torch.nn.Module`` in it), ``PipelineParallelTrainer`` (stages on devices,
1F1B or GPipe micro-batches), ``TensorParallelTrainer`` (Megatron-style split
``Linear`` pairs) and ``AsyncParameterServer`` with ``ParameterServerWorker``
actors (a stated staleness rule). Each rebuilds what a lost context took and
goes on; see ``docs/train-data-parallel.md`` and ``docs/train-parallel.md``.
"""

from __future__ import annotations

from atomr_accel.train._data_parallel import DataParallelTrainer
from atomr_accel.train._dp_ledger import ReplicaRecovered, TrainerStats
from atomr_accel.train._model import (
    GELU,
    Dropout,
    Flatten,
    Layer,
    LayerNorm,
    Linear,
    ReLU,
    Sequential,
    Sigmoid,
    Tanh,
)
from atomr_accel.train._optim import (
    SGD,
    Adam,
    AdamW,
    CrossEntropyLoss,
    MSELoss,
    WarmupCosine,
)
from atomr_accel.train._replica import ModelReplica, ParamInfo
from atomr_accel.train._step_result import StepResult
from atomr_accel.train._torch_module import TorchModule

__all__ = [
    "GELU",
    "SGD",
    "Adam",
    "AdamW",
    "CrossEntropyLoss",
    "DataParallelTrainer",
    "Dropout",
    "Flatten",
    "Layer",
    "LayerNorm",
    "Linear",
    "MSELoss",
    "ModelReplica",
    "ParamInfo",
    "ReLU",
    "ReplicaRecovered",
    "Sequential",
    "Sigmoid",
    "StepResult",
    "Tanh",
    "TorchModule",
    "TrainerStats",
    "WarmupCosine",
]

# part C: model parallelism and the parameter server (docs/train-parallel.md)
from atomr_accel.train._parameter_server import (
    AsyncParameterServer,
    ParameterServerCounters,
    ParameterServerStats,
)
from atomr_accel.train._pipeline import PipelineParallelTrainer
from atomr_accel.train._ps_worker import (
    ParameterServerWorker,
    WorkerReport,
    flatten_parameters,
    unflatten_parameters,
)
from atomr_accel.train._staleness import StaleGradient
from atomr_accel.train._tensor_parallel import TensorParallelTrainer

__all__ += [
    "AsyncParameterServer",
    "ParameterServerCounters",
    "ParameterServerStats",
    "ParameterServerWorker",
    "PipelineParallelTrainer",
    "StaleGradient",
    "TensorParallelTrainer",
    "WorkerReport",
    "flatten_parameters",
    "unflatten_parameters",
]

# The original package's forms of the trainers' spawn, attached to them there.
import atomr_accel.original._train  # noqa: E402, F401
