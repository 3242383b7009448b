"""A warm standby context: a spare host started ahead of need (``spawn_device(standby=1)``).

A rebuild normally starts a new host: on the process host that is a new worker
process that imports its backend and creates its context (about a second for
CUDA). With a standby the device keeps one such host started and warmed (its
context made and asked once), so the next generation takes it at once and a
new standby starts in the background as soon as the last one is taken (so under
faults in quick succession the next spare is already on its way while the
taken one finishes its start). A standby still starting when it is needed is
awaited, which is never slower than starting another; it must answer
a ping before it serves, and one that died or failed to start is dropped and
the ordinary path starts a host. Every
switch is a restart of the context actor, so the restart budget counts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from atomr_accel.core.ops._memory import MemoryInfo
from atomr_accel.hosts._base import ContextHost

_log = logging.getLogger(__name__)

_PING_SECONDS = 5.0
"""How long a standby may take to answer before it is given up for a fresh start."""

__all__ = ["Standby"]


class Standby:
    """One spare context host for a device, kept started on the device's event loop."""

    def __init__(self, make_host: Callable[[], ContextHost],
                 warm: Callable[[ContextHost], Awaitable[None]] | None = None) -> None:
        self._make_host = make_host
        self._warm = warm
        self._task: asyncio.Task[ContextHost] | None = None
        self._closed = False
        self.switches = 0
        """Rebuilds that took the standby instead of starting a host."""
        self.last_switch_ms: float | None = None
        """How long the last rebuild that took the standby waited for it."""

    def replenish(self) -> None:
        """Start a spare host in the background unless one is there or starting."""
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._start())

    async def _start(self) -> ContextHost:
        host = self._make_host()
        try:
            await host.start()
            await host.submit(MemoryInfo())  # the context is made and answers
            if self._warm is not None:
                await self._warm(host)  # e.g. the device's residents, built ahead of use
        except BaseException:
            with contextlib.suppress(Exception):
                await host.close()
            raise
        return host

    async def take(self) -> ContextHost | None:
        """The spare host, started (awaited if still starting); None when there is none or
        it failed or died: then the caller starts a host the ordinary way."""
        task, self._task = self._task, None
        if task is None:
            return None
        self.replenish()  # the next spare starts now, beside this one, not once it serves
        began = time.perf_counter()
        try:
            host = await task
        except Exception as exc:
            _log.warning("the standby context failed to start: %s", exc)
            return None
        try:  # it may have died while it waited, unnoticed yet: it must answer first
            await asyncio.wait_for(host.submit(MemoryInfo()), _PING_SECONDS)
        except BaseException as exc:  # cancelled too: the host must not outlive its taker
            with contextlib.suppress(Exception):
                await host.close()
            if not isinstance(exc, Exception):
                raise
            _log.warning("the standby context does not answer (%s); starting another", exc)
            return None
        self.switches += 1
        self.last_switch_ms = (time.perf_counter() - began) * 1e3
        return host

    @property
    def ready(self) -> bool:
        """True while a started spare host waits."""
        task = self._task
        return task is not None and task.done() and not task.cancelled() \
            and task.exception() is None

    @property
    def pid(self) -> int | None:
        """The process of the spare host once started (None before, or on no process)."""
        return self._task.result().pid if self.ready and self._task is not None else None

    async def close(self) -> None:
        """Stop the spare host (and any start in progress); nothing is started again."""
        self._closed = True
        task, self._task = self._task, None
        if task is None:
            return
        if not task.done():
            task.cancel()
        with contextlib.suppress(BaseException):
            host = await task
            await host.close()
