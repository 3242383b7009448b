"""Scaled-dot-product attention (FlashAttn) and cuDNN's multi-head attention on the cpu backend.

The handlers here are array-module generic (``backend.xp``): the CPU backend
runs them on NumPy in float64 (answering ``"numpy"``), and the CUDA backend
runs the same code on CuPy as its composed path (``"cupy-composed"``) for what
cuDNN's SDPA does not take. Every layout is first gathered into dense
``(batch, heads, seq, head_dim)`` arrays with per-sequence lengths; ragged
(``"thd"``) and paged tensors are gathered with index arithmetic of fixed
shape, so nothing waits for the device. ``Problem`` holds those arrays and the
mask; ``forward`` and ``backward`` are the attention itself.

On the CPU the ragged offsets and the block table are host data, so the
handlers refuse offsets that are not increasing or leave the buffer, a length
past ``seq_q``/``seq_kv`` and a block outside the cache (``InvalidArgument``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cpu
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._attention import (
    Attention,
    AttentionMask,
    AttnLayout,
    MultiHeadAttnBackward,
    MultiHeadAttnForward,
    SdpaBackward,
    SdpaForward,
    SdpaSupport,
    alibi_slopes,
)

__all__ = [
    "Problem",
    "backward",
    "dropout_keep",
    "forward",
    "problem_of",
    "sdpa_backward",
    "sdpa_forward",
    "support",
    "write",
]

Array = Any  # a NumPy or CuPy array, whichever ``backend.xp`` makes


@dataclass(frozen=True, slots=True)
class Problem:
    """Dense attention inputs in the compute dtype: ``q`` ``(B, Hq, Sq, D)``, ``k``/``v``
    ``(B, Hkv, Skv, D)``, the lengths of each sequence (``(B,)`` integer arrays), the
    mask, the scale, ALiBi slopes ``(Hq,)`` or None, an additive ``bias`` ``(B, Hq, Sq,
    Skv)`` or None, and the dropout multiplier ``keep / (1 - p)`` or None."""

    xp: Any
    q: Array
    k: Array
    v: Array
    len_q: Array
    len_kv: Array
    mask: AttentionMask
    scale: float
    slopes: Array | None = None
    bias: Array | None = None
    keep: Array | None = None

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return int(self.q.shape[1] // self.k.shape[1])

    def visible(self) -> Array:
        """``(B, 1, Sq, Skv)`` booleans: which key each query row sees."""
        xp = self.xp
        sq, skv = self.q.shape[2], self.k.shape[2]
        i = xp.arange(sq)[None, :, None]
        j = xp.arange(skv)[None, None, :]
        lq, lkv = self.len_q[:, None, None], self.len_kv[:, None, None]
        pos = i + lkv - lq
        seen = (i < lq) & (j < lkv)
        if self.mask.causal:
            seen &= j <= pos
        if self.mask.window > 0:
            near = (pos - j) < self.mask.window
            if self.mask.sink_tokens > 0:
                near |= j < self.mask.sink_tokens
            seen &= near
        return seen[:, None]

    def scores(self) -> tuple[Array, Array]:
        """``(S, visible)``: the scaled, biased scores with hidden keys at ``-inf``."""
        xp = self.xp
        k = self._grouped(self.k)
        s = self.scale * xp.matmul(self.q, xp.swapaxes(k, -1, -2))
        if self.slopes is not None:
            i = xp.arange(s.shape[2])[None, :, None]
            j = xp.arange(s.shape[3])[None, None, :]
            pos = i + (self.len_kv - self.len_q)[:, None, None]
            s = s + self.slopes[None, :, None, None] * (j - pos)[:, None].astype(s.dtype)
        if self.bias is not None:
            s = s + self.bias
        seen = self.visible()
        return xp.where(seen, s, -xp.inf), seen

    def _grouped(self, x: Array) -> Array:
        """Key/value heads repeated for their group of query heads."""
        return x if self.group == 1 else self.xp.repeat(x, self.group, axis=1)

    def _summed(self, x: Array) -> Array:
        """Per-query-head gradients summed over each key/value head's group."""
        if self.group == 1:
            return x
        b, h, s, d = x.shape
        return x.reshape(b, h // self.group, self.group, s, d).sum(axis=2)


def forward(p: Problem) -> tuple[Array, Array]:
    """``(o, lse)``: attention output ``(B, Hq, Sq, D)`` and the natural-log log-sum-exp of
    each row ``(B, Hq, Sq)`` (``-inf`` and a zero output for a row that sees no key)."""
    xp = p.xp
    s, seen = p.scores()
    top = xp.max(s, axis=-1, keepdims=True)
    top = xp.where(xp.isfinite(top), top, 0)
    e = xp.where(seen, xp.exp(s - top), 0)
    total = e.sum(axis=-1, keepdims=True)
    weights = e / xp.where(total > 0, total, 1)
    if p.keep is not None:
        weights = weights * p.keep
    o = xp.matmul(weights, p._grouped(p.v))
    with np.errstate(divide="ignore"):
        lse = (top + xp.log(total))[..., 0]
    return o, lse


def backward(p: Problem, o: Array, do: Array, lse: Array | None) -> tuple[Array, Array, Array]:
    """``(dq, dk, dv)`` of ``forward`` given ``o``, its gradient ``do`` and the statistics
    ``lse`` (computed again when None)."""
    xp = p.xp
    if lse is None:
        lse = forward(p)[1]
    s, seen = p.scores()
    safe = xp.where(xp.isfinite(lse), lse, 0)[..., None]
    weights = xp.where(seen, xp.exp(s - safe), 0)
    k, v = p._grouped(p.k), p._grouped(p.v)
    dp = xp.matmul(do, xp.swapaxes(v, -1, -2))
    dropped = weights
    if p.keep is not None:
        dp = dp * p.keep
        dropped = weights * p.keep
    dv = xp.matmul(xp.swapaxes(dropped, -1, -2), do)
    delta = (do * o).sum(axis=-1, keepdims=True)
    ds = weights * (dp - delta)
    dq = p.scale * xp.matmul(ds, k)
    dk = p.scale * xp.matmul(xp.swapaxes(ds, -1, -2), p.q)
    return dq, p._summed(dk), p._summed(dv)


# ------------------------------------------------------------ buffers as dense arrays


def _rows(op: Attention, ref: GpuRef, heads: int) -> int:
    """Tokens a ragged buffer holds."""
    return ref.length // (heads * op.head_dim)


def _checked_offsets(xp: Any, cu: Array, rows: int, longest: int, name: str) -> None:
    """Refuse ragged offsets that decrease, leave the buffer or exceed ``longest``."""
    host = np.asarray(cu)
    lens = np.diff(host)
    if host[0] < 0 or (lens < 0).any() or host[-1] > rows:
        raise InvalidArgument(f"{name} must increase from >= 0 to at most {rows} tokens, "
                              f"got {host.tolist()}")
    if (lens > longest).any():
        raise InvalidArgument(f"{name} gives a sequence of {int(lens.max())} tokens; "
                              f"the bound is {longest}")


class _Gather:
    """One tensor of an op: how to read it as dense ``(B, H, S, D)`` and write it back."""

    def __init__(self, backend: ArrayBackend, op: Attention, ref: GpuRef, heads: int,
                 seq: int, cu: Array | None, check: bool) -> None:
        self.backend, self.op, self.ref, self.heads, self.seq, self.cu = (
            backend, op, ref, heads, seq, cu)
        xp, d = backend.xp, op.head_dim
        flat = backend.array(ref.buffer_id)
        if cu is None:
            n = op.batch * heads * seq * d
            if op.layout is AttnLayout.BSHD:
                self.view = flat[:n].reshape(op.batch, seq, heads, d).transpose(0, 2, 1, 3)
            else:
                self.view = flat[:n].reshape(op.batch, heads, seq, d)
            self.lens = xp.full(op.batch, seq, dtype=xp.int64)
            return
        rows = _rows(op, ref, heads)
        self.packed = flat[:rows * heads * d].reshape(rows, heads, d)
        cu = cu.astype(xp.int64)
        if check:
            _checked_offsets(xp, cu, rows, seq, "cu_seqlens")
        self.lens = cu[1:] - cu[:-1]
        s = xp.arange(seq)[None, :]
        self.valid = s < self.lens[:, None]
        self.index = xp.clip(cu[:-1, None] + s, 0, max(rows - 1, 0))
        self.view = None

    def read(self, dtype: Any) -> Array:
        """The tensor as dense ``(B, H, S, D)`` in ``dtype`` (rows past a length: zeros)."""
        xp = self.backend.xp
        if self.view is not None:
            return self.view.astype(dtype)
        x = self.packed[self.index].astype(dtype)  # (B, S, H, D)
        x = xp.where(self.valid[:, :, None, None], x, 0)
        return x.transpose(0, 2, 1, 3)

    def write(self, value: Array) -> None:
        """Store dense ``(B, H, S, D)`` ``value`` (ragged: only each sequence's rows)."""
        xp = self.backend.xp
        if self.view is not None:
            self.view[...] = value.astype(self.view.dtype)
            return
        rows = self.packed.shape[0]
        target = xp.where(self.valid, self.index, rows).reshape(-1)
        spare = xp.concatenate([self.packed, self.packed[:1]], axis=0)
        spare[target] = value.transpose(0, 2, 1, 3).reshape(-1, *self.packed.shape[1:]).astype(
            self.packed.dtype)
        self.packed[...] = spare[:rows]


def _paged(backend: ArrayBackend, op: SdpaForward, ref: GpuRef, check: bool,
           dtype: Any) -> tuple[Array, Array]:
    """``(dense (B, Hkv, Skv, D), context lengths)`` of a block cache read through the
    op's block table."""
    xp = backend.xp
    assert op.block_table is not None and op.context_lens is not None
    nb, bs, h, d = op.num_blocks, op.block_size, op.heads_kv, op.head_dim
    flat = backend.array(ref.buffer_id)[:nb * h * bs * d]
    table = backend.array(op.block_table.buffer_id)[:op.batch * op.max_blocks].reshape(
        op.batch, op.max_blocks).astype(xp.int64)
    lens = backend.array(op.context_lens.buffer_id)[:op.batch].astype(xp.int64)
    if check or op.check_table:  # on CUDA: read back on the op's stream
        host = np.asarray if xp is np else xp.asnumpy
        check_table(host(table), host(lens), op)
    s = xp.arange(op.seq_kv)
    blocks = xp.clip(table[:, s // bs], 0, nb - 1)  # (B, Skv)
    if op.layout is AttnLayout.BSHD:
        x = flat.reshape(nb, bs, h, d)[blocks, (s % bs)[None, :]]  # (B, Skv, H, D)
    else:
        x = flat.reshape(nb, h, bs, d)[blocks, :, (s % bs)[None, :]]  # (B, Skv, H, D)
    return x.transpose(0, 2, 1, 3).astype(dtype), lens


def check_table(table: np.ndarray[Any, Any], lens: np.ndarray[Any, Any],
                op: SdpaForward) -> None:
    """Refuse context lengths outside ``[0, seq_kv]`` and used blocks outside the cache."""
    if (lens < 0).any() or (lens > op.seq_kv).any():
        raise InvalidArgument(f"context_lens must lie in [0, {op.seq_kv}], got {lens.tolist()}")
    for b, n in enumerate(lens.tolist()):
        used = table[b, :-(-n // op.block_size)]
        bad = used[(used < 0) | (used >= op.num_blocks)]
        if bad.size:
            raise InvalidArgument(f"block_table[{b}] names block {int(bad[0])} but the cache "
                                  f"holds {op.num_blocks} blocks")


def dropout_keep(xp: Any, p: float, seed: int, shape: tuple[int, ...], dtype: Any) -> Array | None:
    """The dropout multiplier ``keep / (1 - p)`` drawn from Philox(``seed``) on the host,
    so both backends draw the same mask; None when ``p`` is 0."""
    if p == 0:
        return None
    keep = np.random.Generator(np.random.Philox(seed)).random(shape) >= p
    return xp.asarray(keep.astype(dtype) / (1.0 - p))


def _cu(backend: ArrayBackend, op: Attention, ref: GpuRef | None) -> Array | None:
    """The ragged offsets in ``ref``, or None."""
    return None if ref is None else backend.array(ref.buffer_id)[:op.batch + 1]


def problem_of(backend: ArrayBackend, op: Attention, dtype: Any, check: bool) -> Problem:
    """The op's dense problem in ``dtype`` (``check``: refuse bad ragged offsets and block
    tables, read on the host)."""
    xp = backend.xp

    def cu(ref: GpuRef | None) -> Array | None:
        return _cu(backend, op, ref)

    rows_q = _Gather(backend, op, op.q, op.heads_q, op.seq_q, cu(op.cu_seqlens_q), check)
    if isinstance(op, SdpaForward) and op.paged:
        k, len_kv = _paged(backend, op, op.k, check, dtype)
        v = _paged(backend, op, op.v, False, dtype)[0]
    else:
        gk = _Gather(backend, op, op.k, op.heads_kv, op.seq_kv, cu(op.cu_seqlens_kv), check)
        gv = _Gather(backend, op, op.v, op.heads_kv, op.seq_kv, cu(op.cu_seqlens_kv), False)
        k, v, len_kv = gk.read(dtype), gv.read(dtype), gk.lens
    mask = op.attention_mask()
    slopes = None
    if mask.alibi:
        given = getattr(op, "alibi_slopes", None)
        slopes = (xp.asarray(alibi_slopes(op.heads_q), dtype=dtype) if given is None
                  else backend.array(given.buffer_id)[:op.heads_q].astype(dtype))
    bias = keep = None
    shape = (op.batch, op.heads_q, op.seq_q, op.seq_kv)
    if isinstance(op, MultiHeadAttnForward) and op.bias is not None:
        bias = backend.array(op.bias.buffer_id)[:int(np.prod(shape))].reshape(shape).astype(dtype)
    if isinstance(op, MultiHeadAttnForward | MultiHeadAttnBackward):
        keep = dropout_keep(xp, op.dropout, op.dropout_seed, shape, dtype)
    return Problem(xp, rows_q.read(dtype), k, v, rows_q.lens, len_kv, mask, op.softmax_scale,
                   slopes, bias, keep)


def write(backend: ArrayBackend, op: Attention, out: GpuRef, o: Array, lse: Array,
          stats: GpuRef | None) -> None:
    """Store ``o`` into ``out`` (shaped as ``q``) and, when asked, the statistics."""
    _Gather(backend, op, out, op.heads_q, op.seq_q, _cu(backend, op, op.cu_seqlens_q),
            False).write(o)
    if stats is not None:
        flat = backend.array(stats.buffer_id)
        n = op.batch * op.heads_q * op.seq_q
        flat[:n] = lse.reshape(-1).astype(flat.dtype)


def _compute_dtype(backend: ArrayBackend, op: Attention) -> Any:
    """float64 on the CPU; on CUDA float64 for f64 data, else float32."""
    xp = backend.xp
    if xp is np or op.q.dtype.value == "f64":
        return xp.float64
    return xp.float32


def _grads(backend: ArrayBackend, op: SdpaBackward | MultiHeadAttnBackward,
           stats: GpuRef | None) -> None:
    check = backend.xp is np
    dtype = _compute_dtype(backend, op)
    p = problem_of(backend, op, dtype, check)
    cu_q, cu_kv = _cu(backend, op, op.cu_seqlens_q), _cu(backend, op, op.cu_seqlens_kv)

    def like(ref: GpuRef, heads: int, seq: int, cu: Array | None) -> _Gather:
        return _Gather(backend, op, ref, heads, seq, cu, False)

    o = like(op.o, op.heads_q, op.seq_q, cu_q).read(dtype)
    do = like(op.do, op.heads_q, op.seq_q, cu_q).read(dtype)
    n = op.batch * op.heads_q * op.seq_q
    lse = None if stats is None else backend.array(stats.buffer_id)[:n].reshape(
        op.batch, op.heads_q, op.seq_q).astype(dtype)
    dq, dk, dv = backward(p, o, do, lse)
    like(op.dq, op.heads_q, op.seq_q, cu_q).write(dq)
    like(op.dk, op.heads_kv, op.seq_kv, cu_kv).write(dk)
    like(op.dv, op.heads_kv, op.seq_kv, cu_kv).write(dv)


def _name(backend: ArrayBackend) -> str:
    return "numpy" if backend.xp is np else "cupy-composed"


@cpu.handles(SdpaForward, MultiHeadAttnForward)
def sdpa_forward(backend: ArrayBackend, op: SdpaForward | MultiHeadAttnForward) -> str:
    """Run the forward on dense arrays; answer ``"numpy"`` (or ``"cupy-composed"``)."""
    p = problem_of(backend, op, _compute_dtype(backend, op), backend.xp is np)
    o, lse = forward(p)
    write(backend, op, op.o, o, lse, op.stats)
    return _name(backend)


@cpu.handles(SdpaBackward, MultiHeadAttnBackward)
def sdpa_backward(backend: ArrayBackend, op: SdpaBackward | MultiHeadAttnBackward) -> str:
    """Run the backward on dense arrays; answer ``"numpy"`` (or ``"cupy-composed"``)."""
    _grads(backend, op, op.stats)
    return _name(backend)


@cpu.handles(SdpaSupport)
def support(backend: ArrayBackend, op: SdpaSupport) -> str:
    """Every valid configuration runs on the CPU backend."""
    return "numpy"
