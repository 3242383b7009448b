"""What one rank of a CPU collective sends and receives: the reductions, in NumPy.

Every rank computes its own result from what every rank sent, in the buffers'
dtype: integers wrap as NCCL's do, ``avg`` divides the sum (truncating
integers toward zero, as C's division does).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr_accel.core.ops._collective import CallKind, CollectiveCall, ReduceOp

__all__ = ["reduce", "result_of", "sent_length"]

Array = np.ndarray[Any, Any]


def sent_length(call: CollectiveCall, rank: int, nranks: int) -> int:
    """How many elements of its send buffer rank ``rank`` contributes to ``call``."""
    if call.send is None or (call.kind is CallKind.BROADCAST and rank != call.root):
        return 0
    if call.kind in (CallKind.REDUCE_SCATTER, CallKind.ALL_TO_ALL):
        return call.count * nranks
    return call.count


_UFUNCS = {ReduceOp.PROD: np.multiply, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum}
"""The element-wise ufunc of each reduction but the sums (``np.add``)."""


def reduce(op: ReduceOp, arrays: list[Array]) -> Array:
    """The element-wise ``op`` of ``arrays`` (one per rank, one dtype), accumulated in rank
    order."""
    dtype = arrays[0].dtype
    ufunc = _UFUNCS.get(op, np.add)
    result: Array = np.array(arrays[0], dtype=dtype)
    with np.errstate(over="ignore"):
        for array in arrays[1:]:
            ufunc(result, array, out=result)
        n = len(arrays)
        if op is ReduceOp.AVG and np.issubdtype(dtype, np.signedinteger):
            result = (np.sign(result) * (np.abs(result) // n)).astype(dtype)  # C division
        elif op is ReduceOp.AVG and np.issubdtype(dtype, np.integer):
            result = (result // n).astype(dtype)
        elif op is ReduceOp.AVG:
            result = (result / np.asarray(n, dtype=dtype)).astype(dtype)
    return result


def result_of(call: CollectiveCall, rank: int, sent: dict[int, Array], nranks: int
              ) -> Array | None:
    """What rank ``rank``'s recv buffer receives from ``call``, given what each peer sent
    (``sent``: rank -> its contribution); None where it receives nothing."""
    kind, count = call.kind, call.count
    if kind is CallKind.SEND or (kind is CallKind.REDUCE and rank != call.root):
        return None
    if kind in (CallKind.RECV, CallKind.BROADCAST):
        return sent[call.root]
    if kind is CallKind.ALL_GATHER:
        return np.concatenate([sent[r] for r in range(nranks)])
    if kind is CallKind.ALL_TO_ALL:
        return np.concatenate([sent[p][rank * count:(rank + 1) * count]
                               for p in range(nranks)])
    reduced = reduce(call.op, [sent[r] for r in range(nranks)])
    if kind is CallKind.REDUCE_SCATTER:
        return reduced[rank * count:(rank + 1) * count]
    return reduced
