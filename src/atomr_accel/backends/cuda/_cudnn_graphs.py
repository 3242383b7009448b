"""Built cuDNN frontend graphs, kept per context and run on the op's stream.

A cuDNN frontend graph is described, validated, lowered and planned once for a
shape, dtype and set of options (tens of milliseconds), then executed many
times (microseconds). ``run(backend, key, build, arrays)`` keeps the graphs of
one backend in a small LRU cache under ``key`` (everything the graph depends
on), builds a missing one with ``build(handle) -> Built``, points the
backend's cuDNN handle at the current stream and executes the graph on
``arrays`` (CuPy arrays or device addresses, in the order of ``Built.tensors``)
with a workspace taken from CuPy's stream-ordered pool.

``data_type(dtype)`` maps our dtypes to the frontend's.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import cupy as cp

from atomr_accel.backends._optional import require
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument

__all__ = ["Built", "GraphCache", "cache_of", "data_type", "frontend", "run"]


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


@dataclass(frozen=True, slots=True)
class Built:
    """A built graph and its tensors, in the order ``run`` receives their arrays."""

    graph: Any
    tensors: tuple[Any, ...]


class GraphCache:
    """The ``size`` most recently used built graphs of one backend, and its cuDNN handle."""

    def __init__(self, size: int = 64) -> None:
        self._graphs: OrderedDict[Hashable, Built] = OrderedDict()
        self._size = size
        self._handle: Any = None

    def handle(self) -> Any:
        """The backend's cuDNN handle, made on first use."""
        if self._handle is None:
            self._handle = frontend().create_handle()
        return self._handle

    def get(self, key: Hashable, build: Callable[[Any], Built]) -> Built:
        """The graph under ``key``, built by ``build(handle)`` on a miss."""
        built = self._graphs.pop(key, None)
        if built is None:
            built = build(self.handle())
        self._graphs[key] = built
        if len(self._graphs) > self._size:
            self._graphs.popitem(last=False)
        return built

    def __len__(self) -> int:
        return len(self._graphs)


_CACHES: weakref.WeakKeyDictionary[Any, GraphCache] = weakref.WeakKeyDictionary()


def cache_of(backend: Any) -> GraphCache:
    """The graph cache of ``backend`` (one per context; it goes with the backend)."""
    cache = _CACHES.get(backend)
    if cache is None:
        cache = _CACHES[backend] = GraphCache()
    return cache


def run(backend: Any, key: Hashable, build: Callable[[Any], Built],
        arrays: Sequence[Any]) -> Built:
    """Execute the graph under ``key`` (built by ``build`` on a miss) on ``arrays``, on the
    current stream; return the built graph."""
    cache = cache_of(backend)
    built = cache.get(key, build)
    if len(arrays) != len(built.tensors):
        raise InvalidArgument(f"the graph takes {len(built.tensors)} tensors, got {len(arrays)}")
    handle = cache.handle()
    cudnn = frontend()
    cudnn.set_stream(handle=handle, stream=cp.cuda.get_current_stream().ptr)
    size = built.graph.get_workspace_size()
    workspace = cp.empty(max(size, 1), dtype=cp.uint8)  # the frontend refuses an empty one
    built.graph.execute(dict(zip(built.tensors, arrays, strict=True)), workspace, handle=handle)
    return built
