"""Collective ops on the CPU backend: the ranks exchange their data through shared memory.

A CPU context cannot reach another context's arrays, so each rank's
``RunCollective`` meets its peers in files beside the world's abort word (in
``/dev/shm``: every rank of a CPU world runs on one machine, in this process or
in a worker):

* ``CommInit`` records which world, epoch and rank this context joined and the
  abort word's path; ``CommAbort`` forgets it and removes this rank's files.
* ``RunCollective`` runs its calls in order. For each, a rank writes what it
  sends (an empty file when it sends nothing) as ``<word>.<epoch>.<peers>.<n>.<rank>``
  (``peers``: ``all``, or ``<src>-<dst>`` for a send and its receive; ``n``
  counts the collectives of those peers), waits until every peer's file is
  there, computes its own result in NumPy in the buffers' dtype (integers wrap
  as NCCL's do; ``avg`` divides the sum, truncating integers toward zero) and
  writes it into its recv buffer. Having seen every peer's file of collective
  ``n``, it removes its own of ``n - 1``, which every peer has read by then.
  Past the op's time-out, or once the world's abort word leaves the epoch, it
  raises ``CollectiveAborted``. The world removes what is left when it
  rebuilds or stops.

Where every rank of an epoch runs in this process (thread hosts: each rank's
``CommInit`` leaves a file with its process id), the same exchange goes
through a mailbox in memory instead: a rank posts a copy of what it sends
under the file's name, and no file is written, mapped or removed.
"""

from __future__ import annotations

import contextlib
import glob
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atomr_accel.backends._base import Backend, Rank
from atomr_accel.backends._handlers import cpu
from atomr_accel.backends._shm import SharedWord, remove_files
from atomr_accel.backends._spin import wait_until
from atomr_accel.backends._state import per_backend
from atomr_accel.backends.cpu._collective_maths import result_of, sent_length
from atomr_accel.core._errors import CollectiveAborted
from atomr_accel.core.ops._collective import (
    CallKind,
    CollectiveCall,
    CommAbort,
    CommInit,
    RunCollective,
)

__all__ = ["start_ranks", "unique_id", "worlds"]


def unique_id() -> bytes:
    """The id of a CPU world's epoch: none (its ranks meet beside the abort word)."""
    return b""


@dataclass
class _Joined:
    """This rank's membership of one world epoch: where it meets its peers and how many
    collectives of each set of peers it has run."""

    epoch: int
    rank: int
    nranks: int
    word_path: str
    runs: dict[str, int] = field(default_factory=dict)
    word: SharedWord | None = None
    local: bool | None = None
    """Whether every rank runs in this process (None: not known before the first
    collective, which waits for every rank's process id)."""

    def open(self) -> None:
        """Map the world's abort word (a world without one never aborts early)."""
        if self.word_path:
            self.word = SharedWord(self.word_path)

    def told_to_abort(self) -> bool:
        """Whether the world has left this epoch."""
        return self.word is not None and self.word.value != self.epoch

    def path(self, peers: str, n: int, rank: int) -> str:
        """The file rank ``rank`` writes for the ``n``-th collective of ``peers``."""
        return f"{self.word_path}.{self.epoch}.{peers}.{n}.{rank}"

    def pid_path(self, rank: int) -> str:
        """The file that holds rank ``rank``'s process id."""
        return self.path("pid", 0, rank)

    def leave(self) -> None:
        """Unmap the word and remove this rank's files and posts."""
        if self.word is not None:
            self.word.close()
            self.word = None
        if self.word_path:
            remove_files(f"{glob.escape(self.word_path)}.*.{self.rank}")
        _MAILBOX.drop(f"{self.word_path}.", f".{self.rank}")


class _Mailbox:
    """What the ranks of in-process worlds send, posted under their files' names."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._posts: dict[str, np.ndarray[Any, Any]] = {}

    def post(self, name: str, data: np.ndarray[Any, Any]) -> None:
        """Post a copy of ``data`` (its sender may change it once its own call is done)."""
        copy = data.copy()
        with self._lock:
            self._posts[name] = copy

    def has(self, names: Iterable[str]) -> bool:
        """Whether every one of ``names`` is posted."""
        posts = self._posts
        return all(name in posts for name in names)

    def take(self, name: str) -> np.ndarray[Any, Any]:
        """The post ``name`` (it stays, for the other ranks)."""
        return self._posts[name]

    def discard(self, name: str) -> None:
        """Remove the post ``name``, if there is one."""
        with self._lock:
            self._posts.pop(name, None)

    def drop(self, prefix: str, suffix: str) -> None:
        """Remove the posts whose names start with ``prefix`` and end with ``suffix``."""
        with self._lock:
            for name in [n for n in self._posts if n.startswith(prefix) and n.endswith(suffix)]:
                del self._posts[name]


_MAILBOX = _Mailbox()


worlds: Callable[[Backend], dict[int, _Joined]] = per_backend(dict)
"""``worlds(backend)``: world id -> this context's membership of the world."""


@cpu.handles(CommInit)
def _init(backend: Backend, op: CommInit) -> None:
    _abort(backend, CommAbort(op.world))
    joined = _Joined(op.epoch, op.rank, op.nranks, op.abort_path)
    joined.open()
    if joined.word_path:
        _write(joined.pid_path(op.rank), np.frombuffer(str(os.getpid()).encode(), np.uint8))
    worlds(backend)[op.world] = joined


@cpu.handles(CommAbort)
def _abort(backend: Backend, op: CommAbort) -> None:
    joined = worlds(backend).pop(op.world, None)
    if joined is not None:
        joined.leave()


def _peers(call: CollectiveCall, rank: int, nranks: int) -> tuple[str, tuple[int, ...]]:
    """The name and ranks of the peers taking part in ``call`` (``rank``'s part)."""
    if call.kind is CallKind.SEND:
        return f"{rank}-{call.root}", (rank, call.root)
    if call.kind is CallKind.RECV:
        return f"{call.root}-{rank}", (call.root, rank)
    return "all", tuple(range(nranks))


def _write(path: str, data: np.ndarray[Any, Any]) -> None:
    """Write ``data`` (1-D, contiguous) to ``path`` so that a reader sees all of it or
    nothing."""
    with open(f"{path}.part", "wb") as out:
        out.write(data.view(np.uint8).data)
    os.replace(f"{path}.part", path)


def _read(path: str, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """The elements in file ``path``, mapped without a copy (the map outlives the file)."""
    with open(path, "rb") as source:
        size = os.fstat(source.fileno()).st_size
        if not size:
            return np.empty(0, dtype=dtype)
        mapped = mmap.mmap(source.fileno(), size, access=mmap.ACCESS_READ)
    return np.frombuffer(mapped, dtype=np.uint8).view(dtype)


@cpu.handles(RunCollective)
def _run(backend: Backend, op: RunCollective) -> None:
    joined, deadline = _joined(backend, op)
    for call in op.calls:
        _finish(backend, joined, call, op, _post(backend, joined, call, op), deadline)


def _joined(backend: Backend, op: RunCollective) -> tuple[_Joined, float]:
    """This rank's membership of ``op``'s epoch, and ``op``'s deadline."""
    joined = worlds(backend).get(op.world)
    if joined is None or joined.epoch != op.epoch:
        raise CollectiveAborted(f"device {backend.device_id} holds no communicator of world "
                                f"{op.world}'s epoch {op.epoch} (it was aborted, or its "
                                "context was rebuilt)")
    deadline = time.perf_counter() + op.timeout
    if joined.local is None:
        joined.local = _all_here(joined, op, backend.device_id, deadline)
    return joined, deadline


def start_ranks(parts: Sequence[Rank], failed: Callable[[], object]) -> list[Any]:
    """``CpuBackend.start_ranks``: the ranks advance in turn on this thread, each rank
    posting what it sends before any rank waits, and a rank finishing a call once its
    peers' posts are there. Entries: None, or the exception a rank raised; the first one
    calls ``failed()``, and its peers then abort instead of waiting."""
    started: list[Any] = [None] * len(parts)
    going: list[_Going] = []
    for index, (backend, op, _) in enumerate(parts):
        try:
            going.append(_Going(index, backend, op, *_joined(backend, op)))
        except BaseException as exc:  # an interrupt too: every rank is accounted for
            started[index] = exc
    if going and len(going) < len(parts):
        failed()
    while going:
        moved = False
        for rank in list(going):
            try:
                done = rank.advance(stuck=False)
            except BaseException as exc:
                done, started[rank.index] = True, exc
                failed()
            moved = moved or rank.moved
            if done:
                going.remove(rank)
        if going and not moved:  # each waits for a peer that is not coming: the first
            try:  # aborts (the world left the epoch) or times out
                going[0].advance(stuck=True)
            except BaseException as exc:
                started[going.pop(0).index] = exc
                failed()
    return started


@dataclass
class _Going:
    """One rank of ``start_ranks`` on its way through its calls."""

    index: int
    backend: Backend
    op: RunCollective
    joined: _Joined
    deadline: float
    call: int = 0
    """The call it is at."""
    posted: _Posted | None = None
    """That call, once posted."""
    moved: bool = False
    """Whether its last ``advance`` posted or finished a call."""

    def advance(self, stuck: bool) -> bool:
        """Post the current call, then finish it if its peers' posts are there (``stuck``:
        wait for them); whether every call is done."""
        self.moved = False
        calls = self.op.calls
        while self.call < len(calls):
            call = calls[self.call]
            if self.posted is None:
                self.posted = _post(self.backend, self.joined, call, self.op)
                self.moved = True
            if not (stuck or self.posted.arrived(self.joined)):
                return False
            _finish(self.backend, self.joined, call, self.op, self.posted, self.deadline)
            self.call, self.posted, self.moved = self.call + 1, None, True
        return True


def _all_here(joined: _Joined, op: RunCollective, device_id: int, deadline: float) -> bool:
    """Whether every rank of the epoch runs in this process (waits for their ids)."""
    if not joined.word_path:
        return False
    paths = [joined.pid_path(r) for r in range(joined.nranks)]
    _wait(joined, lambda: all(os.path.exists(p) for p in paths), op, device_id, deadline)
    me = str(os.getpid()).encode()
    return all(_read(p, np.dtype(np.uint8)).tobytes() == me for p in paths)


def _wait(joined: _Joined, arrived: Callable[[], bool], op: RunCollective, device_id: int,
          deadline: float) -> None:
    """Wait until ``arrived()``; ``CollectiveAborted`` past the deadline or once the world
    leaves the epoch."""
    try:
        wait_until(lambda: joined.told_to_abort() or arrived(), deadline)
    except TimeoutError:
        raise _aborted(op, device_id, f"it did not finish within its time-out of "
                                      f"{op.timeout:g} s") from None
    if joined.told_to_abort():
        raise _aborted(op, device_id, "the world aborted it (a peer's context went down)")


@dataclass(frozen=True)
class _Posted:
    """A call this rank has posted: the peers' names, the call's number among them, every
    peer's post (by rank) and the dtype sent."""

    peers: str
    n: int
    paths: dict[int, str]
    dtype: np.dtype[Any]

    def arrived(self, joined: _Joined) -> bool:
        """Whether every peer's post is there."""
        if joined.local:
            return _MAILBOX.has(self.paths.values())
        return all(os.path.exists(p) for p in self.paths.values())


def _post(backend: Backend, joined: _Joined, call: CollectiveCall, op: RunCollective
          ) -> _Posted:
    """Post what this rank sends in ``call`` for its peers."""
    peers, ranks = _peers(call, joined.rank, op.nranks)
    n = joined.runs.get(peers, 0)
    joined.runs[peers] = n + 1
    length = sent_length(call, joined.rank, op.nranks)
    own = backend.array(_ref_of(call))
    mine = own[:length] if call.send is not None else own[:0]
    paths = {r: joined.path(peers, n, r) for r in ranks}
    if joined.local:
        _MAILBOX.post(paths[joined.rank], mine)
    else:
        _write(paths[joined.rank], mine)
    return _Posted(peers, n, paths, mine.dtype)


def _finish(backend: Backend, joined: _Joined, call: CollectiveCall, op: RunCollective,
            posted: _Posted, deadline: float) -> None:
    """Wait for the peers' posts of ``call``, then compute this rank's result."""
    _wait(joined, lambda: posted.arrived(joined), op, backend.device_id, deadline)
    peers, n, paths = posted.peers, posted.n, posted.paths
    data: dict[int, np.ndarray[Any, Any]]
    if joined.local:
        data = {r: _MAILBOX.take(p) for r, p in paths.items()}
        if n:
            _MAILBOX.discard(joined.path(peers, n - 1, joined.rank))
    else:
        data = {r: _read(p, posted.dtype) for r, p in paths.items()}
        if n:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(joined.path(peers, n - 1, joined.rank))
    result = result_of(call, joined.rank, data, op.nranks)
    if result is not None and call.recv is not None:
        backend.write(call.recv.buffer_id, result, 0)


def _ref_of(call: CollectiveCall) -> int:
    ref = call.send if call.send is not None else call.recv
    assert ref is not None  # a validated call names a send or a recv buffer
    return ref.buffer_id


def _aborted(op: RunCollective, device_id: int, why: str) -> CollectiveAborted:
    return CollectiveAborted(f"collective of world {op.world} epoch {op.epoch} on device "
                             f"{device_id} aborted: {why}")
