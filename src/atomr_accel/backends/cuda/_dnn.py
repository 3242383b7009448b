"""cuDNN-shaped convolutions, pooling, softmax, activations, LRN and dropout on CUDA.

Convolutions run as cuDNN frontend graphs (``conv_fprop``, ``conv_dgrad``,
``conv_wgrad``) through ``_cudnn_graphs``: one graph per shape, dtype,
layout and option set, built on first use and cached per context; a repeated
op (``_prepared.Prepared``) launches its graph without deriving it again. The
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
from typing import Any, NamedTuple

import cupy as cp

from atomr_accel.backends._base import Handler
from atomr_accel.backends._handlers import cuda
from atomr_accel.backends._optional import require
from atomr_accel.backends.cpu import _dnn as shared
from atomr_accel.backends.cuda._completion import Event
from atomr_accel.backends.cuda._cudnn_graphs import Built, cache_of, data_type, frontend, launch
from atomr_accel.backends.cuda._prepared import prepared_of, prepares
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


_ConvOp = Conv2dForward | Conv2dBackwardData | Conv2dBackwardFilter


class _Operands(NamedTuple):
    """A convolution's two inputs and its output, the output's element count (``size``),
    and whether it blends (``alpha, beta`` other than ``1, 0``: the graph then writes a
    scratch array)."""

    inputs: tuple[GpuRef, GpuRef]
    out: GpuRef
    size: int
    blend: bool

    def addresses(self, backend: Any) -> tuple[list[int], Any]:
        """The graph's operands: the inputs' addresses, then the output's or (blending) a
        new scratch array's, which comes back too (None when not blending)."""
        pointer = backend.pointer
        addresses = [pointer(ref.buffer_id) for ref in self.inputs]
        if not self.blend:
            addresses.append(pointer(self.out.buffer_id))
            return addresses, None
        scratch = cp.empty(self.size, dtype=backend.array(self.out.buffer_id).dtype)
        addresses.append(scratch.data.ptr)
        return addresses, scratch


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


def _prepare(backend: Any, op: _ConvOp) -> tuple[Built, _Operands]:
    """The op's graph (built on a miss, autotuned on the op's own buffers when it asks) and
    its operands."""
    geo, layout = op.geometry, op.layout
    a, b, out = op.images(geo)
    dtype, (kind, a_arg, b_arg) = a.ref.dtype, _NODES[type(op)]
    _check_dtype(out.ref.dtype)
    operands = _Operands((a.ref, b.ref), out.ref, math.prod(out.shape),
                         not (op.alpha == 1 and op.beta == 0))

    def build(handle: Any) -> Built:
        graph = _graph(handle, dtype)
        first = _tensor(graph, a.name, a.shape, layout, dtype)
        second = _tensor(graph, b.name, b.shape, layout, dtype)
        node = getattr(graph, f"conv_{kind}")
        result = node(**{a_arg: first, b_arg: second}, name=kind, **_options(geo))
        _output(result, out.shape, layout, dtype)
        tensors = (first, second, result)
        _plan(graph, tensors, operands.addresses(backend)[0] if op.autotune else None, handle)
        return Built(graph, tensors)

    key = (kind, geo.x_shape, geo.w_shape, geo.y_shape, geo.pad, geo.stride, geo.dilation,
           geo.groups, layout, dtype, op.autotune)
    return cache_of(backend).get(key, build), operands


prepares(Conv2dForward, Conv2dBackwardData, Conv2dBackwardFilter)


@cuda.handles(Conv2dForward, Conv2dBackwardData, Conv2dBackwardFilter)
def conv2d(backend: Any, op: _ConvOp) -> str:
    """``out = alpha * f(a, b) + beta * out`` with cuDNN's ``conv_fprop`` (``y`` from x and
    w), ``conv_dgrad`` (``dx`` from dy and w) or ``conv_wgrad`` (``dw`` from x and dy).
    A repeated op launches its graph straight away (and only queues work: ``Prepared``);
    a blend other than ``alpha = 1, beta = 0`` runs into a scratch array blended on CuPy."""
    prepared = prepared_of(backend)
    ready: tuple[Built, _Operands] | None = prepared.find(op)
    fresh = ready is None
    if ready is None:
        ready = _prepare(backend, op)
    built, operands = ready
    addresses, scratch = operands.addresses(backend)
    launch(backend, built, addresses)
    if fresh:
        prepared.keep(op, ready, queues=True)
    if scratch is None:
        return "cudnn-graph"
    target = backend.array(operands.out.buffer_id)[:operands.size]
    blended = op.alpha * scratch.astype(cp.float32)
    if op.beta != 0:
        blended += op.beta * target.astype(cp.float32)
    target[...] = blended.astype(target.dtype)
    return "cudnn-graph+cupy"


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
