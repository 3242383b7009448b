"""cuDNN-shaped convolutions, pooling, softmax, activations, LRN and dropout on CUDA.

Convolutions run as cuDNN frontend graphs (``conv_fprop``, ``conv_dgrad``,
``conv_wgrad``) through ``_cudnn_graphs.run``: one graph per shape, dtype,
layout and option set, built on first use and cached per context. The
graph reads and writes the buffers in place by address; each tensor is
described by its logical ``(N, C, H, W)`` dims and the strides of its stored
layout, which is how cuDNN itself tells NCHW from NHWC. Data are f16, bf16
or f32, accumulated in f32; f64 convolutions are refused on CUDA
(``InvalidArgument``) as no double-precision path is offered here. A
blend other than ``alpha = 1, beta = 0`` runs the graph into a scratch
array and blends on CuPy (``"cudnn-graph+cupy"``).

Plans: by default the heuristics' (mode A, then FALLBACK) first plan that
builds. With the op's ``autotune=True`` the build times the first 12 ranked
plans on the op's own buffers (a warm-up and 3 runs each, CUDA events on the
op's stream, which the build waits for once) and keeps the fastest; the
choice is part of the cache key.

The frontend in use has no pooling node, nor softmax, LRN or seeded-dropout
nodes. Those ops, and the activations (element-wise, memory-bound), run the
shared array handlers on CuPy (``backends/cpu/_dnn.py``), which answer
``"cupy"``; like the graphs, they raise ``LibraryUnavailable`` without the
frontend, so a ``Cudnn`` handle either serves every call or none. The
dropout mask is then bit-identical to the CPU backend's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import cupy as cp

from atomr_accel.backends._base import Handler
from atomr_accel.backends._handlers import cuda
from atomr_accel.backends._optional import require
from atomr_accel.backends.cpu import _dnn as shared
from atomr_accel.backends.cuda._completion import Event
from atomr_accel.backends.cuda._cudnn_graphs import Built, data_type, frontend, run
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import Op
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._dnn import (
    Conv2dBackwardData,
    Conv2dBackwardFilter,
    Conv2dForward,
    ConvGeometry,
    Layout,
)

__all__ = ["conv2d", "strides"]

_GRAPH_DTYPES = (DType.F16, DType.BF16, DType.F32)


def strides(shape: tuple[int, ...], layout: Layout) -> list[int]:
    """Element strides of logical ``(N, C, H, W)`` dims stored in ``layout`` (filters alike:
    KCRS or KRSC)."""
    _, c, h, w = shape
    if layout is Layout.NCHW:
        return [c * h * w, h * w, w, 1]
    return [h * w * c, 1, w * c, c]


_TUNE_PLANS = 12
"""How many of cuDNN's ranked plans ``autotune`` times."""
_TUNE_REPS = 3


def _graph(handle: Any, dtype: DType) -> Any:
    cudnn = frontend()
    return cudnn.pygraph(io_data_type=data_type(dtype),
                         intermediate_data_type=cudnn.data_type.FLOAT,
                         compute_data_type=cudnn.data_type.FLOAT, handle=handle)


def _tensor(graph: Any, name: str, shape: tuple[int, ...], layout: Layout, dtype: DType) -> Any:
    return graph.tensor(name=name, dim=list(shape), stride=strides(shape, layout),
                        data_type=data_type(dtype))


def _output(out: Any, shape: tuple[int, ...], layout: Layout, dtype: DType) -> None:
    out.set_output(True).set_dim(list(shape)).set_stride(strides(shape, layout)) \
        .set_data_type(data_type(dtype))


def _fastest_plan(graph: Any, tensors: tuple[Any, ...], addresses: list[int],
                  handle: Any) -> None:
    """Build and time the leading plans on the op's buffers (on the current stream, which
    this waits for); select the fastest. A plan that does not build or run is skipped."""
    cudnn = frontend()
    stream = cp.cuda.get_current_stream()
    cudnn.set_stream(handle=handle, stream=stream.ptr)
    pack = dict(zip(tensors, addresses, strict=True))
    best: tuple[float, int] | None = None
    for index in range(min(graph.get_execution_plan_count(), _TUNE_PLANS)):
        try:
            graph.build_plan_at_index(index)
            size = graph.get_workspace_size_plan_at_index(index)
            workspace = cp.empty(max(size, 1), dtype=cp.uint8)
            graph.execute_plan_at_index(pack, workspace, index, handle=handle)  # warm-up
            start, end = Event(), Event()
            start.record(stream)
            for _ in range(_TUNE_REPS):
                graph.execute_plan_at_index(pack, workspace, index, handle=handle)
            end.record(stream)
            end.synchronize()
        except Exception:  # the frontend declines a plan in several ways: skip it
            continue
        elapsed = cp.cuda.get_elapsed_time(start, end)
        if best is None or elapsed < best[0]:
            best = (elapsed, index)
    if best is None:
        graph.build_plans()  # none of them ran: let the frontend walk the list and say why
        return
    graph.build_plan_at_index(best[1])


def _plan(graph: Any, tensors: tuple[Any, ...], addresses: list[int] | None,
          handle: Any) -> None:
    """Validate, lower and plan the graph; build the heuristics' first plan that builds,
    or (``addresses`` given: autotune) the fastest of the leading ones."""
    cudnn = frontend()
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    if addresses is None:
        graph.build_plans()
    else:
        _fastest_plan(graph, tensors, addresses, handle)


def _check_dtype(dtype: DType) -> None:
    if dtype not in _GRAPH_DTYPES:
        raise InvalidArgument(f"cuDNN convolutions run f16, bf16 or f32 on CUDA, not {dtype}")


Describe = Callable[[Any], tuple[Any, Any, Any]]
"""Adds a convolution's two inputs and its output (described) to a graph."""


def _conv(backend: Any, kind: str, op: Conv2dForward | Conv2dBackwardData | Conv2dBackwardFilter,
          describe: Describe, inputs: tuple[GpuRef, GpuRef], out: GpuRef,
          out_shape: tuple[int, ...]) -> str:
    """Run a convolution graph on the inputs' addresses into ``out`` (through a scratch
    array blended on CuPy unless ``alpha = 1, beta = 0``); answer the path."""
    geo, dtype = op.geometry, out.dtype
    _check_dtype(dtype)
    addresses = [backend.pointer(ref.buffer_id) for ref in inputs]
    blend = not (op.alpha == 1 and op.beta == 0)
    if blend:
        count = math.prod(out_shape)
        target = backend.array(out.buffer_id)[:count]
        scratch = cp.empty(count, dtype=target.dtype)
        addresses.append(scratch.data.ptr)
    else:
        addresses.append(backend.pointer(out.buffer_id))

    def build(handle: Any) -> Built:
        graph = _graph(handle, dtype)
        tensors = describe(graph)
        _plan(graph, tensors, addresses if op.autotune else None, handle)
        return Built(graph, tensors)

    key = (kind, geo.x_shape, geo.w_shape, geo.y_shape, geo.pad, geo.stride, geo.dilation,
           geo.groups, op.layout, dtype, op.autotune)
    run(backend, key, build, addresses)
    if not blend:
        return "cudnn-graph"
    blended = op.alpha * scratch.astype(cp.float32)
    if op.beta != 0:
        blended += op.beta * target.astype(cp.float32)
    target[...] = blended.astype(target.dtype)
    return "cudnn-graph+cupy"


def _options(geo: ConvGeometry) -> dict[str, Any]:
    return {"padding": list(geo.pad), "stride": list(geo.stride),
            "dilation": list(geo.dilation)}


_NODES: dict[type[Op], tuple[str, str, str]] = {
    Conv2dForward: ("fprop", "image", "weight"),
    Conv2dBackwardData: ("dgrad", "loss", "filter"),
    Conv2dBackwardFilter: ("wgrad", "image", "loss"),
}
"""Each convolution op's cuDNN graph node (``conv_<kind>``) and the node's names of the
op's two inputs, in field order."""


@cuda.handles(Conv2dForward, Conv2dBackwardData, Conv2dBackwardFilter)
def conv2d(backend: Any, op: Conv2dForward | Conv2dBackwardData | Conv2dBackwardFilter) -> str:
    """``out = alpha * f(a, b) + beta * out`` with cuDNN's ``conv_fprop`` (``y`` from x and
    w), ``conv_dgrad`` (``dx`` from dy and w) or ``conv_wgrad`` (``dw`` from x and dy)."""
    geo, layout = op.geometry, op.layout
    a, b, out = op.images(geo)
    dtype, (kind, a_arg, b_arg) = a.ref.dtype, _NODES[type(op)]

    def describe(g: Any) -> tuple[Any, Any, Any]:
        first = _tensor(g, a.name, a.shape, layout, dtype)
        second = _tensor(g, b.name, b.shape, layout, dtype)
        node = getattr(g, f"conv_{kind}")
        result = node(**{a_arg: first, b_arg: second}, name=kind, **_options(geo))
        _output(result, out.shape, layout, dtype)
        return first, second, result

    return _conv(backend, kind, op, describe, (a.ref, b.ref), out.ref, out.shape)


def _on_cupy(handler: Handler) -> Handler:
    """``handler`` (a shared array handler), refused like every ``Cudnn`` call when the
    cuDNN frontend is missing (``LibraryUnavailable``), so the handle answers one way."""

    def composed(backend: Any, op: Op) -> Any:
        require("cudnn")
        return handler(backend, op)

    composed.__name__ = composed.__qualname__ = handler.__name__
    composed.__doc__ = handler.__doc__
    return composed


cuda.register_all({kind: _on_cupy(handler) for kind, handler in shared.SHARED.items()})
