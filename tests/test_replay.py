"""The replay journal: recording, replay into a fresh device, durable buffers across rebuilds."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _ray_hosts import RAY

from atomr_accel import (
    ContextPoisoned,
    Device,
    FaultKind,
    GpuBuffer,
    GpuRefStale,
    InvalidArgument,
    Journal,
    JournalConfig,
    LibraryError,
    OutOfMemory,
    ReplayHarness,
    Status,
    System,
)
from atomr_accel.actor import ActorSystem, Lifecycle, LifecycleEvent
from atomr_accel.core import DType, GpuRef
from atomr_accel.core.ops._blas import Axpy, Scal
from atomr_accel.core.ops._faults import InjectFault
from atomr_accel.core.ops._memory import Allocate, Download, Free, Upload
from atomr_accel.core.ops._rng import Distribution, RngFill
from atomr_accel.device import (
    DeviceActor,
    DeviceConfig,
    GetStats,
    JournalEntry,
    MarkDurable,
    SqliteJournalStore,
    recovery_plan,
)
from atomr_accel.hosts import ThreadHost

pytestmark = pytest.mark.anyio

HOSTS = ["thread", "process", RAY]


def bits(array: np.ndarray[Any, Any]) -> bytes:
    """The exact bytes of an array (NaNs and signed zeros compare too)."""
    return np.ascontiguousarray(array).tobytes()


async def mixed_session(dev: Device) -> dict[str, GpuBuffer]:
    """BLAS, FFT, RNG, solver, sparse and tensor ops, one free and one failed factorization."""
    rng = np.random.default_rng(7)
    n = 6
    a = await dev.allocate_f64_async(n * n)
    b = await dev.allocate_f64_async(n * n)
    c = await dev.allocate_f64_async(n * n)
    await dev.copy_from_numpy_async(a, rng.standard_normal(n * n))
    await dev.copy_from_numpy_async(b, rng.standard_normal(n * n))
    blas = dev.blas()
    await blas.gemm_f64_async(a, b, c, n, n, n)
    await blas.axpy_async(n * n, 0.5, a, c)
    await blas.scal_async(n * n, -2.0, b)
    scratch = await dev.allocate_f64_async(n * n)
    await dev.copy_async(c, scratch)
    await dev.free_async(scratch)

    noise = await dev.allocate_f32_async(64)
    counts = await dev.allocate_i32_async(32)
    gen = dev.rng(seed=2024)
    await gen.normal_async(noise, 1.0, 3.0)
    await gen.uniform_async(noise, -1.0, 1.0, length=16)
    await gen.poisson_async(counts, 4.0)

    signal = await dev.allocate_f64_async(32)
    spectrum = await dev.allocate_async(17, DType.C128)
    await dev.copy_from_numpy_async(signal, rng.standard_normal(32))
    await dev.fft().r2c_async(signal, spectrum, 32)
    await dev.fft().c2c_async(spectrum, spectrum, 17, inverse=True)

    spd = rng.standard_normal((n, n))
    spd = spd @ spd.T + n * np.eye(n)
    chol = await dev.allocate_f64_async(n * n)
    rhs = await dev.allocate_f64_async(n)
    await dev.copy_from_numpy_async(chol, spd.ravel(order="F"))
    await dev.copy_from_numpy_async(rhs, rng.standard_normal(n))
    solver = dev.solver()
    await solver.potrf_async(chol, n)
    await solver.potrs_async(chol, rhs, n, 1)
    lu = await dev.allocate_f64_async(n * n)
    ipiv = await dev.allocate_i32_async(n)
    await dev.copy_from_numpy_async(lu, rng.standard_normal(n * n))
    await solver.getrf_async(lu, ipiv, n, n)
    not_spd = await dev.allocate_f64_async(n * n)
    await dev.copy_from_numpy_async(not_spd, -np.eye(n).ravel())
    with pytest.raises(LibraryError):  # ran, failed, may have written: journaled as an error
        await solver.potrf_async(not_spd, n)

    indptr = await dev.allocate_i32_async(4)
    indices = await dev.allocate_i32_async(4)
    values = await dev.allocate_f64_async(4)
    x = await dev.allocate_f64_async(3)
    y = await dev.allocate_f64_async(3)
    await dev.copy_from_numpy_async(indptr, np.array([0, 1, 3, 4], np.int32))
    await dev.copy_from_numpy_async(indices, np.array([0, 0, 2, 1], np.int32))
    await dev.copy_from_numpy_async(values, np.array([1.0, 2.0, 3.0, 4.0]))
    await dev.copy_from_numpy_async(x, np.array([1.0, -1.0, 0.5]))
    matrix = await dev.sparse().csr_async(indptr, indices, values, 3, 3)
    await dev.sparse().spmv_async(matrix, x, y)

    t = await dev.allocate_f64_async(2 * 3)
    await dev.tensor().einsum_async("ab,bc->ac", a, (2, 3), b, (3, 2), t, (2, 2))
    assert await blas.dot_async(n, a, b) is not None  # a read: not journaled
    return {"a": a, "b": b, "c": c, "noise": noise, "counts": counts, "signal": signal,
            "spectrum": spectrum, "chol": chol, "rhs": rhs, "lu": lu, "ipiv": ipiv,
            "not_spd": not_spd, "y": y, "t": t}


@pytest.mark.parametrize("target", HOSTS)
async def test_replay_into_a_fresh_device_is_bit_for_bit(tmp_path: Path, target: str) -> None:
    path = tmp_path / "journal.sqlite"
    async with await System.open_async("record") as system:
        dev = await system.spawn_device_async(mock=True, journal=path)
        buffers = await mixed_session(dev)
        recorded = {name: await dev.copy_to_numpy_async(buf) for name, buf in buffers.items()}
        stream = dev.journal_stream
        assert stream is not None
    journal = Journal.open(path)  # the device closed its journal; the file stays
    try:
        assert journal.streams() == [stream]
        entries = journal.entries(stream)
        kinds = [type(e.op).__name__ for e in entries]
        assert "Download" not in kinds and "Dot" not in kinds and "MemoryInfo" not in kinds
        assert [e.outcome for e in entries].count("error") == 1
        assert [e.seq for e in entries] == sorted(e.seq for e in entries)
        async with await System.open_async("replay") as system:
            fresh = await system.spawn_device_async(mock=True, isolation=target)
            result = await ReplayHarness(journal, stream).replay_async(fresh)
            assert result.ops == len(entries)
            for name, buf in buffers.items():
                ref = result.ref(buf)
                assert ref.owner != buf.ref.owner and ref.dtype is buf.dtype
                replayed = await fresh.copy_to_numpy_async(ref)
                assert bits(replayed) == bits(recorded[name]), name
            scratch = next(e.op.dst for e in entries if type(e.op).__name__ == "CopyBuffer")
            with pytest.raises(InvalidArgument):  # the freed scratch buffer is gone there too
                await fresh.copy_to_numpy_async(result.ref(scratch))
    finally:
        journal.close()


def test_blocking_replay_and_the_harness_of_a_live_device() -> None:
    with System.open("t") as system:
        dev = system.spawn_device(mock=True, journal=True)
        x = dev.allocate_f32(8)
        dev.copy_from_numpy(x, np.arange(8, dtype=np.float32))
        dev.rng(seed=5).normal(x, length=4)
        dev.blas().scal(8, 3.0, x)
        harness = ReplayHarness.of(dev)
        fresh = system.spawn_device(mock=True)
        result = harness.replay(fresh)
        assert result.ops == 4
        assert bits(fresh.copy_to_numpy(result.ref(x))) == bits(dev.copy_to_numpy(x))
        assert harness.replay(fresh, upto=harness.entries()[1].seq).ops == 2
        with pytest.raises(InvalidArgument, match="no journal"):
            ReplayHarness.of(fresh)


@pytest.mark.parametrize("isolation", HOSTS)
async def test_durable_buffers_survive_rebuilds_and_others_go_stale(isolation: str) -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation, journal=":memory:")
        n = 32
        x = np.linspace(-1.0, 1.0, n)
        weights = await dev.allocate_f64_async(n, durable=True)
        temp = await dev.allocate_f64_async(n)  # read by an op on the durable buffer
        other = await dev.allocate_f64_async(n)  # neither durable nor needed
        await dev.copy_from_numpy_async(temp, x)
        await dev.copy_from_numpy_async(other, x)
        await dev.rng(seed=11).normal_async(weights)
        await dev.blas().axpy_async(n, 2.0, temp, weights)
        before = await dev.copy_to_numpy_async(weights)
        await dev.blas().scal_async(n, 5.0, other)
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async(FaultKind.POISON)
        assert bits(await dev.copy_to_numpy_async(weights)) == bits(before)
        assert not weights.is_stale() and weights.generation == dev.generation == 2
        for lost in (temp, other):
            assert lost.is_stale()
            with pytest.raises(GpuRefStale):
                await dev.copy_to_numpy_async(lost)
        await dev.blas().scal_async(n, 0.5, weights)  # journaled under its first name
        fault = FaultKind.CRASH if isolation == "process" else FaultKind.POISON
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async(fault)
        assert bits(await dev.copy_to_numpy_async(weights)) == bits(before * 0.5)
        stats = await dev.stats_async()
        assert (stats.status, stats.generation, stats.restarts) == (Status.READY, 3, 2)
        assert stats.in_flight == 0


class SlowRebuildHost(ThreadHost):
    """A thread host whose starts after the first take 0.2 s, so requests pile up."""

    starts = 0

    async def start(self) -> None:
        SlowRebuildHost.starts += 1
        if SlowRebuildHost.starts > 1:
            await asyncio.sleep(0.2)
        await super().start()


async def test_work_sent_during_a_rebuild_runs_after_rematerialization() -> None:
    """The op that faults fails and stays out of the journal; one queued behind it is
    refused by the dead context or, if the context closed before it was taken, runs on
    the next one (it never ran); ops sent during the rebuild run after rematerialization."""
    SlowRebuildHost.starts = 0
    config = DeviceConfig(host_factory=SlowRebuildHost, journal=JournalConfig(":memory:"))
    async with ActorSystem("t") as system:
        dev = system.spawn(DeviceActor.props(config), "dev")
        ref: GpuRef = await dev.ask(Allocate(DType.F64, 4))
        ones: GpuRef = await dev.ask(Allocate(DType.F64, 4))
        await dev.ask(Upload(ref, np.arange(4.0)))
        await dev.ask(Upload(ones, np.ones(4)))
        await dev.ask(MarkDurable(ref))
        await dev.ask(MarkDurable(ones))
        context_failed = asyncio.Event()
        system.event_stream.subscribe(
            lambda e: context_failed.set() if e.kind is Lifecycle.FAILED else None,
            LifecycleEvent)
        fault = asyncio.ensure_future(dev.ask(InjectFault(FaultKind.POISON, delay=0.3)))
        await asyncio.sleep(0.02)
        doomed = asyncio.ensure_future(dev.ask(Axpy(4, 100.0, ones, ref)))  # behind the fault
        with pytest.raises(ContextPoisoned):
            await fault
        await context_failed.wait()  # the device saw ContextDown before the context failed
        assert (await dev.ask(GetStats())).status is Status.REBUILDING
        queued = [asyncio.ensure_future(dev.ask(op)) for op in
                  (Scal(4, 2.0, ref), Axpy(4, 1.0, ones, ref), Download(ref))]
        *_, seen = await asyncio.gather(*queued)
        try:
            await doomed
            start = np.arange(4.0) + 100  # handed back: it ran first on the next context
        except ContextPoisoned:
            start = np.arange(4.0)  # refused by the dead context: the axpy x100 is not in
        np.testing.assert_array_equal(seen, start * 2 + 1)
        assert (await dev.ask(GetStats())).generation == 2


async def test_mark_durable_refuses_what_it_cannot_keep() -> None:
    async with await System.open_async("t") as system:
        plain = await system.spawn_device_async(mock=True)
        buf = await plain.allocate_f32_async(4)
        with pytest.raises(InvalidArgument, match="journal"):
            await plain.mark_durable_async(buf)
        dev = await system.spawn_device_async(mock=True, journal=True)
        with pytest.raises(InvalidArgument):
            await dev.mark_durable_async(GpuRef(0, 99, DType.F32, 4, 1, owner=12345))
        gone = await dev.allocate_f32_async(4)
        await dev.free_async(gone)
        with pytest.raises(InvalidArgument, match="freed"):
            await dev.mark_durable_async(gone)
        mine = await dev.allocate_f32_async(4)
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async("poison")
        await dev.allocate_f32_async(1)  # after the rebuild
        with pytest.raises(GpuRefStale):
            await dev.mark_durable_async(mine)
        with pytest.raises(InvalidArgument, match="journal must be"):
            await system.spawn_device_async(mock=True, journal=3.5)  # type: ignore[arg-type]
        with pytest.raises(OutOfMemory):  # a failed op is answered and not journaled
            await dev.inject_fault_async("oom")
        assert dev.journal is not None and dev.journal_stream is not None
        kinds = [type(e.op).__name__ for e in await dev.journal.entries_async(dev.journal_stream)]
        assert kinds == ["Allocate", "Free", "Allocate", "Allocate"]


def entry(seq: int, op: Any, result: Any = None) -> JournalEntry:
    return JournalEntry("s", seq, op, result)


def test_recovery_plan_is_the_minimal_closure() -> None:
    refs = [GpuRef(0, i, DType.F64, 4, 1, 7) for i in range(5)]
    d, t, u, v, w = refs
    data = np.zeros(4)
    journal = [
        entry(1, Allocate(DType.F64, 4), d),
        entry(2, Allocate(DType.F64, 4), t),
        entry(3, Allocate(DType.F64, 4), u),
        entry(4, Upload(d, data)),             # cut off by the full upload at 8
        entry(5, Axpy(4, 1.0, u, d)),          # so is this, and u with it
        entry(6, Upload(t, data)),
        entry(7, Allocate(DType.F64, 4), v),   # never touches d
        entry(8, Upload(d, data)),
        entry(9, Axpy(4, 1.0, t, d)),          # needs t's contents
        entry(10, Scal(4, 2.0, v)),
        entry(11, Upload(t, data[:2])),        # after d's last read of t: irrelevant
        entry(12, RngFill(d, Distribution.NORMAL, 1, length=2)),  # partial: d is read too
        entry(13, Allocate(DType.F64, 4), w),
        entry(14, Free(w)),
    ]
    plan = recovery_plan(journal, [d])
    assert [e.seq for e in plan] == [1, 2, 6, 8, 9, 12]
    assert recovery_plan(journal, []) == []


class FailingStore(SqliteJournalStore):
    """An SQLite store whose appends fail (a full disk, say)."""

    def append(self, rows: Any) -> None:
        raise OSError("disk full")


def test_journal_batches_writes_and_reports_store_errors(tmp_path: Path) -> None:
    journal = Journal(SqliteJournalStore(tmp_path / "j.sqlite"), flush_interval=0.01)
    ref = GpuRef(0, 1, DType.F32, 4, 1, 3)
    for seq in range(1, 2001):
        journal.record("a" if seq % 2 else "b", seq, Scal(4, float(seq), ref))
    journal.flush()
    assert journal.written == journal.recorded == 2000
    assert journal.batches < 100
    assert journal.streams() == ["a", "b"]
    assert [e.op.alpha for e in journal.entries("b")[:3]] == [2.0, 4.0, 6.0]
    journal.close()
    broken = Journal(FailingStore(":memory:"))
    broken.record("s", 1, Scal(4, 1.0, ref))
    with pytest.raises(LibraryError, match="disk full"):
        broken.flush()
    with pytest.raises(LibraryError):
        broken.close()
    with pytest.raises(InvalidArgument, match="closed"):
        broken.flush()


async def test_a_failing_journal_loses_the_durable_buffers_not_the_device() -> None:
    journal = Journal(FailingStore(":memory:"))
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, journal=journal)
        with pytest.raises(LibraryError, match="disk full"):  # durability is not promised
            await dev.allocate_f64_async(4, durable=True)
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async("poison")
        fresh = await dev.allocate_f64_async(4)
        await dev.copy_from_numpy_async(fresh, np.ones(4))
        assert (await dev.copy_to_numpy_async(fresh)).sum() == 4
        assert (await dev.stats_async()).status is Status.READY
    with pytest.raises(LibraryError, match="disk full"):
        journal.close()


def test_default_journal_is_a_temporary_file_or_the_environments(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATOMR_ACCEL_JOURNAL", raising=False)
    journal = Journal.open()
    assert isinstance(journal.store, SqliteJournalStore)
    path = journal.store.path
    assert os.path.exists(path)
    journal.close()
    assert not os.path.exists(path)
    monkeypatch.setenv("ATOMR_ACCEL_JOURNAL", str(tmp_path / "env.sqlite"))
    kept = Journal.open()
    assert kept.streams() == []
    kept.close()
    assert (tmp_path / "env.sqlite").exists()


def test_postgres_store_when_a_server_is_given() -> None:
    pytest.importorskip("psycopg")
    dsn = os.environ.get("ATOMR_ACCEL_TEST_POSTGRES")
    if not dsn:
        pytest.skip("set ATOMR_ACCEL_TEST_POSTGRES to a PostgreSQL URL to test that store")
    journal = Journal.open(dsn)
    stream = f"test-{os.getpid()}"
    ref = GpuRef(0, 1, DType.F64, 4, 1, 3)
    journal.record(stream, 2, Upload(ref, np.arange(4.0)))
    journal.record(stream, 1, Allocate(DType.F64, 4), ref)
    entries = journal.entries(stream)
    assert [e.seq for e in entries] == [1, 2] and entries[0].result == ref
    np.testing.assert_array_equal(entries[1].op.data, np.arange(4.0))
    assert stream in journal.streams()
    journal.close()
