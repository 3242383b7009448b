"""The vector index client and actor that the CPU and device indexes share."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from atomr_accel.agents._slots import Slots
from atomr_accel.agents._vectors import (
    F32,
    I64,
    Metric,
    as_ids,
    as_matrix,
    metric_of,
    read_index,
    require_top_k,
    write_index,
)
from atomr_accel.blueprint import (
    TIMEOUT,
    BlueprintClient,
    TurnActor,
    Turns,
    require_positive_int,
    require_timeout,
    twin,
)
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.facade._portal import in_blocking_call

__all__ = ["IndexActor", "Published", "Results", "Store", "VectorIndex"]

Results = list[list[tuple[int, float]]]


class Store(Protocol):
    """Where an index keeps its ``(rows, dim)`` matrix; rows ``0 .. count-1`` are live."""

    async def reserve(self, rows: int, count: int) -> None:
        """Make room for ``rows`` rows, keeping rows ``0 .. count-1``."""

    async def write(self, first: int, matrix: F32, ids: I64) -> None:
        """Write ``matrix``'s rows (the vectors of ``ids``) from row ``first`` on."""

    async def move(self, src: int, dst: int) -> None:
        """Copy row ``src`` onto row ``dst``."""

    async def search(self, queries: F32, ids: I64, top_k: int,
                     timeout: float | None = None) -> Results:
        """The best ``top_k`` ``(id, score)`` of each query over the rows of ``ids``; device
        work waits at most ``timeout`` seconds (None: the system's op time-out)."""

    async def read(self, count: int) -> F32:
        """Rows ``0 .. count-1`` as a host matrix."""


@dataclass(frozen=True, slots=True)
class _Insert:
    ids: list[int]
    matrix: F32


@dataclass(frozen=True, slots=True)
class _Remove:
    id: int


@dataclass(frozen=True, slots=True)
class _Search:
    queries: F32
    top_k: int


@dataclass(frozen=True, slots=True)
class _Save:
    path: str | os.PathLike[str]


@dataclass(frozen=True, slots=True)
class _Load:
    path: str | os.PathLike[str]


class _Count:
    __slots__ = ()


class Published:
    """What an index actor shares with its client so that a blocking search can run on the
    caller's own thread, without a hop to the actor: the ``(store, slots)`` the actor works
    on (None once it has stopped) and ``epoch``, which the actor bumps before and after
    every change (odd while one is under way). A blocking change runs on the caller's
    thread too, on its turn (``turns``), and bumps it the same way.

    Such a search reads ``epoch``, searches, and keeps its answer only when ``epoch`` is
    still what it read, even: no change began or ended meanwhile, so the store's rows and
    the slots' ids it read belonged together (device work is ordered by submission, and a
    change that starts later is submitted later). Otherwise it asks the actor.
    """

    __slots__ = ("epoch", "state", "turns")

    def __init__(self) -> None:
        self.epoch = 0
        self.state: tuple[Store, Slots] | None = None
        self.turns: Turns[IndexActor] = Turns()

    @contextlib.contextmanager
    def changing(self) -> Iterator[None]:
        """Bracket a change of the store or slots (the actor's thread only)."""
        self.epoch += 1
        try:
            yield
        finally:
            self.epoch += 1

    async def search(self, queries: F32, top_k: int, timeout: float) -> Results | None:
        """The answer of a search run here, or None when a change overlapped it (or the
        actor has stopped, or one is under way): then ask the actor. An error of a search
        that no change overlapped is raised."""
        epoch, state = self.epoch, self.state
        if epoch & 1 or state is None:
            return None
        store, slots = state
        try:
            results = await store.search(queries, slots.held(), top_k, timeout)
        except Exception:
            if self.epoch != epoch:
                return None
            raise
        return results if self.epoch == epoch else None


class IndexActor(TurnActor):
    """Holds the ids (``Slots``) and runs each request on its ``Store``, one at a time (a
    blocking change on the caller's turn: ``TurnActor``).

    A restart (after an unexpected failure) starts empty, with a new store. Every
    change is bracketed by ``published.changing()`` (see ``Published``).
    """

    def __init__(self, dim: int, metric: Metric, make_store: Callable[[], Store],
                 published: Published) -> None:
        super().__init__(published.turns)
        self.dim = dim
        self.metric = metric
        self.published = published
        with published.changing():
            self.store = make_store()
            self.slots = Slots()
            published.state = (self.store, self.slots)

    async def post_stop(self) -> None:
        """Withdraw the store from searches and turns on callers' threads, then ``release``
        it."""
        await super().post_stop()
        with self.published.changing():
            self.published.state = None
            await self.release()

    async def release(self) -> None:
        """Free what the store holds (nothing here)."""

    async def handle(self, message: Any) -> Any:
        cls = type(message)
        if cls is _Search:
            return await self.store.search(message.queries, self.slots.held(), message.top_k)
        if cls is _Count:
            return self.slots.count
        if cls is _Save:
            count = self.slots.count
            vectors = await self.store.read(count)
            write_index(message.path, self.metric, self.slots.held().copy(), vectors)
            return count
        with self.published.changing():
            return await self._change(message)

    async def _change(self, message: Any) -> Any:
        cls = type(message)
        if cls is _Insert:
            await self._insert(message.ids, message.matrix)
            return None
        if cls is _Remove:
            row, last = self.slots.remove(message.id)
            if row != last:
                await self.store.move(last, row)
            return None
        if cls is _Load:
            return await self._load(message.path)
        return await super().handle(message)

    async def _insert(self, ids: list[int], matrix: F32) -> None:
        fresh = [position for position, vector_id in enumerate(ids)
                 if vector_id not in self.slots.rows]
        await self.store.reserve(self.slots.count + len(fresh), self.slots.count)
        replaced, first_new = self.slots.assign(ids)
        held = self.slots.held()
        for position, row in replaced:
            await self.store.write(row, matrix[position:position + 1], held[row:row + 1])
        if fresh:
            await self.store.write(first_new, matrix[fresh] if replaced else matrix,
                                   held[first_new:])

    async def _load(self, path: str | os.PathLike[str]) -> int:
        saved = read_index(path, self.dim, self.metric)
        count = len(saved.ids)
        await self.store.reserve(count, 0)
        self.slots.clear()
        self.slots.assign(saved.ids.tolist())
        if count:
            await self.store.write(0, saved.vectors, saved.ids)
        return count


class VectorIndex(BlueprintClient):
    """Exact nearest-neighbour search over ``(id, vector)`` pairs (base of the indexes).

    ``metric`` is ``"cosine"`` (vectors and queries are L2-normalized; score =
    cosine similarity, higher is better), ``"ip"`` (score = inner product,
    higher is better) or ``"l2"`` (score = squared Euclidean distance, lower
    is better). ``search`` returns ``(id, score)`` pairs best first, equal
    scores ordered by the smaller id. Inserting an id already held replaces
    its vector (upsert). Every method has an ``_async`` twin and takes
    ``timeout_secs`` (default 5 s). A vector of the wrong dimension, a
    non-finite number, a zero vector under cosine or a bad ``top_k`` raises
    ``InvalidArgument``; removing an id not held raises ``UnknownVectorId``
    (an ``InvalidArgument`` and a ``KeyError``).
    """

    dim = 0
    metric = Metric.COSINE
    _published = Published()

    def _setup(self, dim: int, metric: Metric, published: Published) -> None:
        self.dim = dim
        self.metric = metric
        self._published = published

    async def _search(self, message: _Search, timeout: float, what: str) -> Results:
        """A blocking call searches on its own thread when no change overlaps it (see
        ``Published``); otherwise, and for awaited calls, the actor searches."""
        if in_blocking_call():
            found = await self._published.search(message.queries, message.top_k, timeout)
            if found is not None:
                return found
        results: Results = await self._call(message, timeout, what)
        return results

    @staticmethod
    def _settings(dim: object, metric: object) -> tuple[int, Metric]:
        """``(dim, metric)`` checked (``InvalidArgument``)."""
        require_positive_int("dim", dim)
        assert isinstance(dim, int)
        return dim, metric_of(metric)

    def insert_async(self, id: int, embedding: Sequence[float] | Any,
                     timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, None]:
        """Store ``embedding`` (``dim`` numbers) under ``id``, replacing what ``id`` held."""
        ids = as_ids([id])
        matrix = as_matrix(embedding, self.dim, "embedding", self.metric, rows=False)
        return self._on_turn(_Insert(ids, matrix), timeout_secs, "insert")

    insert = twin(insert_async)

    def insert_many_async(self, ids: Iterable[int], matrix: Any,
                          timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, None]:
        """Store row ``i`` of ``matrix`` (``n x dim``) under ``ids[i]`` (distinct ids; upsert)."""
        id_list = as_ids(ids)
        rows = as_matrix(matrix, self.dim, "matrix", self.metric, rows=True)
        if len(rows) != len(id_list):
            raise InvalidArgument(f"insert_many got {len(id_list)} ids for {len(rows)} rows")
        return self._on_turn(_Insert(id_list, rows), timeout_secs, "insert_many")

    insert_many = twin(insert_many_async)

    def remove_async(self, id: int, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, None]:
        """Remove ``id`` and its vector; ``UnknownVectorId`` if the index does not hold it."""
        vector_id = as_ids([id])[0]
        return self._on_turn(_Remove(vector_id), timeout_secs, "remove")

    remove = twin(remove_async)

    def search_async(self, query: Sequence[float] | Any, top_k: int,
                     timeout_secs: float = TIMEOUT,
                     ) -> Coroutine[Any, Any, list[tuple[int, float]]]:
        """The ``top_k`` best ``(id, score)`` pairs for ``query``, best first (fewer if the
        index holds fewer)."""
        queries = as_matrix(query, self.dim, "query", self.metric, rows=False)
        return self._first(_Search(queries, require_top_k(top_k)),
                           require_timeout(timeout_secs))

    search = twin(search_async)

    async def _first(self, message: _Search, timeout: float) -> list[tuple[int, float]]:
        return (await self._search(message, timeout, "search"))[0]

    def search_batch_async(self, queries: Any, top_k: int, timeout_secs: float = TIMEOUT,
                           ) -> Coroutine[Any, Any, Results]:
        """``search`` for each row of ``queries`` (``b x dim``), in one request."""
        matrix = as_matrix(queries, self.dim, "queries", self.metric, rows=True)
        return self._search(_Search(matrix, require_top_k(top_k)),
                            require_timeout(timeout_secs), "search_batch")

    search_batch = twin(search_batch_async)

    def count_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, int]:
        """How many ids the index holds."""
        return self._on_turn(_Count(), timeout_secs, "count")

    count = twin(count_async)

    def save_async(self, path: str | os.PathLike[str], timeout_secs: float = TIMEOUT,
                   ) -> Coroutine[Any, Any, int]:
        """Write the index to ``path`` (an ``.npz`` file, see docs/agents-index.md); return
        the number of vectors written."""
        if not isinstance(path, str | os.PathLike):
            raise InvalidArgument(f"path must be a str or a path, got {path!r}")
        return self._on_turn(_Save(path), timeout_secs, "save")

    save = twin(save_async)

    def load_async(self, path: str | os.PathLike[str], timeout_secs: float = TIMEOUT,
                   ) -> Coroutine[Any, Any, int]:
        """Replace the index's contents by the file ``save`` wrote at ``path`` (same ``dim``
        and metric, else ``InvalidArgument``); return the number of vectors read."""
        if not isinstance(path, str | os.PathLike):
            raise InvalidArgument(f"path must be a str or a path, got {path!r}")
        return self._on_turn(_Load(path), timeout_secs, "load")

    load = twin(load_async)

    def __len__(self) -> int:
        """How many ids the index holds (``count()``)."""
        return self.count()
