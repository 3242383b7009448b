"""User kernels in the facade: ``Nvrtc`` compiles CUDA C, ``Modules`` loads PTX/cubin, and
both hand out ``NvrtcKernel`` handles to launch."""

from __future__ import annotations

import os
from collections.abc import Coroutine, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import checked
from atomr_accel.core._ref import KernelRef
from atomr_accel.core.ops._kernels import CompileKernel, LaunchKernel, LoadKernel, dim3
from atomr_accel.facade._bound import check_timeout
from atomr_accel.facade._buffers import GenerationBound, GpuBuffer
from atomr_accel.facade._kernel_args import launch_values
from atomr_accel.facade._libraries import Library
from atomr_accel.facade._portal import blocking

if TYPE_CHECKING:
    from atomr_accel.facade._device import Device

__all__ = [
    "Modules",
    "Nvrtc",
    "NvrtcKernel",
    "compile_kernel",
    "compile_kernel_async",
    "cuda_include_options",
    "launch_op",
]

_ORIGINAL_TIMEOUT = 60.0
"""The original's time-out of a launch and of a compile, in seconds."""

Dim = int | tuple[int, ...]


def launch_op(library: Library, kernel: KernelRef, grid: Dim, block: Dim, args: Iterable[Any],
              shared_mem: int = 0, writes: Iterable[int] | None = None,
              cluster: Dim | None = None, non_portable_cluster: bool = False) -> LaunchKernel:
    """The ``LaunchKernel`` op of a facade launch: buffers become refs, dims get normalized."""
    converted = tuple(library._ref(a, f"argument {i}") if isinstance(a, GpuBuffer) else a
                      for i, a in enumerate(args))
    return LaunchKernel(kernel, dim3(grid, "grid"), dim3(block, "block"), converted,
                        shared_mem, None if writes is None else tuple(writes),
                        None if cluster is None else dim3(cluster, "cluster"),
                        non_portable_cluster)


def _shared_bytes(shared_mem: int, shared: int | None) -> int:
    """The dynamic shared memory of a launch, given by either of its names."""
    if shared is None:
        return shared_mem
    if shared_mem not in (0, shared):
        raise InvalidArgument(f"shared={shared!r} and shared_mem={shared_mem!r} disagree; "
                              "pass one of them")
    return shared


def cuda_include_options(cuda_home: str | os.PathLike[str] | None = None) -> tuple[str, ...]:
    """NVRTC ``-I`` options for the CUDA toolkit's headers (``<cooperative_groups.h>``,
    ``<cuda/barrier>``, ``<cuda/ptx>``): its ``include`` folder and, from CUDA 13, the
    ``include/cccl`` folder those headers need. ``cuda_home`` defaults to ``$CUDA_HOME``,
    ``$CUDA_PATH``, then ``/usr/local/cuda``; ``InvalidArgument`` when it has no headers.
    """
    home = Path(cuda_home or os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
                or "/usr/local/cuda")
    include = home / "include"
    if not (include / "cooperative_groups.h").is_file():
        raise InvalidArgument(f"no CUDA toolkit headers under {include}; pass cuda_home or "
                              "set CUDA_HOME")
    folders = [include, include / "cccl"]
    return tuple(f"-I{folder}" for folder in folders if folder.is_dir())


class NvrtcKernel(GenerationBound, Library):
    """A kernel of one context generation, compiled by NVRTC or loaded from a module.

    ``launch(grid, block, *args)`` passes buffers as device pointers and NumPy
    scalars by value (``np.int32(n)``, ``np.float32(a)``; a plain Python number
    is refused, since its C type would be a guess). The original's form,
    ``launch(grid, block, [KernelArg, ...], shared=0)``, takes typed
    ``KernelArg``s instead. On Hopper (compute capability 9.0+),
    ``launch(..., cluster=(2, 1, 1))`` groups blocks into thread-block
    clusters and a ``TensorMap`` argument passes a tensor-map (TMA)
    descriptor by value (see ``docs/hopper.md``). After a context rebuild the handle is stale
    (``is_stale()``) and a launch raises ``GpuRefStale``: compile or load it
    again (the disk cache makes a recompile cheap).
    """

    def __init__(self, device: Any, ref: KernelRef) -> None:
        super().__init__(device)
        self.ref = ref

    @property
    def name(self) -> str:
        """The kernel's name as it was asked for."""
        return self.ref.name

    @property
    def cache_hit(self) -> bool:
        """True when the compiled image came from the disk cache."""
        return self.ref.cache_hit

    def launch_async(self, grid: Dim, block: Dim, *args: Any, shared_mem: int = 0,
                     shared: int | None = None, writes: Iterable[int] | None = None,
                     cluster: Dim | None = None, non_portable_cluster: bool = False,
                     timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """Run the kernel on ``grid`` blocks of ``block`` threads; returns when it has finished.

        ``args`` are buffers and NumPy scalars, or one list of ``KernelArg``s
        (the original's form). ``shared`` is the original's name of
        ``shared_mem`` (bytes of dynamic shared memory). ``writes`` lists the
        indices of the buffer arguments the kernel writes (default: all), which
        orders later readers on other streams after it. ``cluster`` (1 to 3
        ints dividing ``grid``) launches thread-block clusters of that shape
        through the driver's extended launch: at most 8 blocks, 16 with
        ``non_portable_cluster=True``; clusters and ``TensorMap`` arguments
        need compute capability 9.0 (``InvalidArgument`` elsewhere, the CPU
        backend included). ``timeout_secs``: None
        is the original's 60 s for a list of ``KernelArg``s, the system's
        ``op_timeout`` otherwise. The arguments are checked when called
        (``InvalidArgument``).
        """
        values: tuple[Any, ...] = args
        timeout = timeout_secs
        if len(args) == 1 and isinstance(args[0], list):
            values = launch_values(args[0])
            timeout = _ORIGINAL_TIMEOUT if timeout_secs is None else timeout_secs
        check_timeout(timeout)
        op = checked(launch_op(self, self.ref, grid, block, values,
                               _shared_bytes(shared_mem, shared), writes, cluster,
                               non_portable_cluster))
        return self._launch(op, timeout)

    async def _launch(self, op: LaunchKernel, timeout: float | None) -> None:
        await self.device.run_async(op, timeout)

    launch = blocking(launch_async)

    def __repr__(self) -> str:
        stale = ", stale" if self.is_stale() else ""
        return f"NvrtcKernel({self.name!r}, device={self.ref.device_id}{stale})"


class Nvrtc(Library):
    """Compile CUDA C into kernels with NVRTC (CUDA devices; the cpu backend refuses).

    Compiled images are kept in a disk cache keyed by source, name, options and
    architecture (``$ATOMR_ACCEL_KERNEL_CACHE`` or ``~/.cache/atomr_accel/kernels``;
    the ``kernel_cache_dir`` backend option overrides it). A compile error raises
    ``KernelCompileError`` with the compiler's ``log``.
    """

    async def compile_async(
        self, source: str, name: str, *, options: Iterable[str] = (),
        defines: Mapping[str, object] | None = None, fast_math: bool = False,
        arch: str | None = None,
    ) -> NvrtcKernel:
        """Compile ``source`` and return kernel ``name`` (an ``extern "C"`` name or a
        template instance such as ``"scale<float>"``)."""
        if isinstance(options, str):
            raise InvalidArgument("options must be a sequence of strings, not one string")
        pairs = tuple((str(k), str(v)) for k, v in (defines or {}).items())
        ref: KernelRef = await self._run(
            CompileKernel(source, name, tuple(options), pairs, fast_math, arch))
        return NvrtcKernel(self.device, ref)

    compile = blocking(compile_async)


def compile_kernel_async(device: Device, name: str, src: str,
                         timeout_secs: float | None = _ORIGINAL_TIMEOUT,
                         ) -> Coroutine[Any, Any, NvrtcKernel]:
    """Compile CUDA C ``src`` with NVRTC and return its kernel ``name`` (the original's
    ``Device.compile_kernel``; ``Nvrtc.compile`` takes options and defines too).

    The CPU backend refuses it (``InvalidArgument``: kernels need the CUDA
    backend); a compile error raises ``KernelCompileError`` with the log.
    """
    check_timeout(timeout_secs)
    return _compiled(device, checked(CompileKernel(src, name)), timeout_secs)


async def _compiled(device: Device, op: CompileKernel, timeout: float | None) -> NvrtcKernel:
    ref: KernelRef = await device.run_async(op, timeout)
    return NvrtcKernel(device, ref)


compile_kernel = blocking(compile_kernel_async)


class Modules(Library):
    """Load compiled modules (PTX text or cubin bytes) and get their kernels."""

    async def load_async(self, image: bytes | str, name: str) -> NvrtcKernel:
        """Load ``image`` (once per distinct image) and return its kernel ``name``."""
        data = image.encode() if isinstance(image, str) else image
        if isinstance(data, bytes) and data.isascii() and not data.endswith(b"\0"):
            data += b"\0"  # PTX text is loaded as a NUL-terminated string
        ref: KernelRef = await self._run(LoadKernel(data, name))
        return NvrtcKernel(self.device, ref)

    load = blocking(load_async)


def kernel_ref(kernel: NvrtcKernel | KernelRef) -> KernelRef:
    """The ``KernelRef`` of a facade kernel or a ref."""
    if isinstance(kernel, NvrtcKernel):
        return kernel.ref
    if isinstance(kernel, KernelRef):
        return kernel
    raise InvalidArgument(f"expected an NvrtcKernel, got {type(kernel).__name__}")
