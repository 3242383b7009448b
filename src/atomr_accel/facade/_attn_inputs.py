"""``MultiHeadAttnBwdInputs``: the original package's builder of ``Cudnn.multihead_attn_bwd_f32``.

The backward of multi-head attention takes more arguments than a call reads
well with, so the original collects them on a builder: buffer setters
(``set_q`` ... ``set_stats``), sizes, the mask, scale and dropout. Passing the
builder to ``multihead_attn_bwd_f32`` consumes it (``is_consumed()``); a
consumed builder cannot be passed again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._attention import AttnMask, MultiHeadAttnBackward
from atomr_accel.facade._rnn_inputs import RefOf

__all__ = ["MultiHeadAttnBwdInputs"]

_BUFFERS = ("q", "k", "v", "o", "do", "dq", "dk", "dv", "stats")
_SIZES = ("batch", "seq_q", "seq_kv", "heads_q", "heads_kv", "head_dim")


class MultiHeadAttnBwdInputs:
    """The arguments of one multi-head attention backward (``Cudnn.multihead_attn_bwd_f32``).

    Buffers: ``q``, ``k``, ``v``, ``o`` (the forward's output), ``do`` (its
    gradient), ``dq``, ``dk``, ``dv`` (written) and, optionally, ``stats`` (the
    forward's softmax statistics). Sizes: ``batch``, ``seq_q``, ``seq_kv``,
    ``heads_q``, ``heads_kv``, ``head_dim``. Options: ``mask`` (none, causal,
    sliding_window, causal_sliding_window) with its ``window``, ``scale`` (None:
    ``1 / sqrt(head_dim)``), ``dropout`` and ``dropout_seed`` as in the forward.
    """

    def __init__(self) -> None:
        self._values: dict[str, Any] = {"mask": AttnMask.NONE, "window": 0, "scale": None,
                                        "dropout": 0.0, "dropout_seed": 0, "stats": None}
        self._consumed = False

    def _set(self, name: str, value: Any) -> None:
        if self._consumed:
            raise InvalidArgument("this MultiHeadAttnBwdInputs was consumed by a backward call")
        self._values[name] = value

    def set_q(self, buf: Any) -> None:
        """Set the queries ``(batch, heads_q, seq_q, head_dim)``."""
        self._set("q", buf)

    def set_k(self, buf: Any) -> None:
        """Set the keys ``(batch, heads_kv, seq_kv, head_dim)``."""
        self._set("k", buf)

    def set_v(self, buf: Any) -> None:
        """Set the values ``(batch, heads_kv, seq_kv, head_dim)``."""
        self._set("v", buf)

    def set_o(self, buf: Any) -> None:
        """Set the forward's output."""
        self._set("o", buf)

    def set_do(self, buf: Any) -> None:
        """Set the gradient of the output."""
        self._set("do", buf)

    def set_dq(self, buf: Any) -> None:
        """Set the buffer that receives the gradient of the queries."""
        self._set("dq", buf)

    def set_dk(self, buf: Any) -> None:
        """Set the buffer that receives the gradient of the keys."""
        self._set("dk", buf)

    def set_dv(self, buf: Any) -> None:
        """Set the buffer that receives the gradient of the values."""
        self._set("dv", buf)

    def set_stats(self, buf: Any) -> None:
        """Set the forward's softmax statistics (f32, ``batch * heads_q * seq_q``)."""
        self._set("stats", buf)

    def set_batch(self, batch: int) -> None:
        """Set the batch size."""
        self._set("batch", batch)

    def set_seq_q(self, seq_q: int) -> None:
        """Set the query sequence length."""
        self._set("seq_q", seq_q)

    def set_seq_kv(self, seq_kv: int) -> None:
        """Set the key/value sequence length."""
        self._set("seq_kv", seq_kv)

    def set_heads_q(self, heads_q: int) -> None:
        """Set the number of query heads."""
        self._set("heads_q", heads_q)

    def set_heads_kv(self, heads_kv: int) -> None:
        """Set the number of key/value heads (``heads_q`` must be a multiple)."""
        self._set("heads_kv", heads_kv)

    def set_head_dim(self, head_dim: int) -> None:
        """Set the head dimension."""
        self._set("head_dim", head_dim)

    def set_mask(self, mask: str, window: int = 0) -> None:
        """Set the mask (none, causal, sliding_window, causal_sliding_window) and its window;
        another name raises ``InvalidArgument`` (a ``GpuRuntimeError``)."""
        try:
            parsed = AttnMask(mask.lower() if isinstance(mask, str) else mask)
        except ValueError:
            choices = ", ".join(m.value for m in AttnMask)
            raise InvalidArgument(f"mask must be one of {choices}, got {mask!r}") from None
        self._set("mask", parsed)
        self._set("window", window)

    def set_scale(self, scale: float | None) -> None:
        """Set the softmax scale (None: ``1 / sqrt(head_dim)``)."""
        self._set("scale", scale)

    def set_dropout(self, dropout: float) -> None:
        """Set the dropout probability of the forward."""
        self._set("dropout", dropout)

    def set_dropout_seed(self, seed: int) -> None:
        """Set the dropout seed of the forward."""
        self._set("dropout_seed", seed)

    def is_consumed(self) -> bool:
        """Whether a backward call has taken these inputs."""
        return self._consumed

    def build(self, ref_of: RefOf, dtypes: Iterable[DType] | None) -> MultiHeadAttnBackward:
        """The ``MultiHeadAttnBackward`` op of these inputs, its buffers turned into refs by
        ``ref_of`` (the handle's check, limited to ``dtypes``); raises ``InvalidArgument``
        when consumed already or a required one is unset."""
        if self._consumed:
            raise InvalidArgument("this MultiHeadAttnBwdInputs was consumed by a backward call")
        missing = [n for n in (*_BUFFERS[:-1], *_SIZES) if n not in self._values]
        if missing:
            raise InvalidArgument(f"MultiHeadAttnBwdInputs has no {', '.join(missing)}: "
                                  f"call set_{missing[0]}()")
        values = self._values
        q, k, v, o, do, dq, dk, dv = (ref_of(values[name], name, dtypes)
                                      for name in _BUFFERS[:-1])
        stats = values["stats"]
        return MultiHeadAttnBackward(
            q, k, v, o, do, dq, dk, dv, values["batch"], values["seq_q"], values["seq_kv"],
            values["heads_q"], values["heads_kv"], values["head_dim"],
            None if stats is None else ref_of(stats, "stats", dtypes), values["mask"],
            values["window"], values["scale"], values["dropout"], values["dropout_seed"])

    def consume(self) -> None:
        """Mark these inputs taken by a call."""
        self._consumed = True

    def __repr__(self) -> str:
        sizes = ", ".join(f"{n}={self._values[n]}" for n in _SIZES if n in self._values)
        mask = self._values["mask"].value
        return (f"MultiHeadAttnBwdInputs({sizes}{', ' if sizes else ''}mask={mask!r}, "
                f"consumed={self._consumed})")
