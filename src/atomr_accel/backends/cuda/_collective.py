"""Collective ops on CUDA: NCCL through ``cupy.cuda.nccl``.

* ``CommInit`` creates this rank's ``NcclCommunicator(nranks, unique_id, rank)``
  on the context's thread (its worker process on the process host); NCCL's
  init waits for every rank, so the world puts all ranks' inits in flight
  together. A communicator this context held for the world before is aborted.
* ``RunCollective`` launches its calls between ``groupStart``/``groupEnd`` on
  the op's stream (``all_to_all`` is a group of sends and receives), then
  waits for the group on this thread, polling its event and NCCL's
  asynchronous error, and the world's abort word: past the op's time-out, on
  an NCCL error or once the world has aborted the epoch, it calls
  ``ncclCommAbort`` (which makes the kernels of a broken clique return) and
  raises ``CollectiveAborted``. Waiting here is the one exception to "a
  handler never synchronizes": a collective that cannot finish would
  otherwise hold the context's completion forever, and nothing else could
  abort it from inside a worker process.
* ``CommAbort`` is ``ncclCommAbort``: never a blocking ``ncclCommDestroy`` on a
  clique that may be broken.
"""

from __future__ import annotations

import functools
import itertools
import logging
import mmap
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import cupy as cp
import numpy as np

from atomr_accel.backends._handlers import cuda
from atomr_accel.backends._spin import wait_until
from atomr_accel.backends._state import per_backend
from atomr_accel.backends.cuda._completion import Event
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import CollectiveAborted, DeviceUnavailable, LibraryUnavailable
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

__all__ = ["id_bytes", "unique_id"]

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
        self.lock = threading.Lock()

    def told_to_abort(self) -> bool:
        """Whether the world has left this communicator's epoch."""
        return self.word is not None and int(self.word[0]) != self.epoch

    def abort(self) -> None:
        """``ncclCommAbort`` once (any thread); the kernels of the clique return."""
        with self.lock:
            if self.aborted:
                return
            self.aborted = True
        self.comm.abort()


class _Watchdog:
    """Aborts the communicators of collectives stuck in a blocking NCCL call (``groupEnd``
    waiting for a peer that never comes) once their world aborts the epoch or their
    time-out passes: ``ncclCommAbort`` from this thread makes the stuck call return."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[_Comm, float]] = {}
        self._tokens = itertools.count(1)
        self._thread: threading.Thread | None = None

    def watch(self, held: _Comm, deadline: float) -> int:
        """Watch ``held`` until ``unwatch``; answers the token to unwatch it with."""
        with self._lock:
            token = next(self._tokens)
            self._watched[token] = (held, deadline)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, daemon=True,
                                                name="atomr-nccl-watchdog")
                self._thread.start()
            return token

    def unwatch(self, token: int) -> None:
        """Stop watching."""
        with self._lock:
            self._watched.pop(token, None)

    def _serve(self) -> None:
        while True:
            time.sleep(_WATCHDOG_SECONDS)
            with self._lock:
                watched = list(self._watched.values())
            now = time.perf_counter()
            for held, deadline in watched:
                if not held.aborted and (held.told_to_abort() or now > deadline):
                    try:
                        held.abort()
                    except Exception:  # a broken clique: nothing more to do for it
                        _log.exception("ncclCommAbort failed")


_WATCHDOG_SECONDS = 0.05
"""How often the watchdog looks at the collectives in flight."""
_WATCHDOG = _Watchdog()


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
    send = 0 if call.send is None else int(backend.array(call.send.buffer_id).data.ptr)
    recv = 0 if call.recv is None else int(backend.array(call.recv.buffer_id).data.ptr)
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


_ERROR_POLL = 0.01
"""Seconds between two asks for NCCL's asynchronous error while a collective runs."""


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
def _run(backend: CudaBackend, op: RunCollective) -> None:
    held: _Comm | None = _comms(backend).get(op.world)
    if held is None or held.epoch != op.epoch or held.aborted:
        raise CollectiveAborted(
            f"device {backend.device_id} holds no communicator of world {op.world} epoch "
            f"{op.epoch} (it was aborted, or its context was rebuilt)")
    stream = cp.cuda.get_current_stream()
    comm = held.comm
    nccl = _nccl()
    token = _WATCHDOG.watch(held, time.perf_counter() + op.timeout)
    try:
        try:
            nccl.groupStart()
            try:
                for call in op.calls:
                    _launch(comm, call, backend, op.nranks, stream.ptr)
            finally:
                nccl.groupEnd()
        except Exception as exc:
            if held.aborted:
                raise _aborted(op, backend.device_id, "the watchdog aborted it") from exc
            raise
        event = Event(disable_timing=True)
        event.record(stream)
        _wait(held, event, op, backend.device_id)
    finally:
        _WATCHDOG.unwatch(token)


def _aborted(op: RunCollective, device_id: int, why: str) -> CollectiveAborted:
    return CollectiveAborted(f"collective of world {op.world} on device {device_id} was "
                             f"aborted: {why}")


def _wait(held: _Comm, event: Any, op: RunCollective, device_id: int) -> None:
    """Wait for the group's event (spin, then park: ``wait_until``); abort the communicator
    past the time-out, on an NCCL error or when the world leaves the epoch."""
    why = ""
    next_check = time.perf_counter() + _ERROR_POLL

    def finished_or_broken() -> bool:
        nonlocal why, next_check
        if event.done:
            return True
        if held.aborted:
            why = "the watchdog aborted it (its world left the epoch, or its time-out passed)"
            return True
        if held.told_to_abort():
            why = "the world aborted it (a peer's context went down)"
            return True
        now = time.perf_counter()
        if now >= next_check:
            next_check = now + _ERROR_POLL
            error = _async_error(held.comm)
            if error:
                why = f"NCCL reported an error: {error}"
                return True
        return False

    try:
        wait_until(finished_or_broken, time.perf_counter() + op.timeout)
    except TimeoutError:
        why = f"it did not finish within its time-out of {op.timeout:g} s"
    if why:
        held.abort()
        raise _aborted(op, device_id, why)
