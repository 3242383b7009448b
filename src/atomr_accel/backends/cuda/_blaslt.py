"""cuBLASLt-shaped matmuls with fused epilogues on the cuda backend, through nvmath-python's
cuBLASLt bindings called directly.

cuBLASLt's bias and auxiliary epilogues work on column-major results with a
bias per row. Our matrices are row-major with a bias per column, and a
row-major ``m x n`` ``D`` is a column-major ``n x m`` matrix ``D^T``; so each
op runs as ``D^T = op(B)^T @ op(A)^T`` over the buffers as they are (no
copies), with ``D^T`` computed in place in ``d`` (``C`` and ``D`` are the same
matrix; ``C`` is read only when ``beta != 0``). In that frame our per-column
bias is cuBLASLt's per-row bias, our ``bgrada``/``bgradb`` are its
``BGRADB``/``BGRADA``, and the auxiliary buffers' column-major layouts are the
row-major ones documented in ``core.ops._blaslt``. The matrix layouts are the
ones nvmath's ``Matmul`` chose for the same transposed views before: a
row-major operand is described in cuBLASLt's ``ROW`` order rather than
transposed, and ``BGRADB`` (which wants its ``B`` transposed) gets the
transposed ``B`` in the other order with ``TRANSB = T``.

A plan (``_Plan``) is made once per op type, dtype, shape, transposes,
epilogue, aux, compute type and operand alignment and kept in a small LRU
cache per context (``PlanCache``): the matmul descriptor (compute and scale
type, transposes, epilogue, aux leading dimension), the layouts of A, B and
C = D, and the best algorithm of cuBLASLt's heuristic, asked once (a host
call: planning waits for no stream). The cache also holds the context's
cuBLASLt handle and one ``WORKSPACE``-byte workspace per stream, so calls on
different streams never share one. A call sets only what changed since the
plan's last call (the bias or bias-gradient pointer, the aux pointer, alpha
and beta, kept as host scalars of the scale type) and calls ``cublasLtMatmul``
on the op's stream. On an H100, 64 bf16 matmuls of different shapes took the
handler 11 to 20 us a call this way against 56 us through nvmath's
``Matmul.execute`` (a loop of ``execute`` calls alone took about 38 us a call,
one of bare binding calls 15 us). Bias gradients and auxiliary outputs (ReLU mask,
GELU input) are written straight into the op's buffers.

Where cuBLASLt refuses a bias-gradient epilogue in the layout at hand, the
plan runs the epilogue without the gradient and CuPy sums the gradient on the
same stream (``_sum_bias_grad``). On an H100 that is our ``bgrada`` with
``A`` stored as it is (cuBLASLt's ``BGRADB`` takes no row-major ``B``) and
our ``bgradb`` with ``B`` stored transposed; both failed with
``CUBLAS_STATUS_NOT_SUPPORTED`` through nvmath before. Nothing here
synchronizes the device. Handlers answer ``"nvmath"``.
"""

from __future__ import annotations

import functools
import importlib
import weakref
from collections.abc import Hashable
from typing import Any

import cupy as cp
import numpy as np

from atomr_accel.backends._handlers import cuda
from atomr_accel.backends._optional import require
from atomr_accel.backends._state import Lru, per_backend
from atomr_accel.core._dtype import DType
from atomr_accel.core.ops._blaslt import (
    Epilogue,
    FusedMatmul,
    FusedMatmulGrad,
    gelu_aux_ld,
    relu_aux_ld,
)

__all__ = ["PLANS", "WORKSPACE", "PlanCache", "fused_matmul", "fused_matmul_grad", "plans_of"]

_CUDA_TYPE = {DType.F32: 0, DType.F64: 1, DType.F16: 2, DType.BF16: 14}
"""``cudaDataType_t`` of each dtype (``CUDA_R_32F``, ``CUDA_R_64F``, ``CUDA_R_16F``,
``CUDA_R_16BF``)."""
_COMPUTE_32F, _COMPUTE_64F, _COMPUTE_32F_FAST_TF32 = 68, 70, 77
"""``cublasComputeType_t`` values: f32 accumulation (f16, bf16, f32 data), f64, TF32 products."""
_OP_T = 1
"""``cublasOperation_t``'s ``CUBLAS_OP_T``."""

WORKSPACE = 32 * 2**20
"""Bytes of the workspace each stream's matmuls share, made on a stream's first matmul."""
_WORKSPACE_SLACK = 256
"""Bytes of ``WORKSPACE`` the heuristic may not ask for (nvmath pads an epilogue's workspace
by 16 bytes, a workaround of a cuBLASLt issue)."""

PLANS = 128
"""How many plans a context keeps. Planning one asks cuBLASLt's heuristic (host time), so a
workload cycling through more shapes than the cache holds plans on every call."""


class _Library:
    """nvmath's cuBLASLt bindings and the attribute numbers the hot path uses, as plain ints."""

    def __init__(self) -> None:
        require("blaslt")  # LibraryUnavailable where nvmath is missing
        lt = importlib.import_module("nvmath.bindings.cublasLt")
        self.lt = lt
        desc = lt.MatmulDescAttribute
        self.bias_pointer = int(desc.BIAS_POINTER)
        self.aux_pointer = int(desc.EPILOGUE_AUX_POINTER)
        self.version = int(lt.get_version())
        self.algo_offset = int(lt.matmul_heuristic_result_dtype.fields["algo"][1])

    def set_desc(self, desc: int, attribute: Any, value: int) -> None:
        """Set a matmul descriptor attribute to ``value`` (in the attribute's own type)."""
        lt = self.lt
        buf = np.array([value], dtype=lt.get_matmul_desc_attribute_dtype(attribute))
        lt.matmul_desc_set_attribute(desc, attribute, buf.ctypes.data, buf.itemsize)

    def set_layout(self, layout: int, attribute: Any, value: int) -> None:
        """Set a matrix layout attribute to ``value``."""
        lt = self.lt
        buf = np.array([value], dtype=lt.get_matrix_layout_attribute_dtype(attribute))
        lt.matrix_layout_set_attribute(layout, attribute, buf.ctypes.data, buf.itemsize)

    def set_preference(self, preference: int, attribute: Any, value: int) -> None:
        """Set a matmul preference attribute to ``value``."""
        lt = self.lt
        buf = np.array([value], dtype=lt.get_matmul_preference_attribute_dtype(attribute))
        lt.matmul_preference_set_attribute(preference, attribute, buf.ctypes.data, buf.itemsize)


@functools.cache
def _library() -> _Library:
    """The bindings, imported on first use (raises ``LibraryUnavailable`` without nvmath)."""
    return _Library()


def _epilogue_name(epilogue: Epilogue, with_aux: bool) -> str:
    """The name of cuBLASLt's ``Epilogue`` member that runs ``epilogue`` in the transposed
    frame."""
    if epilogue is Epilogue.NONE:
        return "DEFAULT"
    if epilogue is Epilogue.BGRADA:
        return "BGRADB"
    if epilogue is Epilogue.BGRADB:
        return "BGRADA"
    names = {Epilogue.BIAS: "BIAS", Epilogue.RELU: "RELU", Epilogue.GELU: "GELU",
             Epilogue.BIAS_RELU: "RELU_BIAS", Epilogue.BIAS_GELU: "GELU_BIAS"}
    if epilogue in names:
        name = names[epilogue]
        if with_aux:  # RELU -> RELU_AUX, RELU_BIAS -> RELU_AUX_BIAS, ...
            head, _, tail = name.partition("_")
            name = f"{head}_AUX" + (f"_{tail}" if tail else "")
        return name
    return epilogue.value.upper()  # DRELU, DGELU, DRELU_BGRAD, DGELU_BGRAD


def _layout(rows: int, cols: int, row_stride: int, col_stride: int,
            transpose: bool = False) -> tuple[int, int, int, bool]:
    """(rows, cols, ld, row order) of a strided matrix as nvmath describes it to cuBLASLt; with
    ``transpose``, of its transpose over the same memory (the order flips)."""
    row_order = row_stride != 1 and col_stride == 1
    ld = max(cols, row_stride) if row_order else max(rows, col_stride)
    if not transpose:
        return rows, cols, ld, row_order
    if row_order:
        return cols, rows, max(cols, row_stride), False
    return cols, rows, max(rows, col_stride), True


def _destroy(lt: Any, desc: int, layouts: list[int]) -> None:
    """Destroy a plan's descriptors (host objects; work already queued is unaffected)."""
    for layout in layouts:
        lt.matrix_layout_destroy(layout)
    lt.matmul_desc_destroy(desc)


class _Plan:
    """A planned matmul: its descriptors, best algorithm and host scalars, and the pointers
    and scalars its descriptor holds from its last call."""

    __slots__ = ("__weakref__", "a_layout", "algo", "alpha", "aux", "b_layout", "beta", "bias",
                 "d_layout", "desc", "layouts", "pointer_addr", "pointers", "reduce", "release",
                 "results", "scalars", "scalars_addr")

    def __init__(self, lib: _Library, desc: int, scale: type, reduce: bool) -> None:
        self.desc = desc
        self.reduce = reduce
        """True when cuBLASLt refused the bias-gradient epilogue: the plan runs it without the
        gradient, which the handler then sums with CuPy (``_sum_bias_grad``)."""
        self.layouts: list[int] = []  # every layout made for the plan, destroyed with it
        self.release = weakref.finalize(self, _destroy, lib.lt, desc, self.layouts)
        self.a_layout = self.b_layout = self.d_layout = 0
        self.results: Any = None  # the heuristic's answer: keeps the algorithm's memory
        self.algo = 0
        self.scalars: Any = np.zeros(2, dtype=scale)  # alpha, beta (host pointer mode)
        self.scalars_addr = int(self.scalars.ctypes.data)
        self.alpha = self.beta = 0.0
        self.pointers: Any = np.zeros(2, dtype=np.uint64)  # bias (or bias gradient), aux
        self.pointer_addr = int(self.pointers.ctypes.data)
        self.bias = self.aux = 0

    def set_scalars(self, alpha: float, beta: float) -> None:
        """Hold ``alpha`` and ``beta`` for the next call."""
        self.scalars[0], self.scalars[1] = alpha, beta
        self.alpha, self.beta = alpha, beta

    def set_bias(self, lib: _Library, pointer: int) -> None:
        """Point the descriptor's bias (or bias gradient) at ``pointer``."""
        self.pointers[0] = pointer
        lib.lt.matmul_desc_set_attribute(self.desc, lib.bias_pointer, self.pointer_addr, 8)
        self.bias = pointer

    def set_aux(self, lib: _Library, pointer: int) -> None:
        """Point the descriptor's auxiliary matrix at ``pointer``."""
        self.pointers[1] = pointer
        lib.lt.matmul_desc_set_attribute(self.desc, lib.aux_pointer, self.pointer_addr + 8, 8)
        self.aux = pointer

    def free(self) -> None:
        """Destroy the descriptors now (else when the plan is collected, or at exit)."""
        self.release()


class PlanCache:
    """One context's cuBLASLt state: the ``size`` most recently used plans (an evicted plan
    is freed, and so are the rest with the cache), the cuBLASLt handle and a workspace per
    stream."""

    def __init__(self, size: int = PLANS) -> None:
        self.plans: Lru[_Plan] = Lru(size, self._evicted)
        self._handle = 0
        self._workspaces: dict[int, tuple[Any, int]] = {}  # stream pointer -> (array, pointer)

    @staticmethod
    def _evicted(_key: Hashable, plan: _Plan) -> None:
        plan.free()

    def handle(self) -> int:
        """The context's cuBLASLt handle (made on first use, with the device current)."""
        if not self._handle:
            lt = _library().lt
            self._handle = int(lt.create())
            weakref.finalize(self, lt.destroy, self._handle)
        return self._handle

    def workspace(self, stream: int) -> int:
        """The device address of the workspace of the stream at ``stream`` (made on first
        use from CuPy's pool, ``WORKSPACE`` bytes)."""
        held = self._workspaces.get(stream)
        if held is None:
            array = cp.empty(WORKSPACE, dtype=cp.uint8)
            held = self._workspaces[stream] = (array, int(array.data.ptr))
        return held[1]

    def __len__(self) -> int:
        return len(self.plans)


plans_of = per_backend(PlanCache)
"""The cuBLASLt state of a backend (one per context; it goes with the backend)."""


_WITHOUT_GRAD = {"BGRADA": "DEFAULT", "BGRADB": "DEFAULT", "DRELU_BGRAD": "DRELU",
                 "DGELU_BGRAD": "DGELU"}
"""The epilogue a bias-gradient epilogue falls back to where cuBLASLt refuses it."""


def _plan(lib: _Library, handle: int, op: FusedMatmul | FusedMatmulGrad, with_aux: bool,
          tf32: bool, align: int, bias: int, aux: int) -> _Plan:
    """Describe ``op`` to cuBLASLt in the transposed frame and ask its heuristic for the best
    algorithm (host calls only). Where cuBLASLt refuses a bias-gradient epilogue in this
    layout, the plan runs the epilogue without the gradient and says so (``reduce``)."""
    name = _epilogue_name(op.epilogue, with_aux)
    try:
        return _make_plan(lib, handle, op, name, with_aux, tf32, align, bias, aux)
    except (RuntimeError, lib.lt.cuBLASLtError):
        fallback = _WITHOUT_GRAD.get(name)
        if fallback is None:
            raise
    return _make_plan(lib, handle, op, fallback, with_aux, tf32, align, 0, aux, reduce=True)


def _make_plan(lib: _Library, handle: int, op: FusedMatmul | FusedMatmulGrad, name: str,
               with_aux: bool, tf32: bool, align: int, bias: int, aux: int,
               reduce: bool = False) -> _Plan:
    """A plan of ``op`` running cuBLASLt's epilogue ``name`` (see ``_plan``)."""
    lt = lib.lt
    m, n, k = op.m, op.n, op.k
    dtype = op.d.dtype
    cuda_type = _CUDA_TYPE[dtype]
    f64 = dtype is DType.F64
    compute = _COMPUTE_64F if f64 else _COMPUTE_32F_FAST_TF32 if tf32 else _COMPUTE_32F
    plan = _Plan(lib, int(lt.matmul_desc_create(compute, 1 if f64 else 0)),
                 np.float64 if f64 else np.float32, reduce)
    try:
        attr = lt.MatmulDescAttribute
        epilogue = lt.Epilogue[name]
        lib.set_desc(plan.desc, attr.EPILOGUE, int(epilogue))
        bgradb = epilogue == lt.Epilogue.BGRADB
        if bgradb:  # cuBLASLt's BGRADB wants B transposed
            lib.set_desc(plan.desc, attr.TRANSB, _OP_T)
        # A' = op(B)^T (n x k) and B' = op(A)^T (k x m), as strided views of the buffers.
        shapes = (_layout(n, k, k, 1) if op.trans_b else _layout(n, k, 1, n),
                  _layout(k, m, m, 1, bgradb) if op.trans_a else _layout(k, m, 1, k, bgradb),
                  _layout(n, m, 1, n))
        made = []
        for rows, cols, ld, row_order in shapes:
            layout = int(lt.matrix_layout_create(cuda_type, rows, cols, ld))
            made.append(layout)
            plan.layouts.append(layout)
            if row_order:
                lib.set_layout(layout, lt.MatrixLayoutAttribute.ORDER, int(lt.Order.ROW))
        plan.a_layout, plan.b_layout, plan.d_layout = made
        kind = op.epilogue.activation
        if kind is not None and (with_aux or op.epilogue.is_backward):
            ld = relu_aux_ld(n) * 8 if kind == "relu" else gelu_aux_ld(n)  # in elements (bits)
            lib.set_desc(plan.desc, attr.EPILOGUE_AUX_LD, ld)
            if kind == "gelu" and with_aux and lib.version >= 120800:
                lib.set_desc(plan.desc, attr.EPILOGUE_AUX_DATA_TYPE, cuda_type)
            plan.set_aux(lib, aux)
        if bias:
            plan.set_bias(lib, bias)
        preference = int(lt.matmul_preference_create())
        try:
            pref = lt.MatmulPreferenceAttribute
            lib.set_preference(preference, pref.MAX_WORKSPACE_BYTES, WORKSPACE - _WORKSPACE_SLACK)
            for operand in ("A", "B", "C", "D"):
                minimum = getattr(pref, f"MIN_ALIGNMENT_{operand}_BYTES")
                lib.set_preference(preference, minimum, align)
            results = lt.MatmulHeuristicResult(1)
            found = np.zeros(1, dtype=np.int32)
            lt.matmul_algo_get_heuristic(handle, plan.desc, plan.a_layout, plan.b_layout,
                                         plan.d_layout, plan.d_layout, preference, 1,
                                         results.ptr, found.ctypes.data)
        finally:
            lt.matmul_preference_destroy(preference)
        if found[0] < 1:
            raise RuntimeError(f"cuBLASLt has no algorithm for {type(op).__name__} "
                               f"{dtype.value} m={m} n={n} k={k} {op.epilogue.value}")
        plan.results = results
        plan.algo = int(results.ptr) + lib.algo_offset
    except BaseException:
        plan.free()
        raise
    return plan


def _run(backend: Any, op: FusedMatmul | FusedMatmulGrad, bias: int, aux: int,
         with_aux: bool) -> _Plan:
    """Queue ``op`` on the current stream with its cached (or a new) plan, and answer the plan;
    ``bias`` is the address of the bias or bias gradient, ``aux`` of the auxiliary matrix (0:
    none)."""
    lib = _library()
    pointer = backend.pointer
    a, b, d = pointer(op.a.buffer_id), pointer(op.b.buffer_id), pointer(op.d.buffer_id)
    low = (a | b | d) & 255
    align = low & -low if low else 256
    tf32 = op.allow_tf32 and op.d.dtype is DType.F32
    key = (type(op), op.d.dtype, op.m, op.n, op.k, op.trans_a, op.trans_b, op.epilogue,
           with_aux, tf32, align)
    cache = plans_of(backend)
    handle = cache.handle()
    plan = cache.plans.find(key)
    if plan is None:
        plan = _plan(lib, handle, op, with_aux, tf32, align, bias, aux)
        cache.plans.put(key, plan)
    if bias != plan.bias and not plan.reduce:
        plan.set_bias(lib, bias)
    if aux != plan.aux:
        plan.set_aux(lib, aux)
    alpha, beta = float(op.alpha), float(op.beta)
    if alpha != plan.alpha or beta != plan.beta:
        plan.set_scalars(alpha, beta)
    stream = cp.cuda.get_current_stream().ptr
    scalars = plan.scalars_addr
    lib.lt.matmul(handle, plan.desc, scalars, b, plan.a_layout, a, plan.b_layout,
                  scalars + plan.scalars.itemsize, d, plan.d_layout, d, plan.d_layout,
                  plan.algo, cache.workspace(stream), WORKSPACE, stream)
    return plan


def _sum_bias_grad(backend: Any, op: FusedMatmulGrad) -> None:
    """Write ``op``'s bias gradient with CuPy on the current stream, after its matmul: the row
    sums of ``op(A)`` (``bgrada``), the column sums of ``op(B)`` (``bgradb``) or of ``D``,
    accumulated in f32 (f64 for f64 data)."""
    assert op.bias_grad is not None
    m, n, k = op.m, op.n, op.k
    wide = cp.float64 if op.d.dtype is DType.F64 else cp.float32
    if op.epilogue is Epilogue.BGRADA:
        a = backend.array(op.a.buffer_id)[: m * k]
        grad = (a.reshape(k, m).sum(axis=0, dtype=wide) if op.trans_a
                else a.reshape(m, k).sum(axis=1, dtype=wide))
    elif op.epilogue is Epilogue.BGRADB:
        b = backend.array(op.b.buffer_id)[: k * n]
        grad = (b.reshape(n, k).sum(axis=1, dtype=wide) if op.trans_b
                else b.reshape(k, n).sum(axis=0, dtype=wide))
    else:
        grad = backend.array(op.d.buffer_id)[: m * n].reshape(m, n).sum(axis=0, dtype=wide)
    backend.array(op.bias_grad.buffer_id)[: grad.size] = grad


@cuda.handles(FusedMatmul)
def fused_matmul(backend: Any, op: FusedMatmul) -> str:
    """Write ``epilogue(alpha * op(A) @ op(B) + beta * C [+ bias])`` into ``d`` (and ``aux``)."""
    bias = 0 if op.bias is None else backend.pointer(op.bias.buffer_id)
    aux = 0 if op.aux is None else backend.pointer(op.aux.buffer_id)
    _run(backend, op, bias, aux, op.aux is not None)
    return "nvmath"


@cuda.handles(FusedMatmulGrad)
def fused_matmul_grad(backend: Any, op: FusedMatmulGrad) -> str:
    """Write ``alpha * op(A) @ op(B) + beta * C`` with the backward epilogue into ``d``, and
    the bias gradient into ``bias_grad``."""
    grad = 0 if op.bias_grad is None else backend.pointer(op.bias_grad.buffer_id)
    aux = 0 if op.aux is None else backend.pointer(op.aux.buffer_id)
    if _run(backend, op, grad, aux, False).reduce:
        _sum_bias_grad(backend, op)
    return "nvmath"
