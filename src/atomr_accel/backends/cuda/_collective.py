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
import mmap
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import cupy as cp
import numpy as np

from atomr_accel.backends._base import Handler
from atomr_accel.backends._spin import wait_until
from atomr_accel.backends._state import per_backend
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import CollectiveAborted, DeviceUnavailable, LibraryUnavailable
from atomr_accel.core._op import Op
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

__all__ = ["HANDLERS", "id_bytes", "unique_id"]

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


def id_bytes(raw: tuple[int, ...]) -> bytes:
    """CuPy's unique id (a tuple of signed chars) as bytes."""
    return bytes(v % 256 for v in raw)


def _id_tuple(data: bytes) -> tuple[int, ...]:
    return tuple(b - 256 if b > 127 else b for b in data)


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
        try:
            self.comm.abort()
        finally:
            self.word = None
            if self._map is not None:
                self._map.close()
                self._map = None


_comms: Any = per_backend(dict)
"""``_comms(backend)``: world id -> ``_Comm`` of that context."""


def _init(backend: CudaBackend, op: CommInit) -> None:
    comms: dict[int, _Comm] = _comms(backend)
    old = comms.pop(op.world, None)
    if old is not None:
        old.abort()
    if not op.unique_id:
        raise DeviceUnavailable("a CUDA communicator needs the world's NCCL unique id")
    with cp.cuda.Device(backend.device_id):
        comm = _nccl().NcclCommunicator(op.nranks, _id_tuple(op.unique_id), op.rank)
    comms[op.world] = _Comm(comm, op.epoch, op.rank, op.abort_path)


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


def _run(backend: CudaBackend, op: RunCollective) -> None:
    held: _Comm | None = _comms(backend).get(op.world)
    if held is None or held.epoch != op.epoch or held.aborted:
        raise CollectiveAborted(
            f"device {backend.device_id} holds no communicator of world {op.world} epoch "
            f"{op.epoch} (it was aborted, or its context was rebuilt)")
    stream = cp.cuda.get_current_stream()
    comm = held.comm
    nccl = _nccl()
    nccl.groupStart()
    try:
        for call in op.calls:
            _launch(comm, call, backend, op.nranks, stream.ptr)
    finally:
        nccl.groupEnd()
    event = cp.cuda.Event(disable_timing=True)
    event.record(stream)
    _wait(held, event, op, backend.device_id)


def _wait(held: _Comm, event: Any, op: RunCollective, device_id: int) -> None:
    """Wait for the group's event (spin, then park: ``wait_until``); abort the communicator
    past the time-out, on an NCCL error or when the world leaves the epoch."""
    why = ""

    def finished_or_broken() -> bool:
        nonlocal why
        if event.done:
            return True
        if held.told_to_abort():
            why = "the world aborted it (a peer's context went down)"
            return True
        try:
            held.comm.check_async_error()
        except Exception as exc:
            why = f"NCCL reported an error: {exc}"
            return True
        return False

    try:
        wait_until(finished_or_broken, time.perf_counter() + op.timeout)
    except TimeoutError:
        why = f"it did not finish within its time-out of {op.timeout:g} s"
    if why:
        held.abort()
        raise CollectiveAborted(f"collective of world {op.world} on device {device_id} was "
                                f"aborted: {why}")


HANDLERS: dict[type[Op], Handler] = {CommInit: _init, CommAbort: _abort, RunCollective: _run}
"""The collective op handlers of the CUDA backend."""
