"""DynamicBatchingServer: gather single requests into batches for one batch function."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from atomr_accel.actor import Props, Reply
from atomr_accel.blueprint import (
    BlueprintActor,
    BlueprintClient,
    SystemLike,
    require_positive_int,
    twins_with_old_name,
)
from atomr_accel.blueprint._actor import GetStats, Serve
from atomr_accel.blueprint._invoke import in_context, invoke
from atomr_accel.core._errors import ContextPoisoned, InvalidArgument
from atomr_accel.patterns._batch_queue import BatchQueue, OverflowPolicy
from atomr_accel.patterns._errors import BatchResultMismatch, RequestDropped, RequestRejected
from atomr_accel.patterns._isolate import Outcome, isolate

__all__ = ["BatchingStats", "DynamicBatchingServer", "split_results"]

log = logging.getLogger(__name__)

BatchFn = Callable[[list[Any]], Any]
_DEADLINE_TIMER = "batch-deadline"


@dataclass(frozen=True, slots=True)
class BatchingStats:
    """A snapshot of a ``DynamicBatchingServer``.

    ``expired`` counts requests whose caller had given up (its ask timed out)
    before their batch was flushed; they were skipped, not computed.
    ``timer_sets`` counts how often the one deadline timer was set: once per
    request that becomes the oldest (again after running batches held the
    queue back), never once per request.
    """

    queued: int
    running_batches: int
    batches: int
    completed: int
    failed: int
    rejected: int
    dropped: int
    expired: int
    timer_sets: int


def split_results(result: Any, expected: int) -> list[Any]:
    """Split a batch function's result into one value per request.

    ``result`` must be a sequence (list, tuple, NumPy array, ...) of exactly
    ``expected`` items; otherwise ``BatchResultMismatch``. Strings, bytes and
    mappings do not count as sequences here.
    """
    if (isinstance(result, str | bytes | bytearray | Mapping)
            or not hasattr(result, "__len__") or not hasattr(result, "__getitem__")):
        raise BatchResultMismatch(expected, None, f"a {type(result).__name__}, not a sequence,")
    got = len(result)
    if got != expected:
        raise BatchResultMismatch(expected, got)
    return [result[i] for i in range(expected)]


class _Request:
    __slots__ = ("item", "reply")

    def __init__(self, item: Any, reply: Reply) -> None:
        self.item = item
        self.reply = reply


@dataclass(frozen=True, slots=True)
class _Deadline:
    deadline: float


@dataclass(frozen=True, slots=True)
class _BatchDone:
    completed: int
    failed: int


class _BatchingActor(BlueprintActor):
    """Queues requests, flushes batches and answers request i with result i."""

    def __init__(self, batch_fn: BatchFn, max_batch: int, max_wait: float, queue_capacity: int,
                 overflow: OverflowPolicy, max_concurrent_batches: int) -> None:
        super().__init__()
        self.batch_fn = batch_fn
        self.queue: BatchQueue[_Request] = BatchQueue(max_batch, max_wait, queue_capacity,
                                                      overflow)
        self.max_concurrent = max_concurrent_batches
        self.loop = asyncio.get_running_loop()
        self.running = 0
        self.calling = 0
        """Batches whose first call of the batch function is under way."""
        self.isolating = 0
        """Batches that took the context down (or fell with it), waiting to be run again
        alone; no batch starts meanwhile."""
        self._quiet = asyncio.Event()
        """Set while no first call is under way."""
        self._quiet.set()
        self._alone = asyncio.Lock()
        """Held by the one batch being run again alone."""
        self.armed_for: float | None = None
        self.batches = self.completed = self.failed = 0
        self.rejected = self.dropped = self.expired = self.timer_sets = 0

    async def receive(self, message: Any) -> Any:
        """Handle submits, the deadline timer, finished batches and stats requests."""
        cls = type(message)
        if cls is Serve:
            self._submit(message.x)
        elif cls is _Deadline:
            self.armed_for = None
            self._pump(message.deadline)
        elif cls is _BatchDone:
            self.running -= 1
            self.completed += message.completed
            self.failed += message.failed
            self._pump(None)
        elif cls is GetStats:
            return BatchingStats(len(self.queue), self.running, self.batches, self.completed,
                                 self.failed, self.rejected, self.dropped, self.expired,
                                 self.timer_sets)
        else:
            self.unhandled(message)
        return None

    def _submit(self, item: Any) -> None:
        request = _Request(item, self.context.defer_reply())
        lost = self.queue.offer(request, self.loop.time())
        if lost is request:
            self.rejected += 1
            request.reply.set_exception(RequestRejected(self.context.self_ref.path,
                                                        self.queue.capacity))
            return
        if lost is not None:
            self.dropped += 1
            lost.reply.set_exception(RequestDropped(self.context.self_ref.path,
                                                    self.queue.capacity))
        elif self.armed_for is not None and len(self.queue) < self.queue.max_batch:
            return  # not full, and the timer for the (unchanged) oldest is set
        self._pump(None)

    def _pump(self, fired: float | None) -> None:
        """Start every batch that is due and may run now, then re-arm the one timer."""
        queue = self.queue
        now = self.loop.time()
        while self.running < self.max_concurrent and not self.isolating and len(queue):
            deadline = queue.deadline()
            timer_says = fired is not None and deadline is not None and deadline <= fired
            if not (timer_says or queue.is_due(now)):
                break
            batch = queue.take(self._expired)
            if batch:
                self.running += 1
                self.batches += 1
                self.start_task(self._run(batch))
        self._arm(now)

    def _expired(self, request: _Request) -> bool:
        """True (and counted) when the request's caller has given up."""
        if request.reply.done():
            self.expired += 1
            return True
        return False

    def _arm(self, now: float) -> None:
        """Keep exactly one timer, set for the oldest request's deadline (none while busy)."""
        deadline = self.queue.deadline() \
            if self.running < self.max_concurrent and not self.isolating else None
        if deadline == self.armed_for:
            return
        self.armed_for = deadline
        if deadline is None:
            self.context.cancel_timer(_DEADLINE_TIMER)
        else:
            self.timer_sets += 1
            self.context.schedule_once(max(0.0, deadline - now), _Deadline(deadline),
                                       key=_DEADLINE_TIMER)

    async def _run(self, batch: list[_Request]) -> None:
        items = [r.item for r in batch]
        try:
            try:
                outcomes: list[Outcome] = [(True, v) for v in await self._first(items)]
            except ContextPoisoned as exc:
                if in_context(self.batch_fn) is None or (
                        len(batch) == 1 and self.max_concurrent == 1):
                    raise  # (a lone request that ran alone did it)
                log.warning("a batch of %d fell with its device's context (%s): running it "
                            "again alone to find the request that took it down", len(batch),
                            exc)
                outcomes = await self._alone_again(items)
        except asyncio.CancelledError:
            error = self.stopped_error()
            for request in batch:
                request.reply.set_exception(error)
            raise
        except Exception as exc:
            outcomes = [(False, exc)] * len(batch)
        for request, (ok, value) in zip(batch, outcomes, strict=True):
            if ok:
                request.reply.set_result(value)
            else:
                request.reply.set_exception(value)
        answered = sum(ok for ok, _ in outcomes)
        self.context.self_ref.tell(_BatchDone(answered, len(batch) - answered))

    async def _first(self, items: list[Any]) -> list[Any]:
        """``_values``, counted among the first calls under way."""
        self.calling += 1
        self._quiet.clear()
        try:
            return await self._values(items)
        finally:
            self.calling -= 1
            if not self.calling:
                self._quiet.set()

    async def _alone_again(self, items: list[Any]) -> list[Outcome]:
        """Run a batch that fell with the context again, in groups (``isolate``), while no
        other batch of this server runs: a batch in flight beside the one that took the
        context down fails with it, and only runs alone tell which request did it."""
        self.isolating += 1
        try:
            async with self._alone:
                await self._quiet.wait()  # the batches in flight have ended (or wait here)
                return await isolate(self._values, items)
        finally:
            self.isolating -= 1

    async def _values(self, items: list[Any]) -> list[Any]:
        """One result per item of ``items``, from one call of the batch function."""
        return split_results(await invoke(self.batch_fn, items), len(items))

    async def post_stop(self) -> None:
        """Fail the queued requests, then cancel (and so fail) the running batches."""
        error = self.stopped_error()
        for request in self.queue.take_all():
            request.reply.set_exception(error)
        await super().post_stop()


class DynamicBatchingServer(BlueprintClient):
    """Serve single requests through a function that takes a whole batch.

    ``batch_fn(items)`` gets a list of up to ``max_batch`` items, oldest first,
    and returns one result per item in the same order (a list, tuple or array
    of that length); result *i* answers request *i*. A batch is flushed as
    soon as ``max_batch`` requests wait, or when the oldest has waited
    ``max_wait`` seconds: one timer, always set for the oldest request.

    * ``batch_fn`` may be ``async`` (awaited on the loop; the way to run it on a
      device: ``await dev.blas().matmul_async(...)``) or a plain function (run on
      a worker thread, so it never blocks the event loop), or a ``DeviceFunction``
      (or a ``functools.partial`` of one), run inside its device's context. When a
      device function's batch takes the context down (``ContextPoisoned``), the
      batch is run again on the new context in smaller groups until the request
      that did it is found: only that request fails.
    * A result that is not a sequence, or has the wrong length, fails every
      request of that batch with ``BatchResultMismatch``; an exception from
      ``batch_fn`` fails every request of that batch with that exception.
      Either way the server goes on with the next batch.
    * At most ``queue_capacity`` requests wait. When full, ``overflow="reject"``
      fails the new request with ``RequestRejected``; ``"drop_oldest"`` queues
      it and fails the oldest waiting request with ``RequestDropped``.
    * At most ``max_concurrent_batches`` batches run at once; requests keep
      queueing meanwhile and the next batch starts when one finishes. The
      default (None) is 2 for a device function (``Device.function``, which
      runs one call at a time in its context, in order: the next batch's
      inputs travel while the device computes) and 1 for any other callable
      (batches never overlap, which suits one model on one device). With more
      than one, a batch in flight beside the one that took the context down
      fails with it; every batch that fell so is run again alone (no other batch
      starts meanwhile), so only the request that did it fails.
    * A request whose caller's ask has timed out is skipped when its batch is
      formed (counted as ``expired``).
    """

    @staticmethod
    def props(batch_fn: BatchFn, *, max_batch: int, max_wait: float,
              queue_capacity: int = 1024, overflow: OverflowPolicy = "reject",
              max_concurrent_batches: int | None = None) -> Props:
        """Props for the server actor (arguments as in ``spawn``); checks them now."""
        if not callable(batch_fn):
            raise InvalidArgument(f"batch_fn must be callable, got {batch_fn!r}")
        BatchQueue[Any](max_batch, max_wait, queue_capacity, overflow)  # validates
        if max_concurrent_batches is None:
            max_concurrent_batches = 1 if in_context(batch_fn) is None else 2
        require_positive_int("max_concurrent_batches", max_concurrent_batches)
        return Props(_BatchingActor, batch_fn, max_batch, max_wait, queue_capacity, overflow,
                     max_concurrent_batches)

    @classmethod
    def spawn(cls, system: SystemLike, batch_fn: BatchFn, *, max_batch: int, max_wait: float,
              queue_capacity: int = 1024, overflow: OverflowPolicy = "reject",
              max_concurrent_batches: int | None = None, name: str | None = None,
              ) -> DynamicBatchingServer:
        """Start a server in ``system`` and return its client.

        ``spawn(system, batch_fn, *, max_batch, max_wait, queue_capacity=1024,
        overflow="reject", max_concurrent_batches=None, name=None)`` serves
        ``batch_fn`` and returns this class's client. Raises
        ``InvalidArgument`` for a bad setting (``max_batch`` < 1, a negative
        ``max_wait``, an unknown ``overflow``, ...)."""
        props = cls.props(batch_fn, max_batch=max_batch, max_wait=max_wait,
                          queue_capacity=queue_capacity, overflow=overflow,
                          max_concurrent_batches=max_concurrent_batches)
        return cls._start(system, props, name)

    async def submit_async(self, item: Any, *, timeout_secs: float | None = None) -> Any:
        """Queue ``item`` and return its result once its batch has run.

        Raises what ``batch_fn`` raised, ``BatchResultMismatch``,
        ``RequestRejected`` / ``RequestDropped`` on overflow, ``AskTimeout``
        after ``timeout_secs`` seconds and ``ActorStopped`` if the server stops first.
        """
        return await self._ask(Serve(item), timeout_secs)

    async def stats_async(self, *, timeout_secs: float | None = None) -> BatchingStats:
        """A snapshot of queue depth, running batches and counters."""
        stats: BatchingStats = await self._ask(GetStats(), timeout_secs)
        return stats

    submit, submit_blocking = twins_with_old_name(submit_async)
    stats, stats_blocking = twins_with_old_name(stats_async)
