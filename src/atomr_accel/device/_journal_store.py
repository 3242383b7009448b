"""Where a journal's rows live, and how a batch of entries becomes a row.

A row is one batch of one stream: ``(stream, first seq, last seq, entries,
body)``, the body one pickle of the batch with payload arrays out of band. A
``JournalStore`` keeps rows: SQLite (``SqliteJournalStore``, a file or
``":memory:"``) or PostgreSQL (``PostgresJournalStore``, psycopg 3 imported
only when used). Every method of a store runs on its journal's writer thread.
"""

from __future__ import annotations

import os
import pickle
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import Op

__all__ = [
    "JournalStore", "PostgresJournalStore", "Row", "SqliteJournalStore", "decode", "encode",
    "open_store", "row_of",
]

Row = tuple[str, int, int, int, bytes]
"""``(stream, first seq, last seq, entries, body)``: one batch of one stream, pickled."""


class JournalStore(Protocol):
    """Where a journal's rows live. Every method runs on the journal's writer thread."""

    def append(self, rows: Sequence[Row]) -> None:
        """Store ``rows`` in one transaction."""
        ...

    def read(self, stream: str) -> list[bytes]:
        """The bodies of ``stream``'s batches, oldest first."""
        ...

    def replace(self, stream: str, rows: Sequence[Row]) -> None:
        """Replace every row of ``stream`` with ``rows`` (rows of that stream), in one
        transaction: a compaction."""
        ...

    def streams(self) -> list[str]:
        """Every stream stored, sorted."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS atomr_journal_batches ("
    " id {serial}, stream TEXT NOT NULL, first_seq BIGINT NOT NULL,"
    " last_seq BIGINT NOT NULL, entries INTEGER NOT NULL, body {blob} NOT NULL)"
)
_INDEX = "CREATE INDEX IF NOT EXISTS atomr_journal_stream ON atomr_journal_batches (stream, id)"
_INSERT = ("INSERT INTO atomr_journal_batches (stream, first_seq, last_seq, entries, body)"
           " VALUES ({p}, {p}, {p}, {p}, {p})")


class SqliteJournalStore:
    """A journal in an SQLite file (WAL, ``synchronous=NORMAL``), or ``":memory:"``.

    The connection is opened lazily on the thread that first uses it.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._db: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=30.0)
            try:
                if self.path != ":memory:":
                    db.execute("PRAGMA page_size=65536")  # a new file only: few pages a payload
                    db.execute("PRAGMA journal_mode=WAL")
                    db.execute("PRAGMA synchronous=NORMAL")
                db.execute(_SCHEMA.format(serial="INTEGER PRIMARY KEY", blob="BLOB"))
                db.execute(_INDEX)
                db.commit()
                # a journal that opens read-only, or a table of another shape, fails here
                db.execute(_INSERT.format(p="?"), ("", 0, 0, 0, b""))
                db.rollback()
            except BaseException:
                db.close()
                raise
            self._db = db
        return self._db

    def append(self, rows: Sequence[Row]) -> None:
        """Insert ``rows`` in one transaction."""
        db = self._connect()
        with db:
            db.executemany(_INSERT.format(p="?"), rows)

    def read(self, stream: str) -> list[bytes]:
        """The batches of ``stream``, oldest first."""
        cursor = self._connect().execute(
            "SELECT body FROM atomr_journal_batches WHERE stream = ? ORDER BY id", (stream,))
        return [bytes(row[0]) for row in cursor]

    def replace(self, stream: str, rows: Sequence[Row]) -> None:
        """Delete the rows of ``stream`` and insert ``rows``, in one transaction."""
        db = self._connect()
        with db:
            db.execute("DELETE FROM atomr_journal_batches WHERE stream = ?", (stream,))
            db.executemany(_INSERT.format(p="?"), rows)

    def streams(self) -> list[str]:
        """Every stream stored."""
        cursor = self._connect().execute(
            "SELECT DISTINCT stream FROM atomr_journal_batches ORDER BY stream")
        return [str(row[0]) for row in cursor]

    def close(self) -> None:
        """Close the connection."""
        if self._db is not None:
            self._db.close()
            self._db = None


class PostgresJournalStore:
    """A journal in a PostgreSQL table, through psycopg 3.

    Install it with ``pip install 'atomr-accel-py[postgres]'``.

    ``dsn`` is a libpq connection string or URL; the connection opens lazily.
    """

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._db: Any = None

    def _connect(self) -> Any:
        if self._db is None:
            try:
                import psycopg
            except ImportError as exc:
                raise InvalidArgument(
                    "a PostgreSQL journal needs psycopg: pip install 'atomr-accel-py[postgres]'"
                ) from exc
            db = psycopg.connect(self.dsn)
            with db.transaction():
                db.execute(_SCHEMA.format(serial="BIGSERIAL PRIMARY KEY", blob="BYTEA"))
                db.execute(_INDEX)
            self._db = db
        return self._db

    def append(self, rows: Sequence[Row]) -> None:
        """Insert ``rows`` in one transaction."""
        db = self._connect()
        with db.transaction(), db.cursor() as cursor:
            cursor.executemany(_INSERT.format(p="%s"), list(rows))

    def read(self, stream: str) -> list[bytes]:
        """The batches of ``stream``, oldest first."""
        db = self._connect()
        with db.transaction():
            rows = db.execute(
                "SELECT body FROM atomr_journal_batches WHERE stream = %s ORDER BY id",
                (stream,)).fetchall()
        return [bytes(row[0]) for row in rows]

    def replace(self, stream: str, rows: Sequence[Row]) -> None:
        """Delete the rows of ``stream`` and insert ``rows``, in one transaction."""
        db = self._connect()
        with db.transaction(), db.cursor() as cursor:
            cursor.execute("DELETE FROM atomr_journal_batches WHERE stream = %s", (stream,))
            cursor.executemany(_INSERT.format(p="%s"), list(rows))

    def streams(self) -> list[str]:
        """Every stream stored."""
        db = self._connect()
        with db.transaction():
            rows = db.execute(
                "SELECT DISTINCT stream FROM atomr_journal_batches ORDER BY stream")
            return [str(row[0]) for row in rows.fetchall()]

    def close(self) -> None:
        """Close the connection."""
        if self._db is not None:
            self._db.close()
            self._db = None


def open_store(target: str | os.PathLike[str]) -> JournalStore:
    """A store for ``target``: a ``postgresql://`` URL, or an SQLite path (``":memory:"`` too)."""
    text = os.fspath(target)
    if text.startswith(("postgresql://", "postgres://")):
        return PostgresJournalStore(text)
    return SqliteJournalStore(text.removeprefix("sqlite://"))


def row_of(stream: str, items: list[tuple[int, Op, Any, str]]) -> Row:
    """One row of ``stream`` holding ``items`` (``(seq, op, result, outcome)``)."""
    seqs = [item[0] for item in items]
    return (stream, min(seqs), max(seqs), len(items), encode(items))


def encode(entries: list[tuple[int, Op, Any, str]]) -> bytes:
    """One pickle of ``entries`` with payload arrays out of band (copied once, not twice).

    Layout: head size, sizes size (8 bytes each, little-endian), the pickle, the
    pickled list of payload sizes, then the payloads.
    """
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(entries, protocol=5, buffer_callback=buffers.append)
    raws = [buffer.raw() for buffer in buffers]
    sizes = pickle.dumps([raw.nbytes for raw in raws], protocol=5)
    return b"".join([len(head).to_bytes(8, "little"), len(sizes).to_bytes(8, "little"),
                     head, sizes, *raws])


def decode(body: bytes) -> list[tuple[int, Op, Any, str]]:
    """The entries ``encode`` wrote (payload arrays are read-only views of ``body``)."""
    view = memoryview(body)
    head_size, sizes_size = int.from_bytes(view[:8], "little"), int.from_bytes(view[8:16], "little")
    at = 16 + head_size
    head, sizes = view[16:at], pickle.loads(view[at:at + sizes_size])
    at += sizes_size
    buffers = []
    for size in sizes:
        buffers.append(view[at:at + size])
        at += size
    entries: list[tuple[int, Op, Any, str]] = pickle.loads(head, buffers=buffers)
    return entries
