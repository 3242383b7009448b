"""Agent blueprints: an embedding cache, vector indexes on the CPU and on a device, a RAG
pipeline, a lease coordinator for shared device state and a DAG executor.

See ``docs/agents-index.md``, ``docs/agents-rag.md`` and ``docs/agents-graph.md``.
"""

from atomr_accel.agents._cache import EmbeddingCache
from atomr_accel.agents._coordinator import SharedGpuStateCoordinator
from atomr_accel.agents._embedder import HashedTfidfEmbedder
from atomr_accel.agents._gpu_index import GpuVectorIndex
from atomr_accel.agents._graph import END, CompiledGraph, Graph, GraphCycleError, UnknownNode
from atomr_accel.agents._graph_actor import (
    Checkpoint,
    GraphStats,
    LangGraphGpuActor,
    NodeFailed,
    RunInProgress,
    UnknownRun,
)
from atomr_accel.agents._index import CpuVectorIndex
from atomr_accel.agents._lease import (
    CoordinatorStats,
    LeaseError,
    LeaseInfo,
    LeaseOwnerStopped,
    LeaseTimeout,
    StaleLeaseToken,
)
from atomr_accel.agents._rag import (
    EmbedFailed,
    GenerateFailed,
    RagError,
    RagPipeline,
    RagResult,
    RagStats,
    extractive_answer,
)
from atomr_accel.agents._vectors import UnknownVectorId
from atomr_accel.original._graph import OriginalLangGraphGpuActor

__all__ = [
    "END",
    "Checkpoint",
    "CompiledGraph",
    "CoordinatorStats",
    "CpuVectorIndex",
    "EmbedFailed",
    "EmbeddingCache",
    "GenerateFailed",
    "GpuVectorIndex",
    "Graph",
    "GraphCycleError",
    "GraphStats",
    "HashedTfidfEmbedder",
    "LangGraphGpuActor",
    "LeaseError",
    "LeaseInfo",
    "LeaseOwnerStopped",
    "LeaseTimeout",
    "NodeFailed",
    "OriginalLangGraphGpuActor",
    "RagError",
    "RagPipeline",
    "RagResult",
    "RagStats",
    "RunInProgress",
    "SharedGpuStateCoordinator",
    "StaleLeaseToken",
    "UnknownNode",
    "UnknownRun",
    "UnknownVectorId",
    "extractive_answer",
]
