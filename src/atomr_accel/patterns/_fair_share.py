"""FairShareScheduler: share one model between tenants by weight."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from atomr_accel.actor import Props, Reply
from atomr_accel.blueprint import (
    BlueprintActor,
    BlueprintClient,
    SystemLike,
    twins_with_old_name,
)
from atomr_accel.blueprint._actor import GetStats
from atomr_accel.blueprint._invoke import invoke
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.patterns._errors import PatternError
from atomr_accel.patterns._fair_queue import FairQueue, Ticket

__all__ = ["FairShareScheduler", "FairShareStats"]


@dataclass(frozen=True, slots=True)
class FairShareStats:
    """Per tenant: queued, in flight, completed requests and completed cost; the virtual clock."""

    virtual_time: float
    queued: Mapping[Hashable, int]
    in_flight: Mapping[Hashable, int]
    completed: Mapping[Hashable, int]
    completed_cost: Mapping[Hashable, float]


@dataclass(frozen=True, slots=True)
class _Submit:
    tenant: Hashable
    item: Any
    cost: float


@dataclass(frozen=True, slots=True)
class _Done:
    ticket: Ticket[tuple[Any, Reply]]


class _FairShareActor(BlueprintActor):
    def __init__(self, fn: Callable[[Any], Any], weights: Mapping[Hashable, float],
                 max_in_flight: int, tenant_limits: Mapping[Hashable, int] | None,
                 queue_capacity: int | None) -> None:
        super().__init__()
        self.fn = fn
        self.queue: FairQueue[tuple[Any, Reply]] = FairQueue(
            weights, max_in_flight, tenant_limits, queue_capacity)
        queue = self.queue
        self.completed = dict.fromkeys(queue.tenants, 0)
        self.completed_cost = dict.fromkeys(queue.tenants, 0.0)

    async def receive(self, message: Any) -> Any:
        """Handle submits, finished requests and stats."""
        cls = type(message)
        if cls is _Submit:
            reply = self.context.defer_reply()
            try:
                self.queue.push(message.tenant, (message.item, reply), message.cost)
            except (PatternError, InvalidArgument) as exc:
                reply.set_exception(exc)
            self._pump()
        elif cls is _Done:
            ticket = message.ticket
            self.queue.done(ticket)
            self.completed[ticket.tenant] += 1
            self.completed_cost[ticket.tenant] += ticket.cost
            self._pump()
        elif cls is GetStats:
            q = self.queue
            return FairShareStats(
                q.virtual_time, {t: q.queued(t) for t in q.tenants},
                {t: q.in_flight(t) for t in q.tenants}, dict(self.completed),
                dict(self.completed_cost))
        else:
            self.unhandled(message)
        return None

    def _pump(self) -> None:
        while (ticket := self.queue.pop()) is not None:
            if ticket.value[1].done():  # the caller gave up while it waited
                self.queue.done(ticket)
                continue
            self.start_task(self._run(ticket))

    async def _run(self, ticket: Ticket[tuple[Any, Reply]]) -> None:
        item, reply = ticket.value
        await self.answer(reply, invoke(self.fn, item))
        self.context.self_ref.tell(_Done(ticket))

    async def post_stop(self) -> None:
        """Fail every queued request, then the running ones."""
        error = self.stopped_error()
        for ticket in self.queue.take_all():
            ticket.value[1].set_exception(error)
        await super().post_stop()


class FairShareScheduler(BlueprintClient):
    """Run ``fn(item)`` for many tenants, sharing it by weight (weighted fair queueing).

    Each request carries a tenant and a ``cost`` (default 1). Requests are
    handed to ``fn`` in the order of ``FairQueue``: smallest virtual finish
    tag first on one global virtual clock, ties broken by tenant order (the
    order of ``weights``) then arrival. At most ``max_in_flight`` requests run
    at once, and at most ``tenant_limits[t]`` of tenant ``t``. Under
    saturation each tenant's share of the completed cost follows its share of
    the weights. ``fn`` may be sync (run on a worker thread) or async. Each
    tenant queues at most ``queue_capacity`` requests (``RequestRejected``
    beyond); an unknown tenant gets ``UnknownTenant``.
    """

    @staticmethod
    def props(fn: Callable[[Any], Any], *, weights: Mapping[Hashable, float],
              max_in_flight: int, tenant_limits: Mapping[Hashable, int] | None = None,
              queue_capacity: int | None = 1024) -> Props:
        """Props for the scheduler actor (arguments as in ``spawn``); checks them now."""
        if not callable(fn):
            raise InvalidArgument(f"fn must be callable, got {fn!r}")
        FairQueue[Any](weights, max_in_flight, tenant_limits, queue_capacity)  # validates
        return Props(_FairShareActor, fn, dict(weights), max_in_flight,
                     None if tenant_limits is None else dict(tenant_limits), queue_capacity)

    @classmethod
    def spawn(cls, system: SystemLike, fn: Callable[[Any], Any], *,
              weights: Mapping[Hashable, float], max_in_flight: int,
              tenant_limits: Mapping[Hashable, int] | None = None,
              queue_capacity: int | None = 1024, name: str | None = None,
              ) -> FairShareScheduler:
        """Start a FairShareScheduler in ``system`` and return its client.

        ``spawn(system, fn, *, weights, max_in_flight, tenant_limits=None,
        queue_capacity=1024, name=None)`` shares ``fn`` and returns this class's
        client. Raises ``InvalidArgument`` for a bad setting."""
        props = cls.props(fn, weights=weights, max_in_flight=max_in_flight,
                          tenant_limits=tenant_limits, queue_capacity=queue_capacity)
        return cls._start(system, props, name)

    async def submit_async(self, tenant: Hashable, item: Any, *, cost: float = 1.0,
                     timeout_secs: float | None = None) -> Any:
        """Queue ``item`` for ``tenant`` and return ``fn(item)`` once it has run.

        Raises what ``fn`` raised, ``UnknownTenant``, ``RequestRejected``,
        ``InvalidArgument`` (bad cost), ``AskTimeout`` or ``ActorStopped``.
        """
        return await self._ask(_Submit(tenant, item, cost), timeout_secs)

    async def stats_async(self, *, timeout_secs: float | None = None) -> FairShareStats:
        """Queued, in-flight and completed figures per tenant, and the virtual clock."""
        stats: FairShareStats = await self._ask(GetStats(), timeout_secs)
        return stats

    submit, submit_blocking = twins_with_old_name(submit_async)
    stats, stats_blocking = twins_with_old_name(stats_async)
