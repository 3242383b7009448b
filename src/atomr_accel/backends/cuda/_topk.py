"""Top-k selection on CUDA: the shared handlers' answers, selected by this package's kernels
(``_topk_kernel``) up to ``_topk_kernel.LIMIT`` candidates a row, else by PyTorch where it
imports.

Up to ``LIMIT`` candidates (``k + SPARE``) a row, two small kernels on the op's
stream pick each row's candidates and write their values, columns and keys into
one int64 matrix, downloaded at once; the ordering and the exact pass over tied
rows are the shared handler's (``backends.cpu._topk.order``), the exact pass in
CuPy. No torch call, dtype cast or concatenation lies on that path. On an H200,
selecting and ordering rows of a million f16 scores (``k = 10``) took 0.08 ms
against 0.30 ms through torch for one row, 0.26 ms against 0.35 ms for 16 and
1.7 ms against 2.6 ms for 1024.

Beyond ``LIMIT``, when PyTorch imports, the candidates come from torch on a
zero-copy DLPack view of the scores, on the op's stream: ``torch.topk`` over the
row, or, for wide rows in a batch of ``GROUPED_ROWS`` or more, the shared
two-stage selection written in torch (group maxima by ``amax``, ``topk`` of
those, a ``gather`` of the chosen groups, ``topk`` again), since CuPy's
``argpartition`` sorts each whole row (its documented limitation). Without torch
the shared handlers run on CuPy.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import cupy as cp
import numpy as np
from cupy_backends.cuda.libs import cublas

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cuda
from atomr_accel.backends.cpu import _topk as shared
from atomr_accel.backends.cuda import _topk_kernel as kernel
from atomr_accel.backends.cuda._blas import cublas_handle
from atomr_accel.core._dtype import DType
from atomr_accel.core.ops._topk import ScoreTopK, TopK

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

__all__ = ["GROUPED_ROWS", "score_top_k", "top_k", "torch_module"]

GROUPED_ROWS = 32
"""Rows a batch from which wide rows take the two-stage selection on torch."""


@functools.cache
def torch_module() -> Any:
    """``torch`` when it imports with CUDA here, else None."""
    try:
        torch = importlib.import_module("torch")
    except Exception:  # ImportError, or a loader error of its CUDA libraries
        return None
    return torch if torch.cuda.is_available() else None


@functools.lru_cache(maxsize=64)
def _torch_stream(pointer: int) -> Any:
    """torch's view of the CUDA stream at ``pointer`` (kept: making one costs a few us)."""
    return torch_module().cuda.ExternalStream(pointer)


def _candidates(torch: Any, scores: Any, count: int) -> tuple[Any, Any]:
    """The ``count`` largest of each row of the torch matrix ``scores``: (values, columns)."""
    m, n = scores.shape
    if m < GROUPED_ROWS or not shared.is_wide(n, count):
        return torch.topk(scores, count, dim=1, sorted=False)  # type: ignore[no-any-return]
    group = shared.GROUP
    full = n // group
    maxima = scores[:, : full * group].view(m, full, group).amax(2)
    if full * group < n:
        maxima = torch.cat((maxima, scores[:, full * group:].amax(1, keepdim=True)), 1)
    groups = torch.topk(maxima, count, dim=1, sorted=False)[1]
    offsets = torch.arange(group, device=scores.device)
    columns = (groups[:, :, None] * group + offsets).view(m, count * group)
    outside = columns >= n
    columns = columns.clamp_(max=n - 1)  # the tail group's missing columns, masked below
    values = scores.gather(1, columns).masked_fill_(outside, float("-inf"))
    best, where = torch.topk(values, count, dim=1, sorted=False)
    return best, columns.gather(1, where)


def _select(xp: Any, x: Any, keys: Any | None, k: int) -> shared.Answer:
    """``backends.cpu._topk.select`` of the CuPy matrix ``x`` with torch doing the device
    work on the current stream."""
    torch = torch_module()
    with torch.cuda.stream(_torch_stream(xp.cuda.get_current_stream().ptr)):
        scores = torch.from_dlpack(x)
        key_of = None if keys is None else torch.from_dlpack(keys)
        n = scores.shape[1]
        k = min(k, n)
        count = min(k + shared.SPARE, n)
        values, columns = _candidates(torch, scores, count)
        keyed = columns if key_of is None else key_of[columns]
        bits = values.double().view(torch.int64)
        packed = torch.cat((bits, columns, keyed), 1).cpu().numpy()  # one download

        def exact_row(row: int, kth_column: int) -> shared.Answer:
            line = scores[row]
            tied = torch.nonzero(line >= line[kth_column]).flatten()
            tied_keys = tied if key_of is None else key_of[tied]
            both = torch.cat((line[tied].double().view(torch.int64), tied, tied_keys)).cpu()
            return _best_packed(both.numpy(), k)

        return _order_packed(packed, count, k, n, exact_row)


def _select_small(xp: Any, x: Any, keys: Any | None, k: int) -> shared.Answer:
    """``backends.cpu._topk.select`` of the CuPy matrix ``x`` (``k + SPARE`` candidates a row
    that ``kernel.fits``), the candidates from this package's kernels."""
    n = x.shape[1]
    k = min(k, n)
    count = min(k + shared.SPARE, n)
    packed = kernel.candidates(xp, x, keys, count)

    def exact_row(row: int, kth_column: int) -> shared.Answer:
        line = x[row]
        tied = xp.flatnonzero(line >= line[kth_column])
        tied_keys = tied if keys is None else keys[tied]
        both = xp.concatenate((line[tied].astype(xp.float64).view(xp.int64), tied, tied_keys))
        return _best_packed(both.get(), k)

    return _order_packed(packed, count, k, n, exact_row)


def _order_packed(packed: np.ndarray[Any, Any], count: int, k: int, n: int,
                  exact_row: Callable[[int, int], shared.Answer]) -> shared.Answer:
    """``shared.order`` of ``count`` candidates a row packed in one int64 matrix: the values'
    float64 bits, then their columns, then their keys."""
    return shared.order(packed[:, :count].view(np.float64), packed[:, count:2 * count],
                        packed[:, 2 * count:], k, n, exact_row)


def _best_packed(found: np.ndarray[Any, Any], k: int) -> shared.Answer:
    """``shared.best`` of one row's tied values packed as ``_order_packed``'s rows are, in
    one flat int64 array."""
    values, columns, keys = found.reshape(3, -1)
    return shared.best(values.view(np.float64), columns, keys, k)


def _answer(backend: ArrayBackend, x: Any, keys: Any | None, k: int) -> shared.Answer:
    """``(columns, values)`` of each row of ``x``: the kernels' selection where it fits, else
    torch's, else the shared handler's."""
    if kernel.fits(x, min(k, x.shape[1]) + shared.SPARE):
        return _select_small(backend.xp, x, keys, k)
    if torch_module() is None:
        return shared.select(backend.xp, x, keys, k, shared.PARTITION)
    return _select(backend.xp, x, keys, k)


@cuda.handles(TopK)
def top_k(backend: ArrayBackend, op: TopK) -> shared.Answer:
    """Answer ``(columns, values)`` as the shared handler does (``_answer``)."""
    x = backend.array(op.x.buffer_id)[: op.m * op.n].reshape(op.m, op.n)
    keys = None if op.keys is None else backend.array(op.keys.buffer_id)[: op.n]
    return _answer(backend, x, keys, op.k)


def _staged(xp: Any, host: np.ndarray[Any, Any]) -> tuple[Any, Any]:
    """``host`` copied to the device on the current stream from pinned memory: (the device
    array, the pinned memory, to be held until the copy has run). Unlike a copy from
    pageable memory, the caller does not wait for it, so the work queued next starts at
    once."""
    host = np.ascontiguousarray(host)
    pinned = xp.cuda.alloc_pinned_memory(max(1, host.nbytes))
    np.ndarray(host.shape, host.dtype, pinned)[...] = host
    device = xp.empty(host.shape, host.dtype)
    xp.cuda.runtime.memcpyAsync(device.data.ptr, pinned.ptr, host.nbytes,
                                xp.cuda.runtime.memcpyHostToDevice,
                                xp.cuda.get_current_stream().ptr)
    return device, pinned


def _scores(backend: CudaBackend, op: ScoreTopK, queries: Any) -> Any:
    """``shared.scores`` of ``op``: for f16, the products by one cuBLAS ``gemmEx`` as CuPy's
    matmul calls it (f32 accumulation, a tensor-op algorithm), without the host work that
    call costs around it (a one-query search waits for it before its matmul starts);
    ``alpha`` and the bias then as the shared handler applies them. Other dtypes, and a
    capture, through ``shared.scores``."""
    if op.matrix.dtype is not DType.F16 or backend.capturing:
        return shared.scores(backend, op, queries)
    xp = backend.xp
    m = queries.shape[0]
    out = xp.empty((m, op.n), dtype=np.float16)
    # row-major scores (m x n) are column-major (n x m): matrix^T-as-stored times queries
    cublas.gemmEx(cublas_handle(backend), cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, op.n, m, op.dim,
                  _ONE.ctypes.data, backend.pointer(op.matrix.buffer_id), _HALF, op.dim,
                  queries.data.ptr, _HALF, op.dim, _ZERO.ctypes.data, out.data.ptr, _HALF,
                  op.n, cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_GEMM_DEFAULT_TENSOR_OP)
    return shared.scaled(backend, op, out)


_HALF = int(cp.cuda.runtime.CUDA_R_16F)
_ONE, _ZERO = np.ones((), np.float32), np.zeros((), np.float32)
"""The gemm's alpha and beta, read by cuBLAS from host memory (f32: it accumulates in f32)."""


@cuda.handles(ScoreTopK)
def score_top_k(backend: CudaBackend, op: ScoreTopK) -> shared.Answer:
    """Score (``_scores``: a cuBLAS matmul of the queries, staged through pinned memory)
    and select (``_answer``, which waits for the stream: the staging memory is held until
    then)."""
    keys = None if op.keys is None else backend.array(op.keys.buffer_id)[: op.n]
    queries, staging = _staged(backend.xp, op.queries)
    answer = _answer(backend, _scores(backend, op, queries), keys, op.k)
    del staging
    return answer
