"""What a replay runs: the minimal closure of a journal, compaction, and handles remapped.

Recovery replays the minimal closure of the journal, not all of it
(``recovery_plan``): walking back from the end, an entry is kept when it writes
a buffer whose contents are needed or makes a handle that is needed; a kept
entry needs every buffer and handle it touches (a written buffer may be read
too: ``beta * C``, ``axpy``), except a buffer it overwrites whole without reading
it (a full ``Upload`` or ``RngFill``), whose earlier history then stops
mattering. Non-durable buffers the closure needs are rebuilt as temporaries
and freed once the durable ones are whole again; graphs the replay captured are
destroyed; if the replay fails, everything it made is released.

Compaction bounds that replay (``compacted``): once a durable buffer has been
written by ``compact_after`` journaled ops since its last whole overwrite, the
device downloads it as an op of its own (so its contents are exactly those of
its launch point ``seq``) and journals an ``Upload`` of those bytes under that
``seq``: a snapshot. It then rewrites its stream, dropping the entries before
the oldest op still in flight that nothing live needs any more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from atomr_accel.core._errors import GpuRuntimeError, LibraryError
from atomr_accel.core._op import Op
from atomr_accel.core._ref import GpuRef, GraphRef, KernelRef
from atomr_accel.core.ops._graph import DestroyGraph
from atomr_accel.core.ops._memory import Free, Upload
from atomr_accel.core.ops._rng import RngFill
from atomr_accel.device._journal import JournalEntry

__all__ = [
    "HANDLES", "Handle", "Replayer", "overwrites", "compacted", "drive", "recovery_plan", "remap",
]

HANDLES = (GpuRef, KernelRef, GraphRef)
"""The handle types an op may make: a replay maps each recorded one to the one it makes."""
Handle = GpuRef | KernelRef | GraphRef
"""One handle: a buffer, a kernel or a graph."""


def remap(value: Any, mapping: dict[Any, Any]) -> Any:
    """``value`` with every handle found in ``mapping`` replaced; the same object if none is.

    Walks ops, nested dataclasses (a ``CsrMatrix``, the ops of a graph) and
    tuples; handles themselves (``GpuRef``, ``KernelRef``, ``GraphRef``) are
    looked up whole, never opened.
    """
    if isinstance(value, HANDLES):
        return mapping.get(value, value)
    if isinstance(value, tuple):
        items = tuple(remap(item, mapping) for item in value)
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for field in dataclasses.fields(value):
            old = getattr(value, field.name)
            new = remap(old, mapping)
            if new is not old:
                changes[field.name] = new
        return dataclasses.replace(value, **changes) if changes else value
    return value


def overwrites(op: Op) -> tuple[GpuRef, ...]:
    """Buffers ``op`` overwrites whole without reading them."""
    if isinstance(op, Upload) and op.offset == 0 and getattr(op.data, "size", -1) == op.ref.length:
        return (op.ref,)
    if isinstance(op, RngFill) and op.count == op.out.length:
        return (op.out,)
    return ()


def recovery_plan(entries: Sequence[JournalEntry], durable: Iterable[GpuRef]) -> list[JournalEntry]:
    """The entries that rebuild the ``durable`` buffers (canonical refs), in journal order.

    A backward slice of the journal (no I/O): see the module docstring.
    """
    exists: set[Any] = set(durable)  # buffers and handles the replay must make
    contents: set[GpuRef] = set(exists)  # buffers whose contents it must rebuild
    plan: list[JournalEntry] = []
    for entry in reversed(entries):
        op = entry.op
        if isinstance(op, Free):
            continue
        makes = entry.result in exists if isinstance(entry.result, HANDLES) else False
        if not makes and contents.isdisjoint(op.writes()):
            continue
        plan.append(entry)
        whole = overwrites(op)
        contents.difference_update(whole)
        for ref in op.refs():
            exists.add(ref)
            if ref not in whole:
                contents.add(ref)
        exists.update(op.handles())
    plan.reverse()
    return plan


def compacted(entries: Sequence[JournalEntry], horizon: int,
              live: Iterable[GpuRef]) -> list[JournalEntry]:
    """``entries`` less those before ``horizon`` that nothing live needs (no I/O).

    Every op with ``seq < horizon`` has been answered and journaled (or never
    will be), so that prefix is final: of it, keep the closure that rebuilds
    the ``live`` buffers (canonical refs) and every buffer or handle a later
    entry uses, and every handle it made (a caller may still launch it). The
    entries from ``horizon`` on are kept as they are.
    """
    prefix = [e for e in entries if e.seq < horizon]
    suffix = [e for e in entries if e.seq >= horizon]
    needed: set[Any] = set(live)
    for entry in suffix:
        needed.update(entry.op.refs())
        needed.update(entry.op.handles())
    destroyed = {e.op.graph for e in prefix if isinstance(e.op, DestroyGraph)}
    needed.update(e.result for e in prefix
                  if isinstance(e.result, KernelRef | GraphRef) and e.result not in destroyed)
    return recovery_plan(prefix, needed) + suffix


class Replayer:
    """Replays journal entries in order, mapping recorded handles to the ones it makes.

    No I/O: a driver asks ``next_op()`` for the op to run (the recorded op with
    its handles mapped), runs it, and reports with ``completed(result, error)``.
    ``mapping`` maps each recorded handle to the replayed one.
    """

    def __init__(self, entries: Iterable[JournalEntry],
                 mapping: dict[Any, Any] | None = None) -> None:
        self.entries = list(entries)
        self.mapping: dict[Any, Any] = dict(mapping or {})
        self.index = 0

    def next_op(self) -> Op | None:
        """The next op to run, or None when every entry has been replayed."""
        if self.index >= len(self.entries):
            return None
        op: Op = remap(self.entries[self.index].op, self.mapping)
        return op

    def completed(self, result: Any, error: GpuRuntimeError | None = None) -> None:
        """Record how the op from ``next_op`` ended; re-raise an error the journal did not have."""
        entry = self.entries[self.index]
        self.index += 1
        if error is not None:
            if entry.outcome == "error" and isinstance(error, LibraryError):
                return  # it failed the same way when it was recorded
            error.add_note(f"while replaying journal entry {entry.seq} ({type(entry.op).__name__})")
            raise error
        if isinstance(entry.result, HANDLES) and isinstance(result, HANDLES):
            self.mapping[entry.result] = result


async def drive(replayer: Replayer, run: Callable[[Op], Awaitable[Any]]) -> dict[Any, Any]:
    """Replay every entry through ``run`` (one op at a time, in order); return the mapping."""
    while (op := replayer.next_op()) is not None:
        try:
            result = await run(op)
        except GpuRuntimeError as exc:
            replayer.completed(None, exc)
        else:
            replayer.completed(result)
    return replayer.mapping
