"""Other ways to call a world's collectives: a group fused into one launch per rank, and
the view of one rank (``Collective.rank``) whose calls meet the other ranks' in a
rendezvous."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from contextvars import ContextVar, Token
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any

from atomr_accel.core._errors import CollectiveAborted, GpuRuntimeError, InvalidArgument
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.facade._collective_run import Planned
from atomr_accel.facade._portal import blocking

if TYPE_CHECKING:
    from atomr_accel.facade._collective import Collective

__all__ = ["CollectiveGroup", "CollectiveRank", "Rendezvous", "open_group"]


_GROUPS: ContextVar[Mapping[int, list[Planned]]] = ContextVar("atomr_collective_groups",
                                                              default=MappingProxyType({}))
"""The groups open in this context (thread, task), by ``id`` of their world."""


def open_group(world: Collective) -> list[Planned] | None:
    """The collectives gathered so far by a group of ``world`` open in this context."""
    return _GROUPS.get().get(id(world))


class CollectiveGroup:
    """``with world.group():`` / ``async with world.group():``: the collectives called
    inside run as one launch per rank when it exits (see ``Collective.group``). A group
    is its caller's: other threads and tasks calling the world meanwhile are not in it."""

    def __init__(self, world: Collective, timeout_secs: float | None = None) -> None:
        self._world = world
        self._timeout = timeout_secs
        self._token: Token[Mapping[int, list[Planned]]] | None = None

    def _enter(self) -> None:
        groups = _GROUPS.get()
        if id(self._world) in groups or self._token is not None:
            raise InvalidArgument("groups do not nest")
        self._token = _GROUPS.set(MappingProxyType({**groups, id(self._world): []}))

    def _take(self) -> list[Planned]:
        plans = open_group(self._world) or []
        if self._token is not None:
            _GROUPS.reset(self._token)
            self._token = None
        return plans

    def __enter__(self) -> CollectiveGroup:
        self._enter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        plans = self._take()
        if exc_type is None and plans:
            world = self._world
            world._portal.run_blocking(world._run_checked(plans, world._timeout(self._timeout)))

    async def __aenter__(self) -> CollectiveGroup:
        self._enter()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        plans = self._take()
        if exc_type is None and plans:
            world = self._world
            await world._run_checked(plans, world._timeout(self._timeout))

class _Slot:
    """The k-th collective of every rank of a rank-view rendezvous."""

    def __init__(self, n: int, loop: asyncio.AbstractEventLoop) -> None:
        self.parts: dict[int, tuple[str, tuple[Any, ...], dict[str, Any]]] = {}
        self.answers: list[asyncio.Future[None]] = [loop.create_future() for _ in range(n)]
        self.failed: GpuRuntimeError | None = None


class Rendezvous:
    """Matches the k-th call of every rank view into one collective, runs it, answers each
    rank with its own error (or success)."""

    def __init__(self, world: Collective) -> None:
        self._world = world
        self._next = [0] * world.nranks
        self._slots: dict[int, _Slot] = {}

    async def join(self, rank: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                   timeout: float) -> None:
        """Join rank ``rank``'s next call (``method`` with ``args``) to the other ranks'
        matching calls; return once it has run, raise this rank's error, or
        ``CollectiveAborted`` when not every rank joined within ``timeout`` seconds."""
        world = self._world
        index = self._next[rank]
        self._next[rank] += 1
        slot = self._slots.get(index)
        if slot is None:
            slot = self._slots[index] = _Slot(world.nranks, asyncio.get_running_loop())
        if slot.failed is not None:
            raise slot.failed
        slot.parts[rank] = (method, args, kwargs)
        if len(slot.parts) == world.nranks:
            del self._slots[index]
            asyncio.get_running_loop().create_task(self._run(slot, timeout))
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(slot.answers[rank])
        except TimeoutError:
            if self._slots.get(index) is slot:  # the others never came: this slot is spent
                slot.failed = CollectiveAborted(
                    f"collective {index} of world {world.name}: not every rank joined within "
                    f"{timeout:g} s")
                for answer in slot.answers:
                    if not answer.done():
                        answer.set_exception(slot.failed)
                        answer.exception()
            raise CollectiveAborted(f"rank {rank}'s collective {index} did not finish within "
                                    f"{timeout:g} s") from None

    async def _run(self, slot: _Slot, timeout: float) -> None:
        world = self._world
        methods = {m for m, _, _ in slot.parts.values()}
        errors: list[GpuRuntimeError | None]
        try:
            if len(methods) != 1:
                raise InvalidArgument(f"the ranks called different collectives: "
                                      f"{sorted(methods)}")
            planned = _plan_of(world, methods.pop(), slot.parts)
            errors = await world.execute([planned], timeout)
        except GpuRuntimeError as exc:
            errors = [exc] * world.nranks
        for answer, error in zip(slot.answers, errors, strict=True):
            if answer.done():
                continue
            if error is None:
                answer.set_result(None)
            else:
                answer.set_exception(error)
                answer.exception()


_BUFFER_ARGS = {"all_reduce": 2, "broadcast": 1, "reduce": 2, "all_gather": 2,
                "reduce_scatter": 2, "all_to_all": 2}
"""How many leading arguments of each rank-view method are that rank's buffers."""


def _plan_of(world: Collective, method: str,
             parts: dict[int, tuple[str, tuple[Any, ...], dict[str, Any]]]) -> Planned:
    """The single-controller plan of the ranks' matching calls of ``method``."""
    n, k = world.nranks, _BUFFER_ARGS[method]
    options = parts[0][1][k:]
    if any(parts[r][1][k:] != options for r in range(n)):
        raise InvalidArgument(f"the ranks called {method} with different options")
    lists: list[Any] = []
    for i in range(k):
        column = [parts[r][1][i] for r in range(n)]
        lists.append(None if all(b is None for b in column) else column)
    planner = getattr(world, f"_plan_{method}")
    planned: Planned = planner(*lists, *options)
    return planned


class CollectiveRank:
    """Rank ``index`` of a ``Collective``: the same collectives, each taking this rank's
    buffer(s); the k-th call of every rank runs as the world's k-th collective (the ranks
    must make the same calls in the same order, with the same options)."""

    def __init__(self, world: Collective, index: int) -> None:
        self.world = world
        self.index = index
        self._portal = world._portal

    async def _join(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                    timeout_secs: float | None) -> None:
        timeout = self.world._timeout(timeout_secs)
        rendezvous = self.world._rendezvous
        await self._portal.acall(rendezvous.join(self.index, method, args, kwargs, timeout))

    def all_reduce_async(self, send: GpuBuffer, recv: GpuBuffer | None = None,
                         op: str = "sum", *, timeout_secs: float | None = None,
                         ) -> Coroutine[Any, Any, None]:
        """This rank's part of ``Collective.all_reduce``."""
        return self._join("all_reduce", (send, recv, op), {}, timeout_secs)

    all_reduce = blocking(all_reduce_async)

    def broadcast_async(self, buf: GpuBuffer, root: int = 0, *,
                        timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """This rank's part of ``Collective.broadcast``."""
        return self._join("broadcast", (buf, root), {}, timeout_secs)

    broadcast = blocking(broadcast_async)

    def reduce_async(self, send: GpuBuffer, recv: GpuBuffer | None = None, root: int = 0,
                     op: str = "sum", *, timeout_secs: float | None = None,
                     ) -> Coroutine[Any, Any, None]:
        """This rank's part of ``Collective.reduce`` (``recv`` may be None but on the root)."""
        return self._join("reduce", (send, recv, root, op), {}, timeout_secs)

    reduce = blocking(reduce_async)

    def all_to_all_async(self, send: GpuBuffer, recv: GpuBuffer, *,
                         timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """This rank's part of ``Collective.all_to_all``."""
        return self._join("all_to_all", (send, recv), {}, timeout_secs)

    all_to_all = blocking(all_to_all_async)

    def all_gather_async(self, send: GpuBuffer, recv: GpuBuffer, *,
                         timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """This rank's part of ``Collective.all_gather``."""
        return self._join("all_gather", (send, recv), {}, timeout_secs)

    all_gather = blocking(all_gather_async)

    def reduce_scatter_async(self, send: GpuBuffer, recv: GpuBuffer, op: str = "sum", *,
                             timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """This rank's part of ``Collective.reduce_scatter``."""
        return self._join("reduce_scatter", (send, recv, op), {}, timeout_secs)

    reduce_scatter = blocking(reduce_scatter_async)

    def __repr__(self) -> str:
        return f"CollectiveRank({self.index} of {self.world!r})"
