"""Scaled-dot-product attention (FlashAttn) and cuDNN's multi-head attention.

One set of rules serves both libraries (``Attention``): the shapes, the
grouped heads, the mask and the scale. Tensors are row-major; ``layout``
says how a ``(batch, heads, seq, head_dim)`` tensor lies in its buffer:
``"bhsd"``, ``"bshd"``, or ``"thd"`` (ragged: the tokens of every sequence
packed one after another, ``(tokens, heads, head_dim)``, sequence ``b`` from
``cu_seqlens[b]`` to ``cu_seqlens[b + 1]``).

Which keys query ``i`` of a sequence sees (``AttentionMask``): queries are
aligned to the end of the keys (bottom-right, as FlashAttention 2 and cuDNN's
``BOTTOM_RIGHT`` diagonal), so query ``i`` sits at position
``p = i + len_kv - len_q``. Key ``j < len_kv`` is visible unless ``causal`` and
``j > p``, or a sliding ``window`` > 0 and ``p - j >= window``; under a window
the first ``sink_tokens`` keys stay visible (attention sinks), causality still
applies to them. ALiBi adds ``slope[h] * (j - p)`` to the scores, with the
slopes cuDNN uses (``alibi_slopes``) or a caller's f32 buffer. Scores are
``scale * q.k`` (default ``1 / sqrt(head_dim)``). The softmax statistics
(``stats``, f32, ``(batch, heads_q, seq_q)``) are the natural-log
log-sum-exp of each row's scores, as cuDNN writes them; the backward reads
them. A row that sees no key gets zeros (and ``-inf`` statistics).

Heads: ``heads_q`` must be a multiple of ``heads_kv`` (MHA, GQA, MQA); query
head ``h`` reads key/value head ``h // (heads_q // heads_kv)``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._api import Form
from atomr_accel.core._catalogue import declare
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import (
    Op,
    require,
    require_len,
    require_nonneg,
    require_positive,
    require_same_dtype,
    require_shared_dtype,
)
from atomr_accel.core._ref import GpuRef

__all__ = [
    "ARCHS",
    "ATTENTION_DTYPES",
    "Attention",
    "AttentionMask",
    "AttnLayout",
    "AttnMask",
    "MultiHeadAttnBackward",
    "MultiHeadAttnForward",
    "SdpaBackward",
    "SdpaForward",
    "SdpaSupport",
    "alibi_slopes",
]

declare("flashattn", "FlashAttn",
        "Scaled-dot-product attention: forward, backward, paged KV caches, ragged batches.",
        rank=11, handle="FlashAttn")

ATTENTION_DTYPES = (DType.F16, DType.BF16, DType.F32, DType.F64)
"""Data types attention takes: f16/bf16 run cuDNN's SDPA on CUDA, f32/f64 a composed path."""

ARCHS = {"sm_80": 80, "sm_86": 86, "sm_89": 89, "sm_90": 90, "sm_90a": 90, "sm_100": 100,
         "sm_120": 120}
"""The architectures ``FlashAttn.forward_f16`` knows, with their compute capability."""


class AttnLayout(enum.Enum):
    """How a ``(batch, heads, seq, head_dim)`` tensor lies in its buffer."""

    BHSD = "bhsd"
    BSHD = "bshd"
    THD = "thd"
    """Ragged: the tokens of every sequence packed, ``(tokens, heads, head_dim)``."""


class AttnMask(enum.Enum):
    """cuDNN's multi-head attention mask names (the original package's vocabulary)."""

    NONE = "none"
    CAUSAL = "causal"
    SLIDING_WINDOW = "sliding_window"
    CAUSAL_SLIDING_WINDOW = "causal_sliding_window"

    @property
    def causal(self) -> bool:
        """Whether the mask hides later keys."""
        return self in (AttnMask.CAUSAL, AttnMask.CAUSAL_SLIDING_WINDOW)

    @property
    def sliding(self) -> bool:
        """Whether the mask has a sliding window."""
        return self in (AttnMask.SLIDING_WINDOW, AttnMask.CAUSAL_SLIDING_WINDOW)


@dataclass(frozen=True, slots=True)
class AttentionMask:
    """Which keys a query sees (see the module docstring): causal, a left ``window``
    (0: none), ``sink_tokens`` always-visible first keys under a window, ALiBi."""

    causal: bool = False
    window: int = 0
    sink_tokens: int = 0
    alibi: bool = False

    def validate(self) -> None:
        """Raise ``InvalidArgument`` for an option out of range."""
        require_nonneg(window=self.window, sink_tokens=self.sink_tokens)
        require(self.sink_tokens == 0 or self.window > 0,
                "sink_tokens keep keys visible under a sliding window: set window > 0")


def alibi_slopes(heads: int) -> list[float]:
    """The ALiBi slopes of ``heads`` heads as cuDNN makes them (the paper's geometric
    series ``2^(-8 i / n)`` over the largest power of two ``n <= heads``, the remaining
    heads interleaved at the half steps)."""
    n = 1 << (heads.bit_length() - 1)
    exponents = [float(i + 1) for i in range(n)]
    exponents += [(i + 1) * 0.5 for i in range(0, 2 * (heads - n), 2)]
    return [2.0 ** (-8.0 * e / n) for e in exponents]


def _ints(dtype: DType) -> bool:
    return dtype is DType.I32


class Attention(Op):
    """Rules shared by the attention ops: fields ``q``, ``k``, ``v``, ``batch``, ``heads_q``,
    ``heads_kv``, ``seq_q``, ``seq_kv``, ``head_dim``, ``scale`` and ``layout`` (a subclass
    may leave some out and say so), and the mask its ``attention_mask`` answers."""

    __slots__ = ()
    q: GpuRef
    k: GpuRef
    v: GpuRef
    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int
    seq_kv: int
    head_dim: int
    scale: float | None
    layout: AttnLayout
    cu_seqlens_q: GpuRef | None
    cu_seqlens_kv: GpuRef | None

    def attention_mask(self) -> AttentionMask:
        """The mask this op applies."""
        raise NotImplementedError

    @property
    def softmax_scale(self) -> float:
        """The scale of the scores: ``scale``, or ``1 / sqrt(head_dim)``."""
        return 1.0 / math.sqrt(self.head_dim) if self.scale is None else float(self.scale)

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.heads_q // self.heads_kv

    @property
    def ragged(self) -> bool:
        """Whether the tensors are packed ragged sequences (``layout == "thd"``)."""
        return self.layout is AttnLayout.THD

    def elements(self, heads: int, seq: int) -> int:
        """Elements a dense tensor of ``heads`` x ``seq`` rows per sequence spans."""
        return self.batch * heads * seq * self.head_dim

    def check_shapes(self) -> DType:
        """Check sizes, heads, dtypes, the mask and the scale; return the data type."""
        require_positive(batch=self.batch, heads_q=self.heads_q, heads_kv=self.heads_kv,
                         seq_q=self.seq_q, seq_kv=self.seq_kv, head_dim=self.head_dim)
        if self.heads_q % self.heads_kv:
            raise InvalidArgument(
                f"heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv})")
        dtype = require_shared_dtype(ATTENTION_DTYPES, q=self.q, k=self.k, v=self.v)
        if self.scale is not None:
            require(isinstance(self.scale, int | float) and not isinstance(self.scale, bool)
                    and math.isfinite(self.scale) and self.scale > 0,
                    f"scale must be a positive number, got {self.scale!r}")
        self.attention_mask().validate()
        ragged_given = (self.cu_seqlens_q is not None, self.cu_seqlens_kv is not None)
        if self.ragged:
            require(all(ragged_given),
                    "layout 'thd' (ragged) needs cu_seqlens_q and cu_seqlens_kv")
            for name in ("cu_seqlens_q", "cu_seqlens_kv"):
                ref = getattr(self, name)
                require(_ints(ref.dtype), f"{name} must be an i32 buffer, not {ref.dtype.value}")
                require_len(ref, self.batch + 1, name)
        else:
            require(not any(ragged_given),
                    "cu_seqlens_q/cu_seqlens_kv describe ragged tensors: pass layout='thd'")
        return dtype

    def check_dense(self, ref: GpuRef, heads: int, seq: int, name: str) -> None:
        """``ref`` holds a q/k/v-shaped tensor (ragged: at least one token per sequence)."""
        if self.ragged:
            require_len(ref, self.batch * heads * self.head_dim, name)
        else:
            require_len(ref, self.elements(heads, seq), name)

    def check_stats(self, stats: GpuRef | None) -> None:
        """``stats``, when given, is an f32 buffer of ``batch * heads_q * seq_q``."""
        if stats is not None:
            require(stats.dtype is DType.F32, f"stats must be an f32 buffer, not "
                                              f"{stats.dtype.value}")
            require_len(stats, self.batch * self.heads_q * self.seq_q, "stats")

    def check_queries(self, o: GpuRef) -> None:
        """A forward's shapes (``check_shapes``), and ``q`` and its output ``o``: one dtype,
        each a q-shaped tensor."""
        dtype = self.check_shapes()
        require(o.dtype is dtype, f"o has dtype {o.dtype.value} but q has {dtype.value}")
        self.check_dense(self.q, self.heads_q, self.seq_q, "q")
        self.check_dense(o, self.heads_q, self.seq_q, "o")


class _Gradients(Attention):
    """The fields and checks both attention backwards share (a mixin of field-typed
    dataclass ops): the forward's ``o`` and ``stats``, ``do``, and the gradients ``dq``,
    ``dk`` and ``dv``."""

    __slots__ = ()
    o: GpuRef
    do: GpuRef
    dq: GpuRef
    dk: GpuRef
    dv: GpuRef
    stats: GpuRef | None

    def check_gradients(self) -> None:
        """Check the shapes, one dtype for the tensors, their lengths and ``stats``."""
        self.check_shapes()
        require_same_dtype(q=self.q, o=self.o, do=self.do, dq=self.dq, dk=self.dk, dv=self.dv)
        for name in ("q", "o", "do", "dq"):
            self.check_dense(getattr(self, name), self.heads_q, self.seq_q, name)
        for name in ("k", "v", "dk", "dv"):
            self.check_dense(getattr(self, name), self.heads_kv, self.seq_kv, name)
        self.check_stats(self.stats)


class _Sdpa(Attention):
    """The FlashAttn ops' mask (``causal``, ``window``, ``sink_tokens``, ``alibi``) and the
    caller's ALiBi slopes."""

    __slots__ = ()
    library: ClassVar[str] = "flashattn"
    causal: bool
    window: int
    sink_tokens: int
    alibi: bool
    alibi_slopes: GpuRef | None

    def attention_mask(self) -> AttentionMask:
        return AttentionMask(self.causal, self.window, self.sink_tokens, self.alibi)

    def check_slopes(self) -> None:
        """``alibi_slopes``, when given, goes with ``alibi`` and is f32, one per query head."""
        if self.alibi_slopes is not None:
            require(self.alibi, "alibi_slopes given without alibi=True")
            require(self.alibi_slopes.dtype is DType.F32, "alibi_slopes must be an f32 buffer")
            require_len(self.alibi_slopes, self.heads_q, "alibi_slopes")


_SHAPE = ("q", "k", "v", "o", "batch", "heads_q", "heads_kv", "seq_q", "seq_kv", "head_dim")


@dataclass(frozen=True, slots=True)
class SdpaForward(_Sdpa):
    """Scaled-dot-product attention forward: ``o = softmax(scale * q k^T + alibi, masked) v``,
    optionally writing the softmax statistics (``stats``) the backward reads.

    ``q``/``o`` are ``(batch, heads_q, seq_q, head_dim)``, ``k``/``v``
    ``(batch, heads_kv, seq_kv, head_dim)`` in ``layout``. Ragged (``"thd"``):
    ``cu_seqlens_q``/``cu_seqlens_kv`` (i32, ``batch + 1``) give each sequence's
    tokens, ``seq_q``/``seq_kv`` bound their lengths. Paged KV cache: with
    ``block_table`` (i32, ``batch x ceil(seq_kv / block_size)``) ``k``/``v`` are
    caches of blocks of ``block_size`` tokens (``(blocks, heads_kv, block_size,
    head_dim)`` for ``"bhsd"``, ``(blocks, block_size, heads_kv, head_dim)`` for
    ``"bshd"``), sequence ``b`` reads its token ``t`` from block
    ``block_table[b, t // block_size]``, and ``context_lens`` (i32, ``batch``)
    give its length (at most ``seq_kv``). The table and the lengths are device
    data, read back and checked before the op runs (``check_table``, the
    default): an entry outside the cache or a length outside ``[0, seq_kv]``
    is an ``InvalidArgument``, and nothing is written. On CUDA that check waits
    for the op's stream once; ``check_table=False`` skips it (a decode loop
    whose tables are trusted keeps its calls pipelined), and the CUDA backend
    then clamps an entry outside the cache into it. ``alibi_slopes`` (f32,
    ``heads_q``) replaces the default ALiBi slopes. Answers the path that ran:
    ``"cudnn-graph"`` (cuDNN SDPA, f16/bf16), ``"cupy-composed"`` (CuPy matmuls
    and softmax: f32/f64 data, sink tokens, caller slopes, or a configuration
    cuDNN declines) or ``"numpy"``.
    """

    outputs: ClassVar[tuple[str, ...]] = ("o", "stats")
    api = (Form("forward", _SHAPE, returns="str"),)
    q: GpuRef
    k: GpuRef
    v: GpuRef
    o: GpuRef
    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int
    seq_kv: int
    head_dim: int
    stats: GpuRef | None = None
    scale: float | None = None
    causal: bool = False
    window: int = 0
    sink_tokens: int = 0
    alibi: bool = False
    alibi_slopes: GpuRef | None = None
    layout: AttnLayout = AttnLayout.BHSD
    cu_seqlens_q: GpuRef | None = None
    cu_seqlens_kv: GpuRef | None = None
    block_table: GpuRef | None = None
    context_lens: GpuRef | None = None
    block_size: int = 0
    check_table: bool = True

    @property
    def paged(self) -> bool:
        """Whether ``k``/``v`` are block caches read through ``block_table``."""
        return self.block_table is not None

    @property
    def max_blocks(self) -> int:
        """Columns of the block table: blocks of the longest context."""
        return -(-self.seq_kv // self.block_size)

    @property
    def num_blocks(self) -> int:
        """Blocks the ``k``/``v`` caches hold."""
        per_block = self.heads_kv * self.block_size * self.head_dim
        return min(self.k.length, self.v.length) // per_block

    def validate(self) -> None:
        self.check_queries(self.o)
        self.check_stats(self.stats)
        self.check_slopes()
        if self.paged:
            self._check_paged()
        else:
            require(self.context_lens is None and self.block_size == 0,
                    "context_lens and block_size describe a paged cache: pass block_table")
            self.check_dense(self.k, self.heads_kv, self.seq_kv, "k")
            self.check_dense(self.v, self.heads_kv, self.seq_kv, "v")

    def _check_paged(self) -> None:
        require(not self.ragged, "a paged KV cache takes dense queries (layout 'bhsd' or 'bshd')")
        require_positive(block_size=self.block_size)
        table, lens = self.block_table, self.context_lens
        assert table is not None
        require(lens is not None, "a paged KV cache needs context_lens")
        assert lens is not None
        require(_ints(table.dtype), f"block_table must be an i32 buffer, not {table.dtype.value}")
        require(_ints(lens.dtype), f"context_lens must be an i32 buffer, not {lens.dtype.value}")
        require_len(table, self.batch * self.max_blocks, "block_table")
        require_len(lens, self.batch, "context_lens")
        require(self.num_blocks >= 1, f"k and v must hold at least one block of "
                                      f"{self.heads_kv * self.block_size * self.head_dim} "
                                      f"elements")


@dataclass(frozen=True, slots=True)
class SdpaBackward(_Sdpa, _Gradients):
    """Scaled-dot-product attention backward: ``dq``, ``dk``, ``dv`` from ``do``, the forward's
    ``o`` and softmax statistics ``stats``, under the forward's mask and scale.

    Shapes, layouts and ragged sequences as ``SdpaForward`` (no paged cache);
    ``dq`` is shaped as ``q``, ``dk``/``dv`` as ``k``/``v`` (summed over the
    query heads of a group). Answers ``"cudnn-graph"``, ``"cupy-composed"`` or
    ``"numpy"`` as the forward does.
    """

    outputs: ClassVar[tuple[str, ...]] = ("dq", "dk", "dv")
    api = (Form("backward", ("q", "k", "v", "o", "do", "stats", "dq", "dk", "dv", "batch",
                             "heads_q", "heads_kv", "seq_q", "seq_kv", "head_dim"),
                returns="str"),)
    q: GpuRef
    k: GpuRef
    v: GpuRef
    o: GpuRef
    do: GpuRef
    stats: GpuRef
    dq: GpuRef
    dk: GpuRef
    dv: GpuRef
    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int
    seq_kv: int
    head_dim: int
    scale: float | None = None
    causal: bool = False
    window: int = 0
    sink_tokens: int = 0
    alibi: bool = False
    alibi_slopes: GpuRef | None = None
    layout: AttnLayout = AttnLayout.BHSD
    cu_seqlens_q: GpuRef | None = None
    cu_seqlens_kv: GpuRef | None = None

    def validate(self) -> None:
        self.check_gradients()
        self.check_slopes()


@dataclass(frozen=True, slots=True)
class SdpaSupport(Op):
    """Say whether an attention configuration runs on this device (the original package's
    ``FlashAttn.forward_f16`` check, made a real capability query).

    Answers the path an f16 forward of that configuration takes here:
    ``"cudnn-graph"`` when cuDNN builds and supports its SDPA graph on this
    device (checked once per configuration, cached), ``"cupy-composed"`` when
    only the composed path runs it (cuDNN declines it, or it has sink tokens),
    ``"unsupported"`` when the device is older than ``arch`` or than cuDNN's SDPA
    needs (sm_80), and ``"numpy"`` on the CPU backend. An invalid configuration
    (unknown ``arch``, ``mask``, a head dim that is not a positive multiple of 8,
    ``sink_tokens`` without a window, ...) is an ``InvalidArgument``. ``window``
    None means no window; ``gqa_ratio`` is query heads per key/value head.
    """

    library: ClassVar[str] = "flashattn"
    arch: str = "sm_80"
    head_dim: int = 64
    gqa_ratio: int = 1
    mask: AttnMask = AttnMask.CAUSAL
    window: int | None = None
    alibi: bool = False
    sink_tokens: int = 0
    softmax_scale: float | None = None

    def attention_mask(self) -> AttentionMask:
        """The mask of the configuration."""
        return AttentionMask(self.mask.causal, self.window or 0, self.sink_tokens, self.alibi)

    def validate(self) -> None:
        require(self.arch in ARCHS, f"arch must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        require_positive(head_dim=self.head_dim, gqa_ratio=self.gqa_ratio)
        require(self.head_dim % 8 == 0 and self.head_dim <= 256,
                f"head_dim must be a multiple of 8 up to 256, got {self.head_dim}")
        if self.window is not None:
            require_positive(window=self.window)
        require(self.mask.sliding == (self.window is not None),
                f"mask {self.mask.value!r} {'needs' if self.mask.sliding else 'takes no'} "
                f"window")
        if self.softmax_scale is not None:
            require(isinstance(self.softmax_scale, int | float) and self.softmax_scale > 0,
                    f"softmax_scale must be a positive number, got {self.softmax_scale!r}")
        self.attention_mask().validate()


class _MultiHeadAttn(Attention):
    """The original package's multi-head attention: dense ``"bhsd"`` tensors and a mask
    of cuDNN's vocabulary (``mask``, ``window``)."""

    __slots__ = ()
    library: ClassVar[str] = "cudnn"
    mask: AttnMask
    window: int

    layout: ClassVar[AttnLayout] = AttnLayout.BHSD  # type: ignore[misc]
    cu_seqlens_q: ClassVar[None] = None  # type: ignore[misc]
    cu_seqlens_kv: ClassVar[None] = None  # type: ignore[misc]

    def attention_mask(self) -> AttentionMask:
        return _mha_mask(self.mask, self.window)


@dataclass(frozen=True, slots=True)
class MultiHeadAttnForward(_MultiHeadAttn):
    """cuDNN multi-head attention forward (the original package's
    ``multihead_attn_fwd_f32``): ``o = dropout(softmax(scale * q k^T + bias, mask)) v``.

    Tensors ``(batch, heads, seq, head_dim)`` row-major (``"bhsd"``); ``bias``
    an additive f32 ``(batch, heads_q, seq_q, seq_kv)`` buffer; ``mask`` one of
    none, causal, sliding_window, causal_sliding_window with the left ``window``
    for the sliding ones; ``dropout`` the probability of zeroing a weight, its
    mask drawn from ``dropout_seed`` (Philox; the same seed, the same mask on
    either backend). ``stats`` receives the softmax statistics. On CUDA the f32
    data run a composed path (CuPy matmuls and softmax, ``"cupy-composed"``),
    as cuDNN's SDPA takes f16/bf16 only.
    """

    outputs: ClassVar[tuple[str, ...]] = ("o", "stats")
    q: GpuRef
    k: GpuRef
    v: GpuRef
    o: GpuRef
    batch: int
    seq_q: int
    seq_kv: int
    heads_q: int
    heads_kv: int
    head_dim: int
    stats: GpuRef | None = None
    bias: GpuRef | None = None
    mask: AttnMask = AttnMask.NONE
    window: int = 0
    scale: float | None = None
    dropout: float = 0.0
    dropout_seed: int = 0

    def validate(self) -> None:
        self.check_queries(self.o)
        self.check_dense(self.k, self.heads_kv, self.seq_kv, "k")
        self.check_dense(self.v, self.heads_kv, self.seq_kv, "v")
        self.check_stats(self.stats)
        _check_dropout(self.dropout, self.dropout_seed)
        if self.bias is not None:
            require(self.bias.dtype is DType.F32, "bias must be an f32 buffer")
            require_len(self.bias, self.batch * self.heads_q * self.seq_q * self.seq_kv, "bias")


@dataclass(frozen=True, slots=True)
class MultiHeadAttnBackward(_MultiHeadAttn, _Gradients):
    """cuDNN multi-head attention backward (the original package's ``multihead_attn_bwd_f32``,
    built with ``MultiHeadAttnBwdInputs``): ``dq``, ``dk``, ``dv`` of the forward with the
    same mask, scale and dropout (same seed, same mask). ``stats`` (the forward's
    statistics) is optional: without it they are computed again. No bias."""

    outputs: ClassVar[tuple[str, ...]] = ("dq", "dk", "dv")
    q: GpuRef
    k: GpuRef
    v: GpuRef
    o: GpuRef
    do: GpuRef
    dq: GpuRef
    dk: GpuRef
    dv: GpuRef
    batch: int
    seq_q: int
    seq_kv: int
    heads_q: int
    heads_kv: int
    head_dim: int
    stats: GpuRef | None = None
    mask: AttnMask = AttnMask.NONE
    window: int = 0
    scale: float | None = None
    dropout: float = 0.0
    dropout_seed: int = 0

    def validate(self) -> None:
        self.check_gradients()
        _check_dropout(self.dropout, self.dropout_seed)


def _mha_mask(mask: AttnMask, window: int) -> AttentionMask:
    """The mask of cuDNN's vocabulary: ``window`` counts for the sliding masks only, and
    they need one."""
    if mask.sliding:
        require_positive(window=window)
    return AttentionMask(causal=mask.causal, window=window if mask.sliding else 0)


def _check_dropout(dropout: float, seed: int) -> None:
    require(isinstance(dropout, int | float) and not isinstance(dropout, bool)
            and 0.0 <= dropout < 1.0, f"dropout must be in [0, 1), got {dropout!r}")
    require_nonneg(dropout_seed=seed)
