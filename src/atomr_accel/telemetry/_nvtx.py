"""NVTX ranges: name a stretch of host work so Nsight Systems shows it on the timeline.

``nvtx_range`` is free where NVTX is missing; ``NvtxKernelTrace`` (the original's
name) insists on it.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from types import TracebackType
from typing import Any

from atomr_accel.core._errors import Unrecoverable

__all__ = ["NvtxKernelTrace", "nvtx_range"]

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


def _nvtx_module(load: bool = False) -> Any:
    """CuPy's NVTX module where it is usable, else None; ``load`` imports CuPy if need be."""
    global _unusable
    nvtx = sys.modules.get("cupy.cuda.nvtx")
    if nvtx is None:
        if _unusable or ("cupy" not in sys.modules and not load):
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


class NvtxKernelTrace:
    """The original's NVTX range: ``with NvtxKernelTrace("step", "my-app"): ...``.

    Marks its body as the range ``"<domain>: <name>"`` on the calling thread
    through CuPy's NVTX bindings (CuPy has no NVTX domains, so the domain
    leads the message; Nsight Systems and a ``CuptiSession`` with the
    ``range`` category show it). Unlike ``nvtx_range``, which is a no-op
    without NVTX, ``__enter__`` raises ``Unrecoverable`` where CuPy or its
    NVTX library is missing. Ranges nest; one object may be entered again,
    even inside itself.
    """

    __slots__ = ("_depth", "_nvtx", "domain", "name")

    def __init__(self, name: str = "span", domain: str = "atomr-accel") -> None:
        self.name = name
        """The range's name."""
        self.domain = domain
        """The domain it is reported under (the message's prefix)."""
        self._nvtx: Any = None
        self._depth = 0

    @property
    def message(self) -> str:
        """The NVTX message pushed: ``"<domain>: <name>"``."""
        return f"{self.domain}: {self.name}"

    def __enter__(self) -> NvtxKernelTrace:
        nvtx = _nvtx_module(load=True)
        if nvtx is None:
            raise Unrecoverable(
                "NVTX is not available: NvtxKernelTrace needs CuPy built with NVTX "
                "(pip install 'atomr-accel-py[cuda]' on a GPU machine)")
        nvtx.RangePush(self.message)
        self._nvtx = nvtx
        self._depth += 1
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._depth > 0:
            self._depth -= 1
            self._nvtx.RangePop()

    def __repr__(self) -> str:
        return f"NvtxKernelTrace(name={self.name!r}, domain={self.domain!r})"
