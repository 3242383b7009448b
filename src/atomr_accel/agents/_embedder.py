"""The RAG pipeline's built-in embedder: hashed n-gram TF-IDF, projected on a device.

It needs no model and no download. What it computes for a text, exactly:

1. **Normalise**: ``str.lower()``, every run of whitespace becomes one space, and the
   ends are stripped.
2. **Features**, in three groups, each feature given a 64-bit id:

   * *words*: the maximal runs of word characters (regex ``\\w+``, Unicode); the id is
     BLAKE2b of the word's UTF-8 bytes (8-byte digest, little-endian);
   * *word bigrams*: each pair of consecutive words; the id combines the two word ids
     (``a * 0x9E3779B97F4A7C15 + b + 1`` modulo 2**64);
   * *character 3-, 4- and 5-grams* of the normalised text with one space added at
     each end, over Unicode code points; the id is 64-bit FNV-1a over the code points,
     its offset basis xor-ed with ``n``.

   Every id then goes through the SplitMix64 finaliser. All of it is stable across
   runs, processes and machines (Python's salted ``hash`` is not used).
3. **TF-IDF weights**, per group: a feature counted ``c`` times weighs
   ``(1 + ln c) * idf``, with ``idf = ln((1 + N) / (1 + df)) + 1``, where ``N`` is the
   number of documents learned so far and ``df`` how many of them hold a feature in
   the same one of ``2**20`` document-frequency slots (``id mod 2**20``). Before any
   document is learned, ``N = df = 0`` and every ``idf`` is 1 (plain sublinear term
   frequency). Each group's weights are scaled to unit L2 norm and then by the
   group's weight: words 1.0, bigrams 0.5, character n-grams 1.0.
4. **Signed hashing** into ``buckets`` (default 4096) slots: a feature adds its weight
   to slot ``(id >> 1) mod buckets``, negated when ``id`` is odd.
5. **Projection on the device**: the ``texts x buckets`` matrix times a fixed
   ``buckets x embedding_dim`` matrix of N(0, 1/embedding_dim) draws (NumPy's PCG64
   seeded with ``seed``, default 0), uploaded once to a device buffer; one
   ``gemm_f32`` of the device's BLAS per batch of at most ``batch_rows`` texts.
6. **L2 normalisation** of each row on the host (a text with no features, which only
   an empty or all-whitespace text is, gives the zero vector).

Documents learned after a text was embedded change its IDF weights: an embedding
is the one the learned state of its call gives (``generation`` counts the learned
batches).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from atomr_accel.blueprint import require_positive_int
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.facade import System

if TYPE_CHECKING:
    from atomr_accel.facade import Device, GpuBuffer

__all__ = ["HashedTfidfEmbedder"]

Array = np.ndarray[Any, Any]

DF_SLOTS = 1 << 20
"""Document-frequency slots: a feature's document frequency is that of ``id mod DF_SLOTS``."""
GROUP_WEIGHTS = (1.0, 0.5, 1.0)
"""The weights of the word, word-bigram and character n-gram groups."""
CHAR_NGRAMS = (3, 4, 5)
"""The character n-gram lengths."""

_WORD = re.compile(r"\w+")
_U64 = np.uint64
_FNV_OFFSET = _U64(0xCBF29CE484222325)
_FNV_PRIME = _U64(0x100000001B3)
_GOLDEN = _U64(0x9E3779B97F4A7C15)
_DF_MASK = _U64(DF_SLOTS - 1)


def _splitmix64(ids: Array) -> Array:
    """The SplitMix64 finaliser, element-wise over uint64 (wrapping arithmetic)."""
    ids = ids ^ (ids >> _U64(30))
    ids = ids * _U64(0xBF58476D1CE4E5B9)
    ids = ids ^ (ids >> _U64(27))
    ids = ids * _U64(0x94D049BB133111EB)
    mixed: Array = ids ^ (ids >> _U64(31))
    return mixed


@functools.lru_cache(maxsize=1 << 16)
def _word_id(word: str) -> int:
    """BLAKE2b-64 of the word's UTF-8 bytes."""
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")


def _char_ngram_ids(padded: str) -> Array:
    """FNV-1a 64 (offset basis xor n) of every 3-, 4- and 5-gram of code points."""
    points = np.frombuffer(padded.encode("utf-32-le"), dtype=np.uint32).astype(_U64)
    parts = []
    for n in CHAR_NGRAMS:
        count = len(points) - n + 1
        if count <= 0:
            continue
        ids = np.full(count, _FNV_OFFSET ^ _U64(n), dtype=_U64)
        for j in range(n):
            ids ^= points[j:j + count]
            ids *= _FNV_PRIME
        parts.append(ids)
    return np.concatenate(parts) if parts else np.zeros(0, _U64)


def feature_groups(text: str) -> tuple[Array, Array, Array]:
    """The feature ids (uint64, with repeats) of ``text``: words, word bigrams, char n-grams."""
    normal = " ".join(text.lower().split())
    words = np.array([_word_id(w) for w in _WORD.findall(normal)], dtype=_U64)
    bigrams = words[:-1] * _GOLDEN + words[1:] + _U64(1)
    chars = _char_ngram_ids(f" {normal} ")
    return _splitmix64(words), _splitmix64(bigrams), _splitmix64(chars)


@dataclass(frozen=True, slots=True)
class _Counted:
    """One text's features: per group, the distinct ids and how often each occurs."""

    groups: tuple[tuple[Array, Array], ...]

    @classmethod
    def of(cls, text: str) -> _Counted:
        return cls(tuple(np.unique(ids, return_counts=True) for ids in feature_groups(text)))

    def slots(self) -> Array:
        """The distinct document-frequency slots this text holds a feature in."""
        return np.unique(np.concatenate([ids & _DF_MASK for ids, _ in self.groups]))


@dataclass(frozen=True, slots=True)
class _Learned:
    """An immutable snapshot of the document frequencies (swapped whole on learning)."""

    df: Array
    documents: int
    generation: int


@dataclass(frozen=True, slots=True)
class _Workspace:
    """The embedder's device and buffers: the projection matrix, features in, embeddings out."""

    device: Device
    projection: GpuBuffer
    x: GpuBuffer
    y: GpuBuffer


class HashedTfidfEmbedder:
    """The built-in embedder: hashed word/bigram/char n-gram TF-IDF, projected on a device.

    See this module's docstring for exactly what it computes. ``await
    embedder(texts)`` embeds ``texts`` with the document frequencies learned so
    far (the ``embed`` contract of ``RagPipeline``: a ``len(texts) x
    embedding_dim`` float32 matrix of unit rows); ``await
    embedder.embed_documents(texts)`` first learns their document frequencies
    and then embeds them. ``RagPipeline`` does both for you.

    The projection runs as ``gemm_f32`` on ``device``, a ``Device`` of the facade
    ``system`` (any backend); without one, a CPU-backend device with the BLAS
    library is spawned in ``system`` on first use. Each batch of at most
    ``batch_rows`` texts is featurised and projected on a worker thread, with the
    device's blocking calls. Calls may overlap, from one event loop at a time (the
    system's, in a ``RagPipeline``); their device work runs one batch at a time.

    ``embedding_dim``, ``buckets`` and ``batch_rows`` are ints >= 1 and ``seed`` an
    int >= 0 (``InvalidArgument`` otherwise); a non-str text is an ``InvalidArgument``.
    """

    def __init__(self, system: System, embedding_dim: int, device: Device | None = None, *,
                 buckets: int = 4096, seed: int = 0, batch_rows: int = 256) -> None:
        if not isinstance(system, System):
            raise InvalidArgument(f"system must be a System (System.open), "
                                  f"got {type(system).__name__}")
        require_positive_int("embedding_dim", embedding_dim)
        require_positive_int("buckets", buckets)
        require_positive_int("batch_rows", batch_rows)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise InvalidArgument(f"seed must be an int >= 0, got {seed!r}")
        self.system = system
        self.device = device
        self.embedding_dim = embedding_dim
        self.buckets = buckets
        self.seed = seed
        self.batch_rows = batch_rows
        self._learned = _Learned(np.zeros(DF_SLOTS, np.int32), 0, 0)
        self._buffers: _Workspace | None = None
        self._setup_lock = asyncio.Lock()
        self._workspace_lock = threading.Lock()

    @property
    def documents(self) -> int:
        """How many documents the document frequencies were learned from."""
        return self._learned.documents

    @property
    def generation(self) -> int:
        """How many batches of documents have been learned (0 before any)."""
        return self._learned.generation

    async def __call__(self, texts: Sequence[str]) -> Array:
        """Embed ``texts`` with the document frequencies learned so far."""
        texts = _texts(texts)
        learned = self._learned
        return await self._embed(len(texts), lambda rows: _hashed(
            _count_all(texts[rows]), learned, self.buckets))

    async def embed_documents(self, texts: Sequence[str]) -> Array:
        """Learn the document frequencies of ``texts``, then embed them with them."""
        counted = await asyncio.to_thread(_count_all, _texts(texts))
        self._learned = learned = _learn(self._learned, counted)
        return await self._embed(len(counted), lambda rows: _hashed(
            counted[rows], learned, self.buckets))

    async def _embed(self, count: int, featurise: Callable[[slice], Array]) -> Array:
        """Featurise and project chunk by chunk, each on a worker thread; normalise."""
        workspace = await self._workspace()
        out = np.empty((count, self.embedding_dim), np.float32)
        for start in range(0, count, self.batch_rows):
            rows = slice(start, min(start + self.batch_rows, count))
            out[rows] = await asyncio.to_thread(self._project, workspace, featurise, rows)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        unit: Array = np.divide(out, norms, out=np.zeros_like(out), where=norms > 0)
        return unit

    def _project(self, workspace: _Workspace, featurise: Callable[[slice], Array],
                 rows: slice) -> Array:
        """``featurise(rows) @ P`` by one device gemm (column-major: ``Y^T = P^T X^T``).

        Runs on a worker thread with the device's blocking calls, which run each
        op on this thread: no hand-off to the event loop or the device's thread.
        """
        x = featurise(rows)
        count, dim, device = len(x), self.embedding_dim, workspace.device
        with self._workspace_lock:
            device.copy_from_numpy(workspace.x, x, offset=0)
            device.blas().gemm_f32(workspace.projection, workspace.x, workspace.y,
                                   m=dim, n=count, k=self.buckets)
            return device.copy_to_numpy(workspace.y, 0, count * dim, shape=(count, dim))

    async def _workspace(self) -> _Workspace:
        """The device buffers, made on first use: the projection matrix (uploaded once)
        and room for ``batch_rows`` texts' features and embeddings."""
        async with self._setup_lock:
            if self._buffers is None:
                device = self.device or await self.system.spawn_device_async(
                    mock=True, libraries=["blas"])
                self.device = device
                dim = self.embedding_dim
                matrix = np.random.default_rng(self.seed).standard_normal((self.buckets, dim))
                projection = await device.allocate_async(self.buckets * dim)
                await device.copy_from_numpy_async(
                    projection, (matrix / np.sqrt(dim)).astype(np.float32))
                self._buffers = _Workspace(
                    device, projection,
                    await device.allocate_async(self.batch_rows * self.buckets),
                    await device.allocate_async(self.batch_rows * dim))
            return self._buffers

    def __repr__(self) -> str:
        return (f"HashedTfidfEmbedder(dim={self.embedding_dim}, buckets={self.buckets}, "
                f"documents={self.documents})")


def _texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise InvalidArgument(f"texts must be a list of str, got {type(texts).__name__}")
    for text in texts:
        if not isinstance(text, str):
            raise InvalidArgument(f"texts must hold str only, got {type(text).__name__}")
    return list(texts)


def _count_all(texts: list[str]) -> list[_Counted]:
    return [_Counted.of(text) for text in texts]


def _learn(learned: _Learned, counted: list[_Counted]) -> _Learned:
    df = learned.df.copy()
    for one in counted:
        df[one.slots().astype(np.intp)] += 1
    return _Learned(df, learned.documents + len(counted), learned.generation + 1)


def _hashed(counted: list[_Counted], learned: _Learned, buckets: int) -> Array:
    """Steps 3-4: the signed-hashed TF-IDF rows of ``counted``."""
    x = np.zeros((len(counted), buckets), np.float32)
    for row, one in enumerate(counted):
        for weight, (ids, counts) in zip(GROUP_WEIGHTS, one.groups, strict=True):
            if len(ids) == 0:
                continue
            df = learned.df[(ids & _DF_MASK).astype(np.intp)]
            tfidf = (1.0 + np.log(counts)) * (np.log((1.0 + learned.documents) / (1.0 + df)) + 1.0)
            tfidf *= weight / np.linalg.norm(tfidf)
            slot = (ids >> _U64(1)) % _U64(buckets)
            signed = np.where(ids & _U64(1), -tfidf, tfidf)
            x[row] += np.bincount(slot.astype(np.intp), weights=signed, minlength=buckets)
    return x
