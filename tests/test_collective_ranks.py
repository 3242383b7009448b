"""Starting a collective's ranks from one thread (``Backend.start_ranks``): what a blocking
collective on thread hosts does, with no context thread in between. Every rank is
started before any waits for a peer, so ranks whose calls differ (a send and its receive
beside an all_reduce) all finish, with NumPy's results; a rank that cannot start calls
``failed()`` at once, and its peers abort instead of waiting out their time-out.

The CPU backend runs here; the CUDA one (one NCCL group for every rank) on a machine with
two GPUs (``-m gpu``, ``NCCL_NVLS_ENABLE=0``).
"""

from __future__ import annotations

import glob
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel.backends import backend_class, cuda_device_count
from atomr_accel.backends._base import Backend
from atomr_accel.backends._shm import SharedWord, remove_files
from atomr_accel.core._dtype import DType
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._collective import (
    CallKind,
    CollectiveCall,
    CommAbort,
    CommInit,
    RunCollective,
)
from atomr_accel.errors import CollectiveAborted

WORLD, EPOCH = 7, 1

BACKENDS = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        cuda_device_count() < 2, reason="needs 2 CUDA devices")]),
]


class Ranks:
    """``n`` contexts of one backend kind in this process, joined to one world epoch."""

    def __init__(self, kind: str, n: int) -> None:
        self.word = SharedWord.create("atomr-test-ranks-")
        self.word.value = EPOCH
        self.backends: list[Backend] = [backend_class(kind)(i) for i in range(n)]
        unique = b""
        if kind == "cuda":
            from atomr_accel.backends.cuda._collective import unique_id
            unique = unique_id()
        inits = [threading.Thread(target=b.execute, args=(CommInit(
            WORLD, EPOCH, n, rank, unique, self.word.path),))
            for rank, b in enumerate(self.backends)]
        for init in inits:  # NCCL's init waits for every rank
            init.start()
        for init in inits:
            init.join(60)

    def put(self, rank: int, data: np.ndarray[Any, Any]) -> GpuRef:
        backend = self.backends[rank]
        buffer_id = backend.allocate(DType.F64, len(data))
        backend.write(buffer_id, data, 0)
        return GpuRef(rank, buffer_id, DType.F64, len(data), 1)

    def get(self, ref: GpuRef) -> np.ndarray[Any, Any]:
        backend = self.backends[ref.device_id]
        backend.synchronize()
        return backend.read(ref.buffer_id, 0, ref.length)

    def start(self, ops: list[RunCollective], failed: Any = None) -> list[Any]:
        parts = [(b, op, 0) for b, op in zip(self.backends, ops, strict=True)]
        started = self.backends[0].start_ranks(parts, failed or (lambda: None))
        return [entry if isinstance(entry, BaseException) else b.wait(entry, None)
                for b, entry in zip(self.backends, started, strict=True)]

    def close(self) -> None:
        for backend in self.backends:
            backend.execute(CommAbort(WORLD))
            backend.close()
        self.word.close()
        remove_files(f"{glob.escape(self.word.path)}*")


@pytest.fixture(params=BACKENDS)
def ranks(request: pytest.FixtureRequest) -> Iterator[Ranks]:
    made = Ranks(request.param, 3 if request.param == "cpu" else 2)  # as many as it may have
    yield made
    made.close()


def test_ranks_whose_calls_differ_all_finish_with_numpys_results(ranks: Ranks) -> None:
    """Rank 0 sends to rank 1, then every rank all_reduces: a rank with no send or receive
    (rank 2 on the CPU) can only finish once ranks 0 and 1 are past theirs."""
    rng = np.random.default_rng(71)
    n = len(ranks.backends)
    xs = [rng.standard_normal(12) for _ in range(n)]
    message = rng.standard_normal(5)
    bufs = [ranks.put(r, x) for r, x in enumerate(xs)]
    out = ranks.put(0, message)
    into = ranks.put(1, np.zeros(5))
    total = CollectiveCall(CallKind.ALL_REDUCE, None, None, 12)
    calls = [
        (CollectiveCall(CallKind.SEND, out, None, 5, root=1),),
        (CollectiveCall(CallKind.RECV, None, into, 5, root=0),),
        (),
    ]
    ops = [RunCollective(WORLD, EPOCH, n, (*calls[r], _with(total, bufs[r])), 30.0)
           for r in range(n)]
    assert ranks.start(ops) == [None] * n
    for buf in bufs:
        np.testing.assert_allclose(ranks.get(buf), sum(xs), rtol=1e-12)
    np.testing.assert_array_equal(ranks.get(into), message)


def test_a_rank_that_cannot_start_fails_its_peers_at_once(ranks: Ranks) -> None:
    """Rank 1 is asked for an epoch it holds no communicator of: it fails as it starts,
    ``failed()`` leaves the epoch (as the world does), and the ranks that did start abort
    well within their 30 s time-out."""
    rng = np.random.default_rng(73)
    n = len(ranks.backends)
    bufs = [ranks.put(r, rng.standard_normal(8)) for r in range(n)]
    ops = [RunCollective(WORLD, EPOCH if r != 1 else EPOCH + 1, n,
                         (CollectiveCall(CallKind.ALL_REDUCE, bufs[r], bufs[r], 8),), 30.0)
           for r in range(n)]
    calls = []

    def failed() -> None:
        calls.append(True)
        ranks.word.value = EPOCH + 1_000_000

    began = time.perf_counter()
    results = ranks.start(ops, failed)
    assert time.perf_counter() - began < 10
    assert calls
    assert all(isinstance(result, CollectiveAborted) for result in results), results
    assert "epoch 2" in str(results[1])


def _with(call: CollectiveCall, buf: GpuRef) -> CollectiveCall:
    """``call`` in place on ``buf``."""
    return CollectiveCall(call.kind, buf, buf, call.count, call.op, call.root)
