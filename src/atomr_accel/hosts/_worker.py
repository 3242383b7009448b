"""The context worker process: ``python -m atomr_accel.hosts._worker``.

Reads frames from stdin, runs each op on its backend, writes replies to stdout.
Host payloads arrive and leave through shared memory (``ShmSlice``). It exits
when stdin closes. Anything printed goes to stderr, never into the frames.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import sys
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
    def __init__(self, backend: Backend, arena: mmap.mmap, out: BinaryIO) -> None:
        self.backend = backend
        self.arena = arena
        self.out = out

    def _view(self, piece: ShmSlice) -> tuple[np.ndarray[Any, Any], mmap.mmap | None]:
        mm = self.arena if piece.path is None else map_path(piece.path, piece.nbytes)
        view = np.frombuffer(mm, dtype=piece.dtype, count=piece.count, offset=piece.offset)
        return view, (None if piece.path is None else mm)

    def run(self, op: Op, stream: int, out_slice: ShmSlice | None) -> Any:
        segment: mmap.mmap | None = None
        if isinstance(op, Upload) and isinstance(op.data, ShmSlice):
            data, segment = self._view(op.data)
            op = dataclasses.replace(op, data=data)
        try:
            result = self.backend.execute(op, stream)
        finally:
            if segment is not None:
                del op, data
                segment.close()
        if out_slice is not None and isinstance(result, np.ndarray):
            view, segment = self._view(out_slice)
            view[:] = result.reshape(-1)
            del view
            if segment is not None:
                segment.close()
            return None
        return result

    def serve(self, inp: BinaryIO) -> bool:
        """Answer frames until stdin closes; return True if the context was poisoned."""
        poisoned: GpuRuntimeError | None = None  # sticky: once poisoned, run nothing more
        while (frame := read_frame(inp)) is not None:
            req_id, op, stream, out_slice = frame
            if poisoned is not None:
                reply = (req_id, False, poisoned)
            else:
                try:
                    reply = (req_id, True, self.run(op, stream, out_slice))
                except BaseException as exc:
                    error = picklable(translate_error(exc, op))
                    if isinstance(error, ContextPoisoned):
                        poisoned = error
                    reply = (req_id, False, error)
            self.out.write(encode(reply))
            self.out.flush()
        return poisoned is not None


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
    backend.close()


if __name__ == "__main__":
    main()
