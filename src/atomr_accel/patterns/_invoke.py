"""Call a user's function, sync or async, without blocking the event loop."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["invoke", "is_async_callable"]


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """True for ``async def`` functions, bound methods and objects with an async ``__call__``."""
    while hasattr(fn, "func"):  # functools.partial
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object's async __call__
    )


async def invoke(fn: Callable[..., Any], *args: Any) -> Any:
    """Return ``fn(*args)``: awaited on the loop when async, else run on a worker thread.

    A sync function runs through ``asyncio.to_thread`` so a slow model never
    stalls the event loop (NumPy and device calls release the GIL); if it
    returns an awaitable, that is awaited on the loop.
    """
    if is_async_callable(fn):
        return await fn(*args)
    result = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(result):
        return await result
    return result
