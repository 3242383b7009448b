"""Top-k selection on CUDA: the shared ``top_k`` with a radix select where PyTorch is present.

CuPy's ``argpartition`` sorts each whole row (its documented limitation), so
when PyTorch imports, the ``k + SPARE`` candidates of each row come from
``torch.topk`` on a zero-copy DLPack view of the buffer, run on the op's
stream; otherwise from ``cupy.argpartition``. Ordering and ties are the
shared handler's (``backends.cpu._topk``).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import numpy as np

from atomr_accel.backends._base import ArrayBackend, Handler
from atomr_accel.backends.cpu import _topk as shared
from atomr_accel.core._op import Op
from atomr_accel.core.ops._topk import TopK

__all__ = ["HANDLERS", "top_k", "torch_module"]


@functools.cache
def torch_module() -> Any:
    """``torch`` when it imports with CUDA here, else None."""
    try:
        torch = importlib.import_module("torch")
    except Exception:  # ImportError, or a loader error of its CUDA libraries
        return None
    return torch if torch.cuda.is_available() else None


def _torch_largest(xp: Any, x: Any, count: int) -> tuple[Any, Any]:
    """``torch.topk`` of each row, on the current CuPy stream, back as CuPy arrays."""
    torch = torch_module()
    stream = torch.cuda.ExternalStream(xp.cuda.get_current_stream().ptr)
    with torch.cuda.stream(stream):
        values, columns = torch.topk(torch.from_dlpack(x), count, dim=1, sorted=False)
        return xp.from_dlpack(values), xp.from_dlpack(columns)


def top_k(backend: ArrayBackend, op: TopK) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Answer ``(columns, values)`` as the shared handler does, selecting with torch if present."""
    if torch_module() is None:
        return shared.top_k(backend, op)
    return shared.top_k(backend, op, _torch_largest)


HANDLERS: dict[type[Op], Handler] = {TopK: top_k}
