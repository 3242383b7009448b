"""The base of the agent blueprints' clients: ``_async`` methods with blocking twins, the
actor runtime's errors as typed ``GpuRuntimeError``s, and the actor base that answers a
bad request without losing its state."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

from atomr_accel.actor import Actor, ActorError, ActorStopped, Props
from atomr_accel.core._errors import (
    GpuRuntimeError,
    InvalidArgument,
    Unrecoverable,
    gpu_error_of,
)
from atomr_accel.facade import System
from atomr_accel.patterns._base import PatternClient, SystemLike

__all__ = [
    "AgentActor", "AgentClient", "blocking_twin", "require_system", "require_timeout",
]

T = TypeVar("T")
P = ParamSpec("P")
C = TypeVar("C", bound="AgentClient")

TIMEOUT = 5.0
"""The default ``timeout_secs`` of the agent blueprints' calls, seconds."""


def require_timeout(timeout_secs: object) -> float:
    """``timeout_secs`` as a float; ``InvalidArgument`` unless it is a finite number > 0."""
    if (not isinstance(timeout_secs, int | float) or isinstance(timeout_secs, bool)
            or not math.isfinite(timeout_secs) or timeout_secs <= 0):
        raise InvalidArgument(f"timeout_secs must be a positive number of seconds, "
                              f"got {timeout_secs!r}")
    return float(timeout_secs)


def require_system(system: object) -> System:
    """``system`` if it is a facade ``System`` (``System.open``); ``InvalidArgument`` else."""
    if not isinstance(system, System):
        raise InvalidArgument(f"an agent blueprint runs in a System (System.open), "
                              f"got {type(system).__name__}")
    return system


class AgentClient(PatternClient):
    """Base of the agent blueprint clients: typed asks with a time-out, from any thread.

    Each method is written once as ``name_async``, which checks its arguments
    when called and returns a coroutine to await on any event loop; ``name``
    (``blocking_twin``) is its blocking twin, for any thread but the system's
    own loop, and only for a blueprint spawned in a facade ``System``. A
    time-out raises ``AskTimeout``, a stopped blueprint ``Unrecoverable`` and a
    closed system ``SystemClosed`` (all ``GpuRuntimeError``s).
    """

    _system_name = ""

    @classmethod
    def _start_in(cls, system: SystemLike, props: Props, name: str | None) -> Self:
        """Spawn ``props`` in ``system`` (a facade ``System`` or an ``ActorSystem``) and wrap
        the ref, keeping the system's name for error messages."""
        if name is not None and not isinstance(name, str):
            raise InvalidArgument(f"name must be a str or None, got {name!r}")
        client = cls._start(system, props, name)
        client._system_name = system.name
        return client

    def _blocking(self, coro: Coroutine[Any, Any, T], what: str) -> T:
        """Run ``coro`` to its end on this thread (the blocking method ``what``); refused
        with ``InvalidArgument`` for a client spawned in a bare ``ActorSystem``, which has
        no loop thread to wait on (await ``what_async`` there)."""
        portal = self._portal
        if portal is None:
            coro.close()
            raise InvalidArgument(f"{type(self).__name__}.{what} blocks, which needs a facade "
                                  f"System; in an ActorSystem await {what}_async")
        return portal.run_blocking(coro)

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


def blocking_twin(
    async_method: Callable[Concatenate[C, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[C, P], T]:
    """The blocking twin of an ``AgentClient`` method ``name_async`` (same arguments and
    result; see ``AgentClient._blocking``)."""

    @functools.wraps(async_method)
    def method(self: C, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._blocking(async_method(self, *args, **kwargs), name)

    name = async_method.__name__.removesuffix("_async")
    method.__name__ = name
    method.__qualname__ = async_method.__qualname__.removesuffix("_async")
    summary = (async_method.__doc__ or "").strip()
    method.__doc__ = (f"{summary}\n\nBlocking twin of ``{async_method.__name__}``; never call "
                      "it on the system's own event loop.")
    return method


class AgentActor(Actor):
    """Base of the agent blueprint actors: a ``GpuRuntimeError`` answers the asker.

    ``handle`` does the work; an error it raises that is a ``GpuRuntimeError``
    (a bad argument found in the actor, an unknown id) fails only that request
    and leaves the actor and its state as they were.
    """

    async def receive(self, message: Any) -> Any:
        """Answer ``message`` with ``handle``; a typed error fails this request only."""
        try:
            return await self.handle(message)
        except GpuRuntimeError as exc:
            self.context.defer_reply().set_exception(exc)
            return None

    async def handle(self, message: Any) -> Any:
        """Handle one message (subclasses override); the default refuses it."""
        raise InvalidArgument(f"{type(self).__name__} does not handle {message!r:.80}")
