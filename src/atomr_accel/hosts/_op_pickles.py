"""The pickles of ops a process host sends again as the same object, and the ops its
worker reads again from the same bytes.

A training loop sends the same ops every step: a replica's ``OpSequence`` (kept by
its ops once validated) and a collective's ``RunCollective`` (kept by its plan); and a
facade call repeated with the same buffers and options sends the same op object (the
one ``checked`` remembers). An op is immutable (a frozen dataclass), so its pickle is
too, as long as nothing it holds can change: such an op, sent as the same object on the
same stream, is pickled once, and the worker unpickles those bytes once.
"""

from __future__ import annotations

import pickle
from typing import Any

from atomr_accel.backends._state import Lru
from atomr_accel.core._fields import immutable
from atomr_accel.core._hit_rate import HitRate
from atomr_accel.core._op import Op, remembered
from atomr_accel.core.ops._collective import RunCollective
from atomr_accel.core.ops._graph import OpSequence
from atomr_accel.hosts._channel import Spilled, loads

__all__ = ["OpPickles", "ReadOps", "repeatable"]

KEPT = 256
"""How many pickles a host keeps, and unpickled ops a worker (the least recently used
go first)."""

READ_BYTES = 8192
"""The longest payload a worker keeps the op of (a sequence of about forty ops: a deep
model's forward or update, which on CUDA replays as a graph only when it comes again as
the same object)."""

_REPEATED = (OpSequence, RunCollective)
"""Ops of parts the memo does not hold, sent again as the same object."""


def repeatable(op: object) -> bool:
    """Whether ``op`` cannot change, so its pickle (and the op read from it) may be kept."""
    return remembered(op) or (type(op) in _REPEATED and immutable(op))


class OpPickles:
    """``dumps`` of ``(op, stream, out)``, kept for repeated immutable ops (see module)."""

    def __init__(self) -> None:
        self._kept: Lru[tuple[Op, int, bytes]] = Lru(KEPT)
        """``id(op)`` -> the op (held, so its id is not reused), its stream, the pickle."""

    def dumps(self, op: Op, stream: int, out: Any) -> bytes:
        """The pickle of ``(op, stream, out)``."""
        if out is not None:
            return pickle.dumps((op, stream, out), protocol=pickle.HIGHEST_PROTOCOL)
        kept = self._kept.find(id(op))
        if kept is not None and kept[0] is op and kept[1] == stream:
            return kept[2]
        payload = pickle.dumps((op, stream, None), protocol=pickle.HIGHEST_PROTOCOL)
        if repeatable(op):
            self._kept.put(id(op), (op, stream, payload))
        return payload


class ReadOps:
    """A worker's reading of request payloads (``loads``), keeping the ``(op, stream, out)``
    read from a short payload of a repeatable op, spilled ones aside (see module); a kind
    of op whose payloads keep changing is not kept for a while (``HitRate``)."""

    def __init__(self) -> None:
        self._read: Lru[tuple[Op, int, Any]] = Lru(KEPT)
        self._rates: dict[type, HitRate] = {}

    def __call__(self, payload: bytes) -> tuple[Op, int, Any]:
        """``(op, stream, out)`` of ``payload``."""
        if len(payload) > READ_BYTES:
            read: tuple[Op, int, Any] = loads(payload)
            return read
        kept = self._read.find(payload)
        if kept is not None:
            self._rate(type(kept[0])).hit()
            return kept
        value = pickle.loads(payload)
        if isinstance(value, Spilled):  # its bytes name a segment, read once
            read = pickle.loads(value.read())
            return read
        rate = self._rate(type(value[0]))
        if not rate.resting():
            rate.miss()
            if value[2] is None and repeatable(value[0]):
                self._read.put(payload, value)
        read = value
        return read

    def _rate(self, kind: type) -> HitRate:
        rate = self._rates.get(kind)
        if rate is None:
            rate = self._rates[kind] = HitRate()
        return rate
