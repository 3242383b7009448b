"""RagPipeline: retrieval-augmented answers over an embedding cache and a vector index."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from atomr_accel.actor import Props, Reply
from atomr_accel.agents._embedder import HashedTfidfEmbedder
from atomr_accel.blueprint import (
    BlueprintActor,
    BlueprintClient,
    require_positive_int,
    require_system,
    require_timeout,
    twin,
)
from atomr_accel.blueprint._actor import GetStats
from atomr_accel.blueprint._invoke import invoke
from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument
from atomr_accel.facade import System

__all__ = [
    "EmbedFailed",
    "GenerateFailed",
    "RagError",
    "RagPipeline",
    "RagResult",
    "RagStats",
    "extractive_answer",
]

Array = np.ndarray[Any, Any]
Hits = list[tuple[int, float]]
_Waiting = tuple[str, int, "asyncio.Future[tuple[Array, Hits]]"]
"""A query waiting for an embed call: its text, its k and the future of its embedding and
nearest documents."""
Embed = Callable[[list[str]], Any]
"""``embed(texts) -> matrix``: one row of ``embedding_dim`` numbers per text (sync or async)."""
Generate = Callable[[str, list[str]], Any]
"""``generate(query, passages) -> str`` (sync or async)."""


class RagError(GpuRuntimeError):
    """Base of a ``RagPipeline``'s own errors; raised itself for an untyped failure on the
    way (the ``__cause__``), such as a stopped index's ``ActorStopped``."""


class EmbedFailed(RagError):
    """The ``embed`` callable raised (the error is the ``__cause__``), ran past the
    pipeline's ``timeout_secs`` or returned something other than one finite row of
    ``embedding_dim`` numbers per text."""


class GenerateFailed(RagError):
    """The ``generate`` callable raised (the error is the ``__cause__``), ran past the
    pipeline's ``timeout_secs`` or returned something other than a str."""


class RagResult(NamedTuple):
    """A query's answer, its sources (ids, best first) and whether the query's
    embedding came from the cache."""

    answer: str
    sources: list[int]
    was_cached: bool


@dataclass(frozen=True, slots=True)
class RagStats:
    """Counters of a pipeline: documents held; queries answered and failed; queries whose
    embedding was a cache hit; embed calls made for queries and the queries they embedded;
    queries now waiting for the next embed call."""

    documents: int
    queries: int
    failed: int
    cache_hits: int
    embed_calls: int
    embedded: int
    waiting: int


async def extractive_answer(query: str, passages: list[str]) -> str:
    """The default ``generate``: extractive, no language model.

    Returns the retrieved passages themselves, best first, separated by a blank
    line (the empty string when nothing was retrieved); ``query`` is not used.
    A coroutine function, so the pipeline runs it on its event loop.
    """
    return "\n\n".join(passages)


class _Cache(Protocol):
    def get_async(self, key: str, timeout_secs: float = ...,
                  ) -> Coroutine[Any, Any, list[float] | None]: ...

    def insert_async(self, key: str, value: Any, timeout_secs: float = ...,
                     ) -> Coroutine[Any, Any, None]: ...


class _Index(Protocol):
    def insert_many_async(self, ids: list[int], matrix: Any, timeout_secs: float = ...,
                          ) -> Coroutine[Any, Any, Any]: ...

    def search_async(self, query: Any, top_k: int, timeout_secs: float = ...,
                     ) -> Coroutine[Any, Any, Hits]: ...

    def search_batch_async(self, queries: Any, top_k: int, timeout_secs: float = ...,
                           ) -> Coroutine[Any, Any, list[Hits]]: ...


@dataclass(frozen=True, slots=True)
class _Query:
    text: str
    k: int


@dataclass(frozen=True, slots=True)
class _Add:
    ids: list[int]
    texts: list[str]
    timeout: float


@dataclass(slots=True)
class _Setup:
    """What the pipeline holds across actor restarts: its parts and its documents."""

    cache: _Cache
    index: _Index
    dim: int
    embed: Embed | HashedTfidfEmbedder
    generate: Generate
    timeout: float
    texts: dict[int, str]


class _RagActor(BlueprintActor):
    def __init__(self, setup: _Setup) -> None:
        super().__init__()
        self.setup = setup
        self.pending: list[_Waiting] = []
        self.embedding = False
        self.queries = self.failed = self.cache_hits = self.embed_calls = self.embedded = 0

    async def receive(self, message: Any) -> Any:
        """Start queries and document batches as tasks; answer stats."""
        cls = type(message)
        if cls is _Query:
            self.start_task(self._query(message, self.context.defer_reply()))
        elif cls is _Add:
            self.start_task(self.answer(self.context.defer_reply(), self._add(message),
                                        error=_typed))
        elif cls is GetStats:
            return RagStats(len(self.setup.texts), self.queries, self.failed,
                            self.cache_hits, self.embed_calls, self.embedded,
                            len(self.pending))
        else:
            self.unhandled(message)
        return None

    async def _query(self, query: _Query, reply: Reply) -> None:
        if await self.answer(reply, self._answer(query), error=_typed):
            self.queries += 1
        else:
            self.failed += 1

    async def _answer(self, query: _Query) -> RagResult:
        setup = self.setup
        key = self._key(query.text)
        cached = await setup.cache.get_async(key, setup.timeout)
        if cached is not None:
            self.cache_hits += 1
            vector = np.asarray(cached, dtype=np.float32)
            hits = await setup.index.search_async(vector, query.k, setup.timeout)
        else:
            vector, hits = await self._embed_and_search(query.text, query.k)
            await setup.cache.insert_async(key, vector, setup.timeout)
        sources = [int(id) for id, _ in hits]
        passages = [setup.texts[id] for id in sources if id in setup.texts]
        try:
            async with asyncio.timeout(setup.timeout):
                answer = await invoke(setup.generate, query.text, passages)
        except Exception as exc:
            raise GenerateFailed(f"generate failed: {exc!r}") from exc
        if not isinstance(answer, str):
            raise GenerateFailed(f"generate must return a str, got {type(answer).__name__}")
        return RagResult(answer, sources, cached is not None)

    def _key(self, text: str) -> str:
        """The cache key of a query: its text; with the built-in embedder, prefixed by the
        embedder's generation, since learning documents changes the embedding."""
        embed = self.setup.embed
        if isinstance(embed, HashedTfidfEmbedder):
            return f"{embed.generation}\x1f{text}"
        return text

    def _embed_and_search(self, text: str, k: int) -> asyncio.Future[tuple[Array, Hits]]:
        """Queue ``text`` for the next embed call (start one if none runs); the future
        gets its embedding and its ``k`` nearest documents."""
        future: asyncio.Future[tuple[Array, Hits]] = asyncio.get_running_loop().create_future()
        self.pending.append((text, k, future))
        if not self.embedding:
            self.embedding = True
            self.start_task(self._embed_batches())
        return future

    async def _embed_batches(self) -> None:
        """Embed the queued queries, all of them in one call, until none is left; each
        batch's searches go to the index as one ``search_batch`` while the next embeds."""
        try:
            while self.pending:
                batch, self.pending = self.pending, []
                texts = list(dict.fromkeys(text for text, _, _ in batch))
                self.embed_calls += 1
                self.embedded += len(batch)
                try:
                    matrix = await self._embed(texts, self.setup.timeout)
                except Exception as exc:
                    _fail(batch, exc)
                    continue
                self.start_task(self._search_batch(batch, texts, matrix))
        finally:
            self.embedding = False

    async def _search_batch(self, batch: list[_Waiting], texts: list[str],
                            matrix: Array) -> None:
        k = max(k for _, k, _ in batch)
        try:
            found = await self.setup.index.search_batch_async(matrix, k, self.setup.timeout)
        except asyncio.CancelledError:
            _fail(batch, self.stopped_error())
            raise
        except Exception as exc:
            _fail(batch, exc)
            return
        rows = {text: (matrix[i], found[i]) for i, text in enumerate(texts)}
        for text, k, future in batch:
            if not future.done():
                vector, hits = rows[text]
                future.set_result((vector, hits[:k]))

    async def _embed(self, texts: list[str], timeout: float, *, learn: bool = False) -> Array:
        """``embed(texts)`` checked: a ``len(texts) x dim`` float32 matrix, or ``EmbedFailed``."""
        embed = self.setup.embed
        try:
            async with asyncio.timeout(timeout):
                if learn and isinstance(embed, HashedTfidfEmbedder):
                    result = await embed.embed_documents(texts)
                else:
                    result = await invoke(embed, texts)
            matrix = np.asarray(result, dtype=np.float32)
        except Exception as exc:
            raise EmbedFailed(f"embed failed on {len(texts)} texts: {exc!r}") from exc
        shape = (len(texts), self.setup.dim)
        if matrix.shape != shape:
            raise EmbedFailed(f"embed returned shape {matrix.shape} for {len(texts)} texts; "
                              f"expected {shape}")
        if not np.isfinite(matrix).all():
            raise EmbedFailed("embed returned a matrix with NaN or infinite values")
        return matrix

    async def _add(self, add: _Add) -> int:
        """Embed and index ``add``'s texts; answers how many were added."""
        matrix = await self._embed(add.texts, add.timeout, learn=True)
        await self.setup.index.insert_many_async(add.ids, matrix, add.timeout)
        self.setup.texts.update(zip(add.ids, add.texts, strict=True))
        return len(add.ids)


def _fail(batch: list[_Waiting], exc: BaseException) -> None:
    for _, _, future in batch:
        if not future.done():
            future.set_exception(exc)


def _typed(exc: Exception) -> GpuRuntimeError:
    """``exc`` as a ``GpuRuntimeError`` (a ``RagError`` wrapping anything untyped)."""
    if isinstance(exc, GpuRuntimeError):
        return exc
    error = RagError(f"the pipeline failed: {exc!r}")
    error.__cause__ = exc
    return error


def _text(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"a query or document text must be a non-blank str, "
                              f"got {value!r:.60}")
    return value


def _id(value: object) -> int:
    if not isinstance(value, int | np.integer) or isinstance(value, bool):
        raise InvalidArgument(f"document ids must be ints, got {value!r}")
    return int(value)


class RagPipeline(BlueprintClient):
    """Answer a query from the documents most like it: embed, retrieve, generate.

    ``add_documents(ids, texts)`` embeds the texts (the built-in embedder first
    learns their document frequencies) and inserts them into ``index`` under
    ``ids`` (the pipeline keeps the texts). ``query(text, k)`` looks the
    query's embedding up in ``cache`` (a hit: ``was_cached``), else embeds it
    and caches it; retrieves the ``k`` nearest documents from ``index``; and
    returns ``generate(text, passages)`` with the sources' ids, best first.

    Queries run concurrently; their embeddings are batched: queries that
    arrive while an embed call runs are embedded together, in the next one
    (identical texts once). ``embed`` and ``generate`` are the user's callables,
    sync (run on a worker thread) or async; by default the built-in
    ``HashedTfidfEmbedder`` on a CPU-backend device and ``extractive_answer``,
    which returns the retrieved passages themselves (no language model).
    A callable that raises, returns a bad value or runs past ``timeout_secs``
    fails that query (or batch of documents) with ``EmbedFailed`` or
    ``GenerateFailed``; the pipeline keeps serving. ``timeout_secs`` also bounds
    each call to the cache and the index during a query.

    Methods block; each has an ``_async`` twin to await on any event loop.
    Spawn one with ``RagPipeline.spawn``.
    """

    @classmethod
    def spawn(cls, system: System, cache: Any, index: Any, embedding_dim: int,
              timeout_secs: float = 5.0, name: str | None = None, *,
              embed: Embed | None = None, generate: Generate | None = None) -> RagPipeline:
        """Start a pipeline over ``cache`` (an ``EmbeddingCache``) and ``index`` (a
        ``CpuVectorIndex`` or ``GpuVectorIndex``) of ``embedding_dim``-dimensional vectors.

        The original package's form ``spawn(system, cache, index, embedding_dim,
        timeout_secs=5.0, name=None)`` is this one with the built-in embedder and
        the extractive answer. ``embed(texts)`` must return one row of
        ``embedding_dim`` numbers per text; ``generate(query, passages)`` a str.
        Bad arguments raise ``InvalidArgument``.
        """
        facade = require_system(system)
        require_positive_int("embedding_dim", embedding_dim)
        for role, part, methods in (("cache", cache, ("get_async", "insert_async")),
                                    ("index", index, ("insert_many_async", "search_async",
                                                      "search_batch_async"))):
            if not all(callable(getattr(part, method, None)) for method in methods):
                raise InvalidArgument(f"{role} must offer {' and '.join(methods)} "
                                      f"(an EmbeddingCache / a vector index), got {part!r:.60}")
        for role, fn in (("embed", embed), ("generate", generate)):
            if fn is not None and not callable(fn):
                raise InvalidArgument(f"{role} must be callable, got {fn!r:.60}")
        setup = _Setup(cache, index, embedding_dim,
                       embed if embed is not None else HashedTfidfEmbedder(facade, embedding_dim),
                       generate if generate is not None else extractive_answer,
                       require_timeout(timeout_secs), {})
        client: RagPipeline = cls._start(facade, Props(_RagActor, setup), name)
        return client

    def add_documents_async(self, ids: Sequence[int], texts: Sequence[str],
                            timeout_secs: float = 60.0) -> Coroutine[Any, Any, int]:
        """Embed ``texts`` and insert them into the index under ``ids``; return how many.

        An id already present is replaced (the index's upsert). ``ids`` are ints
        and ``texts`` non-blank strs of the same length (``InvalidArgument``).
        """
        if isinstance(ids, str | bytes) or isinstance(texts, str | bytes):
            raise InvalidArgument("ids and texts must be lists (of ints and of strs)")
        id_list = [_id(id) for id in ids]
        text_list = [_text(text) for text in texts]
        if len(id_list) != len(text_list):
            raise InvalidArgument(f"{len(id_list)} ids for {len(text_list)} texts")
        if len(set(id_list)) != len(id_list):
            raise InvalidArgument("ids must be distinct within one add_documents call")
        timeout = require_timeout(timeout_secs)
        return self._call(_Add(id_list, text_list, timeout), timeout, "add_documents")

    add_documents = twin(add_documents_async)

    def query_async(self, text: str, k: int = 5, timeout_secs: float = 10.0,
                    ) -> Coroutine[Any, Any, RagResult]:
        """Answer ``text`` from its ``k`` nearest documents: ``(answer, sources, was_cached)``.

        ``sources`` are the retrieved ids, best first; ``was_cached`` says the
        query's embedding came from the cache. ``text`` is a non-blank str and
        ``k`` an int >= 1 (``InvalidArgument``); a failing callable raises
        ``EmbedFailed`` or ``GenerateFailed``, past ``timeout_secs`` ``AskTimeout``.
        """
        require_positive_int("k", k)
        return self._call(_Query(_text(text), k), require_timeout(timeout_secs),
                          "query")

    query = twin(query_async)

    async def stats_async(self, timeout_secs: float = 5.0) -> RagStats:
        """The pipeline's counters (see ``RagStats``)."""
        stats: RagStats = await self._call(GetStats(), require_timeout(timeout_secs),
                                           "stats")
        return stats

    stats = twin(stats_async)
