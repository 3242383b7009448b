"""The client base of every blueprint: a typed face over the blueprint actor's ``ActorRef``."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Self, TypeAlias

from atomr_accel.actor import POISON_PILL, ActorError, ActorRef, ActorStopped, ActorSystem, Props
from atomr_accel.blueprint._checks import require_timeout
from atomr_accel.blueprint._turns import Turns
from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument, Unrecoverable, gpu_error_of
from atomr_accel.facade import System
from atomr_accel.facade._portal import Portal

__all__ = ["BlueprintClient", "SystemLike", "spawn_actor"]

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
        if asyncio._get_running_loop() is portal.loop:
            return system.actors.spawn(props, name), portal
        return portal.call(_spawn(system.actors, props, name)), portal
    raise InvalidArgument(f"expected an ActorSystem or a System, got {type(system).__name__}")


async def _spawn(actors: ActorSystem, props: Props, name: str | None) -> ActorRef:
    return actors.spawn(props, name)


class BlueprintClient:
    """Base of the blueprint clients: typed asks to the blueprint's actor, from any thread.

    Each operation is written once as ``name_async``, awaited on the actor
    system's event loop (an ``ActorSystem``) or on any event loop (a facade
    ``System``, whose loop it reaches through the system's portal); ``name``
    is its blocking twin (``twin``), for any thread but the system's own loop,
    and only for a blueprint spawned in a facade ``System``. Build a client
    with the class's ``spawn``, or wrap the ref of an actor spawned from the
    class's ``props`` (``Client(ref)``); anything but an ``ActorRef`` is a
    ``TypeError``.
    """

    _system_name = ""
    _turns: Turns[Any] | None = None
    """The actor's ``Turns`` with blocking callers, where its blueprint offers them."""

    def __init__(self, ref: ActorRef) -> None:
        if not isinstance(ref, ActorRef):
            name = type(self).__name__
            raise TypeError(f"{name} wraps an ActorRef, got {type(ref).__name__}; "
                            f"start one with {name}.spawn(system, ...)")
        self.ref = ref
        self._portal: Portal | None = None

    @classmethod
    def _start(cls, system: SystemLike, props: Props, name: str | None,
               turns: Turns[Any] | None = None) -> Self:
        """Spawn ``props`` in ``system`` (see ``spawn_actor``) and wrap the ref; a ``name``
        that is neither a str nor None is an ``InvalidArgument``. ``turns``: the ones
        the actor of ``props`` shares (``TurnActor``)."""
        if name is not None and not isinstance(name, str):
            raise InvalidArgument(f"name must be a str or None, got {name!r}")
        ref, portal = spawn_actor(system, props, name)
        client = cls(ref)
        client._portal = portal
        client._turns = turns
        client._system_name = system.name
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
        fail with ``ActorStopped``; a blocking call made after ``stop`` takes no
        turn on its thread (``Turns``): it goes to the stopping actor.
        """
        if self._turns is not None:
            self._turns.stop()
        self.ref.tell(POISON_PILL)

    async def _ask(self, message: Any, timeout: float | None) -> Any:
        """Ask the actor (``timeout=None``: the system's ``default_ask_timeout``); the
        actor runtime's errors pass as they are. A ``timeout`` that is not a number of
        seconds > 0 is an ``InvalidArgument``."""
        if timeout is not None:
            timeout = require_timeout(timeout)
        ask = self.ref.ask(message) if timeout is None else self.ref.ask(message, timeout=timeout)
        if self._portal is None:
            return await ask
        return await self._portal.acall(ask)

    async def _call(self, message: Any, timeout_secs: float, what: str) -> Any:
        """Ask the actor; the runtime's errors become typed ones (a stopped blueprint:
        ``Unrecoverable``; a closed system: ``SystemClosed``; no answer: ``AskTimeout``)."""
        try:
            return await self._ask(message, timeout_secs)
        except GpuRuntimeError:
            raise
        except ActorStopped as exc:
            raise Unrecoverable(f"{what}: {type(self).__name__} at {self.path} has stopped"
                                ) from exc
        except ActorError as exc:
            raise gpu_error_of(exc, self._system_name, what) from exc

    def _on_turn(self, message: Any, timeout_secs: object, what: str,
                 ) -> Coroutine[Any, Any, Any]:
        """The coroutine answering ``message``: the actor's ``handle`` run on the calling
        thread when a blocking call finds the actor idle (``Turns``), else the actor's
        answer; ``timeout_secs`` is checked now (``require_timeout``)."""
        timeout = require_timeout(timeout_secs)

        def ask(sent: object) -> Coroutine[Any, Any, Any]:
            return self._call(sent, timeout, what)

        if self._turns is None:  # a client made from a ref, or a blueprint without turns
            return ask(message)
        return self._turns.run(message, ask)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.ref.path})"
