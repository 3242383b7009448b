"""The cutlass library's ops on CUDA: CUTLASS kernels built from their plans
(``backends._cutlass_build``), launched on the op's stream through ctypes.

Every handler runs inside the op's stream context: scratch (workspace, a
transposed f32 ``B``, padded grouped operands) comes from CuPy's pool on that
stream, so it is reused only after the kernel that reads it, and nothing
synchronizes. A reduction node of an epilogue runs as a CuPy sum over the
stored ``D`` right after the GEMM. Once a GEMM of a signature (``signature``:
dtypes, shape, family, epilogue nodes) or a convolution ran, its kernels are
loaded and the next ones only queue work (``_prepared``), so a repeated
awaited call launches from the caller's event loop and gathered calls keep the
device busy. The device's compute capability names the
architecture the kernels are planned and compiled for (8.0, 8.6, 8.9, 9.0,
10.0, 12.0); another device raises ``LibraryUnavailable``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import cupy as cp
import numpy as np

from atomr_accel.backends._cutlass_build import CompiledKernel, library
from atomr_accel.backends._handlers import cuda
from atomr_accel.backends._optional import require
from atomr_accel.backends._state import Lru, per_backend
from atomr_accel.backends.cpu._cutlass import ledger, plan_of
from atomr_accel.backends.cuda._prepared import prepares, prepares_alike, ran
from atomr_accel.core._errors import LibraryError, LibraryUnavailable
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._cutlass import (
    Axis,
    CutlassConv2d,
    CutlassGemm,
    CutlassGroupedGemm,
    CutlassStats,
    alignment,
)
from atomr_accel.core.ops._cutlass_plan import KernelPlan

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend
    from atomr_accel.core.ops._cutlass_fp8 import CutlassGemmFp8

__all__: list[str] = []

_STEPS = {1: "the kernel cannot run this problem (can_implement)",
          2: "initializing the kernel failed", 3: "launching the kernel failed",
          4: "uploading the grouped problem tables failed"}


@functools.cache
def _sm_count(device: int) -> int:
    return int(cp.cuda.Device(device).attributes["MultiProcessorCount"])


_ARCH_OF = {"80": "sm_80", "86": "sm_86", "89": "sm_89", "90": "sm_90a", "100": "sm_100",
            "120": "sm_120"}
"""The architecture a device of each compute capability gets kernels for."""


@functools.cache
def _compute_capability(device: int) -> str:
    return str(cp.cuda.Device(device).compute_capability)


def device_arch(backend: CudaBackend) -> str:
    """The architecture this device's kernels are planned and compiled for; a device of
    another compute capability raises ``LibraryUnavailable``."""
    require("cutlass")
    cc = _compute_capability(backend.device_id)
    arch = _ARCH_OF.get(cc)
    if arch is None:
        raise LibraryUnavailable("cutlass", "nvidia-cutlass", "cutlass",
                                 f"its kernels are built for {', '.join(_ARCH_OF.values())}; "
                                 f"this device is sm_{cc}")
    return arch


def _check(status: int, plan: KernelPlan) -> None:
    if status != 0:
        raise LibraryError("cutlass", status, f"{plan.name}: {_STEPS.get(status, 'failed')}")


def _ptr(backend: CudaBackend, ref: GpuRef, offset: int = 0) -> int:
    return int(backend.array(ref.buffer_id).data.ptr) + offset * ref.dtype.itemsize


def _workspace(nbytes: int) -> tuple[Any, int]:
    """Scratch of ``nbytes`` on the current stream (None, 0 when none is needed)."""
    if nbytes == 0:
        return None, 0
    buf = cp.empty(nbytes, dtype=cp.uint8)
    return buf, int(buf.data.ptr)


class _Launches:
    """A backend's GEMM launches prepared for fixed operands (``atomr_prepare``), by kernel,
    problem, pointers and scalars: a repeated call only launches (``atomr_launch``), its
    arguments not built, checked and initialized again. A key holds every value the
    kernel's arguments are made of, so a buffer freed and another allocated at its address
    launches with the same, still right, arguments. The ``SIZE`` most recently used are
    kept; the others are released."""

    SIZE = 64

    def __init__(self) -> None:
        self._kept: Lru[tuple[CompiledKernel, int]] = Lru(self.SIZE, self._release)

    @staticmethod
    def _release(_key: object, launch: tuple[CompiledKernel, int]) -> None:
        kernel, handle = launch
        kernel.lib.atomr_release(handle)

    def find(self, key: tuple[Any, ...]) -> int | None:
        """The prepared launch under ``key``, or None."""
        found = self._kept.find(key)
        return None if found is None else found[1]

    def prepare(self, key: tuple[Any, ...], kernel: CompiledKernel, plan: KernelPlan,
                args: tuple[Any, ...]) -> int:
        """Prepare ``kernel``'s launch for ``args`` (``atomr_run``'s) and keep it under
        ``key``."""
        status = ctypes.c_int(0)
        handle = kernel.lib.atomr_prepare(*args, ctypes.byref(status))
        _check(status.value, plan)
        self._kept.put(key, (kernel, handle))
        return int(handle)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the libraries may be gone
            for launch in self._kept.values():
                self._release(None, launch)


_launches_of = per_backend(_Launches)


def _run_epilogue_gemm(backend: CudaBackend, op: CutlassGemm | CutlassGemmFp8,
                       plan: KernelPlan, b_ptr: int, alpha: float,
                       sum_dtype: Any = None) -> None:
    """Launch ``plan``'s kernel for ``D = epilogue(alpha * A @ B)`` with B at ``b_ptr``
    (bias, residual and activation fused), then the epilogue's reduction as a CuPy sum
    over D in ``sum_dtype`` (None: the reduction output's dtype). A kernel that needs no
    workspace launches as prepared for these operands before (``_Launches``)."""
    kernel = library(plan)
    m, n, k = op.m, op.n, op.k
    ep = op.epilogue
    residual, bias = ep.residual, ep.bias_node
    d_ptr = _ptr(backend, op.d)
    c_ptr = d_ptr if residual is None else _ptr(backend, residual.c)
    beta = 0.0 if residual is None else float(residual.beta)
    bias_ptr = None if bias is None else _ptr(backend, bias.bias)
    sm = _sm_count(backend.device_id)
    stream = cp.cuda.get_current_stream().ptr
    operands = (m, n, k, _ptr(backend, op.a), b_ptr, c_ptr, d_ptr, bias_ptr, alpha, beta,
                ep.act.code)
    launches = _launches_of(backend)
    key = (id(kernel), sm, *operands)  # kernels are loaded once and never unloaded
    handle = launches.find(key)
    if handle is None:
        nbytes = kernel.lib.atomr_workspace(m, n, k, sm)
        if nbytes == 0:
            handle = launches.prepare(key, kernel, plan, (*operands, None, sm, stream))
    if handle is not None:
        _check(kernel.lib.atomr_launch(handle, stream), plan)
    else:
        ws, ws_ptr = _workspace(nbytes)
        _check(kernel.lib.atomr_run(*operands, ws_ptr, sm, stream), plan)
        del ws
    ledger(backend).launched(plan)
    reduction = ep.reduction
    if reduction is not None:
        d = backend.array(op.d.buffer_id)[: m * n].reshape(m, n)
        axis = 1 if reduction.axis is Axis.ROW else 0
        out = backend.array(reduction.out.buffer_id)[: m if axis == 1 else n]
        cp.sum(d, axis=axis, dtype=out.dtype if sum_dtype is None else sum_dtype, out=out)


def signature(op: CutlassGemm | CutlassGemmFp8) -> Hashable:
    """What a GEMM's first run builds from (its kernel, a transposition, a reduction's sum):
    its class, dtypes, shape, family, and each epilogue node's kind, axis or activation;
    not its buffers or scalars."""
    nodes = tuple((type(node), getattr(node, "axis", None), getattr(node, "fn", None))
                  for node in op.epilogue.nodes)
    return (type(op), op.a.dtype, op.d.dtype, op.m, op.n, op.k, getattr(op, "family", None),
            nodes)


prepares_alike(CutlassGemm, signature)
prepares(CutlassConv2d)


@cuda.handles(CutlassGemm)
def gemm(backend: CudaBackend, op: CutlassGemm) -> None:
    """The fused GEMM; for the ``sm90`` family an f32 ``B`` is transposed first (its TF32
    operands are K-major). Once it ran, ops of its signature only queue work (``ran``)."""
    plan = plan_of(op, device_arch(backend))
    k, n = op.k, op.n
    if plan.dtype.value == "f32" and plan.family == "sm90":
        bt = cp.ascontiguousarray(backend.array(op.b.buffer_id)[: k * n].reshape(k, n).T)
        _run_epilogue_gemm(backend, op, plan, int(bt.data.ptr), op.epilogue.alpha)
    else:
        _run_epilogue_gemm(backend, op, plan, _ptr(backend, op.b), op.epilogue.alpha)
    ran(backend, op)


def _padded(x: Any, rows: int, cols: int) -> Any:
    out = cp.zeros((rows, cols), dtype=x.dtype)
    out[: x.shape[0], : x.shape[1]] = x
    return out


@cuda.handles(CutlassGroupedGemm)
def grouped_gemm(backend: CudaBackend, op: CutlassGroupedGemm) -> None:
    """One ptr-array grouped launch over every non-empty problem. A problem whose ``k`` or
    ``n`` is not a multiple of the vector width, or whose operands do not start on 16
    bytes, runs on zero-padded copies (written back after the launch); ``k = 0`` writes
    zeros."""
    plan = plan_of(op, device_arch(backend))
    step = alignment(plan.dtype)
    item = plan.dtype.itemsize
    a_all, b_all, d_all = (backend.array(r.buffer_id) for r in (op.a, op.b, op.d))
    base = (int(a_all.data.ptr), int(b_all.data.ptr), int(d_all.data.ptr))
    shapes: list[tuple[int, int, int]] = []
    pointers: list[int] = []
    staged: list[tuple[Any, Any]] = []  # (padded D, the problem's D view)
    keep: list[Any] = []
    for (m, n, k), (oa, ob, od) in zip(op.problems, op.offsets(), strict=True):
        if m == 0 or n == 0:
            continue
        d_view = d_all[od: od + m * n].reshape(m, n)
        if k == 0:
            d_view.fill(0)
            continue
        ptrs = (base[0] + oa * item, base[1] + ob * item, base[2] + od * item)
        if n % step or k % step or any(p % 16 for p in ptrs):
            kp, np_ = -(-k // step) * step, -(-n // step) * step
            a = _padded(a_all[oa: oa + m * k].reshape(m, k), m, kp)
            b = _padded(b_all[ob: ob + k * n].reshape(k, n), kp, np_)
            d = cp.empty((m, np_), dtype=d_all.dtype)
            keep += [a, b]
            staged.append((d, d_view))
            shapes.append((m, np_, kp))
            pointers += [int(a.data.ptr), int(b.data.ptr), int(d.data.ptr)]
        else:
            shapes.append((m, n, k))
            pointers += list(ptrs)
    if not shapes:
        return
    kernel = library(plan)
    mnk = np.ascontiguousarray(np.array(shapes, dtype=np.int32).reshape(-1))
    table = np.ascontiguousarray(np.array(pointers, dtype=np.uint64))
    sm = _sm_count(backend.device_id)
    groups = len(shapes)
    ws, ws_ptr = _workspace(kernel.lib.atomr_workspace(groups, mnk.ctypes.data, sm))
    stream = cp.cuda.get_current_stream().ptr
    _check(kernel.lib.atomr_run(groups, mnk.ctypes.data, table.ctypes.data, float(op.alpha),
                                ws_ptr, sm, stream), plan)
    ledger(backend).launched(plan)
    for padded, view in staged:
        view[...] = padded[:, : view.shape[1]]
    del ws, keep


@cuda.handles(CutlassConv2d)
def conv2d(backend: CudaBackend, op: CutlassConv2d) -> None:
    """The implicit-GEMM forward convolution; the bias (zeros without one) is a stride-0 C.
    Once it ran, the op only queues work (``ran``)."""
    plan = plan_of(op, device_arch(backend))
    kernel = library(plan)
    p, q = op.out_hw
    dims = np.array([op.n, op.h, op.w, op.c, op.k, op.r, op.s, p, q, op.pad[0], op.pad[1],
                     op.stride[0], op.stride[1], op.dilation[0], op.dilation[1]], dtype=np.int32)
    if op.bias is None:
        zeros = cp.zeros(op.k, dtype=backend.array(op.y.buffer_id).dtype)
        bias_ptr = int(zeros.data.ptr)
    else:
        zeros, bias_ptr = None, _ptr(backend, op.bias)
    ws, ws_ptr = _workspace(kernel.lib.atomr_workspace(dims.ctypes.data))
    stream = cp.cuda.get_current_stream().ptr
    _check(kernel.lib.atomr_run(dims.ctypes.data, _ptr(backend, op.x), _ptr(backend, op.weight),
                                bias_ptr, _ptr(backend, op.y), float(op.alpha), ws_ptr, stream),
           plan)
    ledger(backend).launched(plan)
    del ws, zeros
    ran(backend, op)


@cuda.handles(CutlassStats)
def stats(backend: CudaBackend, op: CutlassStats) -> tuple[int, int]:
    """``(kernels launched, distinct plans used)`` on this device."""
    book = ledger(backend)
    return book.dispatched, len(book.plans)
