"""cuBLASLt-shaped matmuls with fused epilogues on the cuda backend, through nvmath-python.

cuBLASLt's bias and auxiliary epilogues work on column-major results with a
bias per row. Our matrices are row-major with a bias per column, and a
row-major ``m x n`` ``D`` is a column-major ``n x m`` matrix ``D^T``; so each
op runs as ``D^T = op(B)^T @ op(A)^T`` on transposed CuPy views of the
buffers (no copies), with ``D^T`` computed in place in ``d`` (nvmath's
``inplace`` option; ``d`` is ``C`` when ``beta != 0``). In that frame our
per-column bias is cuBLASLt's per-row bias, our ``bgrada``/``bgradb`` are its
``BGRADB``/``BGRADA``, and the auxiliary buffers' column-major layouts are the
row-major ones documented in ``core.ops._blaslt``.

``nvmath.linalg.advanced.Matmul`` objects are planned once per shape, dtype,
layout, epilogue, compute type and stream and kept in a small LRU cache per
context (``PlanCache``). A call whose buffers and scalars are those of the
plan's last call only runs ``execute`` on the op's stream; another points the
cached object at its buffers first (``reset_operands_unchecked``: the key
guarantees the shapes and strides that ``reset_operands`` would check).
Re-pointing costs GPU time: on an H100 an 8192^3 bf16 matmul with a bias
ran 1.69 ms with its operands reset and released around every execute
against 1.40 ms without; so a plan keeps its last operands referenced until
it is re-pointed or evicted (at most ``PLANS`` a context), and a buffer freed
meanwhile returns its memory to CuPy's pool then. cuda.core, under
nvmath, is initialized once in each thread that runs an op
(``_cuda_core_ready``). Planning runs on a private stream of the cache, so its
wait for the heuristic query never waits for the op's stream. nvmath writes
an auxiliary output (ReLU mask, GELU input, bias gradient) into a fresh array
of its own; the handler copies it into the op's buffer on the op's stream (one
device copy). Nothing here synchronizes the device. Handlers answer ``"nvmath"``.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Hashable
from typing import Any

import cupy as cp

from atomr_accel.backends._handlers import cuda
from atomr_accel.backends._optional import require
from atomr_accel.backends._state import Lru, per_backend
from atomr_accel.core._dtype import DType
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._blaslt import (
    Epilogue,
    FusedMatmul,
    FusedMatmulGrad,
    gelu_aux_ld,
    relu_aux_ld,
)

__all__ = ["PlanCache", "fused_matmul", "fused_matmul_grad", "plans_of"]

Array = Any  # a CuPy array


def _advanced() -> Any:
    """``nvmath.linalg.advanced`` (raises ``LibraryUnavailable`` when nvmath is missing)."""
    require("blaslt")
    return importlib.import_module("nvmath.linalg.advanced")


_THREAD = threading.local()


def _cuda_core_ready(device_id: int) -> None:
    """Initialize cuda.core's ``Device(device_id)`` in this thread, once per thread.

    nvmath works through cuda.core, whose device objects are per thread and refuse
    work ("Device 0 is not yet initialized") until ``set_current()`` ran in that
    thread; nvmath caches stream wrappers across threads, and our ops run on
    whichever thread queues them (the host's, or an event loop's for async calls).
    The CUDA runtime already has this device current here (the backend saw to it),
    so making its primary context current changes nothing else.
    """
    ready: set[int] | None = getattr(_THREAD, "devices", None)
    if ready is None:
        ready = _THREAD.devices = set()
    if device_id not in ready:
        importlib.import_module("cuda.core").Device(device_id).set_current()
        ready.add(device_id)


def _nvmath_epilog(epilogue: Epilogue, with_aux: bool) -> str | None:
    """The name of nvmath's ``MatmulEpilog`` member that runs ``epilogue`` in the transposed
    frame (None: no epilogue)."""
    if epilogue is Epilogue.NONE:
        return None
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


PLANS = 128
"""How many planned matmuls a context keeps. Planning one costs about 1.5 ms on an H100
(the heuristic query), so a workload cycling through more shapes than the cache holds
plans on every call: 64 shapes in turn did with the 32 kept before."""


class PlanCache:
    """The ``size`` most recently used planned ``Matmul`` objects of one context, each with the
    operands it was last bound to; an evicted plan is freed."""

    def __init__(self, size: int = PLANS) -> None:
        self.plans: Lru[Any] = Lru(size, self._evicted)
        self._bound: dict[Hashable, tuple[Any, ...]] = {}
        self._stream: Any = None

    def _evicted(self, key: Hashable, plan: Any) -> None:
        self._bound.pop(key, None)
        plan.free()

    def planning_stream(self) -> Any:
        """The private stream planning runs on (made on first use)."""
        if self._stream is None:
            self._stream = cp.cuda.Stream(non_blocking=True)
        return self._stream

    def rebind(self, key: Hashable, bound: tuple[Any, ...]) -> bool:
        """Record that the plan under ``key`` now holds ``bound``; False when it held them
        already (nothing to reset)."""
        if self._bound.get(key) == bound:
            return False
        self._bound[key] = bound
        return True

    def __len__(self) -> int:
        return len(self.plans)


plans_of = per_backend(PlanCache)
"""The plan cache of a backend (one per context; it goes with the backend)."""


def _operand(backend: Any, ref: GpuRef, rows: int, cols: int, trans: bool) -> Array:
    """The transpose of ``op(X)`` (``cols x rows``) as a view of the row-major buffer."""
    flat = backend.array(ref.buffer_id)[: rows * cols]
    return flat.reshape(cols, rows) if trans else flat.reshape(rows, cols).T


def _rows(backend: Any, ref: GpuRef, rows: int, ld: int) -> Array:
    """The first ``rows * ld`` elements of a buffer as a ``rows x ld`` row-major view."""
    return backend.array(ref.buffer_id)[: rows * ld].reshape(rows, ld)


def _aux_view(backend: Any, op: FusedMatmul | FusedMatmulGrad) -> Array:
    """The aux buffer as nvmath's column-major ``ld x m`` auxiliary matrix."""
    assert op.aux is not None
    ld = relu_aux_ld(op.n) if op.epilogue.activation == "relu" else gelu_aux_ld(op.n)
    return _rows(backend, op.aux, op.m, ld).T


def _run(backend: Any, op: FusedMatmul | FusedMatmulGrad, epilog_inputs: dict[str, Array],
         with_aux: bool) -> Any:
    """Execute ``op`` on its stream with the cached (or a new) planned ``Matmul``; return what
    ``execute`` returned."""
    m, n, k = op.m, op.n, op.k
    a_t = _operand(backend, op.b, op.k, op.n, op.trans_b)  # op(B)^T: n x k
    b_t = _operand(backend, op.a, op.m, op.k, op.trans_a)  # op(A)^T: k x m
    c_t = _rows(backend, op.d, m, n).T  # D^T: n x m, column-major
    stream = cp.cuda.get_current_stream()
    tf32 = op.allow_tf32 and op.d.dtype is DType.F32
    key = (type(op), op.d.dtype, m, n, k, op.trans_a, op.trans_b, op.epilogue, with_aux, tf32,
           stream.ptr)
    advanced = _advanced()  # LibraryUnavailable first, where nvmath is missing
    _cuda_core_ready(backend.device_id)
    cache = plans_of(backend)
    alpha, beta = float(op.alpha), float(op.beta)
    bound = (a_t.data.ptr, b_t.data.ptr, c_t.data.ptr, alpha, beta,
             *(view.data.ptr for view in epilog_inputs.values()))

    def plan() -> Any:
        options: dict[str, Any] = {"inplace": True}
        if tf32:
            linalg = importlib.import_module("nvmath.linalg")
            options["compute_type"] = linalg.ComputeType.COMPUTE_32F_FAST_TF32
        planning = cache.planning_stream()
        made = advanced.Matmul(a_t, b_t, c_t, alpha=alpha, beta=beta, options=options,
                               stream=planning)
        name = _nvmath_epilog(op.epilogue, with_aux)
        epilog = None if name is None else getattr(advanced.MatmulEpilog, name)
        made.plan(epilog=epilog, epilog_inputs=epilog_inputs or None, stream=planning)
        cache.rebind(key, bound)  # planned on these operands
        return made

    mm = cache.plans.get(key, plan)
    if cache.rebind(key, bound):  # other buffers or scalars than the plan holds
        mm.reset_operands_unchecked(a=a_t, b=b_t, c=c_t, alpha=alpha, beta=beta,
                                    epilog_inputs=epilog_inputs or None)
    return mm.execute(stream=stream)


@cuda.handles(FusedMatmul)
def fused_matmul(backend: Any, op: FusedMatmul) -> str:
    """Write ``epilogue(alpha * op(A) @ op(B) + beta * C [+ bias])`` into ``d`` (and ``aux``)."""
    inputs = {}
    if op.bias is not None:
        inputs["bias"] = backend.array(op.bias.buffer_id)[: op.n]
    with_aux = op.aux is not None
    result = _run(backend, op, inputs, with_aux)
    if with_aux:
        _, outputs = result
        produced = outputs["relu_aux" if op.epilogue.activation == "relu" else "gelu_aux"]
        _aux_view(backend, op)[...] = produced
    return "nvmath"


@cuda.handles(FusedMatmulGrad)
def fused_matmul_grad(backend: Any, op: FusedMatmulGrad) -> str:
    """Write ``alpha * op(A) @ op(B) + beta * C`` with the backward epilogue into ``d``, and
    the bias gradient into ``bias_grad``."""
    inputs = {}
    kind = op.epilogue.activation
    if kind is not None:
        inputs[f"{kind}_aux"] = _aux_view(backend, op)
    result = _run(backend, op, inputs, False)
    if op.bias_grad is not None:
        _, outputs = result
        (grad,) = outputs.values()
        backend.array(op.bias_grad.buffer_id)[: grad.size] = grad.reshape(-1)
    return "nvmath"
