"""The parameter server's state on its device, updated by device ops, and rebuilt after a
context rebuild from a host journal.

``"sgd"``: one BLAS axpy, ``w += (-lr * weight) g``. ``"adamw"``: one fused
``AdamUpdate`` op of the ``train`` library (decoupled decay 0, betas 0.9 and
0.999, eps 1e-8: the original's settings), ``grad_scale = weight``, its
moments in two more device buffers, its step the number of updates applied.

**Surviving a poisoned context.** The device buffers die with their context.
The store keeps a host *snapshot* (weights, moments, step count), taken every
``SNAPSHOT_EVERY`` updates, and a *journal* of the gradients (and weights)
applied since. When an op finds the context rebuilt (``GpuRefStale``) or
poisoned (``ContextPoisoned``), the store allocates its buffers again on the
new context, uploads the snapshot, replays the journal with the same device
ops, and redoes the interrupted work once: no applied update is lost and none
is applied twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from atomr_accel.core._errors import ContextPoisoned, GpuRefStale, GpuRuntimeError
from atomr_accel.core.ops._train import AdamUpdate
from atomr_accel.facade import Device
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.train._model import Array

__all__ = ["SNAPSHOT_EVERY", "WeightStore"]

T = TypeVar("T")

SNAPSHOT_EVERY = 32
"""Updates between two host snapshots (the journal holds at most this many gradients)."""


@dataclass
class _Snapshot:
    weights: Array
    exp_avg: Array | None
    exp_avg_sq: Array | None
    steps: int


@dataclass
class _Buffers:
    weights: GpuBuffer
    gradient: GpuBuffer
    exp_avg: GpuBuffer | None
    exp_avg_sq: GpuBuffer | None

    def all(self) -> list[GpuBuffer]:
        """Every buffer held."""
        return [b for b in (self.weights, self.gradient, self.exp_avg, self.exp_avg_sq)
                if b is not None]


@dataclass
class WeightStore:
    """The weights, gradient buffer and optimizer state of a server on ``device``."""

    device: Device
    optimizer: str
    lr: float
    initial: Array
    steps: int = 0
    rebuilds: int = 0
    """How many times the buffers were rebuilt after a context rebuild."""
    _buffers: _Buffers | None = None
    _snapshot: _Snapshot | None = None
    _journal: list[tuple[Array, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        adam = self.optimizer == "adamw"
        zeros = np.zeros_like(self.initial) if adam else None
        self._snapshot = _Snapshot(self.initial, zeros, None if zeros is None else zeros.copy(),
                                   0)

    @property
    def size(self) -> int:
        """How many weights."""
        return int(self.initial.size)

    async def _build(self) -> _Buffers:
        """Allocate the buffers, upload the snapshot and replay the journal."""
        assert self._snapshot is not None
        dev, n, snap = self.device, max(self.size, 1), self._snapshot
        buffers = _Buffers(await dev.allocate_async(n), await dev.allocate_async(n),
                           None if snap.exp_avg is None else await dev.allocate_async(n),
                           None if snap.exp_avg_sq is None else await dev.allocate_async(n))
        for buffer, host in ((buffers.weights, snap.weights), (buffers.exp_avg, snap.exp_avg),
                             (buffers.exp_avg_sq, snap.exp_avg_sq)):
            if buffer is not None and host is not None and self.size:
                await dev.copy_from_numpy_async(buffer, host)
        self.steps = snap.steps
        self._buffers = buffers
        for gradient, weight in self._journal:
            await self._update(buffers, gradient, weight)
        return buffers

    async def _guarded(self, work: Callable[[_Buffers], Awaitable[T]]) -> T:
        """Run ``work`` on the buffers; after a context rebuild, rebuild them and run it
        once more."""
        try:
            return await work(self._buffers or await self._build())
        except (GpuRefStale, ContextPoisoned):
            self._buffers = None
            self.rebuilds += 1
            return await work(await self._build())

    async def _update(self, buffers: _Buffers, gradient: Array, weight: float) -> None:
        """Upload ``gradient`` and apply it times ``weight`` (device ops only)."""
        dev = self.device
        await dev.copy_from_numpy_async(buffers.gradient, gradient)
        if buffers.exp_avg is None or buffers.exp_avg_sq is None:
            await dev.blas().axpy_f32_async(-self.lr * weight, buffers.gradient,
                                            buffers.weights, self.size)
        else:
            await dev.run_async(AdamUpdate(
                buffers.weights.ref, buffers.gradient.ref, buffers.exp_avg.ref,
                buffers.exp_avg_sq.ref, 0, self.size, self.lr, self.steps + 1,
                decoupled=True, grad_scale=weight))
        self.steps += 1

    async def apply(self, gradient: Array, weight: float) -> None:
        """Apply one pushed ``gradient`` times ``weight``; journal it, snapshot when due."""
        if not self.size:
            return
        await self._guarded(lambda buffers: self._update(buffers, gradient, weight))
        self._journal.append((gradient, weight))
        if len(self._journal) >= SNAPSHOT_EVERY:
            self._snapshot = await self._guarded(self._take_snapshot)
            self._journal.clear()

    async def _take_snapshot(self, buffers: _Buffers) -> _Snapshot:
        dev = self.device
        moments = [None if b is None else await dev.copy_to_numpy_async(b, 0, self.size)
                   for b in (buffers.exp_avg, buffers.exp_avg_sq)]
        weights = await dev.copy_to_numpy_async(buffers.weights, 0, self.size)
        return _Snapshot(weights, moments[0], moments[1], self.steps)

    async def read(self) -> Array:
        """The weights, downloaded."""
        if not self.size:
            return np.zeros(0, np.float32)

        async def download(buffers: _Buffers) -> Array:
            data: Array = await self.device.copy_to_numpy_async(buffers.weights, 0, self.size)
            return data

        return await self._guarded(download)

    async def close(self) -> None:
        """Free the buffers (errors of a device or context already gone are ignored)."""
        buffers, self._buffers = self._buffers, None
        for buffer in buffers.all() if buffers is not None else []:
            with contextlib.suppress(GpuRuntimeError):
                await self.device.free_async(buffer)
