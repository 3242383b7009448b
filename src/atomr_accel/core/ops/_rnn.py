"""cuDNN-shaped recurrent networks: RNN (tanh/relu), LSTM and GRU, forward and backward.

Layout (time-major, as cuDNN's and PyTorch's default), row-major buffers:

* ``x``: ``(seq_length, batch_size, input_size)``;
* ``y``: ``(seq_length, batch_size, D * hidden_size)``, ``D`` = 2 when bidirectional
  (the forward direction's outputs first, then the reverse's, per step);
* ``h_in``, ``h_out``, ``c_in``, ``c_out``: ``(num_layers * D, batch_size, hidden_size)``,
  layer by layer, the forward direction first;
* ``weights``: packed as PyTorch's ``nn.RNN``/``nn.LSTM``/``nn.GRU`` parameters in
  order: for each layer, for each direction (forward, then reverse),
  ``w_ih`` ``(G * hidden_size, in)``, ``w_hh`` ``(G * hidden_size, hidden_size)``,
  ``b_ih`` ``(G * hidden_size)``, ``b_hh`` ``(G * hidden_size)``, each row-major,
  where ``in`` is ``input_size`` for layer 0 and ``D * hidden_size`` above, and
  ``G`` is 1 (RNN), 4 (LSTM, gates i, f, g, o) or 3 (GRU, gates r, z, n).

Cells, as PyTorch and cuDNN define them (``*`` elementwise):

* RNN: ``h' = tanh(W_ih x + b_ih + W_hh h + b_hh)`` (or ``relu``);
* LSTM: ``i, f, g, o = sigmoid, sigmoid, tanh, sigmoid`` of the four gate
  pre-activations,
  ``c' = f * c + i * g``, ``h' = o * tanh(c')``;
* GRU: ``r, z = sigmoid(...)``, ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``,
  ``h' = (1 - z) * n + z * h``.

The backward (``RnnBwd``) recomputes the forward's gate activations from ``x``,
``h_in``, ``c_in`` and ``weights``: the forward keeps no reserve space. Its
gradients are written, not accumulated. ``rnn_weight_count`` sizes the
weights (and ``dweights``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from atomr_accel.core._api import Form, Param, choice
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import pickle_by_name
from atomr_accel.core._op import (
    require,
    require_len,
    require_positive,
    require_shared_dtype,
)
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._dnn_common import _DnnOp

__all__ = [
    "RnnBwd",
    "RnnDirection",
    "RnnFwd",
    "RnnMode",
    "RnnShape",
    "WeightSlices",
    "parse_direction",
    "parse_rnn_mode",
    "rnn_weight_count",
]

DTYPES = (DType.F32, DType.F64)
"""The dtypes the recurrent networks take."""


class RnnMode(enum.Enum):
    """The cell: a plain RNN with tanh or relu, an LSTM, or a GRU."""

    RNN_TANH = "rnn_tanh"
    RNN_RELU = "rnn_relu"
    LSTM = "lstm"
    GRU = "gru"

    __reduce_ex__ = pickle_by_name

    @property
    def gates(self) -> int:
        """Gate blocks per weight matrix: 1, 4 (i, f, g, o) or 3 (r, z, n)."""
        return {RnnMode.LSTM: 4, RnnMode.GRU: 3}.get(self, 1)


class RnnDirection(enum.Enum):
    """Unidirectional, or bidirectional (a forward and a reverse pass per layer)."""

    UNI = "uni"
    BI = "bi"

    __reduce_ex__ = pickle_by_name


parse_rnn_mode = choice("mode", {"rnn": RnnMode.RNN_TANH, "rnn_tanh": RnnMode.RNN_TANH,
                                 "rnn_relu": RnnMode.RNN_RELU, "lstm": RnnMode.LSTM,
                                 "gru": RnnMode.GRU})
"""The original's RNN modes (rnn, rnn_tanh, lstm, gru) and rnn_relu."""

parse_direction = choice("direction", {"uni": RnnDirection.UNI,
                                       "unidirectional": RnnDirection.UNI,
                                       "bi": RnnDirection.BI, "bidirectional": RnnDirection.BI})
"""The original's directions: uni, unidirectional, bi, bidirectional."""


class WeightSlices(NamedTuple):
    """Where one layer and direction's ``w_ih``, ``w_hh``, ``b_ih``, ``b_hh`` start in the
    packed weights, and the width of its input."""

    w_ih: int
    w_hh: int
    b_ih: int
    b_hh: int
    inputs: int


class RnnShape(NamedTuple):
    """The sizes of a recurrent network: cell, directions, layers and extents."""

    mode: RnnMode
    directions: int
    num_layers: int
    input_size: int
    hidden_size: int
    seq_length: int
    batch_size: int

    def slices(self, layer: int, direction: int) -> WeightSlices:
        """The packed weights of ``layer`` and ``direction`` (0 forward, 1 reverse)."""
        gh, h, d = self.mode.gates * self.hidden_size, self.hidden_size, self.directions
        offset = 0
        for index in range(layer * d + direction):
            inputs = self.input_size if index < d else d * h
            offset += gh * (inputs + h) + 2 * gh
        inputs = self.input_size if layer == 0 else d * h
        return WeightSlices(offset, offset + gh * inputs, offset + gh * (inputs + h),
                            offset + gh * (inputs + h) + gh, inputs)

    @property
    def weight_count(self) -> int:
        """Elements of the packed weights."""
        gh, h, d = self.mode.gates * self.hidden_size, self.hidden_size, self.directions
        first = gh * (self.input_size + h) + 2 * gh
        above = gh * (d * h + h) + 2 * gh
        return d * (first + (self.num_layers - 1) * above)

    @property
    def x_count(self) -> int:
        """Elements of ``x``."""
        return self.seq_length * self.batch_size * self.input_size

    @property
    def y_count(self) -> int:
        """Elements of ``y``."""
        return self.seq_length * self.batch_size * self.directions * self.hidden_size

    @property
    def state_count(self) -> int:
        """Elements of a hidden or cell state (all layers and directions)."""
        return self.num_layers * self.directions * self.batch_size * self.hidden_size


def rnn_weight_count(mode: str, direction: str, num_layers: int, input_size: int,
                     hidden_size: int) -> int:
    """Elements the packed weights of a network take (the original's option strings)."""
    require_positive(num_layers=num_layers, input_size=input_size, hidden_size=hidden_size)
    return RnnShape(parse_rnn_mode(mode), 2 if parse_direction(direction) is RnnDirection.BI
                    else 1, num_layers, input_size, hidden_size, 1, 1).weight_count


@dataclass(frozen=True)
class _RnnNetwork:
    """The fields both recurrent ops end with, after their buffers: the network's options
    and sizes, read and checked (a field group, named before the buffers' among an op's
    bases)."""

    __slots__ = ()
    mode: RnnMode = RnnMode.LSTM
    direction: RnnDirection = RnnDirection.UNI
    num_layers: int = 1
    input_size: int = 0
    hidden_size: int = 0
    seq_length: int = 0
    batch_size: int = 0
    dropout: float = 0.0

    @property
    def shape(self) -> RnnShape:
        """The network's sizes."""
        return RnnShape(self.mode, 2 if self.direction is RnnDirection.BI else 1,
                        self.num_layers, self.input_size, self.hidden_size, self.seq_length,
                        self.batch_size)

    def _checked_shape(self) -> RnnShape:
        """Check the sizes (all positive) and dropout; answer the network's shape."""
        require_positive(num_layers=self.num_layers, input_size=self.input_size,
                         hidden_size=self.hidden_size, seq_length=self.seq_length,
                         batch_size=self.batch_size)
        dropout = self.dropout
        if not (isinstance(dropout, int | float) and not isinstance(dropout, bool)
                and dropout == 0):
            raise InvalidArgument(f"dropout between layers is not supported: it must be 0.0, "
                                  f"got {dropout!r}")
        return self.shape


def _require_buffers(shape: RnnShape, mode: RnnMode, **refs: GpuRef | None) -> None:
    """Check dtypes (f32/f64, one for all), lengths, and that cell states go with LSTM."""
    given = {name: ref for name, ref in refs.items() if ref is not None}
    require_shared_dtype(DTYPES, **given)
    counts = {"x": shape.x_count, "dx": shape.x_count, "y": shape.y_count,
              "dy": shape.y_count, "weights": shape.weight_count,
              "dweights": shape.weight_count}
    for name, ref in given.items():
        require_len(ref, counts.get(name, shape.state_count), name)
        if name.lstrip("d").startswith("c_") and mode is not RnnMode.LSTM:
            raise InvalidArgument(f"{name} is a cell state; only an lstm has one")


_RNN_PARAMS: tuple[str | Param, ...] = (
    Param("mode", "lstm", parse=parse_rnn_mode, annotation="str"),
    Param("direction", "uni", parse=parse_direction, annotation="str"),
    "num_layers", "input_size", "hidden_size", "seq_length", "batch_size", "dropout")


@dataclass(frozen=True)
class _FwdBuffers:
    """``RnnFwd``'s buffers, its leading fields (a field group, after ``_RnnNetwork``
    among its bases)."""

    __slots__ = ()
    x: GpuRef
    h_in: GpuRef | None
    weights: GpuRef
    y: GpuRef
    h_out: GpuRef | None
    c_in: GpuRef | None = None
    c_out: GpuRef | None = None


@dataclass(frozen=True, slots=True)
class RnnFwd(_DnnOp, _RnnNetwork, _FwdBuffers):
    """Run a recurrent network (RNN tanh/relu, LSTM or GRU; uni- or bidirectional; several
    layers) over ``x`` into ``y`` and the final states ``h_out`` (and ``c_out``).

    ``h_in`` / ``c_in`` None start from zeros; ``h_out`` / ``c_out`` None are not
    written. The layout and the packed ``weights`` are described in
    ``atomr_accel.core.ops._rnn`` (PyTorch's parameter order). The handler answers
    the path that ran: ``"numpy"`` on CPU, ``"composed"`` on CUDA.
    """

    outputs: ClassVar[tuple[str, ...]] = ("y", "h_out", "c_out")
    api = (
        Form("rnn_fwd", ("x", "h_in", "weights", "y", "h_out", "c_in", "c_out", *_RNN_PARAMS),
             timeout=60.0, returns="str", note="f32 or f64; answers the path that ran."),
    )

    def validate(self) -> None:
        shape = self._checked_shape()
        _require_buffers(shape, self.mode, x=self.x, h_in=self.h_in, weights=self.weights,
                         y=self.y, h_out=self.h_out, c_in=self.c_in, c_out=self.c_out)


@dataclass(frozen=True)
class _BwdBuffers:
    """``RnnBwd``'s buffers, its leading fields (a field group, after ``_RnnNetwork``
    among its bases)."""

    __slots__ = ()
    x: GpuRef
    weights: GpuRef
    dy: GpuRef
    dx: GpuRef
    dweights: GpuRef
    h_in: GpuRef | None = None
    c_in: GpuRef | None = None
    y: GpuRef | None = None
    h_out: GpuRef | None = None
    c_out: GpuRef | None = None
    dh_out: GpuRef | None = None
    dc_out: GpuRef | None = None
    dh_in: GpuRef | None = None
    dc_in: GpuRef | None = None


@dataclass(frozen=True, slots=True)
class RnnBwd(_DnnOp, _RnnNetwork, _BwdBuffers):
    """The backward of ``RnnFwd``: ``dx``, ``dweights`` and, where given, ``dh_in`` and
    ``dc_in``, from ``dy`` and (where given) ``dh_out`` / ``dc_out``.

    It recomputes the forward from ``x``, ``h_in``, ``c_in`` and ``weights``;
    ``y``, ``h_out`` and ``c_out`` (the forward's outputs, as the original's
    builder takes them) are checked but not read. Built by ``RnnBwdInputs``.
    """

    outputs: ClassVar[tuple[str, ...]] = ("dx", "dweights", "dh_in", "dc_in")

    def validate(self) -> None:
        shape = self._checked_shape()
        _require_buffers(shape, self.mode, x=self.x, weights=self.weights, dy=self.dy,
                         dx=self.dx, dweights=self.dweights, h_in=self.h_in, c_in=self.c_in,
                         y=self.y, h_out=self.h_out, c_out=self.c_out, dh_out=self.dh_out,
                         dc_out=self.dc_out, dh_in=self.dh_in, dc_in=self.dc_in)
        outputs = {(r.device_id, r.buffer_id) for r in (self.dx, self.dweights, self.dh_in,
                                                         self.dc_in) if r is not None}
        require(len(outputs) == sum(r is not None for r in (self.dx, self.dweights, self.dh_in,
                                                             self.dc_in)),
                "dx, dweights, dh_in and dc_in must be distinct buffers")
