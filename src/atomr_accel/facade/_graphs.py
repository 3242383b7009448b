"""Graphs in the facade: record library calls once with a ``GraphRecorder``, replay the
``Graph`` many times."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from atomr_accel.core._op import Op
from atomr_accel.core._ref import GpuRef, GraphRef
from atomr_accel.core.ops._graph import (
    CaptureGraph,
    DestroyGraph,
    LaunchGraph,
    OpSequence,
    check_capturable,
)
from atomr_accel.core.ops._memory import CopyBuffer
from atomr_accel.facade._buffers import BufferLike, GenerationBound
from atomr_accel.facade._kernels import Dim, NvrtcKernel, kernel_ref, launch_op
from atomr_accel.facade._libraries import Blas, Fft, Library, RngGenerator, Sparse, Tensor
from atomr_accel.facade._portal import blocking

if TYPE_CHECKING:
    from atomr_accel.facade._device import Device

__all__ = ["Graph", "GraphRecorder"]



class Graph(GenerationBound):
    """A recorded sequence of ops of one context generation; ``launch()`` replays it.

    On CUDA it is a CUDA graph made by stream capture, so a replay is one
    launch however many ops it holds; on the CPU backend the ops run again in
    order. A replay is ordered after earlier writers of its buffers and before
    later readers, like any op. After a context rebuild the graph is stale and a
    launch raises ``GpuRefStale``.
    """

    def __init__(self, device: Device, ref: GraphRef) -> None:
        self.device = device
        self.ref = ref
        self._portal = device._portal

    async def launch_async(self) -> None:
        """Replay the graph; returns when its work has finished."""
        await self.device.run_async(LaunchGraph(self.ref))

    async def destroy_async(self) -> None:
        """Release the graph (later launches raise ``InvalidArgument``)."""
        await self.device.run_async(DestroyGraph(self.ref))

    launch = blocking(launch_async)
    destroy = blocking(destroy_async)

    def __repr__(self) -> str:
        stale = ", stale" if self.is_stale() else ""
        return f"Graph({self.ref.op_count} ops, device={self.ref.device_id}{stale})"


class GraphRecorder:
    """Collects the ops of library calls instead of running them; ``capture()`` records them.

    Use the same handles as on the device (``rec.blas().gemm_f32(...)``,
    ``rec.fft()``, ``rec.rng(seed)``, ``rec.sparse()``, ``rec.tensor()``,
    ``rec.copy(...)``, ``rec.launch(kernel, ...)``); each call returns at once
    and runs nothing. Calls a graph cannot hold (host copies, allocations,
    solver ops, reductions that answer a host value) raise ``InvalidArgument``
    when made.
    """

    def __init__(self, device: Device) -> None:
        self.device = device
        self._portal = device._portal
        self.ops: list[Op] = []

    @property
    def generation(self) -> int:
        """The device's context generation."""
        return self.device.generation

    def ref_of(self, buffer: BufferLike, name: str = "buffer") -> GpuRef:
        """The ``GpuRef`` of a buffer of the device."""
        return self.device.ref_of(buffer, name)

    async def run_async(self, op: Op, timeout_secs: float | None = None, *,
                        checked: bool = False) -> None:
        """Record ``op`` (``InvalidArgument`` if a graph cannot hold it); nothing runs, so
        ``timeout_secs`` has nothing to bound."""
        self.ops.append(check_capturable(op, len(self.ops)))

    def _call_now(self, op: Op, timeout_secs: float | None, *, checked: bool = True) -> None:
        """Record ``op``, as ``run_async`` does (the handles' blocking methods)."""
        self.ops.append(check_capturable(op, len(self.ops)))

    def _as_device(self) -> Device:
        return cast("Device", self)  # handles need only ref_of, run_async, _call_now, _portal

    def blas(self) -> Blas:
        """BLAS calls to record."""
        return Blas(self._as_device())

    def fft(self) -> Fft:
        """FFT calls to record."""
        return Fft(self._as_device())

    def rng(self, seed: int = 0) -> RngGenerator:
        """Random fills to record (a replay draws the same numbers again)."""
        return RngGenerator(self._as_device(), seed)

    def sparse(self) -> Sparse:
        """Sparse products to record."""
        return Sparse(self._as_device())

    def tensor(self) -> Tensor:
        """Contractions to record."""
        return Tensor(self._as_device())

    async def copy_async(self, src: BufferLike, dst: BufferLike, length: int | None = None,
                         src_offset: int = 0, dst_offset: int = 0) -> None:
        """Record a device-to-device copy (arguments as for ``Device.copy``)."""
        s, d = self.ref_of(src, "src"), self.ref_of(dst, "dst")
        count = min(s.length - src_offset, d.length - dst_offset) if length is None else length
        await self.run_async(CopyBuffer(s, d, count, src_offset, dst_offset))

    async def launch_async(self, kernel: NvrtcKernel, grid: Dim, block: Dim, *args: Any,
                           shared_mem: int = 0, writes: Iterable[int] | None = None) -> None:
        """Record a kernel launch (arguments as for ``NvrtcKernel.launch``)."""
        handle = Library(self._as_device())
        await self.run_async(launch_op(handle, kernel_ref(kernel), grid, block, args,
                                       shared_mem, writes))

    async def capture_async(self) -> Graph:
        """Record the collected ops into a graph on the device and return it."""
        ref: GraphRef = await self.device.run_async(CaptureGraph(tuple(self.ops)))
        return Graph(self.device, ref)

    async def run_once_async(self, timeout_secs: float | None = None) -> tuple[Any, ...]:
        """Run the collected ops once, in order, as one request (an ``OpSequence``: no graph
        is made, so nothing is kept on the device); answers their results (None each here).
        The ops stay collected, so they can be run again or captured."""
        results: tuple[Any, ...] = await self.device.run_async(OpSequence(tuple(self.ops)),
                                                               timeout_secs)
        return results

    copy = blocking(copy_async)
    launch = blocking(launch_async)
    capture = blocking(capture_async)
    run_once = blocking(run_once_async)

    def __repr__(self) -> str:
        return f"GraphRecorder({len(self.ops)} ops, device={self.device.device_id})"
