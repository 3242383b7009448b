"""Serving blueprints: each an actor with a small client.

``DynamicBatchingServer``, ``InferenceCascade``, ``ModelReplicaPool``,
``FairShareScheduler``, ``ModelHotSwapServer``, ``SpeculativeDecoder`` and
``MoeRouter``. Start one with ``Blueprint.spawn(system, ...)``. Every client
operation is ``name_async(..., timeout_secs=None)``, awaited on the event loop
of an ``ActorSystem`` or on any event loop for a facade ``System``, and
``name_blocking(...)``, its blocking twin (facade ``System`` only; never on
the system's own loop). ``name(...)`` is the operation's old name: it returns
the coroutine to await, as it always did (``timeout=`` is the deprecated
spelling of ``timeout_secs``). ``Blueprint.props(...)`` spawns a blueprint
under your own actor instead. Models are plain callables, sync (run on a
worker thread) or async (awaited on the loop, e.g. running on a device). The
decisions live in plain classes and functions without I/O: ``BatchQueue``, ``FairQueue``,
``pick_replica``, ``accept_draft``, ``top_k_gating``.

Given no model, ``spawn`` takes the original package's form: its signature,
its demo model, and a handle (``OriginalDynamicBatchingServer``, ...) with its
blocking methods; ``HotSwapServer`` is the original's name of
``ModelHotSwapServer``. Those forms live in ``atomr_accel.original`` and are
re-exported here. See ``docs/patterns.md``.
"""

from atomr_accel.blueprint import BlueprintClient as PatternClient
from atomr_accel.original._patterns import (
    HotSwapServer,
    OriginalDynamicBatchingServer,
    OriginalFairShareScheduler,
    OriginalHandle,
    OriginalHotSwapServer,
    OriginalInferenceCascade,
    OriginalModelReplicaPool,
    OriginalMoeRouter,
    OriginalSpeculativeDecoder,
)
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
from atomr_accel.patterns._hot_swap import HotSwapStats, ModelHotSwapServer
from atomr_accel.patterns._moe import MoeRouter, RouterStats, top_k_gating
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
