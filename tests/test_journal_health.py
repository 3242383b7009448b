"""A journal that cannot be opened or written never promises durability silently."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr_accel import (
    ContextPoisoned,
    GpuRefStale,
    InvalidArgument,
    Journal,
    JournalConfig,
    LibraryError,
    Status,
    System,
)
from atomr_accel.core import DType, GpuRef
from atomr_accel.core.ops._blas import Scal
from atomr_accel.core.ops._memory import Upload
from atomr_accel.device import SqliteJournalStore

pytestmark = pytest.mark.anyio

HOSTS = ["thread", "process"]


def unusable(tmp_path: Path, kind: str) -> Path:
    """A journal path that cannot be used: under a file, a directory, or garbage."""
    if kind == "under a file":
        (tmp_path / "file").write_text("not a directory")
        return tmp_path / "file" / "journal.sqlite"
    if kind == "a directory":
        return tmp_path
    path = tmp_path / "garbage.sqlite"
    path.write_bytes(np.random.default_rng(0).bytes(8192))
    return path


@pytest.mark.parametrize("isolation", HOSTS)
@pytest.mark.parametrize("kind", ["under a file", "a directory", "garbage"])
async def test_spawn_refuses_a_journal_it_cannot_use(
        tmp_path: Path, isolation: str, kind: str) -> None:
    path = unusable(tmp_path, kind)
    async with await System.open_async("t") as system:
        with pytest.raises(InvalidArgument, match="cannot be used"):
            await system.spawn_device_async(mock=True, isolation=isolation, journal=path)
        assert system.devices == []
        dev = await system.spawn_device_async(mock=True, isolation=isolation,
                                              journal=tmp_path / "good" / "journal.sqlite")
        assert (await dev.stats_async()).journal_healthy is True
        plain = await system.spawn_device_async(mock=True, isolation=isolation)
        assert (await plain.stats_async()).journal_healthy is None


async def test_spawn_refuses_a_shared_journal_that_is_closed() -> None:
    journal = Journal.open(":memory:")
    journal.close()
    async with await System.open_async("t") as system:
        with pytest.raises(InvalidArgument, match="closed"):
            await system.spawn_device_async(mock=True, journal=journal)


class FlakyStore(SqliteJournalStore):
    """An SQLite store whose appends fail once ``fail`` is set (a full disk, say)."""

    fail = False

    def append(self, rows: Any) -> None:
        if self.fail:
            raise OSError("disk full")
        super().append(rows)


@pytest.mark.parametrize("isolation", HOSTS)
async def test_an_unhealthy_journal_refuses_durability_and_says_so(isolation: str) -> None:
    store = FlakyStore(":memory:")
    journal = Journal(store)
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation, journal=journal)
        kept = await dev.allocate_f64_async(4, durable=True)
        await dev.copy_from_numpy_async(kept, np.arange(4.0))
        stats = await dev.stats_async()
        assert (stats.journal_healthy, stats.journal_error) == (True, None)

        store.fail = True
        later = await dev.allocate_f64_async(4)  # the op path never fails for the journal
        with pytest.raises(LibraryError, match="disk full"):
            await journal.flush_async()
        stats = await dev.stats_async()
        assert stats.journal_healthy is False
        assert stats.journal_error is not None and "disk full" in stats.journal_error
        with pytest.raises(LibraryError, match="disk full"):
            await dev.mark_durable_async(later)
        with pytest.raises(LibraryError, match="disk full"):
            await dev.allocate_f64_async(4, durable=True)

        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async("poison")
        with pytest.raises(GpuRefStale):  # lost loudly: the journal could not bring it back
            await dev.copy_to_numpy_async(kept)
        assert (await dev.stats_async()).status is Status.READY
    with pytest.raises(LibraryError, match="disk full"):
        journal.close()


class StuckStore(SqliteJournalStore):
    """An SQLite store whose appends wait until ``go`` is set (a store far behind)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self.go = threading.Event()

    def append(self, rows: Any) -> None:
        self.go.wait()
        super().append(rows)


class CountingStore(SqliteJournalStore):
    """An SQLite store that waits for ``go`` and keeps the size of each batch it stores."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self.go = threading.Event()
        self.sizes: list[int] = []

    def append(self, rows: Any) -> None:
        self.go.wait()
        self.sizes.append(sum(row[3] for row in rows))
        super().append(rows)


def test_a_full_queue_holds_the_producer_back_until_the_store_catches_up() -> None:
    store = CountingStore(":memory:")
    journal = Journal(store, max_queued=2, flush_interval=0)
    ref = GpuRef(0, 1, DType.F32, 4, 1, 3)

    def produce() -> None:
        for seq in range(1, 11):
            journal.record("s", seq, Scal(4, float(seq), ref))

    producer = threading.Thread(target=produce)
    producer.start()
    store.go.set()
    producer.join()
    journal.flush()
    assert journal.healthy and journal.written == 10
    assert max(store.sizes) <= 2  # never more than the bound waited for the store
    assert [e.op.alpha for e in journal.entries("s")] == [float(i) for i in range(1, 11)]
    journal.close()


def test_a_stuck_store_makes_the_journal_unhealthy_instead_of_growing() -> None:
    store = StuckStore(":memory:")
    journal = Journal(store, max_queued=4, flush_interval=0, queue_timeout=0.0)
    ref = GpuRef(0, 1, DType.F32, 4, 1, 3)
    try:
        for seq in range(1, 5):
            journal.record("s", seq, Scal(4, 1.0, ref))
        assert journal.healthy and journal.error is None
        journal.record("s", 5, Scal(4, 1.0, ref))  # one more than fits: never dropped silently
        assert not journal.healthy
        error = journal.error
        assert isinstance(error, LibraryError) and error.status == "QueueFull"
    finally:
        store.go.set()
    with pytest.raises(LibraryError, match="QueueFull"):
        journal.flush()
    with pytest.raises(LibraryError, match="QueueFull"):
        journal.close()
    assert journal.recorded == 5 and journal.written == 0


def test_the_queue_bound_counts_payload_bytes_and_always_takes_one_entry() -> None:
    store = StuckStore(":memory:")
    journal = Journal(store, max_queued_bytes=1000, flush_interval=0, queue_timeout=0.0)
    ref = GpuRef(0, 1, DType.U8, 4096, 1, 3)
    try:
        journal.record("s", 1, Upload(ref, np.zeros(4096, np.uint8)))  # alone, it fits
        assert journal.healthy
        journal.record("s", 2, Upload(ref, np.zeros(8, np.uint8)))
        assert not journal.healthy
    finally:
        store.go.set()
    with pytest.raises(LibraryError, match="QueueFull"):
        journal.close()


@pytest.mark.parametrize("isolation", HOSTS)
async def test_a_device_whose_journal_falls_behind_keeps_serving_and_says_so(
        isolation: str) -> None:
    store = StuckStore(":memory:")
    journal = Journal(store, max_queued=4, queue_timeout=0.0)
    async with await System.open_async("t") as system:
        try:
            dev = await system.spawn_device_async(
                mock=True, isolation=isolation, journal=JournalConfig(journal))
            buf = await dev.allocate_f32_async(8)
            for i in range(8):
                await dev.copy_from_numpy_async(buf, np.full(8, i, np.float32))
            np.testing.assert_array_equal(await dev.copy_to_numpy_async(buf), np.full(8, 7.0))
            stats = await dev.stats_async()
            assert stats.journal_healthy is False
            assert stats.journal_error is not None and "QueueFull" in stats.journal_error
            with pytest.raises(LibraryError, match="QueueFull"):
                await dev.mark_durable_async(buf)
        finally:
            store.go.set()  # before the device flushes on its way out
    with pytest.raises(LibraryError, match="QueueFull"):
        journal.close()


def test_a_call_its_journal_could_not_store_is_refused_and_the_journal_stays_whole(
) -> None:
    """On a thread-host device with a journal, a device function that names or keeps a
    buffer and takes an argument that cannot be pickled (a lock) is refused before it runs: the
    journal would have failed to store it and stored nothing after. The buffer keeps its
    data, the journal stays healthy and stores what follows. A call that names no buffer
    is not journaled, so its lock passes; an ``ExternalWrite`` built by hand is refused."""
    from atomr_accel.core.ops._dlpack import ExternalWrite

    class Passed:  # a recorded event whose work is done
        ptr = 1

        def synchronize(self) -> None:
            pass

    def scale(view: Any, lock: Any) -> None:
        with lock:
            view *= 2.0

    def locked_sum(values: Any, lock: Any) -> float:
        with lock:
            return float(values.sum())

    values = np.random.default_rng(11).standard_normal(4)
    with System.open("journal-refusal") as system:
        dev = system.spawn_device(mock=True, journal=":memory:")
        journal = dev.journal
        assert journal is not None
        buf = dev.allocate_f64(4, durable=True)
        dev.copy_from_numpy(buf, values)
        with pytest.raises(InvalidArgument, match="cannot be pickled"):
            dev.function(scale)(buf, threading.Lock())
        with pytest.raises(InvalidArgument, match="cannot be pickled"):  # keeps a new buffer
            dev.function(lambda lock: np.ones(4), keep=True)(threading.Lock())
        with pytest.raises(InvalidArgument, match="journal"):
            dev.run(ExternalWrite((dev.ref_of(buf),), Passed()))
        assert dev.function(locked_sum)(values, threading.Lock()) == pytest.approx(values.sum())
        journal.flush()
        assert journal.healthy and journal.error is None
        np.testing.assert_array_equal(dev.copy_to_numpy(buf), values)

        written = journal.written
        dev.function(lambda view: view.__imul__(3.0))(buf)  # a closure pickles: journaled
        journal.flush()
        assert journal.healthy and journal.written == written + 1
        np.testing.assert_array_equal(dev.copy_to_numpy(buf), 3.0 * values)
