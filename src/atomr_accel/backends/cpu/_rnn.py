"""cuDNN-shaped recurrent networks: RNN (tanh/relu), LSTM and GRU, on NumPy or CuPy.

The network runs layer by layer and direction by direction: the input
projections of all time steps as one gemm (``x @ w_ih.T + b_ih``), then per
step the recurrent gemm (``h @ w_hh.T + b_hh``) and the cell's gate math. The
gate math is a ``Cell`` (``numpy_cell`` here on ``backend.xp``; the CUDA
backend passes its fused kernels), so both backends share this module. The
backward recomputes the forward, keeping each step's gate activations (its
tape), then runs back through time and layers. Arithmetic runs in f64 on
NumPy and in the buffers' dtype on CuPy. Layout and packed weights: see
``atomr_accel.core.ops._rnn``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cpu
from atomr_accel.backends.cpu._norm import compute_type, view
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._rnn import RnnBwd, RnnFwd, RnnMode, RnnShape, WeightSlices

__all__ = [
    "Cell",
    "Step",
    "backward",
    "cell_backward",
    "forward",
    "numpy_cell",
    "rnn_bwd",
    "rnn_fwd",
    "run_forward",
]

Array = Any  # a NumPy or CuPy array, whichever ``backend.xp`` makes


class Step(NamedTuple):
    """What one cell step gives: the new hidden and cell states, the gate activations
    (LSTM ``[i, f, g, o]``, GRU ``[r, z, n]``, RNN ``h'``) and an extra the backward needs
    (LSTM ``c'``, GRU ``W_hn h + b_hn``, RNN None)."""

    h: Array
    c: Array | None
    act: Array
    extra: Array | None


Cell = Callable[[RnnMode, Array, Array, Array, Array | None], Step]
"""``cell(mode, xg, hg, h, c)``: one step from the input and recurrent projections."""


def _sigmoid(xp: Any, v: Array) -> Array:
    return 1.0 / (1.0 + xp.exp(-v))


def numpy_cell(xp: Any) -> Cell:
    """The gate math on ``xp`` arrays (several array operations per step)."""

    def cell(mode: RnnMode, xg: Array, hg: Array, h: Array, c: Array | None) -> Step:
        n = h.shape[1]
        if mode is RnnMode.LSTM:
            pre = xg + hg
            i, f = _sigmoid(xp, pre[:, :n]), _sigmoid(xp, pre[:, n:2 * n])
            g, o = xp.tanh(pre[:, 2 * n:3 * n]), _sigmoid(xp, pre[:, 3 * n:])
            c_new = f * c + i * g
            return Step(o * xp.tanh(c_new), c_new, xp.concatenate([i, f, g, o], axis=1), c_new)
        if mode is RnnMode.GRU:
            r = _sigmoid(xp, xg[:, :n] + hg[:, :n])
            z = _sigmoid(xp, xg[:, n:2 * n] + hg[:, n:2 * n])
            hn = hg[:, 2 * n:]
            new = xp.tanh(xg[:, 2 * n:] + r * hn)
            return Step((1 - z) * new + z * h, None, xp.concatenate([r, z, new], axis=1), hn)
        pre = xg + hg
        out = xp.tanh(pre) if mode is RnnMode.RNN_TANH else xp.maximum(pre, 0)
        return Step(out, None, out, None)

    return cell


def cell_backward(xp: Any, mode: RnnMode, dh: Array, dc: Array | None, h_prev: Array,
                  c_prev: Array | None, step: Step) -> tuple[Array, Array, Array | None,
                                                             Array | None]:
    """One step back: ``(d input projection, d recurrent projection, dh_prev's direct
    part, dc_prev)`` from the step's output gradients and its tape entry."""
    n = h_prev.shape[1]
    act = step.act
    if mode is RnnMode.LSTM:
        i, f, g, o = act[:, :n], act[:, n:2 * n], act[:, 2 * n:3 * n], act[:, 3 * n:]
        tc = xp.tanh(step.extra)
        dc = dc + dh * o * (1 - tc * tc)
        dpre = xp.concatenate([dc * g * i * (1 - i), dc * c_prev * f * (1 - f),
                               dc * i * (1 - g * g), dh * tc * o * (1 - o)], axis=1)
        return dpre, dpre, None, dc * f
    if mode is RnnMode.GRU:
        r, z, new = act[:, :n], act[:, n:2 * n], act[:, 2 * n:]
        dnew = dh * (1 - z) * (1 - new * new)
        dr = dnew * step.extra * r * (1 - r)
        dz = dh * (h_prev - new) * z * (1 - z)
        return (xp.concatenate([dr, dz, dnew], axis=1),
                xp.concatenate([dr, dz, dnew * r], axis=1), dh * z, None)
    dpre = dh * (1 - act * act) if mode is RnnMode.RNN_TANH else dh * (act > 0)
    return dpre, dpre, None, None


class _Weights(NamedTuple):
    w_ih: Array
    w_hh: Array
    b_ih: Array
    b_hh: Array


def _weights(w: Array, shape: RnnShape, where: WeightSlices) -> _Weights:
    gh, h = shape.mode.gates * shape.hidden_size, shape.hidden_size
    return _Weights(w[where.w_ih:where.w_ih + gh * where.inputs].reshape(gh, where.inputs),
                    w[where.w_hh:where.w_hh + gh * h].reshape(gh, h),
                    w[where.b_ih:where.b_ih + gh], w[where.b_hh:where.b_hh + gh])


class _Pass(NamedTuple):
    """One direction of one layer run forward: outputs, final states and (kept) tape."""

    out: Array
    h: Array
    c: Array | None
    tape: list[tuple[int, Array, Array | None, Step]]


def _run(xp: Any, shape: RnnShape, cell: Cell, inp: Array, w: _Weights, h: Array,
         c: Array | None, reverse: bool, keep: bool) -> _Pass:
    t_len, batch, n = shape.seq_length, shape.batch_size, shape.hidden_size
    xg = (inp.reshape(t_len * batch, -1) @ w.w_ih.T + w.b_ih).reshape(t_len, batch, -1)
    out = xp.empty((t_len, batch, n), dtype=inp.dtype)
    tape = []
    for t in (range(t_len - 1, -1, -1) if reverse else range(t_len)):
        step = cell(shape.mode, xg[t], h @ w.w_hh.T + w.b_hh, h, c)
        if keep:
            tape.append((t, h, c, step))
        h, c = step.h, step.c
        out[t] = h
    return _Pass(out, h, c, tape)


def _states(backend: ArrayBackend, ref: GpuRef | None, shape: RnnShape,
            compute: Any) -> Array:
    """A state buffer as ``(layers * directions, batch, hidden)`` in ``compute`` (zeros for
    None)."""
    dims = (shape.num_layers * shape.directions, shape.batch_size, shape.hidden_size)
    if ref is None:
        return backend.xp.zeros(dims, dtype=compute)
    return view(backend, ref, dims).astype(compute)


def _store(backend: ArrayBackend, ref: GpuRef | None, dims: tuple[int, ...],
           value: Array) -> None:
    if ref is not None:
        out = view(backend, ref, dims)
        out[...] = value.astype(out.dtype)


def forward(backend: ArrayBackend, op: RnnFwd | RnnBwd, cell: Cell,
            keep: bool) -> tuple[Array, Array, Array, list[Array], dict[tuple[int, int], _Pass]]:
    """Run the network of ``op`` forward: ``(y, h_out, c_out, each layer's input, each
    layer and direction's pass)``; the passes keep their tapes when ``keep``."""
    xp, shape = backend.xp, op.shape
    compute = compute_type(backend, op.x.dtype)
    w = view(backend, op.weights, (shape.weight_count,)).astype(compute)
    h0 = _states(backend, op.h_in, shape, compute)
    lstm = shape.mode is RnnMode.LSTM
    c0 = _states(backend, op.c_in, shape, compute) if lstm else None
    inp = view(backend, op.x, (shape.seq_length, shape.batch_size, shape.input_size))
    inp = inp.astype(compute)
    h_out, c_out = xp.empty_like(h0), xp.empty_like(h0)
    inputs, passes = [], {}
    for layer in range(shape.num_layers):
        inputs.append(inp)
        outs = []
        for d in range(shape.directions):
            k = layer * shape.directions + d
            run = _run(xp, shape, cell, inp, _weights(w, shape, shape.slices(layer, d)), h0[k],
                       None if c0 is None else c0[k], d == 1, keep)
            passes[(layer, d)] = run
            outs.append(run.out)
            h_out[k] = run.h
            if run.c is not None:
                c_out[k] = run.c
        inp = outs[0] if len(outs) == 1 else xp.concatenate(outs, axis=2)
    return inp, h_out, c_out, inputs, passes


def run_forward(backend: ArrayBackend, op: RnnFwd, cell: Cell) -> None:
    """Write ``y``, ``h_out`` and ``c_out`` of ``op`` with ``cell``'s gate math."""
    y, h_out, c_out, _, _ = forward(backend, op, cell, keep=False)
    shape = op.shape
    _store(backend, op.y, y.shape, y)
    _store(backend, op.h_out, h_out.shape, h_out)
    if shape.mode is RnnMode.LSTM:
        _store(backend, op.c_out, c_out.shape, c_out)


def backward(backend: ArrayBackend, op: RnnBwd, cell: Cell) -> None:
    """Write ``dx``, ``dweights``, ``dh_in`` and ``dc_in`` of ``op`` (the forward recomputed
    with ``cell``'s gate math)."""
    xp, shape = backend.xp, op.shape
    compute = compute_type(backend, op.x.dtype)
    _, _, _, inputs, passes = forward(backend, op, cell, keep=True)
    w = view(backend, op.weights, (shape.weight_count,)).astype(compute)
    dw = xp.zeros(shape.weight_count, dtype=compute)
    lstm = shape.mode is RnnMode.LSTM
    dh_out = _states(backend, op.dh_out, shape, compute)
    dc_out = _states(backend, op.dc_out, shape, compute) if lstm else None
    dh_in, dc_in = xp.empty_like(dh_out), xp.empty_like(dh_out)
    n, t_len, batch = shape.hidden_size, shape.seq_length, shape.batch_size
    d_out = view(backend, op.dy, (t_len, batch, shape.directions * n)).astype(compute)
    for layer in range(shape.num_layers - 1, -1, -1):
        inp = inputs[layer]
        d_in = xp.zeros_like(inp)
        for d in range(shape.directions):
            k = layer * shape.directions + d
            where = shape.slices(layer, d)
            weights = _weights(w, shape, where)
            grads = _weights(dw, shape, where)
            dy = d_out[:, :, d * n:(d + 1) * n]
            dh = dh_out[k]
            dc = None if dc_out is None else dc_out[k]
            dxg = xp.empty((t_len, batch, shape.mode.gates * n), dtype=compute)
            for t, h_prev, c_prev, step in reversed(passes[(layer, d)].tape):
                dh = dh + dy[t]
                dxg[t], dhg, direct, dc = cell_backward(xp, shape.mode, dh, dc, h_prev, c_prev,
                                                        step)
                grads.w_hh[...] += dhg.T @ h_prev
                grads.b_hh[...] += dhg.sum(axis=0)
                dh = dhg @ weights.w_hh if direct is None else dhg @ weights.w_hh + direct
            dh_in[k] = dh
            if dc is not None:
                dc_in[k] = dc
            flat = dxg.reshape(t_len * batch, -1)
            grads.w_ih[...] = flat.T @ inp.reshape(t_len * batch, -1)
            grads.b_ih[...] = flat.sum(axis=0)
            d_in += (flat @ weights.w_ih).reshape(inp.shape)
        d_out = d_in
    _store(backend, op.dx, d_out.shape, d_out)
    _store(backend, op.dweights, dw.shape, dw)
    _store(backend, op.dh_in, dh_in.shape, dh_in)
    if lstm:
        _store(backend, op.dc_in, dc_in.shape, dc_in)


@cpu.handles(RnnFwd)
def rnn_fwd(backend: ArrayBackend, op: RnnFwd) -> str:
    """Run the network forward on ``backend.xp``; answer its name."""
    run_forward(backend, op, numpy_cell(backend.xp))
    return str(backend.xp.__name__)


@cpu.handles(RnnBwd)
def rnn_bwd(backend: ArrayBackend, op: RnnBwd) -> str:
    """Run the network's backward on ``backend.xp``; answer its name."""
    backward(backend, op, numpy_cell(backend.xp))
    return str(backend.xp.__name__)
