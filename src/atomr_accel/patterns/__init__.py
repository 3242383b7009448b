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
from atomr_accel.original import _patterns as _original
from atomr_accel.original._patterns import *  # noqa: F403 - the original's forms and handles
from atomr_accel.patterns import _errors
from atomr_accel.patterns._batch_queue import BatchQueue, OverflowPolicy
from atomr_accel.patterns._batching import BatchingStats, DynamicBatchingServer, split_results
from atomr_accel.patterns._cascade import CascadeResult, CascadeStats, InferenceCascade, Stage
from atomr_accel.patterns._errors import *  # noqa: F403 - the serving blueprints' errors
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
    "BatchingStats",
    "CascadeResult",
    "CascadeStats",
    "Decoded",
    "DecoderStats",
    "DynamicBatchingServer",
    "FairQueue",
    "FairShareScheduler",
    "FairShareStats",
    "HotSwapStats",
    "InferenceCascade",
    "ModelHotSwapServer",
    "ModelReplicaPool",
    "ModelSpec",
    "MoeRouter",
    "OverflowPolicy",
    "PatternClient",
    "PoolPolicy",
    "PoolStats",
    "Reloadable",
    "RouterStats",
    "SpeculativeDecoder",
    "Stage",
    "Ticket",
    "accept_draft",
    "pick_replica",
    "split_results",
    "top_k_gating",
]
__all__ += _errors.__all__
__all__ += _original.__all__
