"""The replay journal: completed ops of a device, stored off the op path.

A ``Journal`` takes entries from the event loop without blocking it (a queue
put), and a writer thread pickles and stores them in batches: one row per
stream and batch (one pickle of all its entries), one transaction per batch.
Where they are stored is a ``JournalStore``: SQLite by default
(``SqliteJournalStore``, a file or ``":memory:"``), PostgreSQL optionally
(``PostgresJournalStore``, psycopg 3 imported only when used).

Entries are pickles: open only journals you trust.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr_accel.core._errors import InvalidArgument, LibraryError
from atomr_accel.core._op import Op
from atomr_accel.device._journal_store import (
    JournalStore,
    PostgresJournalStore,
    SqliteJournalStore,
    decode,
    open_store,
    row_of,
)
from atomr_accel.device._payloads import PayloadPool

__all__ = [
    "JOURNAL_ENV",
    "Journal",
    "JournalConfig",
    "JournalEntry",
    "JournalStore",
    "PostgresJournalStore",
    "SqliteJournalStore",
]

JOURNAL_ENV = "ATOMR_ACCEL_JOURNAL"
"""Environment variable naming the default journal (an SQLite path or a PostgreSQL URL)."""

@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One completed op of a device, in launch order (``seq``) within its ``stream``.

    ``result`` is kept only when it is a handle the op made (the ``GpuRef`` of an
    ``Allocate``, a kernel or graph handle); ``outcome`` is ``"ok"``, or
    ``"error"`` for an op that ran and failed with a ``LibraryError`` (it may
    have written part of its outputs, so a replay runs it too).
    """

    stream: str
    seq: int
    op: Op
    result: Any = None
    outcome: str = "ok"


@dataclass(frozen=True, slots=True)
class _Command:
    run: Callable[[], Any]
    future: concurrent.futures.Future[Any]


_STOP = object()


class Journal:
    """Batched, asynchronous writes of ``JournalEntry`` rows to a ``JournalStore``.

    ``record`` never blocks: it queues the entry for the writer thread, which
    waits ``flush_interval`` seconds to gather a batch (at most ``batch_size``
    entries), pickles it and stores it in one transaction. ``entries`` and
    ``flush`` first wait until everything recorded before them is stored.

    The queue is bounded, with back-pressure: while ``max_queued`` entries, or
    more than ``max_queued_bytes`` of upload payload, wait for the store (so
    one large upload always fits), ``record`` blocks its caller until the
    writer catches up, at most ``queue_timeout`` seconds; an entry still
    refused then (a store that is stuck, not merely slower) is dropped. The
    first failure, a store error or a dropped entry, makes the journal
    unhealthy for good (``error``): it stores nothing more, since a stream with
    a gap cannot be replayed, and ``flush``, ``entries``, ``rewrite_async`` and
    ``close`` raise that error (a ``LibraryError`` of library ``"journal"``).
    """

    def __init__(self, store: JournalStore, *, batch_size: int = 512,
                 flush_interval: float = 0.005, max_queued: int = 65536,
                 max_queued_bytes: int = 256 << 20, queue_timeout: float = 30.0,
                 remove_on_close: str | None = None) -> None:
        if (batch_size < 1 or max_queued < 1 or min(flush_interval, max_queued_bytes,
                                                    queue_timeout) < 0):
            raise InvalidArgument("batch_size and max_queued must be >= 1, and flush_interval, "
                                  "max_queued_bytes and queue_timeout >= 0")
        self.store = store
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.max_queued = max_queued
        self.max_queued_bytes = max_queued_bytes
        self.queue_timeout = queue_timeout
        self.recorded = 0
        """Entries handed to ``record``."""
        self.written = 0
        """Entries stored so far."""
        self.batches = 0
        """Transactions committed so far."""
        self._remove_on_close = remove_on_close
        self.payloads = PayloadPool()
        """Where ``copy_payload`` puts copies; the writer gives them back once stored."""
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Condition()
        """Guards the counters below and ``_error``; notified when the writer takes entries."""
        self._queued = 0
        self._queued_bytes = 0
        self._error: LibraryError | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._write_loop, name="atomr-journal",
                                        daemon=True)
        self._thread.start()

    @classmethod
    def open(cls, target: str | os.PathLike[str] | None = None, **options: Any) -> Journal:
        """Open the journal at ``target`` (an SQLite path, ``":memory:"`` or a PostgreSQL URL).

        ``None`` means ``$ATOMR_ACCEL_JOURNAL`` when set, else a temporary SQLite
        file that is removed when the journal closes. ``options`` go to ``Journal``.
        The store is opened by the writer thread when first used (``check_async``).
        """
        remove = None
        if target is None:
            target = os.environ.get(JOURNAL_ENV)
        if target is None:
            target = remove = _temporary_file()
        return cls(open_store(target), remove_on_close=remove, **options)

    # ------------------------------------------------------------ health

    @property
    def healthy(self) -> bool:
        """False once a write failed or an entry found the queue full (see ``error``)."""
        return self._error is None

    @property
    def error(self) -> LibraryError | None:
        """Why the journal is unhealthy (a fresh ``LibraryError`` each call), or None."""
        error = self._error
        if error is None:
            return None
        again = copy.copy(error)
        again.__cause__ = error.__cause__
        return again

    def _fail(self, error: LibraryError) -> None:
        with self._lock:
            if self._error is None:
                self._error = error
            self._lock.notify_all()  # whoever waits for room: drop, do not wait

    async def check_async(self) -> None:
        """Open the store and read it (on the writer thread); ``LibraryError`` if it cannot
        be used (not a journal, not writable, unreachable) or the journal is unhealthy."""
        await asyncio.wrap_future(self._submit(self.store.streams))

    # ------------------------------------------------------------ writing

    def copy_payload(self, data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """A private copy of an upload's ``data`` for an op about to be ``record``-ed, in
        memory the writer recycles once the entry is stored (``PayloadPool``)."""
        return self.payloads.copy(data)

    def record(self, stream: str, seq: int, op: Op, result: Any = None,
               outcome: str = "ok") -> None:
        """Queue one entry (any thread). ``op`` must not change afterwards.

        Returns at once while the queue has room; else blocks (the event loop
        too, when called there) until the writer makes room, at most
        ``queue_timeout`` seconds, then drops the entry and makes the journal
        unhealthy (``error``). An unhealthy journal drops it at once.
        """
        data = getattr(op, "data", None)
        size = data.nbytes if isinstance(data, np.ndarray) else 0
        with self._lock:
            self.recorded += 1
            if not self._lock.wait_for(self._room, self.queue_timeout):
                self._error = LibraryError(
                    "journal", "QueueFull",
                    f"{self._queued} entries holding {self._queued_bytes} payload bytes still "
                    f"wait for the store after {self.queue_timeout:g} s (bounds: "
                    f"{self.max_queued} entries, {self.max_queued_bytes} bytes); it is stuck, "
                    "so nothing recorded from now on is stored")
            if self._error is not None:
                self.payloads.give_back(data)
                return
            self._queued += 1
            self._queued_bytes += size
        self._queue.put((stream, seq, op, result, outcome, size))

    def _room(self) -> bool:
        """True when an entry may be queued, or need not wait (unhealthy, closed)."""
        return (self._error is not None or self._closed or (
            self._queued < self.max_queued and self._queued_bytes <= self.max_queued_bytes))

    def _write_loop(self) -> None:
        pending: list[tuple[str, int, Op, Any, str, int]] = []
        while True:
            item = self._queue.get()
            if item is not _STOP and not isinstance(item, _Command) and self.flush_interval:
                time.sleep(self.flush_interval)  # let a batch gather (releases the GIL)
            commands: list[Any] = []
            while True:
                if item is _STOP or isinstance(item, _Command):
                    commands.append(item)
                else:
                    pending.append(item)
                if len(pending) >= self.batch_size:
                    self._store(pending)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            self._store(pending)
            for command in commands:
                if command is _STOP:
                    self._finish()
                    return
                self._answer(command)

    def _store(self, pending: list[tuple[str, int, Op, Any, str, int]]) -> None:
        if not pending:
            return
        if self._error is None:
            streams: dict[str, list[tuple[int, Op, Any, str]]] = {}
            for stream, seq, op, result, outcome, _ in pending:
                streams.setdefault(stream, []).append((seq, op, result, outcome))
            try:
                self.store.append([row_of(stream, items) for stream, items in streams.items()])
            except Exception as exc:
                self._fail(_store_error(exc))
            else:
                self.written += len(pending)
                self.batches += 1
        for item in pending:
            self.payloads.give_back(getattr(item[2], "data", None))
        size = sum(item[5] for item in pending)
        with self._lock:
            self._queued -= len(pending)
            self._queued_bytes -= size
            self._lock.notify_all()
        pending.clear()

    def _answer(self, command: _Command) -> None:
        if not command.future.set_running_or_notify_cancel():
            return  # the asker went away
        error = self.error
        if error is not None:
            command.future.set_exception(error)
            return
        try:
            command.future.set_result(command.run())
        except Exception as exc:
            command.future.set_exception(_store_error(exc))

    def _finish(self) -> None:
        with contextlib.suppress(Exception):
            self.store.close()
        if self._remove_on_close is not None:
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._remove_on_close + suffix)

    def _submit(self, run: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        if self._closed:
            raise InvalidArgument("the journal is closed")
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._queue.put(_Command(run, future))
        return future

    # ------------------------------------------------------------ reading

    def flush(self) -> None:
        """Block until every entry recorded so far is stored."""
        self._submit(lambda: None).result()

    async def flush_async(self) -> None:
        """Wait (without blocking the loop) until every entry recorded so far is stored."""
        await asyncio.wrap_future(self._submit(lambda: None))

    def entries(self, stream: str) -> list[JournalEntry]:
        """Every entry of ``stream`` by ``seq`` (after a flush)."""
        entries: list[JournalEntry] = self._submit(lambda: self._read(stream)).result()
        return entries

    async def entries_async(self, stream: str) -> list[JournalEntry]:
        """``entries`` without blocking the event loop."""
        entries: list[JournalEntry] = await asyncio.wrap_future(
            self._submit(lambda: self._read(stream)))
        return entries

    def _read(self, stream: str) -> list[JournalEntry]:
        entries = [JournalEntry(stream, seq, op, result, outcome)
                   for body in self.store.read(stream)
                   for seq, op, result, outcome in decode(body)]
        entries.sort(key=lambda entry: entry.seq)
        return entries

    async def rewrite_async(self, stream: str,
                            select: Callable[[list[JournalEntry]], list[JournalEntry]]) -> int:
        """Replace ``stream``'s entries with ``select(entries)`` in one transaction.

        A compaction: ``select`` runs on the writer thread, after every entry
        recorded before this call is stored, and must keep ``seq`` order.
        Returns how many entries were dropped.
        """
        dropped: int = await asyncio.wrap_future(
            self._submit(lambda: self._rewrite(stream, select)))
        return dropped

    def _rewrite(self, stream: str,
                 select: Callable[[list[JournalEntry]], list[JournalEntry]]) -> int:
        entries = self._read(stream)
        kept = [(e.seq, e.op, e.result, e.outcome) for e in select(entries)]
        self.store.replace(stream, [row_of(stream, kept[at:at + self.batch_size])
                                    for at in range(0, len(kept), self.batch_size)])
        return len(entries) - len(kept)

    def streams(self) -> list[str]:
        """Every stream in the store (after a flush)."""
        streams: list[str] = self._submit(self.store.streams).result()
        return streams

    # ------------------------------------------------------------ closing

    def close(self) -> None:
        """Store what is queued, then close the store; raises the error that made the
        journal unhealthy, if one did."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join()
        error = self.error
        if error is not None:
            raise error

    async def close_async(self) -> None:
        """``close`` without blocking the event loop."""
        await asyncio.to_thread(self.close)

    def __repr__(self) -> str:
        return (f"Journal({type(self.store).__name__}, recorded={self.recorded}, "
                f"written={self.written}, batches={self.batches})")


def _temporary_file() -> str:
    """A new temporary SQLite file's path; ``InvalidArgument`` naming the directories and
    the OS error when none is writable."""
    try:
        fd, path = tempfile.mkstemp(prefix="atomr-accel-journal-", suffix=".sqlite")
    except OSError as exc:
        where = tempfile.tempdir or "any temporary directory ($TMPDIR, /tmp, /var/tmp, ...)"
        raise InvalidArgument(f"cannot create the journal's temporary file in {where}: "
                              f"{type(exc).__name__}: {exc}; pass a journal path or set "
                              f"${JOURNAL_ENV}") from exc
    os.close(fd)
    return path


def _store_error(exc: BaseException) -> LibraryError:
    error = LibraryError("journal", type(exc).__name__, str(exc))
    error.__cause__ = exc
    return error


@dataclass(frozen=True)
class JournalConfig:
    """Journal a device's completed ops, for replay and durable-buffer recovery.

    ``target`` is a ``Journal`` to share (the device does not close it), or
    where to open one: an SQLite path, ``":memory:"``, a ``postgresql://`` URL,
    or None for ``$ATOMR_ACCEL_JOURNAL`` / a temporary SQLite file removed on
    close. ``batch_size``, ``flush_interval``, ``max_queued``,
    ``max_queued_bytes`` and ``queue_timeout`` tune the writer thread and its
    back-pressure (see ``Journal``).
    ``compact_after``: once a durable buffer has been written by that many
    journaled ops since its last whole overwrite, the device stores a snapshot
    of it and compacts its stream (None: never; see docs/replay.md).
    """

    target: Journal | str | os.PathLike[str] | None = None
    batch_size: int = 512
    flush_interval: float = 0.005
    max_queued: int = 65536
    max_queued_bytes: int = 256 << 20
    queue_timeout: float = 30.0
    compact_after: int | None = 1024

    def __post_init__(self) -> None:
        if self.compact_after is not None and self.compact_after < 1:
            raise InvalidArgument(f"compact_after must be >= 1 or None, got {self.compact_after}")

    @classmethod
    def of(cls, journal: JournalConfig | Journal | str | os.PathLike[str] | bool | None
           ) -> JournalConfig | None:
        """What ``spawn_device(journal=...)`` means: None/False none, True the default."""
        if journal is None or journal is False:
            return None
        if journal is True:
            return cls()
        if isinstance(journal, JournalConfig):
            return journal
        if isinstance(journal, Journal | str | os.PathLike):
            return cls(journal)
        raise InvalidArgument(
            f"journal must be True, a path, a PostgreSQL URL, a Journal or a JournalConfig; "
            f"got {journal!r}")

    def open(self) -> tuple[Journal, bool]:
        """The journal and whether the caller owns it (and must close it)."""
        if isinstance(self.target, Journal):
            return self.target, False
        journal = Journal.open(self.target, batch_size=self.batch_size,
                               flush_interval=self.flush_interval, max_queued=self.max_queued,
                               max_queued_bytes=self.max_queued_bytes,
                               queue_timeout=self.queue_timeout)
        return journal, True
