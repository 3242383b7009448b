"""The original's ``atomr_accel.graph``: ``GraphScript``, ``GraphCapture`` and
``GraphHandle``, real on both backends (the original's were mocks).

A ``GraphScript`` lists device-to-device copies and float32 matrix products;
``GraphCapture.record`` records them as one graph on its device (a CUDA graph
made by stream capture on CUDA, the op list replayed in order on the CPU
backend: see ``facade/_graphs.py``), and ``launch`` replays it. Every method
checks its arguments when called, the ``*_async`` twins too.
"""

from __future__ import annotations

import weakref
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import Op, checked, is_int
from atomr_accel.core._ref import GpuRef, GraphRef
from atomr_accel.core.ops._blas import Gemm
from atomr_accel.core.ops._graph import CaptureGraph, LaunchGraph
from atomr_accel.core.ops._memory import CopyBuffer
from atomr_accel.facade._bound import DeviceBound, check_timeout
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.facade._device import Device
from atomr_accel.facade._portal import blocking

__all__ = ["GraphCapture", "GraphHandle", "GraphScript"]


@dataclass(frozen=True, slots=True)
class _Step:
    """One step of a script: its op, the buffers it names (kept alive with it), and how a
    DOT node shows it."""

    op: Op
    buffers: tuple[GpuBuffer, ...]
    summary: str
    details: str


def _f32(buffer: object, name: str) -> GpuRef:
    if not isinstance(buffer, GpuBuffer) or buffer.dtype is not DType.F32:
        raise InvalidArgument(f"{name} must be a GpuBufferF32, got {buffer!r}")
    return buffer.ref


class GraphScript:
    """Steps to record as one graph: ``add_memcpy`` and ``add_sgemm``, checked when added.

    All buffers of a script belong to one device.
    """

    def __init__(self) -> None:
        self._steps: list[_Step] = []

    def _add(self, step: _Step) -> None:
        device = self._steps[0].buffers[0].device if self._steps else step.buffers[0].device
        if any(buffer.device is not device for buffer in step.buffers):
            raise InvalidArgument("the buffers of a graph script must all belong to one device")
        self._steps.append(step)

    def add_memcpy(self, src: GpuBuffer, dst: GpuBuffer) -> None:
        """Copy all of ``src`` into the start of ``dst`` (float32 buffers of one device)."""
        s, d = _f32(src, "src"), _f32(dst, "dst")
        if d.length < s.length:
            raise InvalidArgument(f"dst holds {d.length} elements; src's {s.length} do not fit")
        op = checked(CopyBuffer(s, d, s.length))
        self._add(_Step(op, (src, dst), f"memcpy {s.length} x f32", f"src={s!r}\\ndst={d!r}"))

    def add_sgemm(self, a: GpuBuffer, b: GpuBuffer, c: GpuBuffer, m: int, n: int, k: int,
                  alpha: float = 1.0, beta: float = 0.0) -> None:
        """``C = alpha * A @ B + beta * C``, column-major float32: A is m x k, B k x n,
        C m x n (``InvalidArgument`` when a buffer is too short)."""
        op = checked(Gemm(_f32(a, "a"), _f32(b, "b"), _f32(c, "c"), m, n, k, alpha=alpha,
                          beta=beta))
        details = f"alpha={op.alpha} beta={op.beta}\\na={op.a!r}\\nb={op.b!r}\\nc={op.c!r}"
        self._add(_Step(op, (a, b, c), f"sgemm m={op.m} n={op.n} k={op.k}", details))

    def __len__(self) -> int:
        return len(self._steps)

    def __repr__(self) -> str:
        return f"GraphScript(ops={len(self)})"


class GraphHandle:
    """A script recorded as a graph on one device (``GraphCapture.record``).

    It keeps the script's buffers alive, and releases the graph once it is
    collected. After a context rebuild it is stale: launching it raises
    ``GpuRefStale``. ``GraphHandle.synthetic()`` records nothing (generation 0)
    and cannot be launched.
    """

    def __init__(self, device: Device | None, ref: GraphRef | None,
                 steps: tuple[_Step, ...]) -> None:
        self.device = device
        self.ref = ref
        self._steps = steps
        if device is not None and ref is not None:
            weakref.finalize(self, device._state.release, ref).atexit = False

    @staticmethod
    def synthetic() -> GraphHandle:
        """A handle of no graph: generation 0, nothing to launch."""
        return GraphHandle(None, None, ())

    @property
    def generation(self) -> int:
        """The context generation the graph was recorded in (0 when synthetic)."""
        return 0 if self.ref is None else self.ref.generation

    def export_dot(self, flags: int = 0) -> str:
        """The graph as Graphviz DOT text: one node per step, in the order they run.

        ``flags`` as ``cudaGraphDebugDotFlags``: 0 for a terse graph; any other
        value (1, verbose) adds each node's parameters (buffers, alpha, beta).
        """
        if not is_int(flags) or flags < 0:
            raise InvalidArgument(f"flags must be an int >= 0, got {flags!r}")
        name = "synthetic" if self.ref is None else f"graph-{self.ref.graph_id}"
        lines = [f'digraph "{name}" {{', "  rankdir=TB;"]
        for i, step in enumerate(self._steps):
            label = f"{step.summary}\\n{step.details}" if flags else step.summary
            lines.append(f'  n{i} [shape=box, label="{label}"];')
        lines += [f"  n{i - 1} -> n{i};" for i in range(1, len(self._steps))]
        lines.append("}")
        return "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        if self.ref is None:
            return "GraphHandle(synthetic, generation=0)"
        return (f"GraphHandle(ops={len(self._steps)}, device={self.ref.device_id}, "
                f"generation={self.generation})")


class GraphCapture(DeviceBound, prefix="graph-capture"):
    """Records ``GraphScript``s as graphs on one device and launches them.

    ``GraphCapture.spawn(system)`` binds it to ``device`` if given, else the
    system's first device, else a new one (CUDA when a GPU is usable, the CPU
    backend otherwise).
    """

    def record_async(self, script: GraphScript,
                     timeout_secs: float | None = 30.0) -> Coroutine[Any, Any, GraphHandle]:
        """Record ``script``'s steps as one graph on the device; nothing runs yet.

        Raises ``InvalidArgument`` for an empty script or one whose buffers
        belong to another device.
        """
        check_timeout(timeout_secs)
        if not isinstance(script, GraphScript):
            raise InvalidArgument(f"script must be a GraphScript, got {type(script).__name__}")
        steps = tuple(script._steps)
        for step in steps:
            for buffer in step.buffers:
                self.device.ref_of(buffer)  # a buffer of another device: InvalidArgument
        op = checked(CaptureGraph(tuple(step.op for step in steps)))
        return self._record(op, steps, timeout_secs)

    async def _record(self, op: CaptureGraph, steps: tuple[_Step, ...],
                      timeout: float | None) -> GraphHandle:
        ref: GraphRef = await self.device.run_async(op, timeout)
        return GraphHandle(self.device, ref, steps)

    def launch_async(self, handle: GraphHandle,
                     timeout_secs: float | None = 30.0) -> Coroutine[Any, Any, None]:
        """Replay a recorded graph; returns once its work has finished.

        Raises ``InvalidArgument`` for a synthetic handle or one of another
        device, ``GpuRefStale`` once the context was rebuilt since recording.
        """
        check_timeout(timeout_secs)
        if not isinstance(handle, GraphHandle):
            raise InvalidArgument(f"handle must be a GraphHandle, got {type(handle).__name__}")
        if handle.ref is None:
            raise InvalidArgument("a synthetic GraphHandle holds no graph; record a GraphScript "
                                  "to get one to launch")
        return self._launch(handle, checked(LaunchGraph(handle.ref)), timeout_secs)

    async def _launch(self, handle: GraphHandle, op: LaunchGraph, timeout: float | None) -> None:
        """Run ``op``; this frame holds ``handle`` meanwhile (collecting it releases the graph)."""
        await self.device.run_async(op, timeout)

    record = blocking(record_async)
    launch = blocking(launch_async)

    def __repr__(self) -> str:
        return f"GraphCapture(name={self.name!r}, device={self.device.device_id})"
