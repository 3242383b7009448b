"""Ops a backend has run once, and what their handlers derived from them.

Some handlers do host work only the first time an op runs: a cuDNN graph is
built (and may be autotuned, waiting for its stream), a CuPy kernel is
compiled. Until then such an op is not queue-only, so an awaited call goes
through the context's thread. ``Prepared`` remembers, per backend and per op
object, what the handler derived (or only that the op ran); the backend's
``queues_only`` then answers True for it, so a repeated call is launched from
the caller's event loop, and the handler skips its derivation.

An op the op memo never keeps (a CUTLASS GEMM, whose epilogue is no plain
value) is a new object at every call, so its identity says nothing. Its kind
names instead what its first run builds (``prepares_alike``): a signature of
the op without its buffers and scalars, kept once an op of it ran.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from atomr_accel.backends._state import ByIdentity, per_backend

__all__ = ["PREPARING", "SIGNATURES", "Prepared", "prepared_of", "prepares", "prepares_alike",
           "ran"]


class Prepared:
    """What handlers derived from the ops they ran on one backend (a cuDNN graph op's built
    graph and operands; for an op that derives nothing, only that it ran), by op object.

    ``checked`` answers an equal op of plain parts with the same object, so a repeated op
    skips the derivation; one kept with ``queues`` (what its first run built or compiled
    is there, and its run only queues device work) may be launched from an event loop
    (the backend's ``queues_only``). An op is kept by its identity (``ByIdentity``); past
    ``SIZE`` ops it forgets them all."""

    SIZE = 256

    def __init__(self) -> None:
        self._made: ByIdentity[tuple[Any, bool]] = ByIdentity(self.SIZE)
        self._alike: set[Hashable] = set()

    def find(self, op: object) -> Any:
        """What was kept for ``op``, or None."""
        held = self._made.held(op)
        return None if held is None else held[0]

    def keep(self, op: object, made: Any, queues: bool) -> None:
        """Keep ``made`` for ``op``; ``queues``: its next runs only queue device work."""
        self._made.keep(op, (made, queues))

    def queues(self, op: object) -> bool:
        """Whether ``op`` was kept as one whose run only queues device work, or (a kind of
        ``prepares_alike``) an op of its signature ran."""
        signature = SIGNATURES.get(type(op))
        if signature is not None:
            return signature(op) in self._alike
        held = self._made.held(op)
        return held is not None and held[1]

    def ran_alike(self, signature: Hashable) -> None:
        """Note that an op of ``signature`` ran: the next ones only queue device work."""
        if len(self._alike) >= self.SIZE:
            self._alike.clear()
        self._alike.add(signature)


prepared_of = per_backend(Prepared)
"""The prepared ops of a backend (one per context; they go with the backend)."""

PREPARING: set[type] = set()
"""The op classes whose handlers keep what they derive in ``Prepared`` (``prepares``)."""


def prepares(*kinds: type) -> None:
    """Say that the handlers of ``kinds`` keep their ops in ``Prepared``, so the backend
    asks it whether such an op only queues work."""
    PREPARING.update(kinds)


SIGNATURES: dict[type, Callable[[Any], Hashable]] = {}
"""The op classes told ready by a signature (``prepares_alike``), with their signature."""


def prepares_alike(kind: type, signature: Callable[[Any], Hashable]) -> None:
    """Say that an op of ``kind`` only queues work once an op of the same ``signature(op)``
    ran (``ran`` notes it): for ops that are new objects at every call. The signature must
    name everything the first run builds from (a kernel's dtypes, shape, options)."""
    PREPARING.add(kind)
    SIGNATURES[kind] = signature


def ran(backend: Any, op: object) -> None:
    """Note that ``op`` ran on ``backend`` (a handler's last step, for an op whose only host
    work beyond queueing is compiling its kernels on first use): its next runs, or those
    of its signature (``prepares_alike``), only queue device work."""
    prepared = prepared_of(backend)
    signature = SIGNATURES.get(type(op))
    if signature is not None:
        prepared.ran_alike(signature(op))
    elif prepared.find(op) is None:
        prepared.keep(op, True, queues=True)
