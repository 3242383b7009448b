"""Stream pipelines: a ``Source``, stages (``stage``, ``gpu_stage``), a ``Sink``.

Elements travel in chunks (up to ``chunk`` elements, never waiting to fill one)
through bounded queues, so back-pressure holds end to end: a slow stage stops
the source once ``window`` chunks are between the source and the sink. Output
keeps the source's order (hence every key's order). A stage's call that raises
is retried up to the stage's ``retries``; past that the stream fails with that
error, every stage is cancelled and nothing is left running. Cancelling
``run`` cancels every stage the same way. User code (stages, sinks, sources)
may raise any ``BaseException``: one that is no ``Exception`` fails the stream
as ``UserCodeError`` (``atomr_accel.blueprint._invoke.call_here``).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from atomr_accel.actor import user_code
from atomr_accel.blueprint._invoke import call_here
from atomr_accel.core._errors import InvalidArgument, UserCodeError

if TYPE_CHECKING:
    from atomr_accel.facade._device import Device

__all__ = ["Pipeline", "Sink", "Source", "Stage", "gpu_stage", "stage"]

T = TypeVar("T")

_END: Any = object()


class Source(Generic[T]):
    """Where a stream's elements come from: ``Source.of`` (an iterable),
    ``Source.from_async`` (an async iterable) or ``Source.from_queue`` (an
    ``asyncio.Queue``, ended by putting ``end``)."""

    def __init__(self, chunks: Callable[[int], AsyncGenerator[list[T], None]]) -> None:
        self._chunks = chunks

    @classmethod
    def of(cls, items: Iterable[T]) -> Source[T]:
        """The elements of ``items``, in order."""

        async def chunks(size: int) -> AsyncGenerator[list[T], None]:
            it = iter(items)
            while chunk := list(itertools.islice(it, size)):
                yield chunk

        return cls(chunks)

    @classmethod
    def from_async(cls, items: AsyncIterable[T]) -> Source[T]:
        """The elements of an async iterable, in order (one at a time)."""

        async def chunks(size: int) -> AsyncGenerator[list[T], None]:
            try:
                async for item in items:
                    yield [item]
            finally:  # the stream ended, failed or was cancelled: close what it consumed
                close = getattr(items, "aclose", None)
                if close is not None:
                    await close()

        return cls(chunks)

    @classmethod
    def from_queue(cls, queue: asyncio.Queue[Any], end: Any = None) -> Source[Any]:
        """What is put on ``queue``, until ``end`` is put (what is queued already travels
        together, never waiting to fill a chunk)."""

        async def chunks(size: int) -> AsyncGenerator[list[Any], None]:
            while (item := await queue.get()) is not end:
                chunk = [item]
                while len(chunk) < size and not queue.empty():
                    item = queue.get_nowait()
                    if item is end:
                        yield chunk
                        return
                    chunk.append(item)
                yield chunk

        return cls(chunks)

    def chunks(self, size: int) -> AsyncGenerator[list[T], None]:
        """A fresh iterator over the elements, in lists of at most ``size``."""
        return self._chunks(size)


@dataclass(frozen=True)
class Stage:
    """One step of a pipeline: ``fn(element)`` (sync or async) on ``parallelism`` workers,
    each call retried up to ``retries`` times when it raises."""

    fn: Callable[[Any], Any]
    parallelism: int = 1
    retries: int = 0
    name: str = "stage"

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise InvalidArgument(f"a stage needs a callable, got {self.fn!r}")
        if isinstance(self.parallelism, bool) or not isinstance(self.parallelism, int) \
                or self.parallelism < 1:
            raise InvalidArgument(f"parallelism must be an int >= 1, got {self.parallelism!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) \
                or self.retries < 0:
            raise InvalidArgument(f"retries must be an int >= 0, got {self.retries!r}")


def stage(fn: Callable[[Any], Any], parallelism: int = 1, retries: int = 0,
          name: str | None = None) -> Stage:
    """A stage that calls ``fn(element)`` (a plain or an async function)."""
    return Stage(fn, parallelism, retries, name or str(getattr(fn, "__name__", "stage")))


def gpu_stage(fn: Callable[[Device, Any], Any], device: Device, parallelism: int = 1,
              retries: int = 0, name: str | None = None) -> Stage:
    """A stage bound to ``device``: it calls ``fn(device, element)`` (typically an async
    function awaiting the device's ``_async`` methods)."""

    def bound(element: Any) -> Any:
        return fn(device, element)

    return Stage(bound, parallelism, retries, name or str(getattr(fn, "__name__", "gpu_stage")))


@dataclass(frozen=True)
class Sink:
    """Where a stream's results go: ``Sink.to_list()`` collects them (``run`` returns the
    list); ``Sink.foreach(fn)`` calls ``fn(result)`` for each, in order, and awaits what
    it returns if that is awaitable (an async function, ``lambda r: queue.put(r)``)."""

    fn: Callable[[Any], Any] | None = None

    @classmethod
    def to_list(cls) -> Sink:
        """Collect the results; ``run`` returns them as a list."""
        return cls(None)

    @classmethod
    def foreach(cls, fn: Callable[[Any], Any]) -> Sink:
        """Call ``fn`` on each result in order; ``run`` returns how many there were."""
        return cls(fn)


@dataclass
class _Stats:
    retried: int = 0
    in_flight_peak: int = 0


@dataclass
class Pipeline:
    """``source`` through ``stages`` into ``sink``; ``await pipeline.run()`` runs it once.

    ``chunk`` bounds the elements that travel together; ``window`` the chunks
    between the source and the sink at once (memory stays within ``chunk *
    window`` elements plus what the stages hold).
    """

    source: Source[Any]
    stages: list[Stage]
    sink: Sink = field(default_factory=Sink.to_list)
    chunk: int = 64
    window: int = 16
    stats: _Stats = field(default_factory=_Stats)

    def __post_init__(self) -> None:
        self.stages = list(self.stages)
        if not all(isinstance(s, Stage) for s in self.stages):
            raise InvalidArgument("stages must be made with stage() or gpu_stage()")
        if self.chunk < 1 or self.window < 1:
            raise InvalidArgument("chunk and window must be >= 1")

    async def run(self) -> Any:
        """Run the stream to its end: the sink's list, or how many results it took. Raises
        the error of an element that failed past its retries (every stage stopped)."""
        window = asyncio.Semaphore(self.window)
        queues: list[asyncio.Queue[Any]] = [asyncio.Queue(self.window)
                                            for _ in range(len(self.stages) + 1)]
        error: BaseException | None = None
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._feed(queues[0], window))
                for i, step in enumerate(self.stages):
                    left = [step.parallelism]
                    for _ in range(step.parallelism):
                        group.create_task(self._work(step, queues[i], queues[i + 1], left))
                drained = group.create_task(self._drain(queues[-1], window))
        except BaseExceptionGroup as failed:
            error = _first(failed)
        if error is not None:  # raised as it is: its own cause (and context) kept
            raise error
        return drained.result()

    async def _feed(self, out: asyncio.Queue[Any], window: asyncio.Semaphore) -> None:
        seq = 0
        async with contextlib.aclosing(self.source.chunks(self.chunk)) as chunks:
            while True:
                await window.acquire()  # back-pressure: at most ``window`` chunks in flight
                try:
                    with user_code("the source", UserCodeError):
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                await out.put((seq, chunk))
                seq += 1
        await out.put(_END)

    async def _work(self, step: Stage, inp: asyncio.Queue[Any], out: asyncio.Queue[Any],
                    left: list[int]) -> None:
        while (item := await inp.get()) is not _END:
            seq, elements = item
            results = []
            for element in elements:
                results.append(await self._call(step, element))
            await out.put((seq, results))
        await inp.put(_END)  # the next worker of this stage sees the end too
        left[0] -= 1
        if left[0] == 0:
            await out.put(_END)

    async def _call(self, step: Stage, element: Any) -> Any:
        attempt = 0
        while True:
            try:
                return await call_here(step.fn, element)
            except Exception:
                if attempt >= step.retries:
                    raise
                attempt += 1
                self.stats.retried += 1

    async def _drain(self, inp: asyncio.Queue[Any], window: asyncio.Semaphore) -> Any:
        collected: list[Any] = []
        count = 0
        waiting: list[tuple[int, list[Any]]] = []
        expected = 0
        sink = self.sink.fn
        while (item := await inp.get()) is not _END:
            heapq.heappush(waiting, item)
            self.stats.in_flight_peak = max(self.stats.in_flight_peak, len(waiting))
            while waiting and waiting[0][0] == expected:
                _, results = heapq.heappop(waiting)
                expected += 1
                window.release()
                if sink is None:
                    collected.extend(results)
                else:
                    for result in results:
                        await call_here(sink, result)
                count += len(results)
        return collected if sink is None else count


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    """The first error of a failed task group (nested groups unwrapped)."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first
