"""Length-prefixed pickle frames between the parent and a context worker."""

from __future__ import annotations

import pickle
from typing import Any, BinaryIO

__all__ = ["HEADER", "encode", "read_frame"]

HEADER = 8


def encode(obj: Any) -> bytes:
    """One frame: an 8-byte little-endian length, then the pickle."""
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return len(body).to_bytes(HEADER, "little") + body


def read_frame(stream: BinaryIO) -> Any:
    """Read one frame from a blocking stream; None at end of stream."""
    header = stream.read(HEADER)
    if len(header) < HEADER:
        return None
    size = int.from_bytes(header, "little")
    body = stream.read(size)
    if len(body) < size:
        return None
    return pickle.loads(body)
