"""Weighted fair queueing, without I/O: start/finish tags on one global virtual clock."""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from atomr_accel.blueprint import require_positive_int
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.patterns._errors import RequestRejected, UnknownTenant

__all__ = ["FairQueue", "Ticket"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True, eq=False)
class Ticket(Generic[T]):
    """One queued request: its tenant, value, cost and virtual start/finish tags."""

    tenant: Hashable
    value: T
    cost: float
    start: float
    finish: float
    seq: int


class FairQueue(Generic[T]):
    """Weighted fair queueing over tenants, with in-flight limits (no I/O).

    A request of ``cost`` from tenant ``t`` gets the start tag
    ``S = max(V, F_last(t))`` and the finish tag ``F = S + cost / weight(t)``,
    where ``V`` is the global virtual clock: the start tag of the latest
    request handed out (so a tenant that was idle earns no credit). ``pop``
    hands out the waiting request with the smallest finish tag among tenants
    under their limits, ties broken by tenant order (the order of
    ``weights``) and then by arrival. Under saturation each tenant's share of
    the completed cost tends to its share of the weights.

    ``max_in_flight`` bounds requests handed out and not yet ``done``;
    ``tenant_limits`` bounds them per tenant; ``capacity`` bounds each tenant's
    queue (``RequestRejected`` beyond it).
    """

    def __init__(self, weights: Mapping[Hashable, float], max_in_flight: int,
                 tenant_limits: Mapping[Hashable, int] | None = None,
                 capacity: int | None = None) -> None:
        if not weights:
            raise InvalidArgument("weights must name at least one tenant")
        for tenant, weight in weights.items():
            if (not isinstance(weight, int | float) or isinstance(weight, bool)
                    or not math.isfinite(weight) or weight <= 0):
                raise InvalidArgument(f"weight of {tenant!r} must be > 0, got {weight!r}")
        require_positive_int("max_in_flight", max_in_flight)
        require_positive_int("capacity", capacity, allow_none=True)
        limits = dict(tenant_limits or {})
        for tenant, limit in limits.items():
            if tenant not in weights:
                raise UnknownTenant(tenant, tuple(weights))
            require_positive_int(f"limit of {tenant!r}", limit)
        self.weights = dict(weights)
        self.max_in_flight = max_in_flight
        self.limits = limits
        self.capacity = capacity
        self.virtual_time = 0.0
        self._order = {tenant: i for i, tenant in enumerate(self.weights)}
        self._queues: dict[Hashable, deque[Ticket[T]]] = {t: deque() for t in self.weights}
        self._last_finish = dict.fromkeys(self.weights, 0.0)
        self._busy = dict.fromkeys(self.weights, 0)
        self._in_flight = 0
        self._seq = itertools.count()

    @property
    def tenants(self) -> tuple[Hashable, ...]:
        """The tenants, in tie-break order."""
        return tuple(self.weights)

    def push(self, tenant: Hashable, value: T, cost: float = 1.0) -> Ticket[T]:
        """Queue ``value`` for ``tenant``; return its ticket.

        Raises ``UnknownTenant``, ``InvalidArgument`` for a cost that is not a
        finite number > 0, and ``RequestRejected`` when the tenant's queue is full.
        """
        queue = self._queues.get(tenant)
        if queue is None:
            raise UnknownTenant(tenant, self.tenants)
        if (not isinstance(cost, int | float) or isinstance(cost, bool)
                or not math.isfinite(cost) or cost <= 0):
            raise InvalidArgument(f"cost must be a finite number > 0, got {cost!r}")
        if self.capacity is not None and len(queue) >= self.capacity:
            raise RequestRejected(f"tenant {tenant!r}", self.capacity)
        start = max(self.virtual_time, self._last_finish[tenant])
        finish = start + cost / self.weights[tenant]
        self._last_finish[tenant] = finish
        ticket = Ticket(tenant, value, float(cost), start, finish, next(self._seq))
        queue.append(ticket)
        return ticket

    def pop(self) -> Ticket[T] | None:
        """Hand out the next request, or None when the limits or empty queues forbid one."""
        if self._in_flight >= self.max_in_flight:
            return None
        best: Ticket[T] | None = None
        best_key: tuple[float, int, int] | None = None
        for tenant, queue in self._queues.items():
            if not queue or self._busy[tenant] >= self.limits.get(tenant, self.max_in_flight):
                continue
            head = queue[0]
            key = (head.finish, self._order[tenant], head.seq)
            if best_key is None or key < best_key:
                best, best_key = head, key
        if best is None:
            return None
        self._queues[best.tenant].popleft()
        self._busy[best.tenant] += 1
        self._in_flight += 1
        self.virtual_time = max(self.virtual_time, best.start)
        return best

    def done(self, ticket: Ticket[T]) -> None:
        """Mark a handed-out request finished, freeing its in-flight slot."""
        self._busy[ticket.tenant] -= 1
        self._in_flight -= 1

    def take_all(self) -> list[Ticket[T]]:
        """Remove and return every waiting request, in arrival order (for shutting down)."""
        tickets = sorted((t for q in self._queues.values() for t in q), key=lambda t: t.seq)
        for queue in self._queues.values():
            queue.clear()
        return tickets

    def queued(self, tenant: Hashable | None = None) -> int:
        """Requests waiting (for one tenant, or in all)."""
        if tenant is None:
            return sum(len(q) for q in self._queues.values())
        return len(self._queues[tenant])

    def in_flight(self, tenant: Hashable | None = None) -> int:
        """Requests handed out and not yet done (for one tenant, or in all)."""
        return self._in_flight if tenant is None else self._busy[tenant]
