"""User kernels in the facade: ``Nvrtc`` compiles CUDA C, ``Modules`` loads PTX/cubin, and
both hand out ``NvrtcKernel`` handles to launch."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._ref import KernelRef
from atomr_accel.core.ops._kernels import CompileKernel, LaunchKernel, LoadKernel, dim3
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.facade._libraries import Library
from atomr_accel.facade._portal import blocking

__all__ = ["Modules", "Nvrtc", "NvrtcKernel", "launch_op"]

Dim = int | tuple[int, ...]


def launch_op(library: Library, kernel: KernelRef, grid: Dim, block: Dim, args: Iterable[Any],
              shared_mem: int = 0, writes: Iterable[int] | None = None) -> LaunchKernel:
    """The ``LaunchKernel`` op of a facade launch: buffers become refs, dims get normalized."""
    converted = tuple(library._ref(a, f"argument {i}") if isinstance(a, GpuBuffer) else a
                      for i, a in enumerate(args))
    return LaunchKernel(kernel, dim3(grid, "grid"), dim3(block, "block"), converted,
                        shared_mem, None if writes is None else tuple(writes))


class NvrtcKernel(Library):
    """A kernel of one context generation, compiled by NVRTC or loaded from a module.

    ``launch(grid, block, *args)`` passes buffers as device pointers and NumPy
    scalars by value (``np.int32(n)``, ``np.float32(a)``; a plain Python number
    is refused, since its C type would be a guess). After a context rebuild the
    handle is stale (``is_stale()``) and a launch raises ``GpuRefStale``:
    compile or load it again (the disk cache makes a recompile cheap).
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

    def is_stale(self) -> bool:
        """True once the device's context has been rebuilt since the kernel was made."""
        return self.ref.generation != self.device.generation

    async def launch_async(self, grid: Dim, block: Dim, *args: Any, shared_mem: int = 0,
                           writes: Iterable[int] | None = None) -> None:
        """Run the kernel on ``grid`` blocks of ``block`` threads; returns when it has finished.

        ``writes`` lists the indices of the buffer arguments the kernel writes
        (default: all), which orders later readers on other streams after it.
        """
        await self._run(launch_op(self, self.ref, grid, block, args, shared_mem, writes))

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
