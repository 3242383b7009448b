"""cuDNN-shaped recurrent networks on CUDA, composed (the cuDNN frontend has no RNN graph).

Per layer and direction: the input projections of all time steps as one
cuBLAS gemm (CuPy matmul), then per step the recurrent gemm and the cell's
gate math as ONE fused CuPy ``ElementwiseKernel`` (LSTM, GRU, RNN tanh/relu)
that also writes the gate activations the backward needs. The network's
loops and the backward are the shared ones of ``backends/cpu/_rnn.py``
(the backward recomputes the forward with these kernels, then runs its
gradient math as CuPy array operations). Both handlers answer
``"composed"``. f32 and f64 run in their own precision.
"""

from __future__ import annotations

import functools
from typing import Any

import cupy as cp

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cuda
from atomr_accel.backends.cpu._rnn import Cell, Step, backward, run_forward
from atomr_accel.backends.cuda import _cudnn_graphs as graphs
from atomr_accel.core.ops._rnn import RnnBwd, RnnFwd, RnnMode

__all__ = ["fused_cell", "rnn_bwd", "rnn_fwd"]

_SIGMOID = "T sig(T v) { return T(1) / (T(1) + exp(-v)); }"


@functools.cache
def _kernels() -> dict[RnnMode, Any]:
    """The fused cell kernels, compiled on first use (one per cell, any float ``T``)."""
    lstm = cp.ElementwiseKernel(
        "raw T xg, raw T hg, raw T c0, int32 n", "T h, T c, raw T act",
        """
        const ptrdiff_t b = i / n, j = i % n, at = b * 4 * n + j;
        const T ig = sig(xg[at] + hg[at]);
        const T fg = sig(xg[at + n] + hg[at + n]);
        const T gg = tanh(xg[at + 2 * n] + hg[at + 2 * n]);
        const T og = sig(xg[at + 3 * n] + hg[at + 3 * n]);
        const T cn = fg * c0[i] + ig * gg;
        c = cn;
        h = og * tanh(cn);
        act[at] = ig; act[at + n] = fg; act[at + 2 * n] = gg; act[at + 3 * n] = og;
        """, "atomr_lstm_cell", preamble=f"template <typename T> __device__ {_SIGMOID}")
    gru = cp.ElementwiseKernel(
        "raw T xg, raw T hg, raw T h0, int32 n", "T h, raw T act, raw T hn",
        """
        const ptrdiff_t b = i / n, j = i % n, at = b * 3 * n + j;
        const T r = sig(xg[at] + hg[at]);
        const T z = sig(xg[at + n] + hg[at + n]);
        const T hh = hg[at + 2 * n];
        const T nn = tanh(xg[at + 2 * n] + r * hh);
        h = (T(1) - z) * nn + z * h0[i];
        act[at] = r; act[at + n] = z; act[at + 2 * n] = nn;
        hn[i] = hh;
        """, "atomr_gru_cell", preamble=f"template <typename T> __device__ {_SIGMOID}")
    rnn_tanh = cp.ElementwiseKernel("T xg, T hg", "T h", "h = tanh(xg + hg)",
                                    "atomr_rnn_tanh_cell")
    rnn_relu = cp.ElementwiseKernel("T xg, T hg", "T h", "h = max(xg + hg, T(0))",
                                    "atomr_rnn_relu_cell")
    return {RnnMode.LSTM: lstm, RnnMode.GRU: gru, RnnMode.RNN_TANH: rnn_tanh,
            RnnMode.RNN_RELU: rnn_relu}


def fused_cell() -> Cell:
    """The gate math of one step as one fused kernel launch."""
    kernels = _kernels()

    def cell(mode: RnnMode, xg: Any, hg: Any, h: Any, c: Any | None) -> Step:
        batch, n = h.shape
        kernel = kernels[mode]
        if mode is RnnMode.LSTM:
            h_new, c_new = cp.empty_like(h), cp.empty_like(h)
            act = cp.empty((batch, 4 * n), dtype=h.dtype)
            kernel(xg, hg, cp.ascontiguousarray(c), n, h_new, c_new, act)
            return Step(h_new, c_new, act, c_new)
        if mode is RnnMode.GRU:
            h_new, hn = cp.empty_like(h), cp.empty_like(h)
            act = cp.empty((batch, 3 * n), dtype=h.dtype)
            kernel(xg, hg, cp.ascontiguousarray(h), n, h_new, act, hn)
            return Step(h_new, None, act, hn)
        h_new = kernel(xg, hg)
        return Step(h_new, None, h_new, None)

    return cell


@cuda.handles(RnnFwd)
def rnn_fwd(backend: ArrayBackend, op: RnnFwd) -> str:
    """Run the network forward with the fused cells; answer ``"composed"``."""
    graphs.frontend()  # the cudnn library needs its package, as is_available() says
    run_forward(backend, op, fused_cell())
    return "composed"


@cuda.handles(RnnBwd)
def rnn_bwd(backend: ArrayBackend, op: RnnBwd) -> str:
    """Run the network's backward (the forward recomputed with the fused cells); answer
    ``"composed"``."""
    graphs.frontend()
    backward(backend, op, fused_cell())
    return "composed"
