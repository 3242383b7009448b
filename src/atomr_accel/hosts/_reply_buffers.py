"""The large buffers of a worker's reply (a device function's returned arrays) travel
beside its pickle, written once into a file segment of their own.

The worker pickles a reply with protocol 5, taking every buffer of 64 KiB or more
out of band (``dumps``): they are copied into one new file under ``shm_dir()``, which
the worker then forgets, and the reply says where (``Beside``). The parent maps the
file and removes its name at once (``loads``): the arrays it unpickles are views of
that mapping, with no copy, and their memory goes when the last of them does. A
reply the parent drops unread has its file removed (``discard``), and the files a
worker leaves when it dies are removed with it (``remove_segment_files``). Where
shared memory is short, the reply travels in its pickle as before.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import uuid
from dataclasses import dataclass
from typing import Any

from atomr_accel.hosts._channel import loads as load_payload
from atomr_accel.hosts._shm import SEGMENT_PREFIX, map_path, shm_dir

__all__ = ["Beside", "discard", "dumps", "loads"]

_BESIDE = 64 << 10
"""Buffers this large travel beside the pickle."""
_ALIGN = 64
_MARK = b"\x00beside\x00"
"""What a ``Beside`` reply starts with (a pickle starts with its protocol, ``\x80``)."""


@dataclass(frozen=True, slots=True)
class Beside:
    """A reply whose large buffers lie in the file ``path``: ``(offset, nbytes)`` each, in
    the order ``body`` takes them."""

    body: bytes
    path: str
    nbytes: int
    places: tuple[tuple[int, int], ...]


def dumps(value: Any) -> bytes:
    """``value`` pickled, its large buffers written beside it (the worker's side)."""
    chunks: list[memoryview] = []  # the out-of-band buffers' bytes, in the body's order

    def in_band(buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        if raw.nbytes < _BESIDE:
            return True
        chunks.append(raw)
        return False

    body = pickle.dumps(value, 5, buffer_callback=in_band)
    if not chunks:
        return body
    places = []
    end = 0
    for chunk in chunks:
        places.append((end, chunk.nbytes))
        end += -(-chunk.nbytes // _ALIGN) * _ALIGN
    try:
        path = _write_file(chunks, places)
    except OSError:  # shared memory is short: in the pickle, as before
        return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    return _MARK + pickle.dumps(Beside(body, path, end, tuple(places)),
                                pickle.HIGHEST_PROTOCOL)


def _write_file(chunks: list[memoryview], places: list[tuple[int, int]]) -> str:
    """A new file under ``shm_dir()`` holding ``chunks`` at their offsets. Written, not
    mapped: a full file system is an ``OSError`` here (nothing left behind), never a
    ``SIGBUS``, and no page is zeroed first."""
    path = os.path.join(shm_dir(), f"{SEGMENT_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        for chunk, (offset, _) in zip(chunks, places, strict=True):
            done = 0
            while done < chunk.nbytes:
                done += os.pwrite(fd, chunk[done:], offset + done)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    os.close(fd)
    return path


def loads(payload: bytes) -> Any:
    """A reply unpickled, its large buffers mapped from their file (the parent's side)."""
    if not payload.startswith(_MARK):
        return load_payload(payload)
    beside: Beside = pickle.loads(payload[len(_MARK):])
    try:
        mapping = map_path(beside.path, beside.nbytes)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(beside.path)
    view = memoryview(mapping)
    return pickle.loads(beside.body, buffers=[view[offset:offset + nbytes]
                                              for offset, nbytes in beside.places])


def discard(payload: bytes) -> None:
    """Drop a reply unread: remove its buffers' file, if it has one."""
    if payload.startswith(_MARK):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pickle.loads(payload[len(_MARK):]).path)
