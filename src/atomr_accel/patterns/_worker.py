"""The child actor that runs one model (a cascade stage, a replica, an expert)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from atomr_accel.actor import Actor, OneForOneStrategy, Props, SupervisorStrategy
from atomr_accel.blueprint._invoke import invoke
from atomr_accel.core._errors import InvalidArgument

__all__ = [
    "Invoke",
    "ModelSpec",
    "Reloadable",
    "Worker",
    "WorkerDown",
    "WorkerUp",
    "check_model",
    "worker_strategy",
]


@dataclass(frozen=True, slots=True)
class Reloadable:
    """A model built inside its worker actor: ``load()`` runs at start and after every restart.

    ``load`` may be sync (run on a worker thread) or async, and returns the
    model callable. While it runs the worker counts as down (a replica pool
    skips it). A ``load`` that raises stops the worker for good.
    """

    load: Callable[[], Any]


ModelSpec: TypeAlias = Callable[..., Any] | Reloadable
"""A model: a callable (sync or async), or a ``Reloadable`` that builds one."""


def check_model(name: str, spec: object) -> None:
    """Raise ``InvalidArgument`` unless ``spec`` is a callable or a ``Reloadable``."""
    if isinstance(spec, Reloadable):
        if not callable(spec.load):
            raise InvalidArgument(f"{name}: Reloadable.load must be callable, got {spec.load!r}")
    elif not callable(spec):
        raise InvalidArgument(f"{name} must be callable or a Reloadable, got {spec!r}")


def worker_strategy(max_restarts: int | None, within: float | None) -> SupervisorStrategy:
    """Restart a worker whose model raised, at most ``max_restarts`` times in ``within`` s.

    A worker whose ``load`` raised is stopped (the default decider).
    """
    return OneForOneStrategy(max_restarts=max_restarts, within=within)


@dataclass(frozen=True, slots=True)
class Invoke:
    """Call the worker's model with ``args``; the model's return value answers."""

    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class WorkerUp:
    """Told to the parent when worker ``index`` has its model and takes calls."""

    index: int


@dataclass(frozen=True, slots=True)
class WorkerDown:
    """Told to the parent when worker ``index`` failed and is being restarted."""

    index: int
    cause: BaseException


class Worker(Actor):
    """Runs one model, one call at a time; a raise fails that call and restarts the worker."""

    @staticmethod
    def props(index: int, spec: ModelSpec) -> Props:
        """Props for worker ``index`` running ``spec``."""
        return Props(Worker, index, spec)

    def __init__(self, index: int, spec: ModelSpec) -> None:
        self.index = index
        self.spec = spec
        self.model: Callable[..., Any] | None = None

    async def pre_start(self) -> None:
        """Build the model (``Reloadable.load``), then tell the parent ``WorkerUp``."""
        spec = self.spec
        model = await invoke(spec.load) if isinstance(spec, Reloadable) else spec
        if not callable(model):
            raise InvalidArgument(f"Reloadable.load returned {model!r}, which is not callable")
        self.model = model
        parent = self.context.parent
        if parent is not None:
            parent.tell(WorkerUp(self.index))

    async def pre_restart(self, exc: BaseException, message: Any) -> None:
        """Tell the parent ``WorkerDown`` before the restart."""
        parent = self.context.parent
        if parent is not None:
            parent.tell(WorkerDown(self.index, exc))
        await super().pre_restart(exc, message)

    async def receive(self, message: Any) -> Any:
        """Call the model with an ``Invoke``'s arguments and return its result."""
        if type(message) is not Invoke or self.model is None:
            raise TypeError(f"a model worker does not handle {message!r}")
        return await invoke(self.model, *message.args)
