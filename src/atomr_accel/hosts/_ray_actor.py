"""The Ray actor that holds one device context (``RayContext``); it imports no Ray itself.

``hosts/_ray.py`` wraps this class with ``ray.remote`` and starts one per context
generation. The actor is asynchronous so that a watch call can wait in it for
ever (its failure is how the owner learns that the actor died while idle), but
ops run in the order the owner sent them: each carries a sequence number and
waits for its turn, as Ray orders an asynchronous actor's calls only loosely.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import os
from typing import Any

from atomr_accel.backends._base import Backend
from atomr_accel.core._errors import ContextPoisoned, GpuRuntimeError
from atomr_accel.core._op import Op
from atomr_accel.hosts._base import BackendSpec, picklable, translate_error

__all__ = ["RayContext"]

Reply = tuple[bool, Any]
"""``(True, result)`` or ``(False, the typed error)``: errors travel as values, not as
Ray task failures, so they come back with their own type."""


class RayContext:
    """One device context inside a Ray actor: builds the backend, runs ops in sequence order."""

    def __init__(self, spec: BackendSpec) -> None:
        self.backend: Backend | None = None
        self.start_error: GpuRuntimeError | None = None
        try:
            self.backend = spec.create()
        except BaseException as exc:  # reported by ready(), never by a dead actor
            self.start_error = picklable(translate_error(exc, Op()))
        self.next = 1
        self.turns: dict[int, asyncio.Future[None]] = {}
        self.poisoned: GpuRuntimeError | None = None
        self.closing: asyncio.Event | None = None
        self.answering = 0  # ops launched, not yet answered
        self.idle: asyncio.Event | None = None  # set when answering drops to 0 (drain)

    def ready(self) -> tuple[str, Any]:
        """``("ready", (pid, node id))`` or ``("error", the typed start-up error)``."""
        if self.start_error is not None:
            return "error", self.start_error
        node = _node_id()
        return "ready", (os.getpid(), node)

    async def watch(self) -> None:
        """Wait until ``drain``; the owner takes this call's failure as the actor's death."""
        await self._closing().wait()

    def _closing(self) -> asyncio.Event:
        if self.closing is None:
            self.closing = asyncio.Event()
        return self.closing

    async def drain(self, seq: int) -> None:
        """Once every op sent before ``seq`` has been launched and answered, release the
        backend and end ``watch`` (the owner kills the actor next)."""
        await self._turn(seq)
        self._next_turn()
        if self.answering:
            self.idle = asyncio.Event()
            await self.idle.wait()
        if self.backend is not None:
            self.backend.close()
            self.backend = None
        self._closing().set()

    async def _turn(self, seq: int) -> None:
        if seq != self.next:
            turn = self.turns[seq] = asyncio.get_running_loop().create_future()
            await turn

    def _next_turn(self) -> None:
        self.next += 1
        waiting = self.turns.pop(self.next, None)
        if waiting is not None:
            waiting.set_result(None)
        elif self.backend is not None:
            self.backend.flush()  # nothing more to launch: report what is deferred

    async def run(self, seq: int, op: Op, stream: int) -> Reply:
        """Run ``op`` on ``stream`` once every op sent before it has been launched."""
        await self._turn(seq)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Reply] = loop.create_future()
        self.answering += 1
        try:
            try:
                self._launch(op, stream, functools.partial(_settle, loop, answer, op, self))
            finally:
                self._next_turn()
            return await answer
        finally:
            self.answering -= 1
            if not self.answering and self.idle is not None:
                self.idle.set()

    def _launch(self, op: Op, stream: int, done: Any) -> None:
        if self.poisoned is not None or self.backend is None:
            done(None, self.poisoned or ContextPoisoned("the context is closed"))
            return
        self.backend.launch(op, stream, done)


def _settle(loop: asyncio.AbstractEventLoop, answer: asyncio.Future[Reply], op: Op,
            context: RayContext, result: Any, error: BaseException | None) -> None:
    """The backend's ``done``: classify the outcome and hand it to ``run`` (any thread)."""
    reply: Reply
    if error is None:
        reply = (True, result)
    else:
        failure = picklable(translate_error(error, op))
        if isinstance(failure, ContextPoisoned):
            context.poisoned = failure  # sticky, as in a real CUDA context
        reply = (False, failure)

    def put() -> None:
        if not answer.done():
            answer.set_result(reply)

    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        put()
    else:
        loop.call_soon_threadsafe(put)


def _node_id() -> str | None:
    """The Ray node this actor runs on (None if Ray cannot say)."""
    try:
        ray = importlib.import_module("ray")
        return str(ray.get_runtime_context().get_node_id())
    except Exception:
        return None
