"""ModelHotSwapServer: replace the served model without failing a request."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from atomr_accel.actor import Props, Reply
from atomr_accel.blueprint import (
    BlueprintActor,
    BlueprintClient,
    SystemLike,
    twins_with_old_name,
)
from atomr_accel.blueprint._actor import GetStats, Serve
from atomr_accel.blueprint._invoke import invoke
from atomr_accel.core._errors import InvalidArgument

__all__ = ["HotSwapStats", "ModelHotSwapServer"]

_log = logging.getLogger("atomr_accel.patterns")


@dataclass(frozen=True, slots=True)
class HotSwapStats:
    """The served version, its in-flight calls, versions still draining, and counters."""

    version: int
    in_flight: int
    draining: tuple[int, ...]
    served: int
    failed: int


class _Generation:
    __slots__ = ("in_flight", "model", "released", "version", "waiters")

    def __init__(self, version: int, model: Callable[..., Any]) -> None:
        self.version = version
        self.model = model
        self.in_flight = 0
        self.released = False
        self.waiters: list[tuple[Reply, int]] = []  # swaps to answer once this one is released


@dataclass(frozen=True, slots=True)
class _Swap:
    model: Callable[..., Any]


@dataclass(frozen=True, slots=True)
class _Done:
    generation: _Generation
    ok: bool


@dataclass(frozen=True, slots=True)
class _Released:
    generation: _Generation


async def _close(model: Any) -> None:
    """Call the model's ``close()`` if it has one; log (not raise) what it raises."""
    close = getattr(model, "close", None)
    if not callable(close):
        return
    try:
        await invoke(close)
    except Exception:
        _log.exception("close() of a retired model raised")


class _HotSwapActor(BlueprintActor):
    def __init__(self, model: Callable[..., Any]) -> None:
        super().__init__()
        self.current = _Generation(1, model)
        self.draining: dict[int, _Generation] = {}
        self.served = self.failed = 0

    async def receive(self, message: Any) -> Any:
        """Handle calls, swaps, finished calls, released models and stats."""
        cls = type(message)
        if cls is Serve:
            generation = self.current
            generation.in_flight += 1
            self.start_task(self._run(generation, message.x, self.context.defer_reply()))
        elif cls is _Done:
            generation = message.generation
            generation.in_flight -= 1
            if message.ok:
                self.served += 1
            else:
                self.failed += 1
            self._release_if_drained(generation)
        elif cls is _Swap:
            old = self.current
            self.current = _Generation(old.version + 1, message.model)
            old.waiters.append((self.context.defer_reply(), self.current.version))
            self.draining[old.version] = old
            self._release_if_drained(old)
        elif cls is _Released:
            generation = message.generation
            del self.draining[generation.version]
            for reply, version in generation.waiters:
                reply.set_result(version)
        elif cls is GetStats:
            return HotSwapStats(self.current.version, self.current.in_flight,
                                tuple(sorted(self.draining)), self.served, self.failed)
        else:
            self.unhandled(message)
        return None

    def _release_if_drained(self, generation: _Generation) -> None:
        if (generation is not self.current and generation.in_flight == 0
                and not generation.released):
            generation.released = True
            self.start_task(self._release(generation))

    async def _release(self, generation: _Generation) -> None:
        await _close(generation.model)
        self.context.self_ref.tell(_Released(generation))

    async def _run(self, generation: _Generation, x: Any, reply: Reply) -> None:
        ok = await self.answer(reply, invoke(generation.model, x))
        self.context.self_ref.tell(_Done(generation, ok=ok))

    async def post_stop(self) -> None:
        """Fail running calls and pending swaps, then close every model it still holds."""
        await super().post_stop()
        error = self.stopped_error()
        generations = [*self.draining.values(), self.current]
        for generation in generations:
            for reply, _ in generation.waiters:
                reply.set_exception(error)
        for generation in generations:
            if not generation.released:
                generation.released = True
                await _close(generation.model)


class ModelHotSwapServer(BlueprintClient):
    """Serve ``model(x)`` and replace the model while requests keep flowing.

    ``swap(new_model)`` makes every later request go to the new model at once
    (the version goes up by one); calls already running on the old model
    finish on it, and only then is the old model released (its ``close()``
    called, if it has one) and the swap answered. No request fails because of
    a swap. Calls run concurrently; models may be sync (run on a worker
    thread) or async. The server owns its models: it closes each one it
    retires, and all it holds when it stops.
    """

    @staticmethod
    def props(model: Callable[..., Any]) -> Props:
        """Props for the server actor serving ``model`` as version 1."""
        if not callable(model):
            raise InvalidArgument(f"model must be callable, got {model!r}")
        return Props(_HotSwapActor, model)

    @classmethod
    def spawn(cls, system: SystemLike, model: Callable[..., Any], *,
              name: str | None = None) -> ModelHotSwapServer:
        """Start a ModelHotSwapServer in ``system`` and return its client.

        ``spawn(system, model, *, name=None)`` serves ``model`` as version 1
        and returns this class's client."""
        return cls._start(system, cls.props(model), name)

    async def infer_async(self, x: Any, *, timeout_secs: float | None = None) -> Any:
        """Return ``model(x)`` from the model current when the request arrives.

        Raises what the model raised, ``AskTimeout`` or ``ActorStopped``.
        """
        return await self._ask(Serve(x), timeout_secs)

    async def swap_async(self, model: Callable[..., Any], *,
                         timeout_secs: float | None = None) -> int:
        """Serve ``model`` from now on; return its version once the old model is released.

        Raises ``InvalidArgument`` if ``model`` is not callable.
        """
        if not callable(model):
            raise InvalidArgument(f"model must be callable, got {model!r}")
        version: int = await self._ask(_Swap(model), timeout_secs)
        return version

    async def version_async(self, *, timeout_secs: float | None = None) -> int:
        """The version now served (1 for the first model, +1 per swap)."""
        return (await self.stats_async(timeout_secs=timeout_secs)).version

    async def stats_async(self, *, timeout_secs: float | None = None) -> HotSwapStats:
        """Version, in-flight calls, draining versions and counters."""
        stats: HotSwapStats = await self._ask(GetStats(), timeout_secs)
        return stats

    infer, infer_blocking = twins_with_old_name(infer_async)
    swap, swap_blocking = twins_with_old_name(swap_async)
    version, version_blocking = twins_with_old_name(version_async)
    stats, stats_blocking = twins_with_old_name(stats_async)

