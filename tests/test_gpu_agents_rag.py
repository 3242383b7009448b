"""RagPipeline on CUDA: the built-in embedder projecting on the GPU gives the CPU backend's
embeddings, and a pipeline over a GpuVectorIndex retrieves as the CPU one does."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
from test_agents_rag import (
    EVAL_DIM,
    first_sentence,
    numpy_tfidf_baseline,
    recalls,
    stdlib_docstrings,
)

from atomr_accel import System
from atomr_accel.agents import (
    CpuVectorIndex,
    EmbeddingCache,
    GpuVectorIndex,
    HashedTfidfEmbedder,
    RagPipeline,
)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("agents-rag-gpu") as opened:
        yield opened


def test_the_embedder_on_cuda_gives_the_cpu_backends_embeddings(system: System) -> None:
    docs = stdlib_docstrings()[:200]
    queries = [first_sentence(doc) for doc in docs]

    async def embed(embedder: HashedTfidfEmbedder) -> tuple[np.ndarray, np.ndarray]:
        return await embedder.embed_documents(docs), await embedder(queries)

    cpu, gpu = (asyncio.run(embed(HashedTfidfEmbedder(system, EVAL_DIM,
                                                      system.spawn_device(mock=mock))))
                for mock in (True, False))
    for ours, reference in zip(gpu, cpu, strict=True):
        np.testing.assert_allclose(ours, reference, atol=1e-4)


def test_a_pipeline_on_the_gpu_retrieves_stdlib_docstrings_as_the_cpu_one(
        system: System) -> None:
    docs = stdlib_docstrings()
    queries = [first_sentence(doc) for doc in docs]

    def ranking(on_gpu: bool) -> np.ndarray:
        cache = EmbeddingCache.spawn(system, len(queries), EVAL_DIM)
        if on_gpu:
            device = system.spawn_device(mock=False)
            index = GpuVectorIndex.spawn(system, device, EVAL_DIM)
            rag = RagPipeline.spawn(system, cache, index, EVAL_DIM,
                                    embed=HashedTfidfEmbedder(system, EVAL_DIM, device))
        else:
            rag = RagPipeline.spawn(system, cache, CpuVectorIndex.spawn(system, EVAL_DIM),
                                    EVAL_DIM)
        rag.add_documents(list(range(len(docs))), docs)

        async def run() -> list[list[int]]:
            results = await asyncio.gather(*(rag.query_async(q, k=5) for q in queries))
            return [result.sources for result in results]

        return np.array(asyncio.run(run()))

    gpu, cpu = ranking(True), recalls(ranking(False))
    ours = recalls(gpu)
    print(f"\nGPU pipeline recall@1 {ours[0]:.3f} recall@5 {ours[1]:.3f} (CPU {cpu})")
    assert abs(ours[0] - cpu[0]) <= 2 / len(docs) and abs(ours[1] - cpu[1]) <= 2 / len(docs)
    baseline = recalls(numpy_tfidf_baseline(docs, queries))
    assert ours[0] >= baseline[0] and ours[1] >= baseline[1]
