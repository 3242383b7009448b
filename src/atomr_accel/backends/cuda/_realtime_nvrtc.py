"""The NVRTC kernels of the realtime library: each source compiled once per process and
device, its kernels looked up once, and 1-D launches of one thread an element on the
current stream (the op's)."""

from __future__ import annotations

import functools
from typing import Any

import cupy as cp

__all__ = ["Source", "launch"]


class Source:
    """One CUDA source and its NVRTC options (``name_expressions`` for the template
    instantiations it exports); ``kernel(name)`` is a kernel of it on the current device."""

    __slots__ = ("code", "names", "options")

    def __init__(self, code: str, options: tuple[str, ...] = ("--std=c++17",),
                 names: tuple[str, ...] = ()) -> None:
        self.code = code
        self.options = options
        self.names = names

    def kernel(self, name: str) -> Any:
        """The kernel ``name`` (or name expression) on the current device, compiled on
        first use."""
        return _kernel(self, name, cp.cuda.Device().id)


@functools.cache
def _module(source: Source, device_id: int) -> Any:
    return cp.RawModule(code=source.code, options=source.options,
                        name_expressions=list(source.names) or None)


@functools.cache
def _kernel(source: Source, name: str, device_id: int) -> Any:
    return _module(source, device_id).get_function(name)


def launch(kernel: Any, count: int, block: int, *args: Any) -> None:
    """Run ``kernel`` over ``count`` threads (none when 0) in blocks of ``block`` on the
    current stream."""
    if count > 0:
        kernel(((count + block - 1) // block,), (block,), args,
               stream=cp.cuda.get_current_stream())
