"""The context worker process: ``python -m atomr_accel.hosts._worker``.

Reads one start-up frame from stdin (the backend to build, the shared arena
and the channel), then takes ops from the channel's ring in order, runs each
on its backend and answers it in the caller's slot or as a frame on stdout.
Host payloads (uploads, downloads, a device function's large NumPy arguments) arrive
and leave through shared memory (``ShmSlice``, ``StagedArrays``), and the large
arrays of an answer leave in a file beside it (``_reply_buffers.py``). It exits
when the parent asks it to or goes away. Anything printed goes to stderr.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import mmap
import os
import pickle
import select
import sys
import threading
import time
from typing import Any, BinaryIO

import numpy as np

from atomr_accel.backends._base import Backend
from atomr_accel.backends._spin import SPIN_SECONDS, yield_now
from atomr_accel.core._errors import ContextPoisoned, GpuRuntimeError
from atomr_accel.core._op import Op
from atomr_accel.core.ops._function import CallFunction
from atomr_accel.core.ops._memory import Upload
from atomr_accel.hosts._base import picklable, refusal_of, translate_error
from atomr_accel.hosts._channel import NO_SLOT, Channel
from atomr_accel.hosts._op_pickles import ReadOps
from atomr_accel.hosts._reply_buffers import dumps as dump_reply
from atomr_accel.hosts._shm import ShmSlice, map_path, remove_segment_files
from atomr_accel.hosts._staged_arrays import StagedArrays
from atomr_accel.hosts._wire import encode, read_frame

_PARK = 0.05  # seconds between checks on the parent while parked


def _launch_now() -> bool:
    """``Backend.flush``'s ``more`` that stops it at once: report only what has finished."""
    return True


class _Worker:
    """Launches each op on the backend and answers it when the backend reports completion."""

    def __init__(self, backend: Backend, arena: mmap.mmap, channel: Channel,
                 inp: BinaryIO, out: BinaryIO) -> None:
        self.backend = backend
        self.arena = arena
        self.channel = channel
        self.inp = inp
        self.out = out
        self.parent = os.getppid()
        self.poisoned: GpuRuntimeError | None = None  # sticky: once poisoned, run nothing more
        self._lock = threading.Lock()  # completions may answer from other threads
        self._read = ReadOps()

    def _view(self, piece: ShmSlice) -> tuple[np.ndarray[Any, Any], mmap.mmap | None]:
        mm = self.arena if piece.path is None else map_path(piece.path, piece.nbytes)
        view = np.frombuffer(mm, dtype=piece.dtype, count=piece.count, offset=piece.offset)
        return view, (None if piece.path is None else mm)

    def _answer(self, slot: int, request_id: int, ok: bool, payload: Any) -> None:
        try:
            reply = dump_reply((ok, payload))
        except Exception as exc:  # answer the request; never lose the worker over it
            failure = GpuRuntimeError(f"the result ({type(payload).__name__}) could not be "
                                      f"sent back: {exc}")
            reply = pickle.dumps((False, failure), pickle.HIGHEST_PROTOCOL)
        if slot != NO_SLOT:
            try:
                self.channel.answer(slot, reply)
            except GpuRuntimeError as exc:  # no shared memory for a large reply: say so
                self.channel.answer(slot, pickle.dumps((False, picklable(exc))))
            return
        with self._lock:
            self.out.write(encode((request_id, reply)))
            self.out.flush()

    def _finish(self, slot: int, request_id: int, op: Op, out_slice: ShmSlice | None,
                segment: mmap.mmap | None, result: Any, error: BaseException | None) -> None:
        if segment is not None:  # the upload has been copied: its one-off segment can go
            with contextlib.suppress(BufferError):
                segment.close()
        if error is None and out_slice is not None and isinstance(result, np.ndarray):
            try:
                view, out_segment = self._view(out_slice)
                view[:] = result.reshape(-1)
                del view
                if out_segment is not None:
                    out_segment.close()
                result = None
            except Exception as exc:  # answer the request; never lose the worker over it
                error = exc
        if error is not None:
            failure = picklable(translate_error(error, op))
            if isinstance(failure, ContextPoisoned):
                self.poisoned = failure
            self._answer(slot, request_id, False, failure)
            return
        self._answer(slot, request_id, True, result)

    def _run(self, slot: int, request_id: int, payload: bytes) -> None:
        op = Op()
        try:
            op, stream, out_slice = self._read(payload)
            if self.poisoned is not None:
                self._answer(slot, request_id, False, self.poisoned)
                return
            segment = None
            if isinstance(op, Upload) and isinstance(op.data, ShmSlice):
                data, segment = self._view(op.data)
                op = dataclasses.replace(op, data=data)
            elif isinstance(op, CallFunction) and isinstance(op.args.arrays, StagedArrays):
                region, segment = self._view(op.args.arrays.piece)
                op = dataclasses.replace(op, args=op.args.with_arrays(
                    op.args.arrays.views(region)))
        except Exception as exc:  # answer the request; never lose the worker over it
            self._answer(slot, request_id, False, picklable(refusal_of(exc, op)))
            return
        done = functools.partial(self._finish, slot, request_id, op, out_slice, segment)
        backend = self.backend
        if not backend.queues_only(op):  # it runs host code (a device function, say):
            backend.flush(_launch_now)  # answer the ops that have finished first
        backend.launch(op, stream, done)

    def serve(self) -> bool:
        """Answer requests until the parent is done; return True if the context was poisoned."""
        channel = self.channel
        while True:
            request = channel.take()
            if request is None:
                # nothing more to launch: report what is deferred, until a request comes
                self.backend.flush(lambda: channel.has_requests)
                if not self._idle():
                    break
                continue
            if channel.take_backlog_note():
                self._answer(NO_SLOT, 0, True, None)  # room in the ring again
            self._run(*request)
        self.backend.flush()
        return self.poisoned is not None

    def _idle(self) -> bool:
        """Wait for the next request: spin, then park. False once the parent is done."""
        channel = self.channel
        spin_end = time.perf_counter() + SPIN_SECONDS
        while time.perf_counter() < spin_end:
            if channel.has_requests:
                return True
            if channel.closing:
                return False
            yield_now()
        while True:
            channel.park(_PARK)
            if channel.has_requests:
                return True
            if channel.closing or self._orphaned():
                return False

    def _orphaned(self) -> bool:
        """Whether the parent has gone (it never writes to stdin after the start-up frame).
        Segment files it left (``ATOMR_ACCEL_SHM=file``) are removed then."""
        if os.getppid() == self.parent and not select.select([self.inp], [], [], 0)[0]:
            return False
        if not _alive(self.parent):
            remove_segment_files(self.parent)
            remove_segment_files(os.getpid())  # replies no one will read
        return True


def _alive(pid: int) -> bool:
    """Whether process ``pid`` is running (neither gone nor a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return os.getppid() == pid


def main() -> None:
    """Serve one context until the parent is done with it."""
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr
    init = read_frame(inp)
    if init is None:
        return
    spec, arena_path, arena_bytes, channel_path, ring_bytes, slots = init
    try:
        backend = spec.create()
        arena = map_path(arena_path, arena_bytes)
        channel = Channel.attach(channel_path, ring_bytes, slots)
    except BaseException as exc:
        error = translate_error(exc, Op())
        out.write(encode(("error", picklable(error))))
        out.flush()
        return
    backend.warm()
    try:
        backend.register_host_memory(arena)
    except Exception as exc:  # pageable copies still work, only slower
        print(f"atomr-accel worker: could not page-lock the shared arena: {exc}",
              file=sys.stderr)
    out.write(encode(("ready", os.getpid())))
    out.flush()
    if _Worker(backend, arena, channel, inp, out).serve():
        # A poisoned context cannot even free memory: leave without running destructors.
        sys.stderr.flush()
        os._exit(3)
    backend.close()  # waits until every launched op has been answered


if __name__ == "__main__":
    main()
