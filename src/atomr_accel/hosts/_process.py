"""The process host: the context lives in a child worker process.

This is the only host that recovers a poisoned CUDA context for real: the
worker is killed with its context and a fresh one starts. Ops travel as pickled
frames over the worker's stdin/stdout; host payloads (uploads and downloads)
travel through a shared-memory arena, never through pickles.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import pickle
import sys
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

import atomr_accel
from atomr_accel.core._errors import ContextPoisoned, DeviceUnavailable, GpuRuntimeError
from atomr_accel.core._op import Op
from atomr_accel.core.ops._memory import Download, Upload
from atomr_accel.hosts._base import BackendSpec, ContextHost, settle
from atomr_accel.hosts._shm import SharedArena, ShmSlice
from atomr_accel.hosts._wire import HEADER, encode

__all__ = ["ProcessHost"]

_DEFAULT_ARENA = 64 << 20
_PACKAGE_ROOT = str(Path(atomr_accel.__file__).resolve().parents[1])  # the worker imports from it


@dataclasses.dataclass(slots=True)
class _InFlight:
    fut: asyncio.Future[Any]
    staged: ShmSlice | None
    out: ShmSlice | None


class ProcessHost(ContextHost):
    """Runs the context in a worker process (``python -m atomr_accel.hosts._worker``).

    ``arena_bytes`` sizes the shared staging arena; larger payloads get one-off
    segments. When the worker dies, every op in flight fails with
    ``ContextPoisoned`` and ``died`` resolves.
    """

    kind: ClassVar[str] = "process"

    def __init__(
        self, spec: BackendSpec, arena_bytes: int = _DEFAULT_ARENA, start_timeout: float = 60.0
    ) -> None:
        super().__init__(spec)
        self.arena_bytes = arena_bytes
        self.start_timeout = start_timeout
        self._pid: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._arena: SharedArena | None = None
        self._inflight: dict[int, _InFlight] = {}
        self._ids = itertools.count(1)
        self._reader: asyncio.Task[None] | None = None
        self._dead: GpuRuntimeError | None = None

    async def start(self) -> None:
        """Start the worker, build its backend, share the arena with it."""
        loop = asyncio.get_running_loop()
        self.died = loop.create_future()
        self._arena = SharedArena(self.arena_bytes)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p
        )
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "atomr_accel.hosts._worker",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
            )
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.write(encode((self.spec, self._arena.path, self.arena_bytes)))
            async with asyncio.timeout(self.start_timeout):
                reply = await _read(self._proc.stdout)
        except BaseException:
            await self._abort()
            raise
        finally:
            self._arena.unlink()  # the worker has it mapped now (or never will)
        if reply is None or reply[0] != "ready":
            await self._abort()
            if reply is not None and isinstance(reply[1], GpuRuntimeError):
                raise reply[1]
            raise DeviceUnavailable(f"the context worker for {self.spec} failed to start")
        self._pid = reply[1]
        self._reader = loop.create_task(self._read_replies(), name=f"atomr-host-{self._pid}")

    def submit(self, op: Op, stream: int = 0) -> asyncio.Future[Any]:
        """Send ``op`` to the worker; payloads go through shared memory."""
        assert self._proc is not None and self._proc.stdin is not None and self._arena
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self._dead is not None:
            fut.set_exception(self._dead)
            return fut
        staged = out = None
        if isinstance(op, Upload) and isinstance(op.data, np.ndarray):
            data = op.data
            staged = self._arena.take(data.nbytes, data.dtype.str)
            self._arena.array(staged)[:] = data.reshape(-1)
            op = dataclasses.replace(op, data=staged)
        elif isinstance(op, Download):
            dtype = op.ref.dtype.numpy
            out = self._arena.take(op.count * dtype.itemsize, dtype.str)
        req_id = next(self._ids)
        self._inflight[req_id] = _InFlight(fut, staged, out)
        self._proc.stdin.write(encode((req_id, op, stream, out)))
        return fut

    async def _read_replies(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        while (reply := await _read(self._proc.stdout)) is not None:
            req_id, ok, payload = reply
            entry = self._inflight.pop(req_id)
            if ok and entry.out is not None and payload is None:
                payload = self._arena.array(entry.out).copy()  # type: ignore[union-attr]
            self._release(entry)
            settle(entry.fut, payload if ok else None, None if ok else payload)
        code = await self._proc.wait()
        self._fail_all(ContextPoisoned(
            f"context worker {self.pid} for {self.spec.name} device {self.spec.device_id} "
            f"died (exit code {code})"
        ))

    def _release(self, entry: _InFlight) -> None:
        for piece in (entry.staged, entry.out):
            if piece is not None and self._arena is not None:
                self._arena.release(piece)

    def _fail_all(self, error: GpuRuntimeError) -> None:
        if self._dead is None:
            self._dead = error
        for entry in self._inflight.values():
            self._release(entry)
            settle(entry.fut, None, error)
        self._inflight.clear()
        self._mark_died(error)

    @property
    def pid(self) -> int | None:
        """The worker process's id."""
        return self._pid

    @property
    def in_flight(self) -> int:
        """Ops sent to the worker and not yet answered."""
        return len(self._inflight)

    async def close(self) -> None:
        """Stop the worker (kill it if it does not exit), release shared memory."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            if self._dead is None:
                assert proc.stdin is not None
                proc.stdin.close()  # the worker exits at end of input
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(5.0):
                        await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        self._fail_all(ContextPoisoned("the context was closed before this op finished"))
        if self._arena is not None:
            self._arena.close()
            self._arena = None

    async def _abort(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
            await self._proc.wait()
        if self._arena is not None:
            self._arena.close()
            self._arena = None


async def _read(stream: asyncio.StreamReader) -> Any:
    try:
        header = await stream.readexactly(HEADER)
        body = await stream.readexactly(int.from_bytes(header, "little"))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return pickle.loads(body)
