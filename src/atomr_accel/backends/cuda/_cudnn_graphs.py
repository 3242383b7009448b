"""Built cuDNN frontend graphs, kept per context and run on the op's stream.

A cuDNN frontend graph is described, validated, lowered and planned once for a
shape, dtype and set of options (tens of milliseconds), then executed many
times (microseconds of GPU work). ``run(backend, key, build, arrays)`` keeps
the graphs of one backend in a small LRU cache under ``key`` (everything the
graph depends on), builds a missing one with ``build(handle) -> Built``,
points a cuDNN handle at the current stream and executes the graph on
``arrays`` (CuPy arrays or device addresses, in the order of
``Built.tensors``) with a workspace kept per stream.

The frontend's ``execute`` inspects every operand in Python on every call
(tens to hundreds of microseconds, more than many convolutions take on the
GPU). So for a graph that runs on the cuDNN backend a built entry keeps what
the frontend's own last step needs (its lowered graph, the operands' order
by uid, the plan's index) and hands the lowered graph the operands' addresses
in that order directly. A graph this does not apply to (a Python engine, a
frontend without those internals) takes the public ``execute``.

Handles are per thread (a blocking caller's thread may run an op as well as
the host's), each pointed at the stream of the op it runs.

A handler may also keep, per op, what it derived from the op
(``_prepared.Prepared``): the next run of that op launches its graph
(``launch``) without deriving it again, and, since nothing is left to build,
may be queued from an event loop.

``data_type(dtype)`` maps our dtypes to the frontend's.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import cupy as cp
import numpy as np

from atomr_accel.backends._optional import require
from atomr_accel.backends._state import Lru, per_backend
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument

__all__ = ["Built", "GraphCache", "cache_of", "data_type", "frontend", "launch", "run"]


def frontend() -> Any:
    """The ``cudnn`` frontend module (raises ``LibraryUnavailable`` when it is missing)."""
    return require("cudnn")


def data_type(dtype: DType) -> Any:
    """The frontend's ``cudnn.data_type`` for one of our floating dtypes."""
    types = frontend().data_type
    found = {DType.F16: types.HALF, DType.BF16: types.BFLOAT16, DType.F32: types.FLOAT,
             DType.F64: types.DOUBLE}.get(dtype)
    if found is None:
        raise InvalidArgument(f"cuDNN graphs take f16, bf16, f32 or f64 data, not {dtype}")
    return found


@dataclass(slots=True)
class Built:
    """A built graph and its tensors, in the order ``run`` receives their arrays."""

    graph: Any
    tensors: tuple[Any, ...]
    workspace: int = -1
    """Workspace bytes (read once, on the first run)."""
    direct: Any = field(default=None, repr=False)
    """``(lowered execute, operand order, plan index)`` once known; False: not available."""


def _direct(built: Built) -> Any:
    """What a direct launch of ``built`` needs, or False when it must take ``execute``."""
    graph = built.graph
    try:
        if graph.selected_engine is not None:  # a Python engine: the frontend runs it
            return False
        uids = graph._variant_pack_uids()
        mine = [tensor.uid for tensor in built.tensors]
        if not uids or any(uid not in mine for uid in uids):
            return False
        plans = graph._plans
        config = graph._materialize_backend_plan(graph._plan_index) if plans else None
        index = -1 if config is None or config.cpp_index is None else int(config.cpp_index)
        order = tuple(mine.index(uid) for uid in uids)
        return graph._lowered_graph._execute_with_raw_ptrs, order, index
    except Exception:  # another frontend release: keep to its public execute
        return False


class GraphCache:
    """The ``size`` most recently used built graphs of one backend, its cuDNN handles (one a
    thread) and a workspace a stream."""

    def __init__(self, size: int = 64) -> None:
        self._graphs: Lru[Built] = Lru(size)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._workspaces: dict[int, Any] = {}

    def handle(self) -> Any:
        """This thread's cuDNN handle, made on first use."""
        handle = getattr(self._local, "handle", None)
        if handle is None:
            handle = self._local.handle = frontend().create_handle()
            self._local.stream = None
        return handle

    def on_stream(self, stream: int) -> Any:
        """This thread's handle, pointed at ``stream`` (a CUDA stream address)."""
        handle = self.handle()
        if self._local.stream != stream:
            frontend().set_stream(handle=handle, stream=stream)
            self._local.stream = stream
        return handle

    def backend_handle(self) -> int:
        """This thread's handle as the address the lowered graph takes."""
        raw = getattr(self._local, "raw", None)
        if raw is None:
            convert = importlib.import_module("cudnn._handle").to_backend_handle
            raw = self._local.raw = int(convert(self.handle()) or 0)
        return int(raw)

    def workspace(self, stream: int, size: int) -> Any:
        """A device buffer of at least ``size`` bytes for work queued on ``stream`` (work on
        one stream runs in order, so its graphs share one)."""
        with self._lock:
            held = self._workspaces.get(stream)
            if held is None or held.nbytes < size:
                held = self._workspaces[stream] = cp.empty(max(size, 1), dtype=cp.uint8)
            return held

    def get(self, key: Hashable, build: Callable[[Any], Built]) -> Built:
        """The graph under ``key``, built by ``build(handle)`` on a miss (outside the lock:
        a build takes milliseconds; if two threads build one key, the first kept wins)."""
        with self._lock:
            built = self._graphs.find(key)
        if built is not None:
            return built
        made = build(self.handle())
        with self._lock:
            return self._graphs.get(key, lambda: made)

    def __len__(self) -> int:
        return len(self._graphs)


cache_of = per_backend(GraphCache)
"""The graph cache of a backend (one per context; it goes with the backend)."""


def _address(array: Any) -> int:
    return array if type(array) is int else int(array.data.ptr)


def run(backend: Any, key: Hashable, build: Callable[[Any], Built],
        arrays: Sequence[Any]) -> Built:
    """Execute the graph under ``key`` (built by ``build`` on a miss) on ``arrays``, on the
    current stream; return the built graph."""
    built = cache_of(backend).get(key, build)
    launch(backend, built, arrays)
    return built


def launch(backend: Any, built: Built, arrays: Sequence[Any]) -> None:
    """Execute ``built`` (a graph of ``backend``'s) on ``arrays``, on the current stream."""
    cache = cache_of(backend)
    if len(arrays) != len(built.tensors):
        raise InvalidArgument(f"the graph takes {len(built.tensors)} tensors, got {len(arrays)}")
    stream = cp.cuda.get_current_stream().ptr
    handle = cache.on_stream(stream)
    if built.workspace < 0:
        built.workspace = int(built.graph.get_workspace_size())
    workspace = cache.workspace(stream, built.workspace)
    if built.direct is None:
        built.direct = _direct(built)
        if built.direct:
            try:  # the first direct launch: a frontend whose internals differ refuses it
                _launch(built, arrays, workspace, cache)
                return
            except (TypeError, AttributeError):
                built.direct = False
    if built.direct:
        _launch(built, arrays, workspace, cache)
        return
    built.graph.execute(dict(zip(built.tensors, arrays, strict=True)), workspace, handle=handle)


def _launch(built: Built, arrays: Sequence[Any], workspace: Any, cache: GraphCache) -> None:
    """Hand the lowered graph the operands' addresses in its own order."""
    execute, order, index = built.direct
    addresses = np.fromiter((_address(arrays[i]) for i in order), dtype=np.uintp,
                            count=len(order))
    execute(addresses.ctypes.data, len(order), workspace.data.ptr, cache.backend_handle(),
            index)
