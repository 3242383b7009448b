"""The client base of the coordinator and the DAG executor: ``_async`` methods and their
blocking twins, with the actor runtime's errors as typed ``GpuRuntimeError``s."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

from atomr_accel.actor import ActorError, Props
from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument, gpu_error_of
from atomr_accel.patterns._base import PatternClient, SystemLike, require_wait

__all__ = ["TwinClient", "blocking_twin", "check_timeout"]

T = TypeVar("T")
P = ParamSpec("P")
C = TypeVar("C", bound="TwinClient")


def check_timeout(timeout_secs: object) -> float:
    """``timeout_secs`` as a float; ``InvalidArgument`` unless it is a finite number > 0."""
    require_wait("timeout_secs", timeout_secs)
    if timeout_secs == 0:
        raise InvalidArgument("timeout_secs must be > 0, got 0")
    return float(timeout_secs)  # type: ignore[arg-type]  # checked by require_wait


class TwinClient(PatternClient):
    """A blueprint client whose methods are ``name_async`` (awaitable on any event loop)
    with a blocking ``name`` twin (for any thread but the system's own loop; only for a
    blueprint spawned in a facade ``System``).

    Time-outs raise ``atomr_accel.AskTimeout``; a stopped blueprint or a closed
    system raises ``atomr_accel.SystemClosed``.
    """

    _system_name = "actors"

    @classmethod
    def _start(cls, system: SystemLike, props: Props, name: str | None) -> Self:
        """Spawn ``props`` in ``system`` and wrap the ref, keeping the system's name."""
        client = super()._start(system, props, name)
        client._system_name = system.name
        return client

    def _blocking(self, coro: Coroutine[Any, Any, T], what: str) -> T:
        """Run ``coro`` to its end on this thread (a blocking method ``what``).

        Raises ``InvalidArgument`` for a client spawned in a bare ``ActorSystem``
        (it has no loop thread to wait on: await the ``_async`` form there).
        """
        portal = self._portal
        if portal is None:
            coro.close()
            raise InvalidArgument(f"{type(self).__name__}.{what} blocks, which needs a facade "
                                  f"System; in an ActorSystem await {what}_async")
        return portal.run_blocking(coro)

    async def _call(self, what: str, message: Any, timeout_secs: float) -> Any:
        """Ask the blueprint actor ``message``; the runtime's errors become typed ones."""
        try:
            return await self._ask(message, timeout_secs)
        except GpuRuntimeError:
            raise
        except ActorError as exc:
            raise gpu_error_of(exc, self._system_name, what) from exc


def blocking_twin(
    async_method: Callable[Concatenate[C, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[C, P], T]:
    """The blocking twin of a ``TwinClient`` method ``name_async`` (same arguments and
    result; see ``TwinClient._blocking``)."""

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
