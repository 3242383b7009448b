"""The one twin rule of the blueprints: an operation is declared once, as ``name_async``.

Every public client method of a blueprint exists twice: ``name_async(...)``,
which returns a coroutine to await on any event loop (best a plain ``def``
that checks its arguments when called, then returns the coroutine), and
``name(...)``, its blocking twin, generated here from it.
Both take the same arguments, ``timeout_secs`` among them. The blocking twin
is the facade's (``facade._portal.blocking``): it runs the coroutine to its
end on the calling thread, in blocking mode. ``twin(..., on_loop=True)``
instead hands the coroutine to the system's event loop and waits for it,
for operations that must suspend there (gather device calls, spawn actors).

The serving blueprints (``patterns``) offered their operations as ``async``
methods named ``name`` taking ``timeout=`` before this rule; those names keep
returning a coroutine, so their blocking twin is named
``name_blocking``: ``name, name_blocking = twins_with_old_name(name_async)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from atomr_accel.core._errors import InvalidArgument
from atomr_accel.facade._portal import blocking

if TYPE_CHECKING:
    from atomr_accel.facade._portal import Portal

__all__ = ["twin", "twins_with_old_name"]

T = TypeVar("T")
P = ParamSpec("P")
S = TypeVar("S")


def _portal_of(owner: object, name: str) -> Portal:
    """The portal a blocking twin waits through; ``InvalidArgument`` where there is none
    (a blueprint spawned in a bare ``ActorSystem`` has no loop thread to wait on)."""
    portal: Portal | None = getattr(owner, "_portal", None)
    if portal is None:
        base = name.removesuffix("_blocking")
        raise InvalidArgument(f"{type(owner).__name__}.{name} blocks, which needs a facade "
                              f"System; in an ActorSystem await {base}_async")
    return portal


def twin(async_method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]], *,
         on_loop: bool = False, name: str | None = None) -> Callable[Concatenate[S, P], T]:
    """The blocking twin ``name`` of the method ``name_async`` (same arguments and result).

    The method's object must have a ``_portal`` (None: the twin raises
    ``InvalidArgument``). The twin runs the coroutine on the calling thread in
    blocking mode, or (``on_loop=True``) on the portal's event loop while the
    calling thread waits; never call it on that loop. ``name`` is the twin's
    name where it is not ``name_async`` less its suffix.
    """
    run = blocking(async_method)
    if name is not None:
        run.__name__ = name
        run.__qualname__ = f"{run.__qualname__.rpartition('.')[0]}.{name}".lstrip(".")
    called = run.__name__

    @functools.wraps(run)
    def method(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        portal = _portal_of(self, called)
        if on_loop:
            return portal.call(async_method(self, *args, **kwargs))
        return run(self, *args, **kwargs)

    return method


def _async_alias(async_method: Callable[..., Coroutine[Any, Any, T]],
                 ) -> Callable[..., Coroutine[Any, Any, T]]:
    """The old name ``name`` of ``name_async`` for an operation that was async-only before.

    It is a coroutine function, as it always was, and takes ``timeout=`` as the
    deprecated spelling of ``timeout_secs``.
    """

    @functools.wraps(async_method)
    async def method(self: Any, /, *args: Any, **kwargs: Any) -> T:
        if "timeout" in kwargs:
            if "timeout_secs" in kwargs:
                raise InvalidArgument("give timeout_secs, not both it and timeout")
            kwargs["timeout_secs"] = kwargs.pop("timeout")
        return await async_method(self, *args, **kwargs)

    name = async_method.__name__.removesuffix("_async")
    method.__name__ = name
    method.__qualname__ = async_method.__qualname__.removesuffix("_async")
    method.__doc__ = (f"{(async_method.__doc__ or '').strip()}\n\nThe old name of "
                      f"``{async_method.__name__}`` (a coroutine to await; ``timeout=`` is the "
                      f"deprecated spelling of ``timeout_secs``); ``{name}_blocking`` blocks.")
    return method


def twins_with_old_name(
    async_method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> tuple[Callable[..., Coroutine[Any, Any, T]], Callable[Concatenate[S, P], T]]:
    """``(name, name_blocking)`` of ``name_async``, for an operation whose old name ``name``
    was async: that name as it was (``_async_alias``) and the blocking twin (``twin``)."""
    base = async_method.__name__.removesuffix("_async")
    return _async_alias(async_method), twin(async_method, name=f"{base}_blocking")
