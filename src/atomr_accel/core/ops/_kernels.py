"""Ops of user kernels: compile CUDA C with NVRTC, load PTX/cubin modules, launch kernels."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import Op, is_int, positive_ints, require, require_nonneg
from atomr_accel.core._ref import GpuRef, GraphRef, KernelRef

__all__ = ["CompileKernel", "LaunchKernel", "LoadKernel", "dim3"]

_MAX_THREADS_PER_BLOCK = 1024


def dim3(value: int | tuple[int, ...], name: str) -> tuple[int, int, int]:
    """Normalize a grid or block size (an int or 1-3 ints) to three positive ints."""
    if type(value) is tuple and len(value) == 3 and positive_ints(*value):
        x, y, z = value
        return (x, y, z)
    items: tuple[object, ...] = ()
    if is_int(value):
        items = (value,)
    elif isinstance(value, Iterable):
        items = tuple(value)
    if not 1 <= len(items) <= 3 or not all(is_int(v) and v >= 1 for v in items):
        raise InvalidArgument(f"{name} must be 1 to 3 positive ints, got {value!r}")
    x, y, z = (*[operator.index(v) for v in items], 1, 1)[:3]  # type: ignore[arg-type]
    return (x, y, z)


@dataclass(frozen=True, slots=True)
class CompileKernel(Op):
    """Compile CUDA C ``source`` with NVRTC and answer a ``KernelRef`` for kernel ``name``.

    ``name`` is an ``extern "C"`` function name or a C++ name expression such as
    ``"axpy<float>"`` (added to the program and resolved to its lowered name).
    ``arch`` is like ``"sm_90"`` (None: the device's own); ``defines`` become
    ``-D`` options, ``fast_math`` is ``--use_fast_math``; ``options`` are passed
    as they are. Compiled images live in a disk cache keyed by all of these.
    """

    library: ClassVar[str] = "nvrtc"
    source: str
    name: str
    options: tuple[str, ...] = ()
    defines: tuple[tuple[str, str], ...] = ()
    fast_math: bool = False
    arch: str | None = None

    def validate(self) -> None:
        require(isinstance(self.source, str) and bool(self.source.strip()),
                "source must be non-empty CUDA C text")
        require(isinstance(self.name, str) and bool(self.name.strip()),
                "name must name the kernel to get")
        require(all(isinstance(o, str) for o in self.options), "options must be strings")
        require(all(isinstance(k, str) and isinstance(v, str) and k.isidentifier()
                    for k, v in self.defines),
                "defines must be (identifier, value) string pairs")
        if self.arch is not None and not (
            isinstance(self.arch, str) and self.arch.startswith(("sm_", "compute_"))
        ):
            raise InvalidArgument(f"arch must look like 'sm_90' or 'compute_90', got {self.arch!r}")

    def compiler_options(self, arch: str) -> tuple[str, ...]:
        """The NVRTC options for ``arch`` (the op's ``arch`` wins when set)."""
        defines = tuple(f"-D{k}={v}" for k, v in self.defines)
        fast = ("--use_fast_math",) if self.fast_math else ()
        return (f"--gpu-architecture={self.arch or arch}", *defines, *fast, *self.options)


@dataclass(frozen=True, slots=True)
class LoadKernel(Op):
    """Load a PTX or cubin ``image`` as a module and answer a ``KernelRef`` for ``name``.

    Several kernels of one image share one loaded module.
    """

    library: ClassVar[str] = "module"
    image: bytes
    name: str

    def validate(self) -> None:
        require(isinstance(self.image, bytes) and len(self.image) > 0,
                "image must be the non-empty bytes of a PTX or cubin module")
        require(isinstance(self.name, str) and bool(self.name), "name must name a kernel")


def _check_arg(index: int, arg: Any) -> None:
    if isinstance(arg, GpuRef):
        return
    if isinstance(arg, np.generic) and arg.dtype.kind in "biufc":
        return
    if isinstance(arg, bool | int | float | complex):
        raise InvalidArgument(
            f"kernel argument {index} is a Python {type(arg).__name__}; pass a typed scalar "
            f"such as np.int32({arg!r}) or np.float32({arg!r}) to match the kernel's parameter"
        )
    raise InvalidArgument(
        f"kernel argument {index} must be a buffer or a NumPy scalar, got {type(arg).__name__}"
    )


@dataclass(frozen=True, slots=True)
class LaunchKernel(Op):
    """Launch ``kernel`` on a ``grid`` of ``block``-sized blocks with typed ``args``.

    ``args`` are buffers (passed as device pointers) or NumPy scalars (passed by
    value with their exact type: ``np.int32(n)``, ``np.float32(a)``). The kernel
    may write any buffer argument unless ``writes`` lists the indices it writes,
    so later readers on other streams wait for it. The op runs on the kernel
    actor that made the kernel (``kernel.library``).
    """

    kernel: KernelRef
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[Any, ...] = ()
    shared_mem: int = 0
    written: tuple[int, ...] | None = None

    @property
    def library(self) -> str:  # type: ignore[override]
        """The kernel actor that owns the kernel."""
        return self.kernel.library

    def validate(self) -> None:
        if not isinstance(self.kernel, KernelRef):
            raise InvalidArgument(
                f"kernel must be a KernelRef, got {type(self.kernel).__name__}"
            )
        dim3(self.grid, "grid")
        block = dim3(self.block, "block")
        if block[0] * block[1] * block[2] > _MAX_THREADS_PER_BLOCK:
            raise InvalidArgument(
                f"a block holds at most {_MAX_THREADS_PER_BLOCK} threads, got {block}"
            )
        require_nonneg(shared_mem=self.shared_mem)
        for i, arg in enumerate(self.args):
            _check_arg(i, arg)
        if self.written is not None:
            for i in self.written:
                if not (is_int(i) and 0 <= i < len(self.args)
                        and isinstance(self.args[i], GpuRef)):
                    raise InvalidArgument(f"written index {i!r} is not a buffer argument")

    def refs(self) -> tuple[GpuRef, ...]:
        """The buffer arguments."""
        return tuple(a for a in self.args if isinstance(a, GpuRef))

    def writes(self) -> tuple[GpuRef, ...]:
        """The buffer arguments the kernel writes (all of them unless ``written`` says)."""
        if self.written is None:
            return self.refs()
        return tuple(self.args[i] for i in self.written)

    def handles(self) -> tuple[KernelRef | GraphRef, ...]:
        """The kernel."""
        return (self.kernel,)
