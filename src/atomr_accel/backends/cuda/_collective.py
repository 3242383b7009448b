"""Collective ops on CUDA: NCCL through ``cupy.cuda.nccl``.

* ``CommInit`` creates this rank's ``NcclCommunicator(nranks, unique_id, rank)``
  on the context's thread (its worker process on the process host); NCCL's
  init waits for every rank, so the world puts all ranks' inits in flight
  together. A communicator this context held for the world before is aborted.
* ``RunCollective`` launches its calls between ``groupStart``/``groupEnd`` on
  the op's stream (``all_to_all`` is a group of sends and receives) and
  returns at once, like any other handler: the context goes on launching (the
  next layer's backward while the gradients of the last travel) and the op is
  reported when its work has finished, like any other op. Meanwhile the
  watchdog thread watches the world's abort word, the op's time-out and NCCL's
  asynchronous error; on any of them it calls ``ncclCommAbort`` (which makes
  the kernels of a broken clique return), and the op, once its work has
  returned, answers ``CollectiveAborted`` with the reason (``_Launched``).
* ``CommAbort`` is ``ncclCommAbort``: never a blocking ``ncclCommDestroy`` on a
  clique that may be broken.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import cupy as cp
import numpy as np

from atomr_accel.backends._base import Deferred, Rank
from atomr_accel.backends._handlers import cuda
from atomr_accel.backends._state import per_backend
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import (
    CollectiveAborted,
    DeviceUnavailable,
    LibraryUnavailable,
    interrupt_in,
)
from atomr_accel.core.ops._collective import (
    CallKind,
    CollectiveCall,
    CommAbort,
    CommInit,
    ReduceOp,
    RunCollective,
)

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

__all__ = ["id_bytes", "start_ranks", "unique_id"]

_log = logging.getLogger(__name__)

_DTYPES = {DType.I8: 0, DType.U8: 1, DType.I32: 2, DType.U32: 3, DType.I64: 4, DType.U64: 5,
           DType.F16: 6, DType.F32: 7, DType.F64: 8, DType.BF16: 9}
"""``ncclDataType_t`` of each dtype."""
_OPS = {ReduceOp.SUM: 0, ReduceOp.PROD: 1, ReduceOp.MAX: 2, ReduceOp.MIN: 3, ReduceOp.AVG: 4}
"""``ncclRedOp_t`` of each reduction."""


@functools.cache
def _nccl() -> Any:
    """CuPy's NCCL module, imported on first use (``LibraryUnavailable`` without NCCL)."""
    try:
        from cupy.cuda import nccl
    except ImportError as exc:
        raise LibraryUnavailable("nccl", "nvidia-nccl-cu13", "cuda", str(exc)) from exc
    if not getattr(nccl, "available", True):
        raise LibraryUnavailable("nccl", "nvidia-nccl-cu13", "cuda", "CuPy found no NCCL")
    return nccl


def unique_id() -> bytes:
    """A new NCCL unique id (128 bytes), made in this process (the parent of the ranks)."""
    return id_bytes(_nccl().get_unique_id())


def id_bytes(raw: bytes | tuple[int, ...]) -> bytes:
    """CuPy's unique id as bytes: CuPy 14 answers bytes, older CuPy a tuple of signed
    chars."""
    if isinstance(raw, bytes):
        return raw
    return bytes(v % 256 for v in raw)


def _id_tuple(data: bytes) -> tuple[int, ...]:
    return tuple(b - 256 if b > 127 else b for b in data)


def _communicator(nranks: int, unique: bytes, rank: int) -> Any:
    """``NcclCommunicator(nranks, unique_id, rank)``: CuPy 14 takes the id as bytes, older
    CuPy as a tuple of signed chars."""
    make = _nccl().NcclCommunicator
    try:
        return make(nranks, unique, rank)
    except TypeError:
        return make(nranks, _id_tuple(unique), rank)


class _Comm:
    """One rank's communicator of one world epoch, and the world's abort word."""

    def __init__(self, comm: Any, epoch: int, rank: int, abort_path: str) -> None:
        self.comm = comm
        self.epoch = epoch
        self.rank = rank
        self.word: np.ndarray[Any, Any] | None = None
        self._map: mmap.mmap | None = None
        if abort_path:
            fd = os.open(abort_path, os.O_RDWR)
            try:
                self._map = mmap.mmap(fd, 8)
            finally:
                os.close(fd)
            self.word = np.frombuffer(self._map, dtype=np.int64, count=1)
        self.aborted = False
        self.why = ""
        """Why it was aborted (the first reason given)."""
        self.lock = threading.Lock()

    def told_to_abort(self) -> bool:
        """Whether the world has left this communicator's epoch."""
        return self.word is not None and int(self.word[0]) != self.epoch

    def abort(self, why: str = "its world left the epoch") -> None:
        """``ncclCommAbort`` once (any thread); the kernels of the clique return."""
        with self.lock:
            if self.aborted:
                return
            self.aborted = True
            self.why = why
            self.comm.abort()

    def async_error(self) -> str:
        """NCCL's asynchronous error ("" when none, or once aborted: never asked of a
        communicator another thread is aborting)."""
        with self.lock:
            return "" if self.aborted else _async_error(self.comm)


class _Watchdog:
    """Aborts the communicators of collectives in flight once their world aborts the
    epoch, their time-out passes or NCCL reports an asynchronous error:
    ``ncclCommAbort`` from this thread makes their kernels (or a blocking ``groupEnd``
    waiting for a peer that never comes) return.

    It looks every ``_WATCHDOG_SECONDS`` while collectives come, and sleeps only once
    none has been watched for ``_WATCHDOG_IDLE`` seconds: a run of short collectives
    then never wakes it (a wake per call made it take the interpreter lock from the
    caller while that caller launched the next one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._watched: dict[int, tuple[_Comm, float, float]] = {}
        self._tokens = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._asleep = False
        """Whether it sleeps until something is watched (under the lock)."""
        self._last_watch = 0.0
        """When ``watch`` was last called (under the lock)."""

    def watch(self, held: _Comm, timeout: float) -> int:
        """Watch ``held`` for ``timeout`` seconds until ``unwatch``; answers the token."""
        with self._lock:
            token = next(self._tokens)
            self._last_watch = now = time.perf_counter()
            self._watched[token] = (held, now + timeout, timeout)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, daemon=True,
                                                name="atomr-nccl-watchdog")
                self._thread.start()
            if self._asleep:  # else its next round, at most _WATCHDOG_SECONDS away, sees it
                self._work.notify()
            return token

    def unwatch(self, token: int) -> None:
        """Stop watching (again: nothing)."""
        with self._lock:
            self._watched.pop(token, None)

    def _serve(self) -> None:
        while True:
            with self._work:
                if not self._watched and time.perf_counter() - self._last_watch > _WATCHDOG_IDLE:
                    self._asleep = True
                    while not self._watched:
                        self._work.wait()
                    self._asleep = False
                self._work.wait(_WATCHDOG_SECONDS)
                watched = list(self._watched.items())
            now = time.perf_counter()
            asked: dict[int, str] = {}  # NCCL's error, asked once a communicator a round
            for token, (held, deadline, timeout) in watched:
                if held.aborted:  # nothing more to do for it
                    self.unwatch(token)
                    continue
                why = ""
                if held.told_to_abort():
                    why = "the world aborted it (a peer's context went down)"
                elif now > deadline:
                    why = f"it did not finish within its time-out of {timeout:g} s"
                else:
                    key = id(held)
                    if key not in asked:
                        asked[key] = held.async_error()
                    if asked[key]:
                        why = f"NCCL reported an error: {asked[key]}"
                if why:
                    try:
                        held.abort(why)
                    except Exception:  # a broken clique: nothing more to do for it
                        _log.exception("ncclCommAbort failed")


_WATCHDOG_SECONDS = 0.01
"""How often the watchdog looks at the collectives in flight."""
_WATCHDOG_IDLE = 1.0
"""How long the watchdog keeps looking after the last collective it watched, before it
sleeps until the next one."""
_WATCHDOG = _Watchdog()


class _Launched(Deferred):
    """A ``RunCollective`` in flight: once its work has returned, it answers None, or
    ``CollectiveAborted`` with the watchdog's reason where its communicator was aborted."""

    __slots__ = ("device_id", "held", "op", "token")

    def __init__(self, held: _Comm, op: RunCollective, device_id: int) -> None:
        self.held = held
        self.op = op
        self.device_id = device_id
        self.token = _WATCHDOG.watch(held, op.timeout)

    def settle(self) -> None:
        """None; ``CollectiveAborted`` where the communicator was aborted meanwhile."""
        _WATCHDOG.unwatch(self.token)
        if self.held.aborted:
            raise _aborted(self.op, self.device_id, self.held.why)


_comms: Any = per_backend(dict)
"""``_comms(backend)``: world id -> ``_Comm`` of that context."""


@cuda.handles(CommInit)
def _init(backend: CudaBackend, op: CommInit) -> None:
    comms: dict[int, _Comm] = _comms(backend)
    old = comms.pop(op.world, None)
    if old is not None:
        old.abort()
    if not op.unique_id:
        raise DeviceUnavailable("a CUDA communicator needs the world's NCCL unique id")
    with cp.cuda.Device(backend.device_id):
        comm = _communicator(op.nranks, op.unique_id, op.rank)
    comms[op.world] = _Comm(comm, op.epoch, op.rank, op.abort_path)


@cuda.handles(CommAbort)
def _abort(backend: CudaBackend, op: CommAbort) -> None:
    held = _comms(backend).pop(op.world, None)
    if held is not None:
        held.abort()


def _launch(comm: Any, call: CollectiveCall, backend: CudaBackend, nranks: int,
            stream: int) -> None:
    dtype = _DTYPES[call.dtype]
    send = 0 if call.send is None else backend.pointer(call.send.buffer_id)
    recv = 0 if call.recv is None else backend.pointer(call.recv.buffer_id)
    reduce_op, count, root = _OPS[call.op], call.count, call.root
    kind = call.kind
    if kind is CallKind.ALL_REDUCE:
        comm.allReduce(send, recv, count, dtype, reduce_op, stream)
    elif kind is CallKind.BROADCAST:
        comm.broadcast(send, recv, count, dtype, root, stream)
    elif kind is CallKind.REDUCE:
        comm.reduce(send, recv, count, dtype, reduce_op, root, stream)
    elif kind is CallKind.ALL_GATHER:
        comm.allGather(send, recv, count, dtype, stream)
    elif kind is CallKind.REDUCE_SCATTER:
        comm.reduceScatter(send, recv, count, dtype, reduce_op, stream)
    elif kind is CallKind.SEND:
        comm.send(send, count, dtype, root, stream)
    elif kind is CallKind.RECV:
        comm.recv(recv, count, dtype, root, stream)
    else:  # ALL_TO_ALL: block p of send goes to rank p, block p of recv comes from it
        step = count * call.dtype.itemsize
        for peer in range(nranks):
            comm.send(send + peer * step, count, dtype, peer, stream)
            comm.recv(recv + peer * step, count, dtype, peer, stream)


def _async_error(comm: Any) -> str:
    """NCCL's asynchronous error of ``comm`` (``ncclCommGetAsyncError``), "" when none."""
    check = getattr(comm, "check_async_error", None)
    if check is None:
        return ""
    try:
        check()
    except Exception as exc:
        if type(exc).__name__ != "NcclError":
            raise
        return str(exc)
    return ""


@cuda.handles(RunCollective)
def _run(backend: CudaBackend, op: RunCollective) -> _Launched:
    held: _Comm | None = _comms(backend).get(op.world)
    if held is None or held.epoch != op.epoch or held.aborted:
        raise CollectiveAborted(
            f"device {backend.device_id} holds no communicator of world {op.world} epoch "
            f"{op.epoch} (it was aborted, or its context was rebuilt)")
    stream = cp.cuda.get_current_stream().ptr
    comm = held.comm
    nccl = _nccl()
    launched = _Launched(held, op, backend.device_id)
    try:
        nccl.groupStart()
        try:
            for call in op.calls:
                _launch(comm, call, backend, op.nranks, stream)
        finally:
            nccl.groupEnd()
    except Exception as exc:
        _WATCHDOG.unwatch(launched.token)
        if held.aborted:
            raise _aborted(op, backend.device_id, held.why) from exc
        raise
    return launched


def start_ranks(parts: Sequence[Rank], failed: Callable[[], object]) -> list[Any]:
    """``CudaBackend.start_ranks``: every rank's ``RunCollective`` queued inside one NCCL
    group from this thread, as a single thread driving several devices does (no rank's
    launch waits for a peer's thread), then each rank's event recorded behind the kernels
    the group launched. Entries as ``begin`` answers them, ``(op, result, event)``, or the
    exception a rank raised (unclassified). A rank that fails calls ``failed()`` before
    the group is launched: a peer whose launch waits for it (NCCL connects lazily) is
    aborted by the watchdog once the world leaves the epoch."""
    nccl = _nccl()
    queued: list[Any] = []
    runtime = cp.cuda.runtime
    current = runtime.getDevice()  # made current again once every rank is started
    try:
        nccl.groupStart()
        try:
            for backend, op, stream in parts:
                try:
                    runtime.setDevice(backend.device_id)
                    queued.append(backend.enqueue_unrecorded(op, stream))  # type: ignore[attr-defined]
                except BaseException as exc:  # an interrupt too: every rank is accounted for
                    queued.append(exc)
            if any(isinstance(entry, BaseException) for entry in queued):
                failed()
        finally:
            group_error = _end_group(nccl)
        return [_recorded(part, entry, group_error) for part, entry in zip(parts, queued,
                                                                           strict=True)]
    finally:
        with contextlib.suppress(runtime.CUDARuntimeError):  # a rank's error says it
            runtime.setDevice(current)


def _recorded(part: Rank, entry: Any, group_error: Exception | None) -> Any:
    """``start_ranks``' entry of one rank once its group is launched: ``(op, result,
    event)`` with the event recorded behind the rank's work (its device made current), or
    the rank's error."""
    backend, op, _ = part
    if isinstance(entry, BaseException):
        return entry
    if group_error is not None:
        return _unlaunched(entry[0], group_error)
    try:
        cp.cuda.runtime.setDevice(backend.device_id)
        event = backend.record(entry)  # type: ignore[attr-defined]
    except BaseException as exc:  # a context gone bad: nothing will report the op
        return _unlaunched(entry[0], exc)
    return op, entry[0], event


def _end_group(nccl: Any) -> Exception | None:
    """``ncclGroupEnd``; the error it raised, if any."""
    try:
        nccl.groupEnd()
    except Exception as exc:
        return exc
    return None


def _unlaunched(result: Any, error: BaseException) -> BaseException:
    """The error of a rank whose group failed to launch (or whose completion cannot be
    watched): its collective is no longer watched; ``CollectiveAborted`` where its
    communicator was aborted meanwhile (an interrupt stays what it is)."""
    if not isinstance(result, _Launched):
        return error
    _WATCHDOG.unwatch(result.token)
    if result.held.aborted and interrupt_in(error) is None:
        aborted = _aborted(result.op, result.device_id, result.held.why)
        aborted.__cause__ = error
        return aborted
    return error


def _aborted(op: RunCollective, device_id: int, why: str) -> CollectiveAborted:
    return CollectiveAborted(f"collective of world {op.world} on device {device_id} was "
                             f"aborted: {why}")
