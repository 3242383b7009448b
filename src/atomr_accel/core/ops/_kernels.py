"""Ops of user kernels: compile CUDA C with NVRTC, load PTX/cubin modules, launch kernels."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from atomr_accel.core._catalogue import declare
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import Op, is_int, positive_ints, positive_sizes, require, require_nonneg
from atomr_accel.core._ref import GpuRef, GraphRef, KernelRef
from atomr_accel.core.ops._tensor_map import TensorMap

__all__ = ["CompileKernel", "LaunchKernel", "LoadKernel", "dim3"]

declare("nvrtc", "Nvrtc",
        "NVRTC: compiles CUDA C (through a disk cache) and launches the kernels it made.",
        rank=7, sequenced=False)

declare("module", "Module",
        "Loads PTX or cubin modules and launches their kernels.",
        rank=8, sequenced=False)

_MAX_THREADS_PER_BLOCK = 1024
PORTABLE_CLUSTER = 8
"""Blocks a thread-block cluster may hold on any device that has clusters."""
NON_PORTABLE_CLUSTER = 16
"""Blocks a cluster may hold on an H100 once a kernel allows non-portable sizes."""


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
    if not 1 <= len(items) <= 3 or not positive_sizes(items):
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
    if isinstance(arg, TensorMap):
        arg.validate()
        return
    if isinstance(arg, np.generic) and arg.dtype.kind in "biufc":
        return
    if isinstance(arg, bool | int | float | complex):
        raise InvalidArgument(
            f"kernel argument {index} is a Python {type(arg).__name__}; pass a typed scalar "
            f"such as np.int32({arg!r}) or np.float32({arg!r}) to match the kernel's parameter"
        )
    raise InvalidArgument(
        f"kernel argument {index} must be a buffer or a NumPy scalar (or a TensorMap), got "
        f"{type(arg).__name__}"
    )


def check_cluster(grid: tuple[int, int, int], cluster: tuple[int, int, int],
                  non_portable: bool) -> None:
    """A cluster must divide the grid in each dimension and hold at most 8 blocks (16 when
    the launch allows non-portable sizes); ``InvalidArgument`` otherwise."""
    dims = dim3(cluster, "cluster")
    for axis, g, c in zip("xyz", grid, dims, strict=True):
        if g % c:
            raise InvalidArgument(
                f"grid {grid} is not a whole number of clusters {dims}: {axis} = {g} is not "
                f"divisible by {c}")
    size = dims[0] * dims[1] * dims[2]
    most = NON_PORTABLE_CLUSTER if non_portable else PORTABLE_CLUSTER
    if size > most:
        hint = "" if non_portable else " (up to 16 with non_portable_cluster=True)"
        raise InvalidArgument(f"a cluster holds at most {most} blocks, got {dims} = "
                              f"{size}{hint}")


@dataclass(frozen=True, slots=True)
class LaunchKernel(Op):
    """Launch ``kernel`` on a ``grid`` of ``block``-sized blocks with typed ``args``.

    ``args`` are buffers (passed as device pointers) or NumPy scalars (passed by
    value with their exact type: ``np.int32(n)``, ``np.float32(a)``). The kernel
    may write any buffer argument unless ``writes`` lists the indices it writes,
    so later readers on other streams wait for it. The op runs on the kernel
    actor that made the kernel (``kernel.library``).

    ``cluster`` groups blocks into thread-block clusters of that shape
    (Hopper, compute capability 9.0+): it must divide ``grid`` and hold at
    most 8 blocks, or 16 with ``non_portable_cluster``. A ``TensorMap``
    argument passes a tensor-map descriptor of a buffer by value; the buffer
    counts as read and, unless ``written`` says otherwise, written.
    """

    queues_only: ClassVar[bool] = True
    capturable: ClassVar[bool] = True
    kernel: KernelRef
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[Any, ...] = ()
    shared_mem: int = 0
    written: tuple[int, ...] | None = None
    cluster: tuple[int, int, int] | None = None
    non_portable_cluster: bool = False

    @property
    def library(self) -> str:  # type: ignore[override]
        """The kernel actor that owns the kernel."""
        return self.kernel.library

    def validate(self) -> None:
        if not isinstance(self.kernel, KernelRef):
            raise InvalidArgument(
                f"kernel must be a KernelRef, got {type(self.kernel).__name__}"
            )
        grid = dim3(self.grid, "grid")
        if self.cluster is not None:
            check_cluster(grid, self.cluster, self.non_portable_cluster)
        elif self.non_portable_cluster:
            raise InvalidArgument("non_portable_cluster needs a cluster")
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
                        and isinstance(self.args[i], GpuRef | TensorMap)):
                    raise InvalidArgument(f"written index {i!r} is not a buffer argument")

    def uses_hopper(self) -> bool:
        """True when the launch needs compute capability 9.0 (a cluster or a tensor map)."""
        return self.cluster is not None or any(isinstance(a, TensorMap) for a in self.args)

    def refs(self) -> tuple[GpuRef, ...]:
        """The buffer arguments, tensor maps' buffers included."""
        return tuple(a.buffer if isinstance(a, TensorMap) else a
                     for a in self.args if isinstance(a, GpuRef | TensorMap))

    def writes(self) -> tuple[GpuRef, ...]:
        """The buffer arguments the kernel writes (all of them unless ``written`` says)."""
        if self.written is None:
            return self.refs()
        return tuple(a.buffer if isinstance(a, TensorMap) else a
                     for a in (self.args[i] for i in self.written))

    def handles(self) -> tuple[KernelRef | GraphRef, ...]:
        """The kernel."""
        return (self.kernel,)
