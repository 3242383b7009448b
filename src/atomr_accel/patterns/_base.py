"""What every blueprint shares: the client base, the actor base and argument checks."""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Self, TypeAlias

from atomr_accel.actor import POISON_PILL, Actor, ActorRef, ActorStopped, ActorSystem, Props
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.facade import System
from atomr_accel.facade._portal import Portal

__all__ = [
    "PatternActor",
    "PatternClient",
    "SystemLike",
    "is_models",
    "own_form",
    "require_positive_int",
    "require_wait",
    "spawn_actor",
]

SystemLike: TypeAlias = ActorSystem | System
"""Where a blueprint may be spawned: an ``ActorSystem`` or a facade ``System``."""


def spawn_actor(system: SystemLike, props: Props, name: str | None,
                ) -> tuple[ActorRef, Portal | None]:
    """Start a top-level actor in ``system``; return its ref and the portal to its loop.

    An ``ActorSystem`` is used on its own event loop (the portal is None). A
    facade ``System`` may be used from any thread: off its loop the spawn is
    handed to the loop and waited for. Raises ``InvalidArgument`` for anything else.
    """
    if isinstance(system, ActorSystem):
        return system.spawn(props, name), None
    if isinstance(system, System):
        portal = system._portal
        if _running_loop() is portal.loop:
            return system.actors.spawn(props, name), portal
        return portal.call(_spawn(system.actors, props, name)), portal
    raise InvalidArgument(f"expected an ActorSystem or a System, got {type(system).__name__}")


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _spawn(actors: ActorSystem, props: Props, name: str | None) -> ActorRef:
    return actors.spawn(props, name)


def own_form(original: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any],
             model: str, is_model: Callable[[Any], bool] = callable) -> bool:
    """Whether a ``spawn(system, *args, **kwargs)`` call takes the blueprint's own form.

    It does when it passes the model first after the system (positionally,
    where ``is_model`` tells it from the original package's argument in that
    place, or by its keyword ``model``), or when its arguments do not fit
    ``original``, the original package's ``spawn(cls, system, ...)``; the own
    form then says what is wrong with them. Otherwise the call is the
    original package's form.
    """
    if model in kwargs or (len(args) > 0 and is_model(args[0])):
        return True
    try:
        inspect.signature(original).bind(None, None, *args, **kwargs)
    except TypeError:
        return True
    return False


def is_models(value: object) -> bool:
    """True for a collection of models (stages, replicas), not the original's name or count."""
    return value is not None and not isinstance(value, str | int)


def require_positive_int(name: str, value: object, *, allow_none: bool = False) -> None:
    """Raise ``InvalidArgument`` unless ``value`` is an int >= 1 (or None when allowed)."""
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgument(f"{name} must be an int >= 1, got {value!r}")


def require_wait(name: str, value: object) -> None:
    """Raise ``InvalidArgument`` unless ``value`` is a finite number of seconds >= 0."""
    if (not isinstance(value, int | float) or isinstance(value, bool)
            or not math.isfinite(value) or value < 0):
        raise InvalidArgument(f"{name} must be a finite number of seconds >= 0, got {value!r}")


class PatternClient:
    """Base of the blueprint clients: a typed face over the blueprint actor's ``ActorRef``.

    Every ``async`` method is awaited on the actor system's event loop (as
    ``ActorRef.ask``); a client spawned in a facade ``System`` may be awaited
    on any event loop, since it reaches the system's loop through the
    system's portal. ``timeout=None`` means the system's
    ``default_ask_timeout``. Build a client with the class's ``spawn``, or
    wrap the ref of an actor spawned from the class's ``props``
    (``Client(ref)``); anything but an ``ActorRef`` is a ``TypeError``.
    """

    def __init__(self, ref: ActorRef) -> None:
        if not isinstance(ref, ActorRef):
            name = type(self).__name__
            raise TypeError(f"{name} wraps an ActorRef, got {type(ref).__name__}; "
                            f"start one with {name}.spawn(system, ...)")
        self.ref = ref
        self._portal: Portal | None = None

    @classmethod
    def _start(cls, system: SystemLike, props: Props, name: str | None) -> Self:
        """Spawn ``props`` in ``system`` (see ``spawn_actor``) and wrap the ref."""
        ref, portal = spawn_actor(system, props, name)
        client = cls(ref)
        client._portal = portal
        if isinstance(system, System):
            system.adopt_blueprint(client)
        return client

    @property
    def path(self) -> str:
        """The blueprint actor's path."""
        return self.ref.path

    @property
    def is_alive(self) -> bool:
        """True until the blueprint actor has begun stopping."""
        return self.ref.is_alive

    def stop(self) -> None:
        """Stop the blueprint after the mail already sent to it; returns at once.

        Requests still waiting inside it (queued, or running when it stops)
        fail with ``ActorStopped``.
        """
        self.ref.tell(POISON_PILL)

    async def _ask(self, message: Any, timeout: float | None) -> Any:
        ask = self.ref.ask(message) if timeout is None else self.ref.ask(message, timeout=timeout)
        if self._portal is None:
            return await ask
        return await self._portal.acall(ask)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.ref.path})"


class PatternActor(Actor):
    """Base of the blueprint actors: owns the tasks that run requests.

    Requests run as tasks so the actor keeps taking mail while models work.
    ``post_stop`` (also run before a restart) cancels those tasks; each task
    answers its own requests, so a cancelled one fails them with ``ActorStopped``.
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def start_task(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a task owned by this actor."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stopped_error(self) -> ActorStopped:
        """The error for requests this actor can no longer answer."""
        return ActorStopped(self.context.self_ref.path, "stopped before answering")

    def unhandled(self, message: object) -> None:
        """Fail the asker of an unknown message with ``TypeError`` (the actor keeps running)."""
        self.context.defer_reply().set_exception(
            TypeError(f"{type(self).__name__} does not handle {message!r}"))

    async def post_stop(self) -> None:
        """Cancel the running request tasks and wait for them to answer their callers."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

