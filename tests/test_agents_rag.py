"""RagPipeline and its built-in embedder: cache hits, sources, batching of concurrent queries,
the user's callables (sync, async, failing), and a retrieval evaluation on a corpus nobody
here wrote: the docstrings of Python's standard library."""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import inspect
import itertools
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import GpuRuntimeError, InvalidArgument, System
from atomr_accel.agents import (
    CpuVectorIndex,
    EmbeddingCache,
    EmbedFailed,
    GenerateFailed,
    GpuVectorIndex,
    HashedTfidfEmbedder,
    RagPipeline,
    RagResult,
    extractive_answer,
)

DIM = 256
DOCS = {
    1: "The cat sat on the mat and purred at the warm afternoon sun.",
    2: "Stock markets fell sharply as investors worried about interest rates.",
    3: "A recipe for bread: flour, water, salt and yeast, kneaded and baked.",
    4: "The telescope observed a distant galaxy rich in young blue stars.",
}


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("agents-rag") as opened:
        yield opened


def parts(system: System, dim: int = DIM) -> tuple[EmbeddingCache, CpuVectorIndex]:
    return EmbeddingCache.spawn(system, 100, dim), CpuVectorIndex.spawn(system, dim)


def pipeline(system: System, **kwargs: Any) -> RagPipeline:
    cache, index = parts(system)
    rag = RagPipeline.spawn(system, cache, index, DIM, **kwargs)
    assert rag.add_documents(list(DOCS), list(DOCS.values())) == len(DOCS)
    return rag


def letter_embed(texts: list[str]) -> np.ndarray[Any, Any]:
    """A user's embedder: letter counts (a..z) in the first 26 of DIM slots, unit rows."""
    rows = np.zeros((len(texts), DIM), np.float32)
    for row, text in enumerate(texts):
        for char in text.lower():
            if "a" <= char <= "z":
                rows[row, ord(char) - ord("a")] += 1
    norms: np.ndarray[Any, Any] = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1e-9)


# ------------------------------------------------------------------ the pipeline


def test_the_original_form_misses_then_hits_and_answers_extractively(system: System) -> None:
    cache, index = parts(system)
    rag = RagPipeline.spawn(system, cache, index, DIM, 5.0, "rag-original")
    rag.add_documents(list(DOCS), list(DOCS.values()))
    query = "the cat sat on the mat and purred"
    answer, sources, was_cached = rag.query(query, 2, timeout_secs=10.0)
    assert sources[0] == 1 and len(sources) == 2 and not was_cached
    assert answer == asyncio.run(extractive_answer("", [DOCS[i] for i in sources]))
    assert answer.startswith(DOCS[1] + "\n\n")
    again = rag.query(query, k=2)
    assert again == RagResult(answer, sources, True)
    stats = rag.stats()
    assert (stats.documents, stats.queries, stats.cache_hits, stats.embed_calls) == (4, 2, 1, 1)
    assert cache.stats()["hits"] == 1


def test_sources_are_the_best_documents_first(system: System) -> None:
    rag = pipeline(system)
    for doc_id, query in ((2, "stock markets fell as investors worried"),
                          (3, "bread from flour, water, salt and yeast"),
                          (4, "a telescope observed a distant galaxy")):
        _, sources, _ = rag.query(query, k=4)
        assert sources[0] == doc_id and sorted(sources) == [1, 2, 3, 4]


def test_adding_documents_renews_cached_query_embeddings_and_replaces_texts(
        system: System) -> None:
    rag = pipeline(system)
    assert not rag.query("bread and yeast", k=1).was_cached
    assert rag.query("bread and yeast", k=1).was_cached
    rag.add_documents([3, 5], ["Sourdough bread rises slowly with wild yeast.", "Rain."])
    answer, sources, was_cached = rag.query("bread and yeast", k=1)
    assert not was_cached  # new document frequencies: a new embedding
    assert sources == [3] and answer == "Sourdough bread rises slowly with wild yeast."


def test_a_device_index_and_an_embedder_on_a_given_device_give_the_same_answers(
        system: System) -> None:
    queries = ["stock markets fell as investors worried", "the cat sat on the mat",
               "a telescope observed a distant galaxy", "bread from flour and yeast"]
    reference = pipeline(system)
    device = system.spawn_device(mock=True)
    cache = EmbeddingCache.spawn(system, 100, DIM)
    rag = RagPipeline.spawn(system, cache, GpuVectorIndex.spawn(system, device, DIM), DIM,
                            embed=HashedTfidfEmbedder(system, DIM, device))
    rag.add_documents(list(DOCS), list(DOCS.values()))
    for query in queries:
        assert rag.query(query, k=3) == reference.query(query, k=3)


@pytest.mark.anyio
async def test_queries_arriving_during_an_embed_call_are_embedded_together() -> None:
    calls: list[list[str]] = []
    entered, gate = asyncio.Event(), asyncio.Event()

    async def embed(texts: list[str]) -> np.ndarray[Any, Any]:
        calls.append(list(texts))
        entered.set()
        await gate.wait()
        return letter_embed(texts)

    async with await System.open_async("rag-batching") as system:
        cache, index = parts(system)
        rag = RagPipeline.spawn(system, cache, index, DIM, embed=embed)
        gate.set()
        await rag.add_documents_async(list(DOCS), list(DOCS.values()))
        calls.clear()
        gate.clear()
        entered.clear()
        first = asyncio.ensure_future(rag.query_async("the first query", k=1))
        await asyncio.wait_for(entered.wait(), 10)
        texts = [f"query number {i}" for i in range(8)] + ["query number 0"]
        ks = [1 + i % 4 for i in range(len(texts))]  # one search_batch of k=4, cut per query
        rest = [asyncio.ensure_future(rag.query_async(text, k=k))
                for text, k in zip(texts, ks, strict=True)]
        for _ in range(10_000):  # until all 9 wait behind the running embed call
            if (await rag.stats_async()).waiting == len(texts):
                break
            await asyncio.sleep(0.001)
        gate.set()
        results = await asyncio.gather(first, *rest)
        assert calls == [["the first query"], [f"query number {i}" for i in range(8)]]
        assert [len(sources) for _, sources, _ in results] == [1, *ks]
        assert not any(cached for _, _, cached in results)
        for (_, sources, _), k, text in zip(results[1:], ks, texts, strict=True):
            assert sources == (await rag.query_async(text, k=k)).sources  # alone, cached
        stats = await rag.stats_async()
        assert (stats.embed_calls, stats.embedded) == (2, 10)
        assert (stats.queries, stats.cache_hits) == (19, 9)


@pytest.mark.anyio
async def test_sync_and_async_callables_and_the_async_twins() -> None:
    seen: list[tuple[str, list[str]]] = []

    async def generate(query: str, passages: list[str]) -> str:
        seen.append((query, passages))
        return f"{len(passages)} passages for {query!r}"

    async with await System.open_async("rag-callables") as system:
        cache, index = parts(system)
        rag = RagPipeline.spawn(system, cache, index, DIM, embed=letter_embed,
                                generate=generate)
        assert await rag.add_documents_async(list(DOCS), list(DOCS.values())) == 4
        answer, sources, was_cached = await rag.query_async("the cat sat on the mat", k=3)
        assert answer == "3 passages for 'the cat sat on the mat'" and not was_cached
        assert sources[0] == 1 and seen == [("the cat sat on the mat",
                                             [DOCS[i] for i in sources])]
        assert (await rag.query_async("the cat sat on the mat", k=3)).was_cached


def test_a_failing_callable_fails_its_query_only(system: System) -> None:
    def embed(texts: list[str]) -> np.ndarray[Any, Any]:
        if any("boom" in text for text in texts):
            raise RuntimeError("the embedding model crashed")
        return letter_embed(texts)

    def generate(query: str, passages: list[str]) -> Any:
        if "explain" in query:
            raise KeyError("the LLM is down")
        return 42 if "number" in query else passages[0]

    rag = pipeline(system, embed=embed, generate=generate)
    with pytest.raises(EmbedFailed) as failed:
        rag.query("boom")
    assert isinstance(failed.value.__cause__, RuntimeError)
    with pytest.raises(GenerateFailed) as generation:
        rag.query("explain the cat")
    assert isinstance(generation.value.__cause__, KeyError)
    with pytest.raises(GenerateFailed, match="must return a str"):
        rag.query("a number please")
    with pytest.raises(EmbedFailed):
        rag.add_documents([9], ["boom goes the document"])
    assert rag.query("the cat sat on the mat", k=1).answer == DOCS[1]  # still serving
    stats = rag.stats()
    assert (stats.documents, stats.failed, stats.queries) == (4, 3, 1)
    assert isinstance(failed.value, GpuRuntimeError)


def test_bad_embeddings_and_slow_callables_are_typed_errors(system: System) -> None:
    async def slow(query: str, passages: list[str]) -> str:
        await asyncio.sleep(30)
        return ""

    cache, index = parts(system)
    wrong = RagPipeline.spawn(system, cache, index, DIM,
                              embed=lambda texts: letter_embed(texts)[:, :10])
    with pytest.raises(EmbedFailed, match="expected"):
        wrong.query("cat")
    with pytest.raises(EmbedFailed, match="expected"):
        wrong.add_documents([1], ["cat"])
    nan = RagPipeline.spawn(system, cache, index, DIM,
                            embed=lambda texts: letter_embed(texts) * np.nan)
    with pytest.raises(EmbedFailed, match="NaN"):
        nan.query("cat")
    stalled = RagPipeline.spawn(system, cache, index, DIM, timeout_secs=0.05,
                                embed=letter_embed, generate=slow)
    stalled.add_documents([1], ["the cat"])
    with pytest.raises(GenerateFailed):
        stalled.query("cat")


def test_a_stopped_index_fails_queries_with_a_rag_error(system: System) -> None:
    cache, index = parts(system)
    rag = RagPipeline.spawn(system, cache, index, DIM)
    rag.add_documents([1], ["hello world"])
    index.stop()
    with pytest.raises(GpuRuntimeError, match="stopped"):
        rag.query("hello", timeout_secs=5.0)
    assert rag.stats().failed == 1


def test_bad_arguments_are_invalid_argument(system: System) -> None:
    cache, index = parts(system)
    rag = RagPipeline.spawn(system, cache, index, DIM)
    for call in (lambda: rag.query(""), lambda: rag.query("   "), lambda: rag.query("x", k=0),
                 lambda: rag.query(b"x"),  # type: ignore[arg-type]
                 lambda: rag.query("x", timeout_secs=0),
                 lambda: rag.add_documents([1, 2], ["one"]),
                 lambda: rag.add_documents([1, 1], ["one", "two"]),
                 lambda: rag.add_documents(["a"], ["one"]),  # type: ignore[list-item]
                 lambda: rag.add_documents([1], "one"),  # type: ignore[arg-type]
                 lambda: RagPipeline.spawn(system, cache, index, 0),
                 lambda: RagPipeline.spawn(system, index, cache, DIM),
                 lambda: RagPipeline.spawn(system, cache, index, DIM, embed="no"),  # type: ignore[arg-type]
                 lambda: RagPipeline.spawn(object(), cache, index, DIM)):  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            call()


# ------------------------------------------------------------- the built-in embedder


def reference_embedding(texts: list[str], learned: list[str], dim: int,
                        buckets: int = 4096, seed: int = 0) -> np.ndarray[Any, Any]:
    """The built-in embedder's documented computation, written again from its docstring."""
    mask64 = (1 << 64) - 1

    def splitmix(x: int) -> int:
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & mask64
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & mask64
        return x ^ (x >> 31)

    def features(text: str) -> list[list[int]]:
        normal = " ".join(text.lower().split())
        words = [int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
                 for w in re.findall(r"\w+", normal)]
        bigrams = [(a * 0x9E3779B97F4A7C15 + b + 1) & mask64
                   for a, b in itertools.pairwise(words)]
        padded, chars = f" {normal} ", []
        for n in (3, 4, 5):
            for start in range(len(padded) - n + 1):
                h = 0xCBF29CE484222325 ^ n
                for char in padded[start:start + n]:
                    h = (h ^ ord(char)) * 0x100000001B3 & mask64
                chars.append(h)
        return [[splitmix(x) for x in group] for group in (words, bigrams, chars)]

    df: dict[int, int] = {}
    for text in learned:
        for slot in {x % (1 << 20) for group in features(text) for x in group}:
            df[slot] = df.get(slot, 0) + 1
    x = np.zeros((len(texts), buckets))
    for row, text in enumerate(texts):
        for weight, group in zip((1.0, 0.5, 1.0), features(text), strict=True):
            ids, counts = np.unique(np.array(group, dtype=np.uint64), return_counts=True)
            if len(ids) == 0:
                continue
            idf = [np.log((1 + len(learned)) / (1 + df.get(int(i) % (1 << 20), 0))) + 1
                   for i in ids]
            tfidf = (1 + np.log(counts)) * np.array(idf)
            tfidf *= weight / np.linalg.norm(tfidf)
            for i, value in zip(ids, tfidf, strict=True):
                x[row, (int(i) >> 1) % buckets] += -value if int(i) & 1 else value
    matrix = np.random.default_rng(seed).standard_normal((buckets, dim)) / np.sqrt(dim)
    y = x @ matrix.astype(np.float32)
    return y / np.linalg.norm(y, axis=1, keepdims=True)


@pytest.mark.anyio
async def test_the_embedder_computes_what_its_documentation_says() -> None:
    learned = list(DOCS.values())
    queries = ["The cat's mat!", "Ünïcode wörds, straße and naïve café", "bread bread bread"]
    async with await System.open_async("rag-embedder") as system:
        embedder = HashedTfidfEmbedder(system, 32)
        before = await embedder(queries)
        np.testing.assert_allclose(before, reference_embedding(queries, [], 32), atol=2e-5)
        docs = await embedder.embed_documents(learned)
        assert (embedder.documents, embedder.generation) == (4, 1)
        np.testing.assert_allclose(docs, reference_embedding(learned, learned, 32), atol=2e-5)
        after = await embedder(queries)
        np.testing.assert_allclose(after, reference_embedding(queries, learned, 32), atol=2e-5)
        again = HashedTfidfEmbedder(system, 32)  # stable: no salted hash, a seeded projection
        np.testing.assert_array_equal(await again(queries), before)
        assert np.allclose(np.linalg.norm(after, axis=1), 1.0, atol=1e-5)
        with pytest.raises(InvalidArgument):
            await embedder(["fine", 3])  # type: ignore[list-item]
        with pytest.raises(InvalidArgument):
            HashedTfidfEmbedder(system, 0)


# ------------------------------------- evaluation: the standard library's docstrings

MODULES = ("argparse", "bisect", "calendar", "collections", "configparser", "contextlib", "csv",
           "dataclasses", "datetime", "decimal", "difflib", "email.message", "email.utils",
           "enum", "fractions", "ftplib", "functools", "gettext", "heapq", "http.client",
           "inspect", "ipaddress", "json", "logging", "mailbox", "optparse", "pathlib",
           "pprint", "queue", "random", "shutil", "smtplib", "socketserver", "statistics",
           "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
           "unittest.case", "urllib.parse", "zipfile")
EVAL_DIM = 768


def stdlib_docstrings() -> list[str]:
    """Docstrings of >= 200 characters of the public functions, classes and methods the
    modules define, deduplicated, in a fixed order."""
    seen: dict[str, None] = {}
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for attr, obj in sorted(vars(module).items()):
            if attr.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            found = [obj] if inspect.isfunction(obj) or inspect.isclass(obj) else []
            if inspect.isclass(obj):
                found += [member for name, member in sorted(vars(obj).items())
                          if not name.startswith("_") and inspect.isfunction(member)]
            for item in found:
                doc = inspect.getdoc(item)
                if doc and len(doc) >= 200:
                    seen.setdefault(doc)
    return list(seen)


def first_sentence(doc: str) -> str:
    paragraph = " ".join(doc.split("\n\n", maxsplit=1)[0].split())
    match = re.match(r"(.+?[.!?])(\s|$)", paragraph)
    return match.group(1) if match else paragraph


def recalls(ranked: np.ndarray[Any, Any]) -> tuple[float, float]:
    """recall@1 and recall@5 when query ``i``'s answer is document ``i``."""
    hit = ranked == np.arange(len(ranked))[:, None]
    return float(hit[:, :1].any(1).mean()), float(hit[:, :5].any(1).mean())


def tfidf_cosine_ranking(doc_rows: Any, query_rows: Any) -> np.ndarray[Any, Any]:
    scores = np.asarray(query_rows @ doc_rows.T)
    return np.argsort(-scores, axis=1, kind="stable")[:, :5]


def numpy_tfidf_baseline(docs: list[str], queries: list[str]) -> np.ndarray[Any, Any]:
    """Plain TF-IDF cosine as scikit-learn's defaults compute it: lower-cased tokens of 2+ word
    characters, raw counts, idf = ln((1 + n) / (1 + df)) + 1, L2-normalised rows."""
    token = re.compile(r"(?u)\b\w\w+\b")
    vocabulary: dict[str, int] = {}
    tokenised = [token.findall(doc.lower()) for doc in docs]
    for words in tokenised:
        for word in words:
            vocabulary.setdefault(word, len(vocabulary))
    df = np.zeros(len(vocabulary))
    for words in tokenised:
        df[[vocabulary[w] for w in set(words)]] += 1
    idf = np.log((1 + len(docs)) / (1 + df)) + 1

    def rows(texts: list[str]) -> np.ndarray[Any, Any]:
        out = np.zeros((len(texts), len(vocabulary)))
        for row, text in enumerate(texts):
            for word in token.findall(text.lower()):
                if word in vocabulary:
                    out[row, vocabulary[word]] += 1
        out *= idf
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)

    return tfidf_cosine_ranking(rows(docs), rows(queries))


async def pipeline_ranking(docs: list[str], queries: list[str]) -> np.ndarray[Any, Any]:
    """Query the pipeline (built-in embedder, CPU index) with every query at once."""
    async with await System.open_async("rag-eval") as system:
        cache = EmbeddingCache.spawn(system, len(queries), EVAL_DIM)
        index = CpuVectorIndex.spawn(system, EVAL_DIM)
        rag = RagPipeline.spawn(system, cache, index, EVAL_DIM)
        await rag.add_documents_async(list(range(len(docs))), docs)
        results = await asyncio.gather(*(rag.query_async(q, k=5) for q in queries))
        return np.array([result.sources for result in results])


@pytest.fixture(scope="module")
def evaluation() -> dict[str, Any]:
    docs = stdlib_docstrings()
    queries = [first_sentence(doc) for doc in docs]
    ours = recalls(asyncio.run(pipeline_ranking(docs, queries)))
    baseline = recalls(numpy_tfidf_baseline(docs, queries))
    print(f"\nstdlib docstrings: {len(docs)} documents from {len(MODULES)} modules, "
          f"embedding_dim {EVAL_DIM}")
    print(f"  built-in embedder   recall@1 {ours[0]:.3f}  recall@5 {ours[1]:.3f}")
    print(f"  NumPy TF-IDF cosine recall@1 {baseline[0]:.3f}  recall@5 {baseline[1]:.3f}")
    return {"docs": docs, "queries": queries, "ours": ours, "numpy": baseline}


def test_the_built_in_embedder_retrieves_stdlib_docstrings_as_well_as_tfidf(
        evaluation: dict[str, Any]) -> None:
    assert len(evaluation["docs"]) >= 300
    ours, baseline = evaluation["ours"], evaluation["numpy"]
    assert ours[0] >= baseline[0] and ours[1] >= baseline[1]


def test_it_matches_or_beats_scikit_learns_tfidf_vectorizer(evaluation: dict[str, Any]) -> None:
    text = pytest.importorskip("sklearn.feature_extraction.text")
    vectorizer = text.TfidfVectorizer()
    doc_rows = vectorizer.fit_transform(evaluation["docs"])
    ranked = tfidf_cosine_ranking(doc_rows.toarray(),
                                  vectorizer.transform(evaluation["queries"]).toarray())
    sklearn = recalls(ranked)
    print(f"\n  scikit-learn TfidfVectorizer cosine recall@1 {sklearn[0]:.3f}  "
          f"recall@5 {sklearn[1]:.3f}")
    ours = evaluation["ours"]
    assert ours[0] >= sklearn[0] and ours[1] >= sklearn[1]
