"""The context worker process: ``python -m atomr_accel.hosts._worker``.

Reads frames from stdin, runs each op on its backend, writes replies to stdout.
Host payloads arrive and leave through shared memory (``ShmSlice``). It exits
when stdin closes. Anything printed goes to stderr, never into the frames.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import mmap
import os
import select
import sys
import threading
from typing import Any, BinaryIO

import numpy as np

from atomr_accel.backends._base import Backend
from atomr_accel.core._errors import ContextPoisoned, GpuRuntimeError
from atomr_accel.core._op import Op
from atomr_accel.core.ops._memory import Upload
from atomr_accel.hosts._base import BackendSpec, picklable, translate_error
from atomr_accel.hosts._shm import ShmSlice, map_path
from atomr_accel.hosts._wire import encode, read_frame


class _Worker:
    """Launches each op on the backend and answers it when the backend reports completion."""

    def __init__(self, backend: Backend, arena: mmap.mmap, out: BinaryIO) -> None:
        self.backend = backend
        self.arena = arena
        self.out = out
        self.poisoned: GpuRuntimeError | None = None  # sticky: once poisoned, run nothing more
        self._lock = threading.Lock()  # completions may answer from other threads

    def _view(self, piece: ShmSlice) -> tuple[np.ndarray[Any, Any], mmap.mmap | None]:
        mm = self.arena if piece.path is None else map_path(piece.path, piece.nbytes)
        view = np.frombuffer(mm, dtype=piece.dtype, count=piece.count, offset=piece.offset)
        return view, (None if piece.path is None else mm)

    def _answer(self, req_id: int, ok: bool, payload: Any) -> None:
        with self._lock:
            self.out.write(encode((req_id, ok, payload)))
            self.out.flush()

    def _finish(self, req_id: int, op: Op, out_slice: ShmSlice | None,
                segment: mmap.mmap | None, result: Any, error: BaseException | None) -> None:
        if segment is not None:  # the upload has been copied: its one-off segment can go
            with contextlib.suppress(BufferError):
                segment.close()
        if error is not None:
            failure = picklable(translate_error(error, op))
            if isinstance(failure, ContextPoisoned):
                self.poisoned = failure
            self._answer(req_id, False, failure)
            return
        if out_slice is not None and isinstance(result, np.ndarray):
            view, out_segment = self._view(out_slice)
            view[:] = result.reshape(-1)
            del view
            if out_segment is not None:
                out_segment.close()
            result = None
        self._answer(req_id, True, result)

    def serve(self, inp: BinaryIO) -> bool:
        """Answer frames until stdin closes; return True if the context was poisoned."""
        while (frame := read_frame(inp)) is not None:
            req_id, op, stream, out_slice = frame
            if self.poisoned is not None:
                self._answer(req_id, False, self.poisoned)
                continue
            segment = None
            if isinstance(op, Upload) and isinstance(op.data, ShmSlice):
                data, segment = self._view(op.data)
                op = dataclasses.replace(op, data=data)
            done = functools.partial(self._finish, req_id, op, out_slice, segment)
            self.backend.launch(op, stream, done)
            if not _readable(inp):  # nothing more to launch: report what is deferred
                self.backend.flush()
        return self.poisoned is not None


def _readable(inp: BinaryIO) -> bool:
    """Whether the next frame has (begun to) arrive; False means flush now, never a hang."""
    return bool(select.select([inp], [], [], 0)[0])


def main() -> None:
    """Serve one context until stdin closes."""
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr
    init = read_frame(inp)
    if init is None:
        return
    spec, arena_path, arena_bytes = init
    assert isinstance(spec, BackendSpec)
    try:
        backend = spec.create()
        arena = map_path(arena_path, arena_bytes)
    except BaseException as exc:
        error = translate_error(exc, Op())
        out.write(encode(("error", picklable(error))))
        out.flush()
        return
    try:
        backend.register_host_memory(arena)
    except Exception as exc:  # pageable copies still work, only slower
        print(f"atomr-accel worker: could not page-lock the shared arena: {exc}",
              file=sys.stderr)
    out.write(encode(("ready", os.getpid())))
    out.flush()
    if _Worker(backend, arena, out).serve(inp):
        # A poisoned context cannot even free memory: leave without running destructors.
        sys.stderr.flush()
        os._exit(3)
    backend.close()  # waits until every launched op has been answered


if __name__ == "__main__":
    main()
