"""Serving blueprints: each an actor with a small async client.

``DynamicBatchingServer``, ``InferenceCascade``, ``ModelReplicaPool``,
``FairShareScheduler``, ``ModelHotSwapServer``, ``SpeculativeDecoder`` and
``MoeRouter``. Start one with ``Blueprint.spawn(system, ...)`` and await its
client's methods: on the event loop of an ``ActorSystem``, on any event loop
for a facade ``System``; ``Blueprint.props(...)`` spawns it under your own
actor instead. Models are plain callables, sync (run on a worker thread) or
async (awaited on the loop, e.g. running on a device). The decisions live in
plain classes and functions without I/O: ``BatchQueue``, ``FairQueue``,
``pick_replica``, ``accept_draft``, ``top_k_gating``.

Given no model, ``spawn`` takes the original package's form: its signature,
its demo model, and a handle (``OriginalDynamicBatchingServer``, ...) with its
blocking methods. ``HotSwapServer`` is the original's name of
``ModelHotSwapServer``. See ``docs/patterns.md``.
"""

from atomr_accel.patterns._base import PatternClient
from atomr_accel.patterns._batch_queue import BatchQueue, OverflowPolicy
from atomr_accel.patterns._batching import BatchingStats, DynamicBatchingServer, split_results
from atomr_accel.patterns._cascade import CascadeResult, CascadeStats, InferenceCascade, Stage
from atomr_accel.patterns._errors import (
    BatchResultMismatch,
    InvalidModelOutput,
    NoReplicaAvailable,
    PatternError,
    QueueOverflow,
    RequestDropped,
    RequestRejected,
    UnknownTenant,
)
from atomr_accel.patterns._fair_queue import FairQueue, Ticket
from atomr_accel.patterns._fair_share import FairShareScheduler, FairShareStats
from atomr_accel.patterns._hot_swap import HotSwapServer, HotSwapStats, ModelHotSwapServer
from atomr_accel.patterns._moe import MoeRouter, RouterStats, top_k_gating
from atomr_accel.patterns._original import (
    OriginalDynamicBatchingServer,
    OriginalFairShareScheduler,
    OriginalHandle,
    OriginalHotSwapServer,
    OriginalInferenceCascade,
    OriginalModelReplicaPool,
    OriginalMoeRouter,
    OriginalSpeculativeDecoder,
)
from atomr_accel.patterns._replica_pool import (
    ModelReplicaPool,
    PoolPolicy,
    PoolStats,
    pick_replica,
)
from atomr_accel.patterns._speculative import (
    Decoded,
    DecoderStats,
    SpeculativeDecoder,
    accept_draft,
)
from atomr_accel.patterns._worker import ModelSpec, Reloadable

__all__ = [
    "BatchQueue",
    "BatchResultMismatch",
    "BatchingStats",
    "CascadeResult",
    "CascadeStats",
    "Decoded",
    "DecoderStats",
    "DynamicBatchingServer",
    "FairQueue",
    "FairShareScheduler",
    "FairShareStats",
    "HotSwapServer",
    "HotSwapStats",
    "InferenceCascade",
    "InvalidModelOutput",
    "ModelHotSwapServer",
    "ModelReplicaPool",
    "ModelSpec",
    "MoeRouter",
    "NoReplicaAvailable",
    "OriginalDynamicBatchingServer",
    "OriginalFairShareScheduler",
    "OriginalHandle",
    "OriginalHotSwapServer",
    "OriginalInferenceCascade",
    "OriginalModelReplicaPool",
    "OriginalMoeRouter",
    "OriginalSpeculativeDecoder",
    "OverflowPolicy",
    "PatternClient",
    "PatternError",
    "PoolPolicy",
    "PoolStats",
    "QueueOverflow",
    "Reloadable",
    "RequestDropped",
    "RequestRejected",
    "RouterStats",
    "SpeculativeDecoder",
    "Stage",
    "Ticket",
    "UnknownTenant",
    "accept_draft",
    "pick_replica",
    "split_results",
    "top_k_gating",
]
