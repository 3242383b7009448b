"""Snapshot compaction bounds what a rebuild replays; a replay releases what it made."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import numpy as np
import pytest

from atomr_accel import (
    ContextPoisoned,
    GpuRefStale,
    Journal,
    JournalConfig,
    ReplayHarness,
    System,
)
from atomr_accel.core import DType, GpuRef
from atomr_accel.core.ops._blas import Axpy, Scal
from atomr_accel.core.ops._memory import Allocate, Free, Upload
from atomr_accel.device import JournalEntry, SqliteJournalStore, recovery_plan
from atomr_accel.device._replay import compacted

pytestmark = pytest.mark.anyio

HOSTS = ["thread", "process"]


def entry(seq: int, op: Any, result: Any = None) -> JournalEntry:
    return JournalEntry("s", seq, op, result)


def test_compaction_keeps_what_live_buffers_and_later_entries_need() -> None:
    d, t, s, u = (GpuRef(0, i, DType.F64, 4, 1, 7) for i in range(4))
    data = np.zeros(4)
    journal = [
        entry(1, Allocate(DType.F64, 4), d),
        entry(2, Allocate(DType.F64, 4), t),
        entry(3, Allocate(DType.F64, 4), s),
        entry(4, Upload(t, data)),
        entry(5, Axpy(4, 1.0, t, d)),       # superseded by the snapshot at 8
        entry(6, Upload(s, data)),          # s is freed: gone with its history
        entry(7, Free(s)),
        entry(8, Upload(d, data)),          # the snapshot of d
        entry(9, Allocate(DType.F64, 4), u),
        entry(10, Scal(4, 2.0, u)),         # u is not live, but entry 12 uses it
        entry(12, Axpy(4, 1.0, u, d)),      # at or past the horizon: kept as it is
        entry(13, Scal(4, 3.0, d)),
    ]
    kept = compacted(journal, horizon=12, live=[d, t])
    assert [e.seq for e in kept] == [1, 2, 4, 8, 9, 10, 12, 13]
    assert [e.seq for e in recovery_plan(kept, [d])] == [1, 8, 9, 10, 12, 13]
    assert compacted(journal, horizon=1, live=[]) == journal  # nothing is final yet


class WatchedStore(SqliteJournalStore):
    """An SQLite store that says when a compaction has rewritten a stream."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self.rewritten = threading.Event()

    def replace(self, stream: str, rows: Any) -> None:
        super().replace(stream, rows)
        self.rewritten.set()


@pytest.mark.parametrize("isolation", HOSTS)
async def test_a_long_history_is_snapshotted_and_replays_bounded(isolation: str) -> None:
    bound = 8
    store = WatchedStore(":memory:")
    journal = Journal(store)
    rng = np.random.default_rng(3)
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(
            mock=True, isolation=isolation,
            journal=JournalConfig(journal, compact_after=bound))
        stream = dev.journal_stream
        assert stream is not None
        w = await dev.allocate_f64_async(16, durable=True)
        t = await dev.allocate_f64_async(16)
        await dev.copy_from_numpy_async(t, rng.standard_normal(16))
        scratch = await dev.allocate_f64_async(16)
        await dev.copy_from_numpy_async(scratch, rng.standard_normal(16))
        await dev.free_async(scratch)
        await dev.copy_from_numpy_async(w, rng.standard_normal(16))
        for _ in range(bound):  # the last one reaches the bound: a snapshot, a compaction
            await dev.blas().axpy_async(16, 0.5, t, w)
        assert await asyncio.to_thread(store.rewritten.wait, 20.0)
        entries = await journal.entries_async(stream)
        kinds = [type(e.op).__name__ for e in entries]
        assert kinds == ["Allocate", "Allocate", "Upload", "Upload"]  # w, t, t's data, w's
        for _ in range(3):
            await dev.blas().axpy_async(16, 0.5, t, w)
        before = await dev.copy_to_numpy_async(w)

        entries = await journal.entries_async(stream)
        recorded = w.ref  # its canonical name in the journal
        assert len(recovery_plan(entries, [recorded])) == 4 + 3
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async("poison")
        assert (await dev.copy_to_numpy_async(w)).tobytes() == before.tobytes()
        with pytest.raises(GpuRefStale):
            await dev.copy_to_numpy_async(t)

        fresh = await system.spawn_device_async(mock=True)
        result = await ReplayHarness(journal, stream).replay_async(fresh)
        assert (await fresh.copy_to_numpy_async(result.ref(recorded))).tobytes() == before.tobytes()
    journal.close()


class LossyStore(SqliteJournalStore):
    """An SQLite store that has lost its oldest batch when read back."""

    def read(self, stream: str) -> list[bytes]:
        return super().read(stream)[1:]


@pytest.mark.parametrize("isolation", HOSTS)
async def test_a_failed_recovery_releases_what_it_made(isolation: str) -> None:
    journal = Journal(LossyStore(":memory:"))
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation, journal=journal)
        kept = await dev.allocate_f64_async(16, durable=True)
        await journal.flush_async()  # its allocation is stored alone: the batch lost
        t = await dev.allocate_f64_async(16)
        await dev.copy_from_numpy_async(t, np.ones(16))
        await dev.blas().axpy_async(16, 2.0, t, kept)
        await journal.flush_async()
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async("poison")
        with pytest.raises(GpuRefStale):  # recovery failed (the journal lost rows): lost
            await dev.copy_to_numpy_async(kept)
        assert (await dev.stats_async()).bytes_allocated == 0  # the replay's t went too
    journal.close()


@pytest.mark.parametrize("isolation", HOSTS)
async def test_a_recovery_destroys_the_graphs_it_captured(isolation: str) -> None:
    async with await System.open_async("t") as system:
        telemetry = await system.enable_telemetry_async(interval=None)
        dev = await system.spawn_device_async(mock=True, isolation=isolation, journal=":memory:")
        w = await dev.allocate_f64_async(8, durable=True)
        t = await dev.allocate_f64_async(8)
        await dev.copy_from_numpy_async(t, np.arange(8.0))
        rec = dev.record_graph()
        await rec.blas().axpy_async(8, 1.0, t, w)
        graph = await rec.capture_async()
        await graph.launch_async()
        await graph.launch_async()
        before = await dev.copy_to_numpy_async(w)
        graph_ops = ops_of(telemetry.render(), "graph")
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async("poison")
        assert (await dev.copy_to_numpy_async(w)).tobytes() == before.tobytes()
        replayed = ops_of(telemetry.render(), "graph") - graph_ops
        assert replayed == 1 + 2 + 1  # capture, two launches, and the destroy
        assert (await dev.stats_async()).bytes_allocated == 8 * 8  # only w: t was freed


def ops_of(text: str, library: str) -> float:
    """The ``atomr_ops_total`` count of ``library`` in a Prometheus exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("atomr_ops_total{") and f'library="{library}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total
