"""The child actor that runs one model (a cascade stage, a replica, an expert), and the
base of the blueprint actors that run their models in such children."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeAlias

from atomr_accel.actor import Actor, ActorRef, OneForOneStrategy, Props, SupervisorStrategy
from atomr_accel.blueprint import BlueprintActor
from atomr_accel.blueprint._invoke import invoke
from atomr_accel.core._errors import InvalidArgument

__all__ = [
    "Invoke",
    "ModelSpec",
    "Reloadable",
    "Worker",
    "WorkerDown",
    "WorkerParent",
    "WorkerUp",
    "check_model",
    "checked_models",
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


def checked_models(owner: str, role: str, specs: Iterable[ModelSpec]) -> list[ModelSpec]:
    """``specs`` as a list, each checked by ``check_model`` (named ``"<role> <i>"``);
    ``InvalidArgument`` when there is none (``"<owner> needs at least one <role>"``)."""
    models = list(specs)
    if not models:
        raise InvalidArgument(f"{owner} needs at least one {role}")
    for i, spec in enumerate(models):
        check_model(f"{role} {i}", spec)
    return models


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


class WorkerParent(BlueprintActor):
    """Base of the blueprint actors whose models run in ``Worker`` children.

    It spawns one worker per model (``<role>-0``, ...), supervised by
    ``worker_strategy``, counts each worker's restarts, and takes the workers'
    ``WorkerUp`` and ``WorkerDown`` notes (``worker_up``, ``worker_down``);
    ``serve`` handles every other message. ``watch`` also watches the workers,
    so the actor is told ``Terminated`` when one stops for good.
    """

    def __init__(self, role: str, specs: Iterable[ModelSpec], max_restarts: int | None,
                 within: float | None, *, watch: bool = False) -> None:
        super().__init__()
        self.supervisor_strategy = worker_strategy(max_restarts, within)
        ctx = self.context
        self.workers: list[ActorRef] = []
        for i, spec in enumerate(specs):
            worker = ctx.spawn(Worker.props(i, spec), f"{role}-{i}")
            self.workers.append(ctx.watch(worker) if watch else worker)
        self.restarts = [0] * len(self.workers)

    async def ask_worker(self, index: int, *args: Any) -> Any:
        """What the model of worker ``index`` returns for ``args`` (no time-out of its
        own: the request's asker bounds the wait)."""
        return await self.workers[index].ask(Invoke(args), timeout=None)

    async def receive(self, message: Any) -> Any:
        """Take the workers' lifecycle notes; ``serve`` handles every other message."""
        cls = type(message)
        if cls is WorkerUp:
            self.worker_up(message.index)
        elif cls is WorkerDown:
            self.restarts[message.index] += 1
            self.worker_down(message.index)
        else:
            return await self.serve(message)
        return None

    def worker_up(self, index: int) -> None:
        """Worker ``index`` has its model and takes calls (nothing to do by default)."""

    def worker_down(self, index: int) -> None:
        """Worker ``index`` failed and is being restarted (its restart is counted already)."""

    async def serve(self, message: Any) -> Any:
        """Handle a message other than a worker's note (the default fails it as unknown)."""
        self.unhandled(message)
