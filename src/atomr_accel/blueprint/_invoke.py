"""Call a user's function, sync or async, without blocking the event loop, and so that
nothing it raises ends the caller's task or its loop (``atomr_accel.actor.user_code``)."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from atomr_accel.actor import user_code
from atomr_accel.core._errors import UserCodeError
from atomr_accel.facade._functions import DeviceFunction

__all__ = ["call_here", "in_context", "invoke", "is_async_callable", "name_of"]


def in_context(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]] | None:
    """``fn``'s way into its device's context when it is a ``DeviceFunction`` (or a
    ``functools.partial`` of one, e.g. with a resident bound): its ``call_async`` with
    the bound arguments first; None for any other callable."""
    if isinstance(fn, DeviceFunction):
        return fn.call_async
    if isinstance(fn, functools.partial) and isinstance(fn.func, DeviceFunction):
        return functools.partial(fn.func.call_async, *fn.args, **fn.keywords)
    return None


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """True for ``async def`` functions, bound methods and objects with an async ``__call__``."""
    while hasattr(fn, "func"):  # functools.partial
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object's async __call__
    )


def name_of(fn: Callable[..., Any]) -> str:
    """How an error names user function ``fn``: its qualified name (a device function's
    name), or its class's."""
    inner = fn.func if isinstance(fn, functools.partial) else fn
    if isinstance(inner, DeviceFunction):
        return inner.name
    name = getattr(fn, "__qualname__", None)
    return name if isinstance(name, str) else f"a {type(fn).__qualname__} object"


async def invoke(fn: Callable[..., Any], *args: Any) -> Any:
    """Return ``fn(*args)``: awaited on the loop when async, else run on a worker thread.

    A ``DeviceFunction`` (or a ``functools.partial`` of one) runs inside its device's
    context (``call_async``: no thread of the caller's). A sync function runs through
    ``asyncio.to_thread`` so a slow model never stalls the event loop (NumPy and device
    calls release the GIL); if it returns an awaitable, that is awaited on the loop. An
    ``Exception`` it raises reaches the caller unchanged; any other ``BaseException``
    (``SystemExit``, ``KeyboardInterrupt``, a ``CancelledError`` that is not
    the calling task's own cancellation) is raised as ``UserCodeError``.
    """
    with user_code(name_of(fn), UserCodeError):
        device_call = in_context(fn)
        if device_call is not None:
            return await device_call(*args)
        if is_async_callable(fn):
            return await fn(*args)
        result = await asyncio.to_thread(fn, *args)
        if inspect.isawaitable(result):
            return await result
        return result


async def call_here(fn: Callable[..., Any], *args: Any) -> Any:
    """Return ``fn(*args)`` called on this thread (the loop's), awaited if it returns an
    awaitable (a ``DeviceFunction``: ``call_async``); raises as ``invoke`` does. For cheap
    functions called once per element."""
    with user_code(name_of(fn), UserCodeError):
        device_call = in_context(fn)
        result = device_call(*args) if device_call is not None else fn(*args)
        if inspect.isawaitable(result):
            return await result
        return result
