"""``DataParallelTrainer``: one model replica per device, each global batch split across
them, gradients all-reduced in buckets while backward runs, one optimizer step on every
replica, and a replica whose context dies mid-step rebuilt and the step run again."""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import numpy as np

from atomr_accel.actor import Props
from atomr_accel.blueprint import BlueprintClient, require_system, require_timeout, twin
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._files import read_npz
from atomr_accel.facade import Device, System
from atomr_accel.train._dp_actor import (
    DataParallelActor,
    Evaluate,
    LoadState,
    Predict,
    Ready,
    ReplicaStates,
    StateDict,
    Stats,
    Step,
)
from atomr_accel.train._dp_ledger import Ledger, TrainerStats
from atomr_accel.train._dp_spec import Model, TrainerSpec
from atomr_accel.train._dp_split import batch_arrays, rows_array
from atomr_accel.train._model import Array
from atomr_accel.train._optim import Loss, Optimizer
from atomr_accel.train._step_result import StepResult

__all__ = ["DataParallelTrainer"]

T = TypeVar("T")
STEP_TIMEOUT = 10.0
"""The default ``timeout_secs`` of ``step``, ``predict`` and ``evaluate`` (the original's)."""
READY_TIMEOUT = 120.0
"""The default ``timeout_secs`` of ``ready`` (spawning devices, a world, the replicas)."""


class DataParallelTrainer(BlueprintClient):
    """Data-parallel training of one model over several devices, in a supervised actor.

    **Own form**: ``spawn(system, model, *, loss, optimizer, devices=None,
    n_replicas=2, seed=0, name=None, ...)``. ``model`` is a ``Sequential`` (run
    on our ops by a ``ModelReplica`` a device) or a ``TorchModule``. The
    replicas start from identical parameters (drawn from ``seed``, or the torch
    module's). ``step(x, y)`` splits the global batch across the replicas
    (contiguous shares, as even as possible; uneven is fine: each replica's
    gradient is weighted by its share of the rows, so the result is one
    device's on the whole batch), all-reduces the gradients bucket by bucket
    through ``system.nccl_world(devices)`` (NCCL on CUDA devices, the CPU
    collective otherwise) while backward still fills later buckets, and applies
    the same optimizer step on every replica. It answers a ``StepResult``: the
    mean loss as a float, which also unpacks as ``(loss, grad_norm,
    step_micros)``.

    **The original's form**: ``spawn(system, n_replicas=2,
    batch_size_per_device=4, lr=0.01, name=None)``, then ``step(batch,
    timeout_secs=10.0) -> (loss, grad_norm, step_micros)`` with ``batch`` a list
    of rows. It trains for real, a documented default model: ``Sequential(
    Linear(width, 1))`` (width: the first batch's rows), ``MSELoss`` toward each
    row's sum, ``SGD(lr)``, each replica's share run in micro-batches of
    ``batch_size_per_device`` rows with gradient accumulation (so the loss is
    an MSE, not the original's echo of row sums).

    **Failures**: when a replica's context is poisoned or its process-host
    worker dies mid-step, the trainer waits for the device's rebuilt context,
    rebuilds that replica, copies parameters, optimizer state and step count
    from a healthy replica (with none left, the last host checkpoint, taken
    every ``checkpoint_every`` steps, then replays the batches since), and runs
    the step again (at most ``max_retries`` times): the caller gets the
    correct loss or a typed error, never a replica that silently diverged.
    Each rebuilt replica counts in ``stats().recoveries`` and publishes a
    ``ReplicaRecovered`` on the system's event stream.

    Every method has an ``_async`` twin, checks its arguments when called
    (``InvalidArgument``, ``DTypeMismatch``) and takes ``timeout_secs``; a
    time-out (``AskTimeout``) does not cancel a step the actor has begun.
    """

    _original = False

    @classmethod
    def spawn(cls, system: System, model: Model, *, loss: Loss, optimizer: Optimizer,
              devices: Sequence[Device] | None = None, n_replicas: int = 2, seed: int = 0,
              name: str | None = None, mock: bool | None = None, isolation: str = "thread",
              standby: int = 0, dtype: str = "f32", micro_batch: int | None = None,
              checkpoint_every: int | None = None, max_retries: int = 2,
              collective_timeout: float = 60.0) -> DataParallelTrainer:
        """Start a trainer in the facade ``system`` (class doc).

        The settings beyond the model: ``loss`` (``MSELoss`` or
        ``CrossEntropyLoss``), ``optimizer`` (``SGD``, ``Adam``, ``AdamW``);
        ``devices`` the devices, one replica each (None: ``n_replicas``
        devices ``0 .. n-1`` spawned here with ``mock``, ``isolation`` and
        ``standby``, as ``spawn_device`` takes them; ``mock=None``: GPUs where the
        machine has one for each replica, else CPU devices); ``seed`` and ``dtype``
        (``"f32"``, ``"f64"``) of the parameters; ``micro_batch`` (rows a
        replica runs at once, accumulating; None: its whole share);
        ``checkpoint_every`` (steps between host checkpoints; None: 50 for one
        replica, 0 (none) for several, where a healthy replica is the source);
        ``max_retries`` (runs of a step again after a recovery);
        ``collective_timeout`` (seconds, each all-reduce). The devices, world
        and replicas are built in the actor; ``ready()`` waits for them.
        """
        require_system(system)
        if model is None:
            raise InvalidArgument("model must be a Sequential or a TorchModule, got None")
        spec = TrainerSpec.checked(model, loss, optimizer, devices, n_replicas, mock,
                                   isolation, standby, seed, dtype, micro_batch,
                                   checkpoint_every, max_retries, collective_timeout)
        return cls._launch(system, spec, name, original=False)

    @classmethod
    def _launch(cls, system: System, spec: TrainerSpec, name: str | None, *,
                original: bool) -> DataParallelTrainer:
        ledger = Ledger(spec.checkpoint_every or 0)
        client = cls._start(system, Props(DataParallelActor, system, spec, ledger), name)
        client._original = original
        client._spec = spec
        client.ref.tell(Ready())  # start building at once; the first call waits for it
        return client

    _spec: TrainerSpec

    # ------------------------------------------------------------------ calls

    def ready_async(self, timeout_secs: float = READY_TIMEOUT) -> Coroutine[Any, Any, None]:
        """Return once the devices, the world and the replicas are up (the original
        form's replicas wait for the first batch's width)."""
        return self._call(Ready(), require_timeout(timeout_secs), "ready")

    ready = twin(ready_async)

    def step_async(self, x: Any, y: Any = None, timeout_secs: float = STEP_TIMEOUT,
                   ) -> Coroutine[Any, Any, StepResult]:
        """Train one step on the global batch ``x`` (rows) and targets ``y`` (class labels
        for ``CrossEntropyLoss``, values for ``MSELoss``); answer its ``StepResult``.

        In the original form ``y`` is left out (each row's sum is its target),
        and a number in its place is taken as ``timeout_secs`` (the original's
        ``step(batch, ts)``).
        """
        if self._original and _is_number(y):
            timeout_secs, y = float(y), None
        if y is None and not self._original:
            raise InvalidArgument("step(x, y) needs the targets y")
        timeout = require_timeout(timeout_secs)
        # NaN and infinities are found on the devices, from the loss and the gradient
        # norm, before anything is applied: a pass over a large batch here cost more.
        if y is None:
            return self._call(Step(rows_array(x, finite=False), None), timeout, "step")
        xs, ys = batch_arrays(x, y, self._spec.classification, finite=False)
        return self._call(Step(xs, ys), timeout, "step")

    step = twin(step_async)

    def predict_async(self, x: Any, timeout_secs: float = STEP_TIMEOUT,
                      ) -> Coroutine[Any, Any, Array]:
        """The model's outputs on ``x`` (evaluation mode: no dropout), rows split across
        the replicas."""
        return self._call(Predict(rows_array(x)), require_timeout(timeout_secs), "predict")

    predict = twin(predict_async)

    def evaluate_async(self, x: Any, y: Any, timeout_secs: float = STEP_TIMEOUT,
                       ) -> Coroutine[Any, Any, dict[str, float]]:
        """``{"loss", "samples"}`` on ``(x, y)``, plus ``"accuracy"`` for
        ``CrossEntropyLoss`` (loss computed on the host in float64 from the outputs)."""
        xs, ys = batch_arrays(x, y, self._spec.classification)
        return self._call(Evaluate(xs, ys), require_timeout(timeout_secs), "evaluate")

    evaluate = twin(evaluate_async)

    def state_dict_async(self, timeout_secs: float = STEP_TIMEOUT,
                         ) -> Coroutine[Any, Any, dict[str, Array]]:
        """The whole state (parameters, optimizer state, step) as NumPy arrays by name;
        every replica holds the same."""
        return self._call(StateDict(), require_timeout(timeout_secs), "state_dict")

    state_dict = twin(state_dict_async)

    def replica_states_async(self, timeout_secs: float = STEP_TIMEOUT,
                             ) -> Coroutine[Any, Any, list[dict[str, Array]]]:
        """Every replica's whole state, in replica order (they are equal after every
        step: this is how to check it)."""
        return self._call(ReplicaStates(), require_timeout(timeout_secs), "replica_states")

    replica_states = twin(replica_states_async)

    def load_state_dict_async(self, state: dict[str, Array],
                              timeout_secs: float = STEP_TIMEOUT) -> Coroutine[Any, Any, None]:
        """Load ``state`` (as ``state_dict`` answers it) into every replica."""
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise InvalidArgument(f"state must be a dict of arrays by name, got "
                                  f"{type(state).__name__}")
        arrays = {k: np.asarray(v) for k, v in state.items()}
        return self._call(LoadState(arrays), require_timeout(timeout_secs), "load_state_dict")

    load_state_dict = twin(load_state_dict_async)

    async def save_async(self, path: str | os.PathLike[str],
                         timeout_secs: float = STEP_TIMEOUT) -> None:
        """Write the state to ``path`` (an ``.npz`` archive, the name as given)."""
        target = _path(path)
        state = await self.state_dict_async(timeout_secs)
        await self._on_loop(asyncio.to_thread(_write, target, state))

    save = twin(save_async)

    async def load_async(self, path: str | os.PathLike[str],
                         timeout_secs: float = STEP_TIMEOUT) -> None:
        """Load a state written by ``save`` into every replica."""
        state = await self._on_loop(asyncio.to_thread(read_npz, _path(path), "a saved state"))
        await self.load_state_dict_async(state, timeout_secs)

    load = twin(load_async)

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the system's loop (file work in its executor, whether the
        caller blocks or awaits)."""
        portal = self._portal
        assert portal is not None  # spawned in a facade System
        return await portal.acall(coro)

    def stats_async(self, timeout_secs: float = 2.0) -> Coroutine[Any, Any, TrainerStats]:
        """A ``TrainerStats`` snapshot (steps, samples, recoveries, ...)."""
        return self._call(Stats(), require_timeout(timeout_secs), "stats")

    stats = twin(stats_async)

    def __repr__(self) -> str:
        return f"DataParallelTrainer({self.path}, replicas={self._spec.n_replicas})"


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value)


def _write(target: str, state: dict[str, Array]) -> None:
    try:
        with open(target, "wb") as file:
            np.savez(file, **state)  # type: ignore[arg-type]
    except OSError as exc:
        raise InvalidArgument(f"cannot write {target}: {exc}") from exc


def _path(path: object) -> str:
    if not isinstance(path, str | os.PathLike):
        raise InvalidArgument(f"path must be a str or a PathLike, got {type(path).__name__}")
    return os.fspath(path)
