"""VideoEffectsGraph: a directed acyclic graph of filter and blend nodes run over each frame
on a device, in an actor."""

from __future__ import annotations

from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr_accel.blueprint import twin
from atomr_accel.blueprint._checks import require_name
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._realtime_frames import BlendFrames, FilterFrames, Stage
from atomr_accel.facade import Device, System
from atomr_accel.realtime._actor import Placement, RealtimeActor, RealtimeClient
from atomr_accel.realtime._checks import require_number
from atomr_accel.realtime._frames import Frame, FrameShape, as_frame, as_stages, frame_shape
from atomr_accel.realtime._image import TIMEOUT

__all__ = ["SOURCE", "VideoEffectsGraph"]

SOURCE = "source"
"""The name of the graph's input: the frame given to ``process``."""


@dataclass(frozen=True, slots=True)
class _Node:
    """A node: a filter chain over one input, or a blend of two (``weights``)."""

    inputs: tuple[str, ...]
    stages: tuple[Stage, ...] = ()
    weights: tuple[float, float] = (0.5, 0.5)


def _cycle(nodes: dict[str, _Node]) -> list[str] | None:
    """A cycle among ``nodes`` (names, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for parent in nodes[name].inputs:
            if parent not in nodes:
                continue
            if state.get(parent) == 1:
                return [*path[path.index(parent):], parent]
            if parent not in state and (found := visit(parent)) is not None:
                return found
        path.pop()
        state[name] = 2
        return None

    for name in nodes:
        if name not in state and (found := visit(name)) is not None:
            return found
    return None


def _order(nodes: dict[str, _Node], output: str | None) -> list[str]:
    """The nodes ``output`` needs, each after its inputs (ties in the order they were added);
    ``InvalidArgument`` for no output, an unknown input or a cycle."""
    if output is None:
        raise InvalidArgument("the graph has no output: call set_output(name)")
    needed: set[str] = set()
    stack = [output]
    while stack:
        name = stack.pop()
        if name == SOURCE or name in needed:
            continue
        if name not in nodes:
            raise InvalidArgument(f"the graph names an unknown node {name!r}")
        needed.add(name)
        stack.extend(nodes[name].inputs)
    order: list[str] = []
    done = {SOURCE}
    while len(order) < len(needed):
        ready = [n for n in nodes if n in needed and n not in done
                 and all(p in done for p in nodes[n].inputs)]
        if not ready:
            raise InvalidArgument("the graph has a cycle")
        order.append(ready[0])
        done.add(ready[0])
    return order


class _GraphActor(RealtimeActor):
    """Holds the nodes and a float32 buffer a node; runs the nodes in order per frame."""

    def __init__(self, system: System, placement: Placement, shape: FrameShape) -> None:
        super().__init__(system, placement)
        self.shape = shape
        self.nodes: dict[str, _Node] = {}
        self.output: str | None = None

    async def on_add(self, name: str, node: _Node) -> None:
        if name == SOURCE or name in self.nodes:
            raise InvalidArgument(f"a node named {name!r} exists already")
        nodes = {**self.nodes, name: node}
        cycle = _cycle(nodes)
        if cycle is not None:
            raise InvalidArgument(f"adding {name!r} would make a cycle: {' -> '.join(cycle)}")
        self.nodes = nodes

    async def on_set_output(self, name: str) -> None:
        self.output = name

    async def on_order(self) -> list[str]:
        return _order(self.nodes, self.output)

    async def on_process(self, frame: Frame) -> Any:
        return (await self.on_process_many([frame]))[0]

    async def on_process_many(self, frames: list[Frame]) -> list[Any]:
        """Run the graph over ``frames`` at once: every node is one op over all of them (the
        frames lie one after another in each node's buffer), so the device runs them back
        to back; one upload in, one download out."""
        order = _order(self.nodes, self.output)
        device = self.device
        s, dtype = self.shape, frames[0].dtype
        if any(f.dtype is not dtype for f in frames):
            raise InvalidArgument("the frames of one process_many call must share a dtype")
        count, n = len(frames), s.size
        data = np.concatenate([f.data for f in frames]) if count > 1 else frames[0].data
        held = {SOURCE: await self.upload(f"src-{dtype.value}", data, dtype)}
        for name in order:
            node = self.nodes[name]
            out = held[name] = await self.buffer(f"node-{name}", n * count, DType.F32)
            refs = [device.ref_of(held[i]) for i in node.inputs]
            if node.stages:
                await device.run_async(FilterFrames(refs[0], device.ref_of(out), s.height,
                                                    s.width, s.channels, node.stages, count))
            else:
                await device.run_async(BlendFrames(refs[0], refs[1], device.ref_of(out),
                                                   n * count, *node.weights))
        result = held[order[-1]] if order else held[SOURCE]
        if dtype is DType.U8 and result.dtype is not DType.U8:
            stored = await self.buffer("out-u8", n * count, DType.U8)
            await device.run_async(BlendFrames(device.ref_of(result), device.ref_of(result),
                                               device.ref_of(stored), n * count, 1.0, 0.0))
            result = stored
        values = await device.copy_to_numpy_async(result, 0, n * count)
        return [f.answer(values[i * n:(i + 1) * n]) for i, f in enumerate(frames)]

class VideoEffectsGraph(RealtimeClient):
    """A DAG of effect nodes run over ``height x width x channels`` frames on a device.

    The input frame is the node ``"source"``. ``add_filter(name, input, stages)``
    adds a chain of filter stages over one node, ``add_blend(name, a, b, weight_a,
    weight_b)`` a weighted sum of two (a node may feed several: fan-out);
    inputs may name nodes added later. A node that would close a cycle is refused
    with ``InvalidArgument``, as are a repeated name, and (at ``process`` or
    ``order``) an unknown input or a missing output. ``process(frame)`` runs the
    nodes the output needs, each after its inputs, in float32 on the device, and
    answers the output in the frame's form (rounded and saturated for u8).
    Every method has an ``_async`` twin and takes ``timeout_secs`` (10 s).
    """

    shape = FrameShape(1, 1, 1)

    @classmethod
    def spawn(cls, system: Any, width: int, height: int, channels: int,
              name: str | None = None, *, device: Device | None = None) -> VideoEffectsGraph:
        """Start an empty graph on ``device`` (None: the system places it as it starts)."""
        shape = frame_shape(width, height, channels)
        client = cls._spawn(system, _GraphActor, (shape,), name, device)
        client.shape = shape
        return client

    def add_filter_async(self, name: str, input: str, stages: Iterable[Stage],
                         timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, None]:
        """Add node ``name``: the chain ``stages`` over node ``input``."""
        chain = as_stages(stages)
        if not chain:
            raise InvalidArgument("a filter node needs at least one stage")
        node = _Node((require_name(input, "input"),), chain)
        return self._run("add", (require_name(name, "name"), node), timeout_secs)

    add_filter = twin(add_filter_async)

    def add_blend_async(self, name: str, a: str, b: str, weight_a: float = 0.5,
                        weight_b: float = 0.5, timeout_secs: float = TIMEOUT,
                        ) -> Coroutine[Any, Any, None]:
        """Add node ``name``: ``weight_a * a + weight_b * b``."""
        weights = (require_number("weight_a", weight_a), require_number("weight_b", weight_b))
        node = _Node((require_name(a, "a"), require_name(b, "b")), (), weights)
        return self._run("add", (require_name(name, "name"), node), timeout_secs)

    add_blend = twin(add_blend_async)

    def set_output_async(self, name: str, timeout_secs: float = TIMEOUT,
                         ) -> Coroutine[Any, Any, None]:
        """Make node ``name`` the graph's output."""
        return self._run("set_output", (require_name(name, "name"),), timeout_secs)

    set_output = twin(set_output_async)

    def order_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, list[str]]:
        """The nodes ``process`` runs, in the order it runs them."""
        return self._run("order", (), timeout_secs)

    order = twin(order_async)

    def process_async(self, frame: Any, timeout_secs: float = TIMEOUT,
                      ) -> Coroutine[Any, Any, Any]:
        """The output node's frame for ``frame``, in the form ``frame`` came in."""
        return self._run("process", (as_frame(frame, self.shape),), timeout_secs)

    process = twin(process_async)

    def process_many_async(self, frames: Iterable[Any], timeout_secs: float = TIMEOUT,
                           ) -> Coroutine[Any, Any, list[Any]]:
        """``process`` of each of ``frames`` (one or more, of one dtype), in order, in one
        request: each node runs once over all of them, back to back on the device."""
        checked = [as_frame(frame, self.shape) for frame in frames]
        if not checked:
            raise InvalidArgument("process_many needs at least one frame")
        return self._run("process_many", (checked,), timeout_secs)

    process_many = twin(process_many_async)
