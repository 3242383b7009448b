"""Scaled-dot-product attention (FlashAttn) and cuDNN's multi-head attention on the cuda backend.

f16/bf16 attention runs cuDNN's fused SDPA graphs (``sdpa``/``sdpa_backward``
of the cuDNN frontend, flash-attention kernels on Hopper), built once per
configuration (``Config``) and cached per context by ``_cudnn_graphs``: dense
``"bhsd"``/``"bshd"`` tensors, ragged ``"thd"`` ones (ragged offsets and a
padding mask with each sequence's length), a paged KV cache (page tables, a
padding mask with the context lengths), causal and sliding-window masks (the
diagonal band, bottom-right aligned where query and key lengths differ), and
ALiBi with cuDNN's slopes (causal, equal lengths). These answer
``"cudnn-graph"``.

Everything else runs the shared handlers of ``backends.cpu._attention`` on
CuPy (``"cupy-composed"``: matmuls and a softmax over the whole score matrix,
in float32, float64 for f64 data): f32/f64 data (cuDNN's SDPA takes f16/bf16
only), sink tokens, caller-given ALiBi slopes, cuDNN's multi-head attention
with a bias or dropout, a backward without statistics, and any configuration
cuDNN declines to build (remembered, so it is tried once).

A paged cache's block table is device data: entries outside the cache are
clamped into it (and context lengths into ``[0, seq_kv]``) on the device, so
no kernel reads outside the cache; nothing reports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cupy as cp
import numpy as np

from atomr_accel.backends._handlers import cuda
from atomr_accel.backends._state import per_backend
from atomr_accel.backends.cpu import _attention as shared
from atomr_accel.backends.cuda import _cudnn_graphs as graphs
from atomr_accel.backends.cuda._prepared import prepared_of, prepares
from atomr_accel.core._dtype import DType
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._attention import (
    ARCHS,
    Attention,
    AttnLayout,
    MultiHeadAttnBackward,
    MultiHeadAttnForward,
    SdpaBackward,
    SdpaForward,
    SdpaSupport,
)

__all__ = ["Config", "config_of", "sdpa_backward", "sdpa_forward", "support"]

_HALF = (DType.F16, DType.BF16)
_COMPOSED = "cupy-composed"
_GRAPH = "cudnn-graph"


@dataclass(frozen=True, slots=True)
class Config:
    """What one cuDNN SDPA graph depends on (its cache key)."""

    backward: bool
    dtype: DType
    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int
    seq_kv: int
    head_dim: int
    layout: AttnLayout
    causal: bool
    window: int
    alibi: bool
    scale: float
    stats: bool
    paged: tuple[int, int, int] | None = None
    """``(blocks in the cache, block_size, table columns)`` of a paged KV cache."""

    @property
    def ragged(self) -> bool:
        """Packed ragged tensors."""
        return self.layout is AttnLayout.THD

    @property
    def padded(self) -> bool:
        """Whether the graph takes each sequence's length (ragged or paged)."""
        return self.ragged or self.paged is not None

    def strides(self, heads: int, seq: int) -> list[int]:
        """Strides of a ``(batch, heads, seq, head_dim)`` tensor in the layout."""
        d = self.head_dim
        if self.layout is AttnLayout.BHSD:
            return [heads * seq * d, seq * d, d, 1]
        return [seq * heads * d, d, heads * d, 1]  # bshd, and thd's rows within a sequence


def config_of(op: Attention, backward: bool) -> Config | None:
    """The cuDNN graph configuration of ``op``, or None when only the composed path runs it."""
    mask = op.attention_mask()
    if op.q.dtype not in _HALF or mask.sink_tokens or op.head_dim % 8 or op.head_dim > 256:
        return None
    if getattr(op, "alibi_slopes", None) is not None:
        return None
    if isinstance(op, MultiHeadAttnForward) and (op.bias is not None or op.dropout):
        return None
    if isinstance(op, MultiHeadAttnBackward) and (op.dropout or op.stats is None):
        return None
    paged = None
    if isinstance(op, SdpaForward) and op.paged:
        paged = (op.num_blocks, op.block_size, op.max_blocks)
    if mask.alibi and not (mask.causal and op.seq_q == op.seq_kv and paged is None
                           and not op.ragged):
        return None
    stats = getattr(op, "stats", None) is not None
    return Config(backward, op.q.dtype, op.batch, op.heads_q, op.heads_kv, op.seq_q, op.seq_kv,
                  op.head_dim, op.layout, mask.causal, mask.window, mask.alibi,
                  op.softmax_scale, stats, paged)


def _mask_options(cfg: Config) -> dict[str, Any]:
    """The frontend's ``sdpa`` options of the configuration's mask."""
    cudnn = graphs.frontend()
    options: dict[str, Any] = {}
    bottom = cfg.padded or cfg.seq_q != cfg.seq_kv
    if bottom and (cfg.causal or cfg.window):
        options["diagonal_alignment"] = cudnn.diagonal_alignment.BOTTOM_RIGHT
    if cfg.causal:
        options["diagonal_band_right_bound"] = 0
    if cfg.window:
        options["diagonal_band_left_bound"] = cfg.window
    if cfg.alibi:
        options["use_alibi_mask"] = True
    return options


def _ints(g: Any, name: str, dim: list[int]) -> Any:
    cudnn = graphs.frontend()
    stride = [1] * len(dim)
    for i in range(len(dim) - 2, -1, -1):
        stride[i] = stride[i + 1] * dim[i + 1]
    return g.tensor(name=name, dim=dim, stride=stride, data_type=cudnn.data_type.INT32)


def _build(cfg: Config, handle: Any) -> graphs.Built:
    """Describe, check and plan the configuration's SDPA graph (forward or backward).

    Tensor order: q, k, v, o, [stats], then (backward) do, dq, dk, dv, then the
    ragged offsets of q and k, the sequence lengths of q and kv, the page table.
    """
    cudnn = graphs.frontend()
    io = graphs.data_type(cfg.dtype)
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    b, hq, hkv, d = cfg.batch, cfg.heads_q, cfg.heads_kv, cfg.head_dim
    q_dim, q_stride = [b, hq, cfg.seq_q, d], cfg.strides(hq, cfg.seq_q)
    kv_dim, kv_stride = [b, hkv, cfg.seq_kv, d], cfg.strides(hkv, cfg.seq_kv)
    if cfg.paged is not None:
        blocks, size, _ = cfg.paged
        kv_dim, kv_stride = [blocks, hkv, size, d], cfg.strides(hkv, size)

    def data(name: str, dim: list[int], stride: list[int]) -> Any:
        return g.tensor(name=name, dim=dim, stride=stride, data_type=io)

    q, k, v = data("q", q_dim, q_stride), data("k", kv_dim, kv_stride), data("v", kv_dim,
                                                                              kv_stride)
    options = _mask_options(cfg) | {"attn_scale": cfg.scale}
    extra: list[Any] = []
    q_off = k_off = None
    if cfg.ragged:
        q_off, k_off = _ints(g, "q_offsets", [b + 1, 1, 1, 1]), _ints(g, "k_offsets",
                                                                      [b + 1, 1, 1, 1])
        q.set_ragged_offset(q_off)
        k.set_ragged_offset(k_off)
        v.set_ragged_offset(k_off)
        extra += [q_off, k_off]
    if cfg.padded:
        lens_q, lens_kv = _ints(g, "seq_len_q", [b, 1, 1, 1]), _ints(g, "seq_len_kv",
                                                                     [b, 1, 1, 1])
        options |= {"use_padding_mask": True, "seq_len_q": lens_q, "seq_len_kv": lens_kv}
        extra += [lens_q, lens_kv]
    if cfg.paged is not None:
        table = _ints(g, "page_table", [b, 1, cfg.paged[2], 1])
        options |= {"paged_attention_k_table": table, "paged_attention_v_table": table,
                    "paged_attention_max_seq_len_kv": cfg.seq_kv}
        extra.append(table)
    stats_dim, stats_stride = [b, hq, cfg.seq_q, 1], [hq * cfg.seq_q, cfg.seq_q, 1, 1]
    if not cfg.backward:
        o, stats = g.sdpa(q=q, k=k, v=v, generate_stats=cfg.stats, **options)
        o.set_output(True).set_dim(q_dim).set_stride(q_stride).set_data_type(io)
        tensors = [q, k, v, o]
        if cfg.stats:
            stats.set_output(True).set_dim(stats_dim).set_stride(stats_stride).set_data_type(
                cudnn.data_type.FLOAT)
            tensors.append(stats)
        if q_off is not None:
            o.set_ragged_offset(q_off)
    else:
        o = data("o", q_dim, q_stride)
        stats = g.tensor(name="stats", dim=stats_dim, stride=stats_stride,
                         data_type=cudnn.data_type.FLOAT)
        do = data("do", q_dim, q_stride)
        if q_off is not None:
            o.set_ragged_offset(q_off)
            do.set_ragged_offset(q_off)
        dq, dk, dv = g.sdpa_backward(q=q, k=k, v=v, o=o, dO=do, stats=stats, **options)
        for grad, dim, stride, off in ((dq, q_dim, q_stride, q_off), (dk, kv_dim, kv_stride, k_off),
                                       (dv, kv_dim, kv_stride, k_off)):
            grad.set_output(True).set_dim(dim).set_stride(stride).set_data_type(io)
            if off is not None:
                grad.set_ragged_offset(off)
        tensors = [q, k, v, o, stats, do, dq, dk, dv]
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return graphs.Built(g, tuple(tensors + extra))


_declined: Callable[[Any], set[Config]] = per_backend(set)
"""The configurations cuDNN declined on a backend (each is tried once)."""


def _builds(backend: Any, cfg: Config) -> bool:
    """Whether cuDNN builds the configuration's graph here (built into the cache, or
    remembered as declined)."""
    if cfg in _declined(backend):
        return False
    try:
        graphs.cache_of(backend).get(cfg, lambda handle: _build(cfg, handle))
    except Exception:  # the frontend's not-supported, validation or planning errors
        _declined(backend).add(cfg)
        return False
    return True


def _ptr(backend: Any, ref: GpuRef | None) -> int:
    assert ref is not None
    return int(backend.array(ref.buffer_id).data.ptr)


def _lengths(backend: Any, op: Attention, cfg: Config) -> list[Any]:
    """The ragged offsets and sequence lengths the graph takes, made on the device."""
    arrays: list[Any] = []
    if cfg.ragged:
        assert op.cu_seqlens_q is not None and op.cu_seqlens_kv is not None
        cu_q = backend.array(op.cu_seqlens_q.buffer_id)[:op.batch + 1]
        cu_kv = backend.array(op.cu_seqlens_kv.buffer_id)[:op.batch + 1]
        arrays += [cu_q * (op.heads_q * op.head_dim), cu_kv * (op.heads_kv * op.head_dim),
                   cu_q[1:] - cu_q[:-1], cu_kv[1:] - cu_kv[:-1]]
    elif cfg.paged is not None:
        assert isinstance(op, SdpaForward)
        assert op.context_lens is not None and op.block_table is not None
        lens = backend.array(op.context_lens.buffer_id)[:op.batch]
        table = backend.array(op.block_table.buffer_id)[:op.batch * op.max_blocks]
        if op.check_table:  # read back on the op's stream: a bad entry is refused, not run
            shared.check_table(cp.asnumpy(table).reshape(op.batch, op.max_blocks)
                               .astype(np.int64), cp.asnumpy(lens).astype(np.int64), op)
        arrays += [cp.full(op.batch, op.seq_q, dtype=cp.int32),
                   cp.clip(lens, 0, op.seq_kv), cp.clip(table, 0, op.num_blocks - 1)]
    return arrays


_Ready = tuple[graphs.Built, Config, bool]
"""An op's built graph, its configuration, and whether it was kept already (``Prepared``)."""


def _ready(backend: Any, op: Attention, backward: bool) -> _Ready | None:
    """The op's built graph and configuration (kept for the op once it ran: ``Prepared``),
    or None when the composed path runs it."""
    kept: tuple[graphs.Built, Config] | None = prepared_of(backend).find(op)
    if kept is not None:
        return (*kept, True)
    graphs.frontend()
    cfg = config_of(op, backward)
    if cfg is None or not _builds(backend, cfg):
        return None
    return graphs.cache_of(backend).get(cfg, lambda handle: _build(cfg, handle)), cfg, False


def _launch(backend: Any, op: Attention, ready: _Ready, buffers: tuple[GpuRef | None, ...]
            ) -> str:
    """Run the graph on ``buffers`` and the lengths it takes; keep what the op needs to run
    again, queue-only unless it reads a paged cache's table back to check it."""
    built, cfg, kept = ready
    arrays: list[Any] = [_ptr(backend, r) for r in buffers]
    held = _lengths(backend, op, cfg)  # alive until the graph is queued
    graphs.launch(backend, built, arrays + [int(a.data.ptr) for a in held])
    if not kept:
        checks = cfg.paged is not None and getattr(op, "check_table", False)
        prepared_of(backend).keep(op, (built, cfg), queues=not checks)
    return _GRAPH


prepares(SdpaForward, MultiHeadAttnForward, SdpaBackward, MultiHeadAttnBackward)


@cuda.handles(SdpaForward, MultiHeadAttnForward)
def sdpa_forward(backend: Any, op: SdpaForward | MultiHeadAttnForward) -> str:
    """Run cuDNN's SDPA graph where it applies, else the composed path; answer which ran."""
    ready = _ready(backend, op, backward=False)
    if ready is None:
        return shared.sdpa_forward(backend, op)
    stats = (op.stats,) if ready[1].stats else ()
    return _launch(backend, op, ready, (op.q, op.k, op.v, op.o, *stats))


@cuda.handles(SdpaBackward, MultiHeadAttnBackward)
def sdpa_backward(backend: Any, op: SdpaBackward | MultiHeadAttnBackward) -> str:
    """Run cuDNN's SDPA backward graph where it applies, else the composed path."""
    ready = _ready(backend, op, backward=True)
    if ready is None:
        return shared.sdpa_backward(backend, op)
    return _launch(backend, op, ready, (op.q, op.k, op.v, op.o, op.stats, op.do, op.dq,
                                        op.dk, op.dv))


_support_of: Callable[[Any], dict[SdpaSupport, str]] = per_backend(dict)
"""The answers of ``support`` on a backend, by query."""


@cuda.handles(SdpaSupport)
def support(backend: Any, op: SdpaSupport) -> str:
    """Answer the path an f16 forward of the configuration takes on this device."""
    graphs.frontend()
    here = int(cp.cuda.Device().compute_capability)  # "90" on an H100
    if here < max(80, ARCHS[op.arch]):
        return "unsupported"
    known = _support_of(backend)
    answer = known.get(op)
    if answer is None:
        mask = op.attention_mask()
        seq = max(256, 2 * (op.window or 0))
        scale = op.softmax_scale if op.softmax_scale is not None else op.head_dim ** -0.5
        cfg = Config(False, DType.F16, 1, op.gqa_ratio, 1, seq, seq, op.head_dim,
                     AttnLayout.BHSD, mask.causal, mask.window, mask.alibi, float(scale), False)
        alibi_ok = not mask.alibi or mask.causal
        cudnn_ok = not mask.sink_tokens and alibi_ok and _builds(backend, cfg)
        answer = known[op] = _GRAPH if cudnn_ok else _COMPOSED
    return answer
