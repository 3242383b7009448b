"""SharedGpuStateCoordinator: write and read leases on shared device state, with fencing
tokens, lease expiry, FIFO waiters and release on the holder's death."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Coroutine
from itertools import count
from typing import Any

from atomr_accel.actor import ActorRef, Props, Reply, Terminated
from atomr_accel.agents._lease import (
    _ANSWER_GRACE,
    _SWEEP,
    ACQUIRE_TIMEOUT,
    CALL_TIMEOUT,
    LEASE_SECS,
    READ,
    WRITE,
    CoordinatorStats,
    LeaseInfo,
    LeaseOwnerStopped,
    LeaseTimeout,
    StaleLeaseToken,
    _Acquire,
    _Check,
    _Fenced,
    _FencedDone,
    _GiveUp,
    _Lease,
    _Release,
    _Renew,
    _Sweep,
    _Tokens,
    _Waiter,
)
from atomr_accel.blueprint import (
    BlueprintActor,
    BlueprintClient,
    SystemLike,
    require_timeout,
    require_wait,
    twin,
)
from atomr_accel.blueprint._actor import GetStats
from atomr_accel.blueprint._invoke import invoke
from atomr_accel.core._errors import InvalidArgument

__all__ = ["SharedGpuStateCoordinator"]


class _CoordinatorActor(BlueprintActor):
    def __init__(self, lease_secs: float, clock: Callable[[], float], tokens: _Tokens) -> None:
        super().__init__()
        self.tokens = tokens
        self.lease_secs = lease_secs
        self.clock = clock
        self.leases: dict[int, _Lease] = {}
        self.writer: int | None = None
        self.queue: deque[_Waiter] = deque()
        self.waiter_ids = count(1)
        self.owners: dict[ActorRef, int] = {}  # leases and waiters per watched owner
        self.granted = self.expired = self.released = self.owner_releases = 0
        self.stale_releases = self.timeouts = self.refused = 0

    async def pre_start(self) -> None:
        """Sweep expired leases periodically, so waiters move on without other traffic."""
        self.context.schedule_repeatedly(min(self.lease_secs / 4, 1.0), _SWEEP, key="sweep")

    async def receive(self, message: Any) -> Any:
        """Expire what is due, then handle one request."""
        self._sweep()
        answer: Any = None
        cls = type(message)
        if cls is _Acquire:
            self._acquire(message)
        elif cls is _Release:
            answer = self._release(message.token, message.mode)
        elif cls is _Renew or cls is _Check:
            self._renew_or_check(message)
        elif cls is _Fenced:
            self._fenced(message)
        elif cls is _FencedDone:
            lease = self.leases.get(message.token)
            if lease is not None:
                lease.pinned -= 1
                if message.renew:
                    lease.expires_at = max(lease.expires_at, self.clock() + self.lease_secs)
        elif cls is _GiveUp:
            self._give_up(message.waiter_id, message.timed_out)
        elif cls is Terminated:
            self._owner_stopped(message.ref)
        elif cls is GetStats:
            answer = self._stats()
        elif cls is not _Sweep:
            self.unhandled(message)
        self._grant()
        return answer

    # -------------------------------------------------------------- acquiring

    def _acquire(self, request: _Acquire) -> None:
        reply = self.context.defer_reply()
        waiter = _Waiter(next(self.waiter_ids), request.agent_id, request.mode, request.owner,
                         reply)
        if request.owner is not None:
            self._hold_owner(request.owner)
        self.queue.append(waiter)
        me = self.context.self_ref
        self.context.schedule_once(request.timeout_secs, _GiveUp(waiter.id, True),
                                   key=("acquire", waiter.id))
        reply.when_abandoned(lambda: me.tell(_GiveUp(waiter.id, False)))

    def _grant(self) -> None:
        """Serve the queue's head while it fits: FIFO, readers together, a writer alone."""
        while self.queue:
            waiter = self.queue[0]
            if waiter.reply.done():  # its asker gave up; _GiveUp is on its way
                self._drop_waiter(waiter)
                continue
            if self.writer is not None or (waiter.mode == WRITE and self.leases):
                return
            self._drop_waiter(waiter)
            self.tokens.last += 1
            token = self.tokens.last
            lease = _Lease(token, waiter.agent_id, waiter.mode, waiter.owner,
                           self.clock() + self.lease_secs)
            self.leases[token] = lease
            if waiter.mode == WRITE:
                self.writer = token
            if waiter.owner is not None:
                self._hold_owner(waiter.owner)
            self.granted += 1
            waiter.reply.set_result(token)

    def _drop_waiter(self, waiter: _Waiter) -> None:
        self.queue.remove(waiter)
        self.context.cancel_timer(("acquire", waiter.id))
        if waiter.owner is not None:
            self._let_owner_go(waiter.owner)

    def _give_up(self, waiter_id: int, timed_out: bool) -> None:
        for waiter in self.queue:
            if waiter.id == waiter_id:
                self._drop_waiter(waiter)
                if timed_out:
                    self.timeouts += 1
                    waiter.reply.set_exception(LeaseTimeout(
                        f"{waiter.mode} lease for agent {waiter.agent_id!r} not granted in time "
                        f"(held: {self._holders()})"))
                return

    # ------------------------------------------------------ leases and tokens

    def _renew_or_check(self, request: _Renew | _Check) -> None:
        """Answer the lease's info (renewed first for ``_Renew``), or ``StaleLeaseToken``
        (a refusal is an answer, not a failure of the coordinator)."""
        reply = self.context.defer_reply()
        try:
            lease = self._live(request.token)
        except StaleLeaseToken as exc:
            reply.set_exception(exc)
            return
        if type(request) is _Renew:
            lease.expires_at = self.clock() + self.lease_secs
        reply.set_result(self._info(lease))

    def _live(self, token: int) -> _Lease:
        lease = self.leases.get(token)
        if lease is None:
            self.refused += 1
            raise StaleLeaseToken(token, self._why_not(token))
        return lease

    def _why_not(self, token: int) -> str:
        if 0 < token <= self.tokens.last:
            return "it was released or expired"
        return "no lease has had it"

    def _info(self, lease: _Lease) -> LeaseInfo:
        return LeaseInfo(lease.token, lease.agent_id, lease.mode,
                         max(0.0, lease.expires_at - self.clock()))

    def _release(self, token: int, mode: str) -> bool:
        lease = self.leases.get(token)
        if lease is None or lease.mode != mode:
            self.stale_releases += 1
            return False
        self._drop_lease(lease)
        self.released += 1
        return True

    def _drop_lease(self, lease: _Lease) -> None:
        del self.leases[lease.token]
        if self.writer == lease.token:
            self.writer = None
        if lease.owner is not None:
            self._let_owner_go(lease.owner)

    def _sweep(self) -> None:
        now = self.clock()
        for lease in [le for le in self.leases.values() if not le.pinned and le.expires_at <= now]:
            self._drop_lease(lease)
            self.expired += 1

    def _fenced(self, request: _Fenced) -> None:
        reply = self.context.defer_reply()
        try:
            lease = self._live(request.token)
            if lease.mode != WRITE:
                self.refused += 1
                raise StaleLeaseToken(request.token, "it is a read lease")
        except StaleLeaseToken as exc:
            reply.set_exception(exc)
            return
        lease.pinned += 1
        self.start_task(self._run_fenced(request, reply))

    async def _run_fenced(self, request: _Fenced, reply: Reply) -> None:
        limit = asyncio.timeout(request.timeout_secs)
        try:
            async with limit:
                result = await invoke(request.fn, *request.args)
        except asyncio.CancelledError:
            reply.set_exception(self.stopped_error())
            raise
        except Exception as exc:
            reply.set_exception(LeaseTimeout(f"the fenced call under lease {request.token} ran "
                                             f"past {request.timeout_secs} s")
                                if limit.expired() else exc)
        else:
            reply.set_result(result)
        finally:
            self.context.self_ref.tell(_FencedDone(request.token, renew=not limit.expired()))

    # ------------------------------------------------------------- owners

    def _hold_owner(self, owner: ActorRef) -> None:
        if owner not in self.owners:
            self.owners[owner] = 0
            self.context.watch(owner)
        self.owners[owner] += 1

    def _let_owner_go(self, owner: ActorRef) -> None:
        left = self.owners.get(owner, 0) - 1
        if left > 0:
            self.owners[owner] = left
        elif owner in self.owners:
            del self.owners[owner]
            self.context.unwatch(owner)

    def _owner_stopped(self, owner: ActorRef) -> None:
        self.owners.pop(owner, None)
        for lease in [le for le in self.leases.values() if le.owner == owner]:
            lease.owner = None
            self._drop_lease(lease)
            self.owner_releases += 1
        for waiter in [w for w in self.queue if w.owner == owner]:
            waiter.owner = None
            self._drop_waiter(waiter)
            waiter.reply.set_exception(LeaseOwnerStopped(
                f"the owner {owner.path} of agent {waiter.agent_id!r}'s acquire stopped"))

    # -------------------------------------------------------------- stats

    def _holders(self) -> str:
        if not self.leases:
            return "none"
        return ", ".join(f"{le.mode} {le.token} by {le.agent_id!r}" for le in self.leases.values())

    def _stats(self) -> CoordinatorStats:
        readers = tuple(t for t, le in self.leases.items() if le.mode == READ)
        return CoordinatorStats(self.writer, readers, len(self.queue), self.tokens.last,
                                self.granted, self.expired, self.released, self.owner_releases,
                                self.stale_releases, self.timeouts, self.refused)

    async def post_stop(self) -> None:
        """Fail the queued acquires and running fenced calls."""
        await super().post_stop()
        error = self.stopped_error()
        for waiter in self.queue:
            waiter.reply.set_exception(error)
        self.queue.clear()


def _agent(agent_id: object) -> str | int:
    if isinstance(agent_id, bool) or not isinstance(agent_id, str | int):
        raise InvalidArgument(f"agent_id must be a str or an int, got {agent_id!r}")
    return agent_id


def _token(token: object) -> int:
    if isinstance(token, bool) or not isinstance(token, int):
        raise InvalidArgument(f"token must be an int, got {token!r}")
    return token


def _owner(owner: object) -> ActorRef | None:
    if owner is not None and not isinstance(owner, ActorRef):
        raise InvalidArgument(f"owner must be an ActorRef or None, got {owner!r}")
    return owner


class SharedGpuStateCoordinator(BlueprintClient):
    """Leases on shared device state: one writer or many readers at a time.

    * ``acquire_write`` / ``acquire_read`` wait in one FIFO queue and return a
      token; read leases are shared, a write lease excludes every other
      lease. The queue's head is served as soon as it fits, and readers behind
      a waiting writer wait behind it, so neither readers nor writers starve
      (FIFO fairness; consecutive readers are granted together).
    * Tokens are fencing tokens: every lease, read or write, gets a token
      greater than every earlier one. ``check(token)`` and ``fenced(token, fn)``
      refuse a token that is not a live lease with ``StaleLeaseToken``, so a
      holder whose lease expired cannot write.
    * A lease not renewed (``renew``) within ``lease_secs`` of the coordinator's
      ``clock`` expires and the next waiter proceeds; expiry is checked on
      every request and periodically.
    * Given ``owner=`` (an ``ActorRef`` of the same actor system), a lease is
      released when that actor stops (death watch), and a queued acquire fails
      with ``LeaseOwnerStopped``.
    * Releasing a stale or unknown token is a counted no-op.

    Methods are ``name_async`` (awaitable on any event loop) with blocking
    twins ``name`` (for a coordinator spawned in a facade ``System``).
    """

    @staticmethod
    def props(lease_secs: float = LEASE_SECS, clock: Callable[[], float] | None = None) -> Props:
        """Props for the coordinator actor (see ``spawn``)."""
        require_wait("lease_secs", lease_secs)
        if lease_secs <= 0:
            raise InvalidArgument(f"lease_secs must be > 0, got {lease_secs!r}")
        if clock is not None and not callable(clock):
            raise InvalidArgument(f"clock must be a callable returning seconds, got {clock!r}")
        return Props(_CoordinatorActor, float(lease_secs), clock or time.monotonic, _Tokens())

    @classmethod
    def spawn(cls, system: SystemLike, name: str | None = None, *,
              lease_secs: float = LEASE_SECS,
              clock: Callable[[], float] | None = None) -> SharedGpuStateCoordinator:
        """Start a coordinator in ``system`` and return its client.

        ``lease_secs``: how long a lease lives without ``renew``. ``clock``: a
        callable returning monotonic seconds (default ``time.monotonic``);
        tests inject one to control expiry. Acquire time-outs use real time.
        """
        return cls._start(system, cls.props(lease_secs, clock), name)

    def acquire_write_async(self, agent_id: str | int, timeout_secs: float = ACQUIRE_TIMEOUT,
                            *, owner: ActorRef | None = None) -> Coroutine[Any, Any, int]:
        """Wait for the write lease; return its token (an int > 0, greater than every
        earlier token).

        Raises ``LeaseTimeout`` after ``timeout_secs`` (the queue behind keeps
        its order), ``LeaseOwnerStopped`` if ``owner`` stops first.
        """
        return self._acquire(agent_id, WRITE, timeout_secs, owner)

    acquire_write = twin(acquire_write_async)

    def acquire_read_async(self, agent_id: str | int, timeout_secs: float = ACQUIRE_TIMEOUT,
                           *, owner: ActorRef | None = None) -> Coroutine[Any, Any, int]:
        """Wait for a shared read lease; return its token (as ``acquire_write_async``)."""
        return self._acquire(agent_id, READ, timeout_secs, owner)

    acquire_read = twin(acquire_read_async)

    def _acquire(self, agent_id: object, mode: str, timeout_secs: object, owner: object,
                 ) -> Coroutine[Any, Any, int]:
        request = _Acquire(_agent(agent_id), mode, _owner(owner), require_timeout(timeout_secs))
        return self._call(request, request.timeout_secs + _ANSWER_GRACE, f"acquire_{mode}")

    def release_write_async(self, token: int,
                            timeout_secs: float = CALL_TIMEOUT,
                            ) -> Coroutine[Any, Any, bool]:
        """Release the write lease ``token``; return True, or False for a stale or unknown
        token (a counted no-op)."""
        return self._call(_Release(_token(token), WRITE),
                          require_timeout(timeout_secs), "release_write")

    def release_read_async(self, token: int,
                           timeout_secs: float = CALL_TIMEOUT,
                           ) -> Coroutine[Any, Any, bool]:
        """Release the read lease ``token``; True, or False for a stale token (a no-op)."""
        return self._call(_Release(_token(token), READ),
                          require_timeout(timeout_secs), "release_read")

    def release_write(self, token: int) -> None:
        """Release the write lease ``token`` and return at once (the original's
        fire-and-forget); a stale token is a counted no-op."""
        self.ref.tell(_Release(_token(token), WRITE))

    def release_read(self, token: int) -> None:
        """Release the read lease ``token`` and return at once; a stale token is a no-op."""
        self.ref.tell(_Release(_token(token), READ))

    def renew_async(self, token: int,
                    timeout_secs: float = CALL_TIMEOUT,
                    ) -> Coroutine[Any, Any, LeaseInfo]:
        """Restart the lease's ``lease_secs``; return its ``LeaseInfo``.

        Raises ``StaleLeaseToken`` if the lease is no longer live.
        """
        return self._call(_Renew(_token(token)), require_timeout(timeout_secs), "renew")

    renew = twin(renew_async)

    def check_async(self, token: int,
                    timeout_secs: float = CALL_TIMEOUT,
                    ) -> Coroutine[Any, Any, LeaseInfo]:
        """Return the live lease's ``LeaseInfo``; raise ``StaleLeaseToken`` if it is not live."""
        return self._call(_Check(_token(token)), require_timeout(timeout_secs), "check")

    check = twin(check_async)

    def fenced_async(self, token: int, fn: Callable[..., Any], *args: Any,
                     timeout_secs: float = ACQUIRE_TIMEOUT) -> Coroutine[Any, Any, Any]:
        """Return ``fn(*args)`` (sync on a worker thread, or async), run only if ``token``
        is the live write lease; it does not expire while ``fn`` runs.

        Raises ``StaleLeaseToken`` (``fn`` not called) otherwise, what ``fn``
        raised, or ``LeaseTimeout`` past ``timeout_secs`` (the lease may then
        expire: an async ``fn`` is cancelled, a sync one cannot be stopped, so
        keep fenced calls short).
        """
        if not callable(fn):
            raise InvalidArgument(f"fn must be callable, got {fn!r}")
        timeout = require_timeout(timeout_secs)
        return self._call(_Fenced(_token(token), fn, args, timeout),
                          timeout + _ANSWER_GRACE, "fenced")

    fenced = twin(fenced_async)

    def stats_async(self, timeout_secs: float = CALL_TIMEOUT,
                    ) -> Coroutine[Any, Any, CoordinatorStats]:
        """The coordinator's ``CoordinatorStats``."""
        return self._call(GetStats(), require_timeout(timeout_secs), "stats")

    stats = twin(stats_async)
