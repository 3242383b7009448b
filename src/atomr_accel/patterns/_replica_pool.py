"""ModelReplicaPool: spread requests over supervised replicas of one model."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from atomr_accel.actor import ActorRef, Props, Reply, Terminated
from atomr_accel.blueprint import (
    BlueprintClient,
    SystemLike,
    require_positive_int,
    twins_with_old_name,
)
from atomr_accel.blueprint._actor import GetStats, Serve
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.patterns._errors import NoReplicaAvailable, RequestRejected
from atomr_accel.patterns._worker import ModelSpec, WorkerParent, checked_models

__all__ = ["ModelReplicaPool", "PoolPolicy", "PoolStats", "pick_replica"]

PoolPolicy = Literal["round_robin", "least_loaded"]
"""How a pool picks a replica."""


def pick_replica(policy: PoolPolicy, in_flight: Sequence[int], up: Sequence[bool],
                 cursor: int) -> int | None:
    """Pick a replica that is up, or None when none is.

    ``"round_robin"`` takes the first replica that is up from ``cursor`` on
    (wrapping around); ``"least_loaded"`` the one with the fewest requests in
    flight, the lowest index on a tie.
    """
    n = len(up)
    if policy == "round_robin":
        for step in range(n):
            index = (cursor + step) % n
            if up[index]:
                return index
        return None
    candidates = [i for i in range(n) if up[i]]
    if not candidates:
        return None
    return min(candidates, key=lambda i: (in_flight[i], i))


@dataclass(frozen=True, slots=True)
class PoolStats:
    """Per replica: requests in flight, whether it takes work, served/failed counts, restarts.

    ``pending`` counts requests waiting because no replica was up.
    """

    in_flight: tuple[int, ...]
    up: tuple[bool, ...]
    served: tuple[int, ...]
    failed: tuple[int, ...]
    restarts: tuple[int, ...]
    pending: int


@dataclass(frozen=True, slots=True)
class _Done:
    index: int
    ok: bool


class _PoolActor(WorkerParent):
    def __init__(self, replicas: Sequence[ModelSpec], policy: PoolPolicy, queue_capacity: int,
                 max_restarts: int | None, within: float | None) -> None:
        super().__init__("replica", replicas, max_restarts, within, watch=True)
        self.policy: PoolPolicy = policy
        self.capacity = queue_capacity
        n = len(self.workers)
        self.up = [False] * n
        self.alive = [True] * n
        self.in_flight = [0] * n
        self.served = [0] * n
        self.failed = [0] * n
        self.cursor = 0
        self.pending: deque[tuple[Any, Reply]] = deque()

    def worker_up(self, index: int) -> None:
        """Take replica ``index`` again, and give it the requests waiting for a replica."""
        self.up[index] = True
        self._drain()

    def worker_down(self, index: int) -> None:
        """Skip replica ``index`` until it is up again."""
        self.up[index] = False

    async def serve(self, message: Any) -> Any:
        """Handle calls, finished calls, stopped replicas and stats."""
        cls = type(message)
        if cls is Serve:
            self._dispatch(message.x, self.context.defer_reply())
        elif cls is _Done:
            self.in_flight[message.index] -= 1
            (self.served if message.ok else self.failed)[message.index] += 1
        elif cls is Terminated:
            self._replica_stopped(message.ref)
        elif cls is GetStats:
            return PoolStats(tuple(self.in_flight), tuple(self.up), tuple(self.served),
                             tuple(self.failed), tuple(self.restarts), len(self.pending))
        else:
            self.unhandled(message)
        return None

    def _dispatch(self, x: Any, reply: Reply) -> None:
        if not any(self.alive):
            reply.set_exception(NoReplicaAvailable(
                f"{self.context.self_ref.path}: every replica has stopped"))
            return
        index = pick_replica(self.policy, self.in_flight, self.up, self.cursor)
        if index is None:  # all are (re)starting: wait for one
            if len(self.pending) >= self.capacity:
                reply.set_exception(RequestRejected(self.context.self_ref.path, self.capacity))
            else:
                self.pending.append((x, reply))
            return
        self.cursor = index + 1
        self.in_flight[index] += 1
        self.start_task(self._call(index, x, reply))

    def _drain(self) -> None:
        while self.pending and any(self.up):
            x, reply = self.pending.popleft()
            if not reply.done():
                self._dispatch(x, reply)

    def _replica_stopped(self, ref: ActorRef) -> None:
        index = next((i for i, w in enumerate(self.workers) if w is ref), None)
        if index is None:
            return
        self.up[index] = False
        self.alive[index] = False
        if not any(self.alive):
            error = NoReplicaAvailable(f"{self.context.self_ref.path}: every replica has stopped")
            while self.pending:
                self.pending.popleft()[1].set_exception(error)

    async def _call(self, index: int, x: Any, reply: Reply) -> None:
        ok = await self.answer(reply, self.ask_worker(index, x))
        self.context.self_ref.tell(_Done(index, ok=ok))

    async def post_stop(self) -> None:
        """Fail the requests waiting for a replica, then the running ones."""
        error = self.stopped_error()
        while self.pending:
            self.pending.popleft()[1].set_exception(error)
        await super().post_stop()


class ModelReplicaPool(BlueprintClient):
    """Serve requests on several replicas of a model, each a supervised child actor.

    Each replica (``replica-0``, ...) runs one call at a time; the pool picks
    one per request by ``policy``: ``"round_robin"``, or ``"least_loaded"`` by
    its real count of requests in flight (dispatched and not yet answered; the
    count goes down when the call finishes, also when it fails).

    A replica whose model raises fails that request with the same exception
    and is restarted by supervision (a ``Reloadable`` model is loaded again);
    from its failure until it is up again the pool skips it. Requests already
    in its mailbox are served after the restart. Past ``max_restarts`` restarts
    in ``within`` seconds the replica stops for good; when every replica has
    stopped, requests fail with ``NoReplicaAvailable``. While no replica is up
    (all starting or restarting) up to ``queue_capacity`` requests wait in the
    pool; beyond that they fail with ``RequestRejected``.
    """

    @staticmethod
    def props(replicas: Sequence[ModelSpec], *, policy: PoolPolicy = "round_robin",
              queue_capacity: int = 1024, max_restarts: int | None = 10,
              within: float | None = 60.0) -> Props:
        """Props for the pool actor (arguments as in ``spawn``); checks them now."""
        replicas = checked_models("a replica pool", "replica", replicas)
        if policy not in get_args(PoolPolicy):
            raise InvalidArgument(
                f"policy must be 'round_robin' or 'least_loaded', got {policy!r}")
        require_positive_int("queue_capacity", queue_capacity)
        return Props(_PoolActor, replicas, policy, queue_capacity, max_restarts, within)

    @classmethod
    def spawn(cls, system: SystemLike, replicas: Sequence[ModelSpec], *,
              policy: PoolPolicy = "round_robin", queue_capacity: int = 1024,
              max_restarts: int | None = 10, within: float | None = 60.0,
              name: str | None = None) -> ModelReplicaPool:
        """Start a ModelReplicaPool in ``system`` and return its client.

        ``spawn(system, replicas, *, policy="round_robin", queue_capacity=1024,
        max_restarts=10, within=60.0, name=None)`` runs ``replicas`` and returns
        this class's client. Raises ``InvalidArgument`` for a bad setting."""
        props = cls.props(replicas, policy=policy, queue_capacity=queue_capacity,
                          max_restarts=max_restarts, within=within)
        return cls._start(system, props, name)

    async def call_async(self, x: Any, *, timeout_secs: float | None = None) -> Any:
        """Run ``model(x)`` on a replica and return its result.

        Raises what the model raised, ``NoReplicaAvailable``,
        ``RequestRejected``, ``AskTimeout`` or ``ActorStopped``.
        """
        return await self._ask(Serve(x), timeout_secs)

    async def stats_async(self, *, timeout_secs: float | None = None) -> PoolStats:
        """In-flight counts, up flags, served/failed counts and restarts per replica."""
        stats: PoolStats = await self._ask(GetStats(), timeout_secs)
        return stats

    call, call_blocking = twins_with_old_name(call_async)
    stats, stats_blocking = twins_with_old_name(stats_async)
