"""The pickles of ops a process host sends again as the same object.

A training loop sends the same ops every step: a replica's ``OpSequence`` (kept by
its ops once validated) and a collective's ``RunCollective`` (kept by its plan). An op
is immutable (a frozen dataclass), so its pickle is too, as long as nothing it holds
can change: such an op, sent as the same object on the same stream, is pickled once.
"""

from __future__ import annotations

import pickle
from typing import Any

from atomr_accel.backends._state import Lru
from atomr_accel.core._fields import immutable
from atomr_accel.core._op import Op
from atomr_accel.core.ops._collective import RunCollective
from atomr_accel.core.ops._graph import OpSequence

__all__ = ["OpPickles"]

KEPT = 256
"""How many pickles a host keeps (the least recently used go first)."""

_REPEATED = (OpSequence, RunCollective)
"""The ops sent again as the same object; any other is pickled each time."""


class OpPickles:
    """``dumps`` of ``(op, stream, out)``, kept for repeated immutable ops (see module)."""

    def __init__(self) -> None:
        self._kept: Lru[tuple[Op, int, bytes]] = Lru(KEPT)
        """``id(op)`` -> the op (held, so its id is not reused), its stream, the pickle."""

    def dumps(self, op: Op, stream: int, out: Any) -> bytes:
        """The pickle of ``(op, stream, out)``."""
        if out is not None or type(op) not in _REPEATED:
            return pickle.dumps((op, stream, out), protocol=pickle.HIGHEST_PROTOCOL)
        kept = self._kept.find(id(op))
        if kept is not None and kept[0] is op and kept[1] == stream:
            return kept[2]
        payload = pickle.dumps((op, stream, None), protocol=pickle.HIGHEST_PROTOCOL)
        if immutable(op):
            self._kept.put(id(op), (op, stream, payload))
        return payload
