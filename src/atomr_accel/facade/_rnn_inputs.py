"""``RnnBwdInputs``: the original package's builder of an RNN backward call.

Set the buffers and sizes one by one, then pass the builder to
``Cudnn.rnn_bwd_f32`` (or ``rnn_bwd`` for f64): the call builds the
``RnnBwd`` op from it and marks it consumed, so one builder serves one call.
``set_mode`` and ``set_direction`` take the original's option strings and
refuse others at once (``InvalidArgument``, a ``GpuRuntimeError``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._rnn import (
    RnnBwd,
    RnnDirection,
    RnnMode,
    parse_direction,
    parse_rnn_mode,
)

__all__ = ["RnnBwdInputs"]

RefOf = Callable[[Any, str, Iterable[DType] | None], GpuRef]
"""How a handle turns a buffer into its checked ``GpuRef`` (``Library._ref``)."""

_BUFFERS = ("x", "y", "dy", "h_in", "c_in", "h_out", "c_out", "dh_out", "dc_out", "weights",
            "dx", "dh_in", "dc_in", "dweights")
_REQUIRED = ("x", "weights", "dy", "dx", "dweights")


class RnnBwdInputs:
    """The inputs of one RNN backward call, set one by one (the original's builder).

    Buffers: ``set_x``, ``set_y``, ``set_dy``, ``set_h_in``, ``set_c_in``,
    ``set_h_out``, ``set_c_out``, ``set_dh_out``, ``set_dc_out``, ``set_weights``,
    ``set_dx``, ``set_dh_in``, ``set_dc_in``, ``set_dweights``; ``x``, ``weights``,
    ``dy``, ``dx`` and ``dweights`` are required. Options: ``set_mode`` (rnn,
    rnn_tanh, rnn_relu, lstm, gru), ``set_direction`` (uni, bi, unidirectional,
    bidirectional), ``set_num_layers``, ``set_input_size``, ``set_hidden_size``,
    ``set_seq_length``, ``set_batch_size``, ``set_dropout``. Each setter returns
    the builder.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, Any] = {}
        self._mode = RnnMode.LSTM
        self._direction = RnnDirection.UNI
        self._sizes = {"num_layers": 1, "input_size": 0, "hidden_size": 0, "seq_length": 0,
                       "batch_size": 0}
        self._dropout = 0.0
        self._consumed = False

    def _set(self, name: str, buffer: Any) -> RnnBwdInputs:
        self._buffers[name] = buffer
        return self

    def _size(self, name: str, n: int) -> RnnBwdInputs:
        self._sizes[name] = n
        return self

    def set_x(self, buf: Any) -> RnnBwdInputs:
        """The forward's input ``(seq_length, batch_size, input_size)``."""
        return self._set("x", buf)

    def set_y(self, buf: Any) -> RnnBwdInputs:
        """The forward's output (checked, not read: the backward recomputes it)."""
        return self._set("y", buf)

    def set_dy(self, buf: Any) -> RnnBwdInputs:
        """The gradient of ``y``."""
        return self._set("dy", buf)

    def set_h_in(self, buf: Any) -> RnnBwdInputs:
        """The forward's initial hidden state (unset: zeros)."""
        return self._set("h_in", buf)

    def set_c_in(self, buf: Any) -> RnnBwdInputs:
        """The forward's initial cell state, LSTM only (unset: zeros)."""
        return self._set("c_in", buf)

    def set_h_out(self, buf: Any) -> RnnBwdInputs:
        """The forward's final hidden state (checked, not read)."""
        return self._set("h_out", buf)

    def set_c_out(self, buf: Any) -> RnnBwdInputs:
        """The forward's final cell state (checked, not read)."""
        return self._set("c_out", buf)

    def set_dh_out(self, buf: Any) -> RnnBwdInputs:
        """The gradient of the final hidden state (unset: zeros)."""
        return self._set("dh_out", buf)

    def set_dc_out(self, buf: Any) -> RnnBwdInputs:
        """The gradient of the final cell state, LSTM only (unset: zeros)."""
        return self._set("dc_out", buf)

    def set_weights(self, buf: Any) -> RnnBwdInputs:
        """The packed weights (PyTorch's order; see ``atomr_accel.core.ops._rnn``)."""
        return self._set("weights", buf)

    def set_dx(self, buf: Any) -> RnnBwdInputs:
        """Receives the gradient of ``x``."""
        return self._set("dx", buf)

    def set_dh_in(self, buf: Any) -> RnnBwdInputs:
        """Receives the gradient of the initial hidden state (unset: not written)."""
        return self._set("dh_in", buf)

    def set_dc_in(self, buf: Any) -> RnnBwdInputs:
        """Receives the gradient of the initial cell state (unset: not written)."""
        return self._set("dc_in", buf)

    def set_dweights(self, buf: Any) -> RnnBwdInputs:
        """Receives the gradient of the packed weights (written, not accumulated)."""
        return self._set("dweights", buf)

    def set_num_layers(self, n: int) -> RnnBwdInputs:
        """Stacked layers."""
        return self._size("num_layers", n)

    def set_input_size(self, n: int) -> RnnBwdInputs:
        """Features of ``x``."""
        return self._size("input_size", n)

    def set_hidden_size(self, n: int) -> RnnBwdInputs:
        """Features of a hidden state."""
        return self._size("hidden_size", n)

    def set_seq_length(self, n: int) -> RnnBwdInputs:
        """Time steps."""
        return self._size("seq_length", n)

    def set_batch_size(self, n: int) -> RnnBwdInputs:
        """Sequences run side by side."""
        return self._size("batch_size", n)

    def set_mode(self, mode: str) -> RnnBwdInputs:
        """The cell: rnn, rnn_tanh, rnn_relu, lstm or gru (else ``InvalidArgument``)."""
        self._mode = parse_rnn_mode(mode)
        return self

    def set_direction(self, direction: str) -> RnnBwdInputs:
        """uni, unidirectional, bi or bidirectional (else ``InvalidArgument``)."""
        self._direction = parse_direction(direction)
        return self

    def set_dropout(self, p: float) -> RnnBwdInputs:
        """Dropout between layers (only 0.0 is supported)."""
        self._dropout = p
        return self

    def is_consumed(self) -> bool:
        """Whether a backward call has taken these inputs already."""
        return self._consumed

    def build(self, ref_of: RefOf, dtypes: Iterable[DType] | None) -> RnnBwd:
        """The ``RnnBwd`` op of these inputs, its buffers turned into refs by ``ref_of`` (the
        handle's check; ``dtypes`` limits the first buffer's dtype); raises
        ``InvalidArgument`` when consumed or a required buffer is unset."""
        if self._consumed:
            raise InvalidArgument("these RnnBwdInputs were consumed by an earlier call; "
                                  "build new ones")
        for name in _REQUIRED:
            if name not in self._buffers:
                raise InvalidArgument(f"RnnBwdInputs needs {name} (set_{name})")
        refs: dict[str, GpuRef | None] = {
            name: ref_of(self._buffers[name], name, dtypes if name == "x" else None)
            if name in self._buffers else None for name in _BUFFERS}
        x, weights, dy, dx, dw = (refs.pop(name) for name in _REQUIRED)
        assert x is not None and weights is not None and dy is not None  # required above
        assert dx is not None and dw is not None
        sizes = self._sizes
        return RnnBwd(x, weights, dy, dx, dw, refs["h_in"], refs["c_in"], refs["y"],
                      refs["h_out"], refs["c_out"], refs["dh_out"], refs["dc_out"],
                      refs["dh_in"], refs["dc_in"], self._mode, self._direction,
                      sizes["num_layers"], sizes["input_size"], sizes["hidden_size"],
                      sizes["seq_length"], sizes["batch_size"], self._dropout)

    def consume(self) -> None:
        """Mark these inputs taken by a call."""
        self._consumed = True

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self._sizes.items())
        buffers = ", ".join(sorted(self._buffers))
        return (f"RnnBwdInputs(mode={self._mode.value!r}, direction={self._direction.value!r}, "
                f"{sizes}, dropout={self._dropout}, buffers=[{buffers}], "
                f"consumed={self._consumed})")
