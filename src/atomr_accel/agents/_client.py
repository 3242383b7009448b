"""The base of the agent blueprints' clients: blocking methods beside ``_async`` twins."""

from __future__ import annotations

import math
from typing import Any

from atomr_accel.actor import Actor, Props
from atomr_accel.actor import AskTimeout as ActorAskTimeout
from atomr_accel.actor import SystemClosed as ActorSystemClosed
from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument, gpu_error_of
from atomr_accel.facade import System
from atomr_accel.patterns._base import PatternClient

__all__ = ["AgentActor", "AgentClient", "require_system", "require_timeout"]

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
    is its blocking twin (any thread but the system's own loop). A time-out
    raises ``AskTimeout`` and a closed system ``SystemClosed`` (both
    ``GpuRuntimeError``s).
    """

    _system_name = ""

    @classmethod
    def _start_in(cls, system: object, props: Props, name: str | None) -> Any:
        """Spawn ``props`` in the facade ``system`` and wrap the ref."""
        facade = require_system(system)
        if name is not None and not isinstance(name, str):
            raise InvalidArgument(f"name must be a str or None, got {name!r}")
        client = cls._start(facade, props, name)
        client._system_name = facade.name
        return client

    async def _call(self, message: Any, timeout_secs: float, what: str) -> Any:
        """Ask the actor; the runtime's time-out and closed-system errors become typed ones."""
        try:
            return await self._ask(message, timeout_secs)
        except GpuRuntimeError:
            raise
        except (ActorAskTimeout, ActorSystemClosed) as exc:
            raise gpu_error_of(exc, self._system_name, what) from exc


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
