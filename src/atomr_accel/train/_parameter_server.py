"""AsyncParameterServer: one flat weight vector on a device, updated by pushed gradients.

Workers pull the weights (and the version they were at), compute a gradient
against them on their own schedule and push it back with that version; the
server applies it with its optimizer on the device and bumps the version.
Bounded staleness: see ``_staleness`` for the rule (``s = version -
worker_version``; applied at weight ``1/(1+s)`` while ``s <= max_staleness``,
rejected with ``StaleGradient`` beyond).

The weights live in a float32 device buffer, and so does the optimizer's
state; an update is device ops only: the gradient is uploaded into a device
buffer, then ``"sgd"`` is one BLAS axpy (``w += -(lr/(1+s)) g``) and
``"adamw"`` one fused optimizer-update op (bias-corrected Adam with decoupled
weight decay, ``weight_decay=0.0`` as the original's). A poisoned context is
survived: the state is rebuilt from a host snapshot and journal (``_ps_update``)
and the interrupted push or pull redone, nothing lost. Pushes and pulls are
messages to one actor, handled one at a time, so concurrent pushes from any
number of threads or tasks are applied one after another and none is lost.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from atomr_accel.actor import Props
from atomr_accel.blueprint import (
    BlueprintClient,
    TurnActor,
    Turns,
    require_system,
    require_timeout,
    twin,
)
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.facade import Device, System
from atomr_accel.train._ps_update import WeightStore
from atomr_accel.train._staleness import StaleGradient, StalenessCounters, staleness_weight

__all__ = ["AsyncParameterServer", "ParameterServerCounters", "ParameterServerStats"]

PUSH_TIMEOUT = 10.0
"""The default ``timeout_secs`` of ``push_gradient`` and ``pull_weights`` (the original's)."""

STATS_TIMEOUT = 2.0
"""The default ``timeout_secs`` of ``stats`` (the original's)."""


class ParameterServerStats(NamedTuple):
    """``stats()``: the original's four numbers, in its order."""

    version: int
    """Applied gradients so far (the version pushes are measured against)."""
    gradients_applied: int
    """Gradients applied (full or down-weighted)."""
    weights_pulled: int
    """``pull_weights`` calls answered."""
    avg_staleness: float
    """Mean staleness of the last 128 applied gradients (0.0 before the first)."""


@dataclass(frozen=True)
class ParameterServerCounters:
    """``counters()``: everything the server counts, rejections included."""

    version: int
    gradients_applied: int
    gradients_rejected: int
    """Pushes refused with ``StaleGradient``."""
    gradients_downweighted: int
    """Applied pushes with staleness > 0 (weighted ``1/(1+s)``)."""
    weights_pulled: int
    avg_staleness: float
    rebuilds: int = 0
    """Times the device state was rebuilt after a context rebuild (nothing lost)."""


@dataclass(frozen=True, slots=True)
class _Push:
    worker_id: int
    worker_version: int
    gradient: np.ndarray[Any, Any]


@dataclass(frozen=True, slots=True)
class _Pull:
    worker_id: int


@dataclass(frozen=True, slots=True)
class _Stats:
    pass


@dataclass(frozen=True, slots=True)
class _Device:
    pass


@dataclass
class _Kept:
    """The server's state, shared by its actor's incarnations (a restart keeps it)."""

    counters: StalenessCounters = field(default_factory=StalenessCounters)
    store: WeightStore | None = None


class _ServerActor(TurnActor):
    """Holds the weights and optimizer state on its device; answers pushes and pulls (a
    blocking one on the caller's turn once the store is on its device: ``TurnActor``)."""

    def __init__(self, turns: Turns[_ServerActor], system: System, device: Device | None,
                 initial: np.ndarray[Any, Any], optimizer: str, lr: float, max_staleness: int,
                 kept: _Kept) -> None:
        super().__init__(turns)
        self._system = system
        self._device = device
        self._initial = initial
        self._optimizer = optimizer
        self._lr = lr
        self._max_staleness = max_staleness
        self._kept = kept

    async def _ready(self) -> WeightStore:
        """The store on its device (placed at the first request if spawn named none)."""
        if self._kept.store is None:
            device = self._device
            if device is None:
                system = self._system
                device = (await system.place_async(self._initial.nbytes * 4)
                          if system.devices else await system.spawn_device_async(mock=True))
            self._kept.store = WeightStore(device, self._optimizer, self._lr, self._initial)
            self.publish_turns()
        return self._kept.store

    async def pre_start(self) -> None:
        """Take turns with blocking callers once the store is on its device (a restarted
        server keeps it; a new one places it at its first request)."""
        if self._kept.store is not None:
            self.publish_turns()

    async def pre_restart(self, exc: BaseException, message: Any) -> None:
        """Keep the device state for the next incarnation (the default would free it)."""

    async def handle(self, message: Any) -> Any:
        """Answer a push, a pull, a stats request or the device question."""
        store = await self._ready()
        counters = self._kept.counters
        if type(message) is _Push:
            try:
                staleness, weight = staleness_weight(counters.version, message.worker_version,
                                                     self._max_staleness)
            except StaleGradient:
                counters.gradients_rejected += 1
                raise
            await store.apply(message.gradient, weight)
            return counters.applied(staleness)
        if type(message) is _Pull:
            data = await store.read()
            counters.weights_pulled += 1
            return data, counters.version
        if type(message) is _Stats:
            return ParameterServerCounters(
                counters.version, counters.gradients_applied, counters.gradients_rejected,
                counters.gradients_downweighted, counters.weights_pulled,
                counters.avg_staleness, store.rebuilds)
        if type(message) is _Device:
            return store.device
        return await super().handle(message)

    async def post_stop(self) -> None:
        """Free the device buffers, once a blocking caller's turn under way has ended."""
        await super().post_stop()
        if self._kept.store is not None:
            await self._kept.store.close()


def _float_vector(values: object, name: str) -> np.ndarray[Any, Any]:
    """``values`` (a sequence of numbers or a NumPy array) as a finite float32 vector."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray):
        raise InvalidArgument(f"{name} must be a list of numbers or a NumPy array, got "
                              f"{type(values).__name__}")
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{name} must hold numbers only: {exc}") from exc
    if not np.all(np.isfinite(array)):
        raise InvalidArgument(f"{name} holds a NaN or an infinity")
    return np.ascontiguousarray(array.reshape(-1), dtype=np.float32)


def _count(name: str, value: object) -> int:
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 0:
        raise InvalidArgument(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


class AsyncParameterServer(BlueprintClient):
    """A central weight vector with asynchronous gradient pushes and weight pulls.

    Start one with ``spawn``; see the module for the update and the staleness
    rule. Every method has an ``_async`` twin that checks its arguments when
    called. Errors: ``InvalidArgument`` (bad arguments, a gradient of the
    wrong length, a ``worker_version`` from the future), ``StaleGradient``
    (too stale: not applied), ``AskTimeout``, and the device's errors.
    """

    _shape: tuple[int, ...] = ()
    _as_list = True

    @classmethod
    def spawn(cls, system: Any, initial_weights: Any, optimizer: str = "sgd",
              lr: float = 0.01, max_staleness: int = 4, name: str | None = None, *,
              device: Device | None = None) -> AsyncParameterServer:
        """Start a server holding ``initial_weights`` (a list of numbers, as the original,
        or a NumPy array of any shape; kept as float32) in the facade ``system``.

        ``optimizer`` is ``"sgd"`` (``w -= lr * g``) or ``"adamw"`` (betas 0.9,
        0.999, eps 1e-8, no weight decay, as the original's); any other name is
        an ``InvalidArgument``. ``max_staleness`` bounds how many versions a
        push may lag. ``device`` (ours) picks the device that holds the
        weights; by default the system places it on one of its devices (it
        starts a CPU device, ``mock=True``, for itself if the system has none).
        ``pull_weights`` answers a list for a list and an array of the same
        shape for an array.
        """
        facade = require_system(system)
        if not isinstance(optimizer, str) or optimizer.lower() not in ("sgd", "adamw"):
            raise InvalidArgument(f"optimizer must be 'sgd' or 'adamw' (got {optimizer!r})")
        if (not isinstance(lr, int | float) or isinstance(lr, bool) or not np.isfinite(lr)
                or lr <= 0):
            raise InvalidArgument(f"lr must be a finite number > 0, got {lr!r}")
        staleness = _count("max_staleness", max_staleness)
        if device is not None and (not isinstance(device, Device)
                                   or all(d is not device for d in facade.devices)):
            raise InvalidArgument(f"device must be a Device of this system or None, got "
                                  f"{device!r}")
        initial = _float_vector(initial_weights, "initial_weights")
        turns: Turns[_ServerActor] = Turns()
        props = Props(_ServerActor, turns, facade, device, initial, optimizer.lower(),
                      float(lr), staleness, _Kept())
        client = cls._start(facade, props, name, turns)
        client._shape = np.shape(initial_weights)
        client._as_list = not isinstance(initial_weights, np.ndarray)
        return client

    @property
    def size(self) -> int:
        """How many weights the server holds."""
        return int(np.prod(self._shape, dtype=np.int64))

    def push_gradient_async(self, worker_id: int, worker_version: int, gradient: Any,
                            timeout_secs: float = PUSH_TIMEOUT) -> Coroutine[Any, Any, int]:
        """Apply ``gradient`` (as many numbers as the weights; a list or an array), computed
        by ``worker_id`` against ``worker_version``; returns the server's new version.

        Raises ``StaleGradient`` (not applied, counted) when it lags more than
        ``max_staleness`` versions.
        """
        worker = _count("worker_id", worker_id)
        version = _count("worker_version", worker_version)
        data = _float_vector(gradient, "gradient")
        if data.size != self.size:
            raise InvalidArgument(f"gradient has {data.size} numbers, the weights {self.size}")
        return self._on_turn(_Push(worker, version, data), timeout_secs, "push_gradient")

    push_gradient = twin(push_gradient_async)

    async def _pull(self, worker: int, timeout: float) -> tuple[Any, int]:
        data, version = await self._on_turn(_Pull(worker), timeout, "pull_weights")
        weights = data.reshape(self._shape)
        return (weights.tolist() if self._as_list else weights), int(version)

    def pull_weights_async(self, worker_id: int, timeout_secs: float = PUSH_TIMEOUT,
                           ) -> Coroutine[Any, Any, tuple[Any, int]]:
        """The current weights and version, ``(weights, version)``: a list of floats when the
        server was spawned from a list, else a float32 array of the initial shape."""
        return self._pull(_count("worker_id", worker_id), require_timeout(timeout_secs))

    pull_weights = twin(pull_weights_async)

    async def _stats(self, timeout: float) -> ParameterServerStats:
        counters: ParameterServerCounters = await self._on_turn(_Stats(), timeout, "stats")
        return ParameterServerStats(counters.version, counters.gradients_applied,
                                    counters.weights_pulled, counters.avg_staleness)

    def stats_async(self, timeout_secs: float = STATS_TIMEOUT,
                    ) -> Coroutine[Any, Any, ParameterServerStats]:
        """``(version, gradients_applied, weights_pulled, avg_staleness)``, as the original."""
        return self._stats(require_timeout(timeout_secs))

    stats = twin(stats_async)

    def counters_async(self, timeout_secs: float = STATS_TIMEOUT,
                       ) -> Coroutine[Any, Any, ParameterServerCounters]:
        """Every counter: ``stats()``'s and the rejected and down-weighted pushes (ours)."""
        return self._on_turn(_Stats(), timeout_secs, "counters")

    counters = twin(counters_async)

    def device_async(self, timeout_secs: float = STATS_TIMEOUT) -> Coroutine[Any, Any, Device]:
        """The device that holds the weights (placed at the first request if spawn named
        none)."""
        return self._on_turn(_Device(), timeout_secs, "device")

    device = twin(device_async)
