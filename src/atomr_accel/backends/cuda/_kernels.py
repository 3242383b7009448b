"""User kernels on CUDA: NVRTC compiles through a persistent disk cache, modules load PTX or
cubin, and launches pass buffers as device pointers and NumPy scalars by value.

The cache key is a SHA-256 of the source, the kernel name, every compiler option (the
architecture included) and the NVRTC version; an entry is the compiled image plus the
kernel's lowered name, written atomically so concurrent workers never see half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cupy as cp
from cupy_backends.cuda.libs import nvrtc

from atomr_accel.backends._handlers import cuda
from atomr_accel.backends.cuda._hopper import launch_ex
from atomr_accel.core._errors import KernelCompileError
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._kernels import CompileKernel, LaunchKernel, LoadKernel

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

__all__ = ["Kernel", "KernelCache", "compile_source", "default_cache_dir"]


def default_cache_dir() -> Path:
    """``$ATOMR_ACCEL_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/atomr_accel/kernels``."""
    explicit = os.environ.get("ATOMR_ACCEL_KERNEL_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "atomr_accel" / "kernels"


class KernelCache:
    """Compiled kernel images on disk, keyed by everything that shapes them."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_cache_dir()

    @staticmethod
    def key(source: str, name: str, options: tuple[str, ...]) -> str:
        """The entry name for one compilation."""
        material = json.dumps([source, name, list(options), list(nvrtc.getVersion())])
        return hashlib.sha256(material.encode()).hexdigest()

    def load(self, key: str) -> tuple[bytes, str] | None:
        """``(image, lowered name)`` of an entry, or None when absent or unreadable."""
        try:
            meta = json.loads((self.directory / f"{key}.json").read_text())
            image = (self.directory / f"{key}.bin").read_bytes()
        except (OSError, ValueError):
            return None
        lowered = meta.get("lowered")
        return (image, lowered) if isinstance(lowered, str) else None

    def store(self, key: str, image: bytes, lowered: str) -> None:
        """Write an entry (image first, then its metadata, each atomically)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._write(f"{key}.bin", image)
        self._write(f"{key}.json", json.dumps({"lowered": lowered}).encode())

    def _write(self, name: str, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.directory / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


class Kernel:
    """A loaded kernel and the module that keeps it alive."""

    def __init__(self, module: Any, name: str) -> None:
        self.module = module
        self.function = module.get_function(name)


def compile_source(source: str, name: str, options: tuple[str, ...]) -> tuple[bytes, str]:
    """Run NVRTC; return ``(image, lowered kernel name)``: a cubin for an ``sm_`` target,
    PTX for a ``compute_`` one. ``KernelCompileError`` carries the log of a failure."""
    program = nvrtc.createProgram(source, f"{name}.cu", (), ())
    try:
        add = getattr(nvrtc, "addNameExpression", None) or nvrtc.addAddNameExpression
        add(program, name)
        try:
            nvrtc.compileProgram(program, list(options))
        except nvrtc.NVRTCError as exc:
            raise KernelCompileError(getattr(exc, "status", "error"),
                                     nvrtc.getProgramLog(program), name) from None
        lowered = nvrtc.getLoweredName(program, name)
        arch = next((o.split("=", 1)[1] for o in options
                     if o.startswith("--gpu-architecture=")), "")
        if arch.startswith("sm_") and hasattr(nvrtc, "getCUBIN"):
            image = bytes(nvrtc.getCUBIN(program))
        else:
            ptx = nvrtc.getPTX(program)
            image = ptx if isinstance(ptx, bytes) else ptx.encode()
        return image, lowered
    finally:
        nvrtc.destroyProgram(program)


def _module(backend: CudaBackend, image: bytes) -> Any:
    """One loaded module per distinct image in this context."""
    digest = hashlib.sha256(image).hexdigest()
    module = backend.modules.get(digest)
    if module is None:
        module = cp.cuda.function.Module()
        module.load(image)
        backend.modules[digest] = module
    return module


@cuda.handles(CompileKernel)
def compile_kernel(backend: CudaBackend, op: CompileKernel) -> tuple[int, bool]:
    """Compile (or take from the disk cache) and load; answer ``(kernel id, cache hit)``."""
    options = op.compiler_options(f"sm_{backend.compute_capability}")
    key = KernelCache.key(op.source, op.name, options)
    entry = backend.kernel_cache.load(key)
    cache_hit = entry is not None
    if entry is None:
        entry = compile_source(op.source, op.name, options)
        backend.kernel_cache.store(key, *entry)
    image, lowered = entry
    return backend.keep(Kernel(_module(backend, image), lowered)), cache_hit


@cuda.handles(LoadKernel)
def load_kernel(backend: CudaBackend, op: LoadKernel) -> int:
    """Load a PTX or cubin image (once per image) and answer the kernel's id."""
    return backend.keep(Kernel(_module(backend, op.image), op.name))


@cuda.handles(LaunchKernel)
def launch_kernel(backend: CudaBackend, op: LaunchKernel) -> None:
    """Launch on the current stream; buffers go as pointers, scalars by value. Clusters and
    tensor maps go through the driver's extended launch (``_hopper.py``)."""
    kernel = backend.kept(op.kernel.kernel_id, Kernel)
    if op.uses_hopper():
        launch_ex(backend, kernel.function, op)
        return
    args = tuple(backend.array(a.buffer_id) if isinstance(a, GpuRef) else a for a in op.args)
    kernel.function(op.grid, op.block, args, shared_mem=op.shared_mem,
                    stream=cp.cuda.get_current_stream())
