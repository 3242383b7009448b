"""The cutlass library's ops on NumPy (``core.ops._cutlass``), and what both backends share:
the epilogue's node-by-node evaluation and the per-device counters.

The CPU computes what the CUDA kernels compute: products of the operands
widened to f32 and accumulated in f32 (f64 for f64), the epilogue in that
precision node by node, one rounding to D's dtype after the activation, a
reduction over the stored ``D``. It reports the plans CUDA would use on an
H100 (``plan_of``), so the counters behave alike on both backends.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cpu
from atomr_accel.backends._lazy import lazy_module
from atomr_accel.core._dtype import DType
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._cutlass import (
    Activate,
    Activation,
    Axis,
    BiasAdd,
    CutlassConv2d,
    CutlassGemm,
    CutlassGroupedGemm,
    CutlassStats,
    Epilogue,
    Reduce,
    ResidualAdd,
    Scale,
)
from atomr_accel.core.ops._cutlass_plan import KernelPlan, conv2d_plan, gemm_plan, grouped_plan

special = lazy_module("scipy.special")

__all__ = ["Ledger", "activate", "apply_epilogue", "ledger", "plan_of"]

Array = Any  # a NumPy or CuPy array


@dataclass
class Ledger:
    """A device's cutlass counters: kernels launched and the plans used."""

    dispatched: int = 0
    plans: set[KernelPlan] = field(default_factory=set)

    def launched(self, plan: KernelPlan, count: int = 1) -> None:
        """Count ``count`` launches of ``plan``'s kernel."""
        self.plans.add(plan)
        self.dispatched += count


_LEDGERS: weakref.WeakKeyDictionary[Any, Ledger] = weakref.WeakKeyDictionary()


def ledger(backend: Any) -> Ledger:
    """``backend``'s counters (made on first use)."""
    found = _LEDGERS.get(backend)
    if found is None:
        found = _LEDGERS[backend] = Ledger()
    return found


_gemm_plan = functools.lru_cache(maxsize=256)(gemm_plan)
"""``gemm_plan``, remembered for the problems seen last (a plan is a function of its
arguments' values alone): a repeated GEMM does not plan again."""


def plan_of(op: CutlassGemm | CutlassGroupedGemm | CutlassConv2d,
            arch: str = "sm_90a") -> KernelPlan:
    """The kernel plan an op runs with on ``arch`` (the GEMM's ``family`` honoured)."""
    if isinstance(op, CutlassGemm):
        bias = op.epilogue.bias_node
        axis = "row" if bias is not None and bias.axis is Axis.ROW else "column"
        return _gemm_plan(op.a.dtype, op.m, op.n, op.k, arch, axis, op.family)
    if isinstance(op, CutlassGroupedGemm):
        return grouped_plan(op.a.dtype, arch)
    return conv2d_plan(op.x.dtype, arch)


def activate(xp: Any, x: Array, fn: Activation, erf: Callable[[Array], Array]) -> Array:
    """``fn`` applied to the f32 or f64 array ``x``, in its precision (``erf``: the array
    module's error function)."""
    real = x.dtype.type
    if fn is Activation.RELU:
        return xp.maximum(x, real(0))
    if fn is Activation.GELU:
        return (real(0.5) * x * (real(1) + erf(x * real(np.sqrt(0.5))))).astype(x.dtype)
    if fn is Activation.SILU:
        return (x / (real(1) + xp.exp(-x))).astype(x.dtype)
    return x


def apply_epilogue(xp: Any, acc: Array, epilogue: Epilogue, fetch: Callable[[GpuRef], Array],
                   out: Array, erf: Callable[[Array], Array]) -> None:
    """Run ``epilogue``'s nodes over the ``m x n`` accumulator ``acc`` (f32, or f64 for an f64
    GEMM) in its precision and store into ``out`` (``m x n`` of D's dtype); ``fetch`` gives a
    buffer's flat array. A reduction sums in the accumulator's precision."""
    m, n = acc.shape
    x = acc
    real = acc.dtype.type
    stored = False
    for node in epilogue.nodes:
        if isinstance(node, Scale):
            x = x * real(node.alpha)
        elif isinstance(node, BiasAdd):
            vector = fetch(node.bias).astype(acc.dtype)
            x = x + (vector[:m, None] if node.axis is Axis.ROW else vector[None, :n])
        elif isinstance(node, ResidualAdd):
            x = x + real(node.beta) * fetch(node.c)[: m * n].reshape(m, n).astype(acc.dtype)
        elif isinstance(node, Activate):
            x = activate(xp, x, node.fn, erf)
        elif isinstance(node, Reduce):
            out[...] = x
            stored = True
            target = fetch(node.out)
            target[: m if node.axis is Axis.ROW else n] = out.astype(acc.dtype).sum(
                axis=1 if node.axis is Axis.ROW else 0, dtype=acc.dtype)
    if not stored:
        out[...] = x


def _erf(x: Array) -> Array:
    return special.erf(x).astype(x.dtype)


def _matrix(backend: ArrayBackend, ref: GpuRef, rows: int, cols: int, start: int = 0) -> Array:
    flat = backend.array(ref.buffer_id)
    return flat[start: start + rows * cols].reshape(rows, cols)


@cpu.handles(CutlassGemm, quiet=True)
def gemm(backend: ArrayBackend, op: CutlassGemm) -> None:
    """``D = epilogue(A @ B)`` in f32 (f64 for f64)."""
    acc = np.float64 if op.a.dtype is DType.F64 else np.float32
    a = _matrix(backend, op.a, op.m, op.k).astype(acc)
    b = _matrix(backend, op.b, op.k, op.n).astype(acc)
    out = _matrix(backend, op.d, op.m, op.n)
    apply_epilogue(np, a @ b, op.epilogue, lambda r: backend.array(r.buffer_id), out, _erf)
    ledger(backend).launched(plan_of(op))


@cpu.handles(CutlassGroupedGemm, quiet=True)
def grouped_gemm(backend: ArrayBackend, op: CutlassGroupedGemm) -> None:
    """``D_i = alpha * A_i @ B_i`` for every problem, in f32."""
    for (m, n, k), (oa, ob, od) in zip(op.problems, op.offsets(), strict=True):
        if m == 0 or n == 0:
            continue
        a = _matrix(backend, op.a, m, k, oa).astype(np.float32)
        b = _matrix(backend, op.b, k, n, ob).astype(np.float32)
        _matrix(backend, op.d, m, n, od)[...] = np.float32(op.alpha) * (a @ b)
    if any(m and n and k for m, n, k in op.problems):  # CUDA launches only for those
        ledger(backend).launched(plan_of(op))


@cpu.handles(CutlassConv2d, quiet=True)
def conv2d(backend: ArrayBackend, op: CutlassConv2d) -> None:
    """The forward convolution, one filter tap at a time, in f32."""
    p, q = op.out_hw
    (ph, pw), (sh, sw), (dh, dw) = op.pad, op.stride, op.dilation
    x = backend.array(op.x.buffer_id)[: op.n * op.h * op.w * op.c].reshape(
        op.n, op.h, op.w, op.c).astype(np.float32)
    x = np.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0)))
    w = backend.array(op.weight.buffer_id)[: op.k * op.r * op.s * op.c].reshape(
        op.k, op.r, op.s, op.c).astype(np.float32)
    acc = np.zeros((op.n, p, q, op.k), np.float32)
    for r in range(op.r):
        for s in range(op.s):
            window = x[:, r * dh: r * dh + (p - 1) * sh + 1: sh,
                       s * dw: s * dw + (q - 1) * sw + 1: sw, :]
            acc += window @ w[:, r, s, :].T
    acc *= np.float32(op.alpha)
    if op.bias is not None:
        acc += backend.array(op.bias.buffer_id)[: op.k].astype(np.float32)
    y = backend.array(op.y.buffer_id)
    y[: acc.size] = acc.reshape(-1)
    ledger(backend).launched(plan_of(op))


@cpu.handles(CutlassStats, quiet=True)
def stats(backend: ArrayBackend, op: CutlassStats) -> tuple[int, int]:
    """``(kernels launched, distinct plans used)`` on this device."""
    book = ledger(backend)
    return book.dispatched, len(book.plans)
