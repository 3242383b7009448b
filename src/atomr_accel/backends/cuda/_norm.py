"""cuDNN-shaped normalizations on CUDA: cuDNN frontend graphs, else composed CuPy.

Each handler first tries the cuDNN frontend graph of its normalization
(``batchnorm``, ``batchnorm_inference``, ``layernorm``, ``instancenorm``,
``rmsnorm`` and their ``*_backward``) through ``_cudnn_graphs.run``, on f16,
bf16 and f32 data with f32 parameters and statistics; it answers
``"cudnn-graph"``. Where no graph fits (group norm, f64 data, a backward
asked to recompute its statistics) or the engine refuses the shape (cuDNN's
batch and instance norm engines want channels-last data; ours are NCHW), the
shared handlers of ``backends/cpu/_norm.py`` run on CuPy (f32 arithmetic, f64
for f64 data) and answer ``"cupy"``. A refused graph is remembered per key, so
the refusal costs one attempt.

Graph tensors are 4-D: batch and instance norm see ``x`` as ``(N, C, S, 1)``,
layer and RMS norm as ``(M, K, 1, 1)``; epsilon and the running average
factor are f32 pass-by-value scalars, read from the host at each execution.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import cupy as cp
import numpy as np

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cuda
from atomr_accel.backends.cpu import _norm as shared
from atomr_accel.backends.cuda import _cudnn_graphs as graphs
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import LibraryUnavailable
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._norm import (
    BatchNorm,
    GroupNorm,
    InstanceNorm,
    LayerNorm,
    NormBwd,
    NormMode,
    NormPhase,
    RmsNorm,
)

__all__ = ["REFUSED", "batch_norm", "instance_norm", "layer_norm", "norm_bwd",
           "rms_norm"]

GRAPH_DTYPES = (DType.F16, DType.BF16, DType.F32)
"""Data dtypes the graphs run (parameters and statistics in f32)."""

REFUSED: set[Hashable] = set()
"""Keys of graphs the frontend refused in this process: those shapes run composed."""

_LOG = logging.getLogger(__name__)

Spec = tuple[str, tuple[int, ...], DType]
"""A graph tensor: its name, 4-D dims (row-major) and dtype."""

Node = Callable[[Any, Any, dict[str, Any]], Sequence[tuple[Any, DType]]]
"""``node(cudnn, graph, inputs)``: add the operation; answer its bound outputs and dtypes."""


def _strides(dims: tuple[int, ...]) -> list[int]:
    out, step = [], 1
    for n in reversed(dims):
        out.append(step)
        step *= n
    return out[::-1]


def _builder(io: DType, inputs: Sequence[Spec], scalars: Sequence[str],
             node: Node) -> Callable[[Any], graphs.Built]:
    """Build a graph of ``inputs``, the f32 host ``scalars`` (pass-by-value) and ``node``'s
    operation; its tensors are the inputs, the scalars, then the outputs ``node`` answers."""

    def build(handle: Any) -> graphs.Built:
        cudnn = graphs.frontend()
        f32 = cudnn.data_type.FLOAT
        g = cudnn.pygraph(io_data_type=graphs.data_type(io), intermediate_data_type=f32,
                          compute_data_type=f32, handle=handle)
        ins = {name: g.tensor(name=name, dim=list(dims), stride=_strides(dims),
                              data_type=graphs.data_type(dtype)) for name, dims, dtype in inputs}
        ins.update({name: g.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1],
                                   is_pass_by_value=True, data_type=f32) for name in scalars})
        outs = node(cudnn, g, ins)
        for tensor, dtype in outs:
            tensor.set_output(True).set_data_type(graphs.data_type(dtype))
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        return graphs.Built(g, (*ins.values(), *(t for t, _ in outs)))

    return build


def _attempt(backend: ArrayBackend, key: Hashable, io: DType, inputs: Sequence[Spec],
             node: Node, arrays: Sequence[Any], scalars: dict[str, float] | None = None) -> bool:
    """Run the graph under ``key`` on ``arrays`` (device arrays: the inputs, then the
    outputs) and the host ``scalars``; False when it is refused (now or before), so the
    caller composes instead."""
    if io not in GRAPH_DTYPES or key in REFUSED:
        return False
    scalars = scalars or {}
    host = [np.full((1, 1, 1, 1), value, np.float32) for value in scalars.values()]
    pointers = [a.data.ptr for a in arrays]
    pointers[len(inputs):len(inputs)] = [h.ctypes.data for h in host]  # read at execute
    try:
        graphs.run(backend, key, _builder(io, inputs, tuple(scalars), node), pointers)
    except LibraryUnavailable:
        raise
    except Exception as exc:  # the frontend refused the graph (not supported, or no engine)
        REFUSED.add(key)
        _LOG.warning("cuDNN refused the %s graph; it runs composed: %s: %s", key,
                     type(exc).__name__, str(exc)[:300])
        return False
    return True


def _whole(backend: ArrayBackend, ref: GpuRef, count: int) -> Any:
    return backend.array(ref.buffer_id)[:count]


def _or_temp(backend: ArrayBackend, ref: GpuRef | None, count: int) -> Any:
    """The buffer of ``ref``, or a scratch f32 array of ``count`` when it is None."""
    return cp.empty(count, cp.float32) if ref is None else _whole(backend, ref, count)


_F32 = DType.F32


@cuda.handles(BatchNorm)
def batch_norm(backend: ArrayBackend, op: BatchNorm) -> str:
    """Batch norm forward: cuDNN's ``batchnorm`` (training) or ``batchnorm_inference``."""
    graphs.frontend()
    layout = op.layout
    n, c, s = layout.view
    xd, pd = (n, c, s, 1), (1, c, 1, 1)
    count = layout.size
    x, y = _whole(backend, op.x, count), _whole(backend, op.y, count)
    scale, bias = _whole(backend, op.scale, c), _whole(backend, op.bias, c)
    io, eps = op.x.dtype, op.epsilon
    if op.phase is NormPhase.INFERENCE:
        assert op.running_mean is not None and op.running_var is not None
        mean = _whole(backend, op.running_mean, c)
        inv = 1.0 / cp.sqrt(_whole(backend, op.running_var, c) + eps)

        def infer(cudnn: Any, g: Any, t: dict[str, Any]) -> list[tuple[Any, DType]]:
            out = g.batchnorm_inference(input=t["x"], mean=t["mean"], inv_variance=t["inv"],
                                        scale=t["scale"], bias=t["bias"])
            return [(out, io)]

        specs = [("x", xd, io), ("mean", pd, _F32), ("inv", pd, _F32), ("scale", pd, _F32),
                 ("bias", pd, _F32)]
        if _attempt(backend, ("bn-infer", io, xd), io, specs, infer,
                    [x, mean, inv, scale, bias, y]):
            return "cudnn-graph"
        return shared.batch_norm(backend, op)
    if (op.running_mean is None) != (op.running_var is None):
        return shared.batch_norm(backend, op)  # the graph updates both running statistics
    running = op.running_mean is not None
    factor = op.exp_avg_factor

    def train(cudnn: Any, g: Any, t: dict[str, Any]) -> list[tuple[Any, DType]]:
        outs = g.batchnorm(input=t["x"], scale=t["scale"], bias=t["bias"],
                           in_running_mean=t.get("rm"), in_running_var=t.get("rv"),
                           epsilon=t["epsilon"], momentum=t["momentum"])
        bound = [(outs[0], io), (outs[1], _F32), (outs[2], _F32)]
        return bound + ([(outs[3], _F32), (outs[4], _F32)] if running else [])

    specs = [("x", xd, io), ("scale", pd, _F32), ("bias", pd, _F32)]
    arrays = [x, scale, bias]
    outputs = [y, _or_temp(backend, op.saved_mean, c), _or_temp(backend, op.saved_var, c)]
    if op.running_mean is not None and op.running_var is not None:
        rm, rv = _whole(backend, op.running_mean, c), _whole(backend, op.running_var, c)
        specs += [("rm", pd, _F32), ("rv", pd, _F32)]
        arrays += [rm, rv]
        outputs += [rm, rv]  # cuDNN updates the running statistics in place
    if _attempt(backend, ("bn-train", io, xd, running), io, specs, train, arrays + outputs,
                {"epsilon": eps, "momentum": factor}):
        return "cudnn-graph"
    return shared.batch_norm(backend, op)


def _stats_graph(backend: ArrayBackend, kind: str, op: LayerNorm | InstanceNorm,
                 xd: tuple[int, ...], pd: tuple[int, ...]) -> bool:
    """Run cuDNN's ``layernorm`` or ``instancenorm`` (training phase: statistics out)."""
    layout = op.layout
    io, eps, count = op.x.dtype, op.epsilon, layout.size

    def node(cudnn: Any, g: Any, t: dict[str, Any]) -> list[tuple[Any, DType]]:
        make = g.layernorm if kind == "layernorm" else g.instancenorm
        y, mean, inv = make(norm_forward_phase=cudnn.norm_forward_phase.TRAINING,
                            input=t["x"], scale=t["scale"], bias=t["bias"],
                            epsilon=t["epsilon"])
        return [(y, io), (mean, _F32), (inv, _F32)]

    specs = [("x", xd, io), ("scale", pd, _F32), ("bias", pd, _F32)]
    arrays = [_whole(backend, op.x, count), _whole(backend, op.scale, layout.param_count),
              _whole(backend, op.bias, layout.param_count), _whole(backend, op.y, count),
              _or_temp(backend, op.saved_mean, layout.stat_count),
              _or_temp(backend, op.saved_var, layout.stat_count)]
    return _attempt(backend, (kind, io, xd), io, specs, node, arrays, {"epsilon": eps})


@cuda.handles(LayerNorm)
def layer_norm(backend: ArrayBackend, op: LayerNorm) -> str:
    """Layer norm forward: cuDNN's ``layernorm``, else composed."""
    graphs.frontend()
    m, k = op.layout.view
    if _stats_graph(backend, "layernorm", op, (m, k, 1, 1), (1, k, 1, 1)):
        return "cudnn-graph"
    return shared.affine_norm(backend, op)


@cuda.handles(InstanceNorm)
def instance_norm(backend: ArrayBackend, op: InstanceNorm) -> str:
    """Instance norm forward: cuDNN's ``instancenorm``, else composed."""
    graphs.frontend()
    n, c, s = op.layout.view
    if _stats_graph(backend, "instancenorm", op, (n, c, s, 1), (1, c, 1, 1)):
        return "cudnn-graph"
    return shared.affine_norm(backend, op)


@cuda.handles(GroupNorm)
def group_norm(backend: ArrayBackend, op: GroupNorm) -> str:
    """Group norm forward: composed (the frontend has no group norm graph)."""
    graphs.frontend()
    return shared.affine_norm(backend, op)


@cuda.handles(RmsNorm)
def rms_norm(backend: ArrayBackend, op: RmsNorm) -> str:
    """RMS norm forward: cuDNN's ``rmsnorm``, else composed."""
    graphs.frontend()
    layout = op.layout
    m, k = layout.view
    io, eps, has_bias = op.x.dtype, op.epsilon, op.bias is not None

    def node(cudnn: Any, g: Any, t: dict[str, Any]) -> list[tuple[Any, DType]]:
        y, inv = g.rmsnorm(norm_forward_phase=cudnn.norm_forward_phase.TRAINING,
                           input=t["x"], scale=t["scale"], bias=t.get("bias"),
                           epsilon=t["epsilon"])
        return [(y, io), (inv, _F32)]

    specs = [("x", (m, k, 1, 1), io), ("scale", (1, k, 1, 1), _F32)]
    arrays = [_whole(backend, op.x, m * k), _whole(backend, op.scale, k)]
    if op.bias is not None:
        specs.append(("bias", (1, k, 1, 1), _F32))
        arrays.append(_whole(backend, op.bias, k))
    arrays += [_whole(backend, op.y, m * k), _or_temp(backend, op.saved_var, m)]
    if _attempt(backend, ("rmsnorm", io, m, k, has_bias), io, specs, node, arrays,
                {"epsilon": eps}):
        return "cudnn-graph"
    return shared.rms_norm(backend, op)


_BACKWARD = {NormMode.BATCH: "batchnorm_backward", NormMode.LAYER: "layernorm_backward",
             NormMode.INSTANCE: "instancenorm_backward", NormMode.RMS: "rmsnorm_backward"}


@cuda.handles(NormBwd)
def norm_bwd(backend: ArrayBackend, op: NormBwd) -> str:
    """Normalization backward: cuDNN's ``*_backward`` graph on the saved statistics, else
    composed (group norm, or statistics to recompute)."""
    graphs.frontend()
    kind = _BACKWARD.get(op.mode)
    if kind is None or op.var is None:
        return shared.norm_bwd(backend, op)
    layout = op.layout
    rms = op.mode is NormMode.RMS
    if op.mode in (NormMode.LAYER, NormMode.RMS):
        m, k = layout.view
        xd, pd, sd = (m, k, 1, 1), (1, k, 1, 1), (m, 1, 1, 1)
    else:
        n, c, s = layout.view
        xd, pd = (n, c, s, 1), (1, c, 1, 1)
        sd = (1, c, 1, 1) if op.mode is NormMode.BATCH else (n, c, 1, 1)
    io = op.x.dtype

    def node(cudnn: Any, g: Any, t: dict[str, Any]) -> list[tuple[Any, DType]]:
        if rms:
            dx, dscale, dbias = g.rmsnorm_backward(grad=t["dy"], input=t["x"],
                                                   scale=t["scale"], inv_variance=t["inv"],
                                                   has_dbias=False)
            return [(dx, io), (dscale, _F32)]
        dx, dscale, dbias = getattr(g, kind)(grad=t["dy"], input=t["x"], scale=t["scale"],
                                             mean=t["mean"], inv_variance=t["inv"])
        return [(dx, io), (dscale, _F32), (dbias, _F32)]

    count, params, stats = layout.size, layout.param_count, layout.stat_count
    specs = [("dy", xd, io), ("x", xd, io), ("scale", pd, _F32)]
    arrays = [_whole(backend, op.dy, count), _whole(backend, op.x, count),
              _whole(backend, op.scale, params)]
    if not rms:
        assert op.mean is not None
        specs.append(("mean", sd, _F32))
        arrays.append(_whole(backend, op.mean, stats))
    specs.append(("inv", sd, _F32))
    arrays.append(_whole(backend, op.var, stats))
    arrays += [_whole(backend, op.dx, count), _or_temp(backend, op.dscale, params)]
    if not rms:
        arrays.append(_or_temp(backend, op.dbias, params))
    if not _attempt(backend, (kind, io, xd), io, specs, node, arrays):
        return shared.norm_bwd(backend, op)
    if rms and op.dbias is not None:
        dbias = _whole(backend, op.dbias, params).reshape(layout.param_shape)
        dy = _whole(backend, op.dy, count).reshape(layout.view).astype(cp.float32)
        dbias[...] = dy.sum(axis=layout.param_reduce, keepdims=True)
    return "cudnn-graph"
