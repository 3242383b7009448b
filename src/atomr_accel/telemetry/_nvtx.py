"""NVTX ranges: name a stretch of host work so Nsight Systems shows it on the timeline."""

from __future__ import annotations

import contextlib
import importlib
import sys
from types import TracebackType
from typing import Any

__all__ = ["nvtx_range"]

_NULL = contextlib.nullcontext()
_unusable = False  # set once CuPy is loaded but its NVTX module cannot be used


class _Range:
    __slots__ = ("_name", "_nvtx")

    def __init__(self, nvtx: Any, name: str) -> None:
        self._nvtx = nvtx
        self._name = name

    def __enter__(self) -> None:
        self._nvtx.RangePush(self._name)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._nvtx.RangePop()


def _nvtx_module() -> Any:
    global _unusable
    nvtx = sys.modules.get("cupy.cuda.nvtx")
    if nvtx is None:
        if _unusable or "cupy" not in sys.modules:
            return None
        try:
            nvtx = importlib.import_module("cupy.cuda.nvtx")
        except ImportError:
            _unusable = True
            return None
    return nvtx if getattr(nvtx, "available", True) else None


def nvtx_range(name: str) -> contextlib.AbstractContextManager[None]:
    """Return a context manager that marks its body as the NVTX range ``name``.

    Ranges go through ``cupy.cuda.nvtx`` once CuPy is loaded (the CUDA backend
    loads it); without CuPy, or where NVTX is not available, this is a shared
    no-op context costing one dictionary look-up. Push and pop happen on the
    calling thread, as NVTX requires.
    """
    nvtx = _nvtx_module()
    return _NULL if nvtx is None else _Range(nvtx, name)
