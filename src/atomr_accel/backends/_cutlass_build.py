"""Build CUTLASS kernels with nvcc into shared libraries, cache them on disk, load them.

``library(plan)`` answers the loaded kernel of a ``KernelPlan``: from this
process's table, else from the disk cache (``$ATOMR_ACCEL_KERNEL_CACHE``, else
``~/.cache/atomr_accel/kernels``, folder ``cutlass``), else compiled by nvcc
from ``_cutlass_source.render(plan)`` against the CUTLASS headers shipped in
the ``nvidia-cutlass`` package, for the plan's architecture (``sm_90`` as
``sm_90a``, the WGMMA target). A cache file is named by the
plan (problem class, tile, stages, arch) and a hash of the source, the nvcc
flags, nvcc's version and the CUTLASS version, so a change of any of them
builds anew. ``build(plans)`` compiles several plans in parallel processes
(warming the cache needs nvcc, not a GPU).

Missing pieces raise ``LibraryUnavailable`` naming them (the ``nvidia-cutlass``
package, nvcc, or an nvcc that cannot generate code for the plan's
architecture); a compiler error raises ``KernelCompileError`` with nvcc's log.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from atomr_accel.backends._cutlass_source import render
from atomr_accel.backends._optional import require
from atomr_accel.core._errors import (
    KernelCompileError,
    LibraryError,
    LibraryUnavailable,
)
from atomr_accel.core.ops._cutlass_plan import CUTLASS_VERSION, KernelPlan, PlanKind, smem_limit

__all__ = [
    "CompiledKernel", "NvccError", "build", "cache_dir", "cache_path", "find_nvcc", "library",
    "nvcc_flags",
]

COMPILE_TIMEOUT = 900.0
"""Seconds one nvcc run may take."""
_U64 = ctypes.c_uint64
_PTR = ctypes.c_void_p
_INT = ctypes.c_int
_LOCK = threading.Lock()
_LOADED: dict[Path, CompiledKernel] = {}
_BY_PLAN: dict[KernelPlan, CompiledKernel] = {}
"""Loaded kernels by plan: the hot path, which skips rendering and hashing the source."""


class NvccError(KernelCompileError):
    """nvcc could not build a CUTLASS kernel (``log``: its output), or the kernel it built
    cannot run (it needs more shared memory than a CTA has)."""

    __module__ = "atomr_accel.errors"  # its public home, which loads it on first use

    def __init__(self, status: object, log: str, name: str) -> None:
        LibraryError.__init__(self, "nvcc", status,
                              f"CUTLASS kernel {name!r} did not build:\n{log.strip()}")
        self.log = log


def cache_dir() -> Path:
    """The kernel cache's ``cutlass`` folder: under ``$ATOMR_ACCEL_KERNEL_CACHE``, else
    ``$XDG_CACHE_HOME/atomr_accel/kernels`` (NVRTC's cache's root)."""
    explicit = os.environ.get("ATOMR_ACCEL_KERNEL_CACHE")
    if explicit:
        return Path(explicit) / "cutlass"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "atomr_accel" / "kernels" / "cutlass"


@functools.cache
def find_nvcc() -> str | None:
    """nvcc on ``PATH``, else under ``$CUDA_HOME`` / ``$CUDA_PATH`` or ``/usr/local/cuda``
    (looked up once a process)."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (candidate := Path(root) / "bin" / "nvcc").is_file():
            return str(candidate)
    return None


def _nvcc() -> str:
    nvcc = find_nvcc()
    if nvcc is None:
        raise LibraryUnavailable("cutlass", "nvcc (the CUDA toolkit)", "cutlass",
                                 "nvcc is not on PATH, CUDA_HOME or /usr/local/cuda")
    return nvcc


@functools.cache
def _nvcc_version(nvcc: str) -> str:
    done = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60,
                          check=False)
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "unknown"


def _headers() -> tuple[Path, Path]:
    cutlass_library = require("cutlass")
    root = Path(str(cutlass_library.__file__)).parent / "source"
    include, util = root / "include", root / "tools" / "util" / "include"
    if not (include / "cutlass" / "cutlass.h").is_file():
        raise LibraryUnavailable("cutlass", "nvidia-cutlass", "cutlass",
                                 f"its CUTLASS headers are missing under {root}")
    return include, util


@functools.cache
def _gpu_codes(nvcc: str) -> frozenset[str]:
    done = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, timeout=60,
                          check=False)
    return frozenset(done.stdout.split())


def _target(arch: str) -> str:
    """``arch`` as nvcc's target: ``sm_90`` is built as ``sm_90a`` (WGMMA needs it)."""
    return "sm_90a" if arch == "sm_90" else arch


def nvcc_flags(arch: str = "sm_90a") -> list[str]:
    """The flags a kernel for ``arch`` is compiled with (headers, C++17, O3, its target)."""
    include, util = _headers()
    code = _target(arch)
    return ["-shared", "-Xcompiler", "-fPIC", "-O3", "-std=c++17", "--expt-relaxed-constexpr",
            "-DNDEBUG", f"-gencode=arch={code.replace('sm_', 'compute_')},code={code}",
            f"-I{include}", f"-I{util}"]


def _nvcc_for(arch: str) -> str:
    """nvcc, after checking it generates code for ``arch``."""
    nvcc = _nvcc()
    if arch.removesuffix("a") not in _gpu_codes(nvcc):
        raise LibraryUnavailable("cutlass", "nvcc (the CUDA toolkit)", "cutlass",
                                 f"{_nvcc_version(nvcc)} cannot generate code for {arch}")
    return nvcc


def cache_path(plan: KernelPlan) -> Path:
    """Where ``plan``'s compiled kernel lives in the disk cache."""
    flags = nvcc_flags(plan.arch)  # the package first: without it, that is what to install
    nvcc = _nvcc_for(plan.arch)
    digest = hashlib.sha256("\0".join(
        [render(plan), *flags[:-2], _nvcc_version(nvcc), CUTLASS_VERSION]).encode()).hexdigest()
    return cache_dir() / f"{plan.name}-{digest[:16]}.so"


def _compile(plan: KernelPlan, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="atomr-cutlass-") as tmp:
        source = Path(tmp) / f"{plan.name}.cu"
        source.write_text(render(plan))
        out = Path(tmp) / "kernel.so"
        try:
            done = subprocess.run([_nvcc_for(plan.arch), *nvcc_flags(plan.arch), "-o", str(out),
                                   str(source)],
                                  capture_output=True, text=True, timeout=COMPILE_TIMEOUT,
                                  check=False)
        except subprocess.TimeoutExpired as exc:
            raise NvccError("timeout", f"nvcc ran over {COMPILE_TIMEOUT:.0f} s",
                                     plan.name) from exc
        if done.returncode != 0:
            raise NvccError(done.returncode, done.stderr[-20000:], plan.name)
        partial = target.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        shutil.copyfile(out, partial)
        os.replace(partial, target)


@dataclass(frozen=True, slots=True)
class CompiledKernel:
    """A loaded kernel library: its ``plan``, file and ctypes entry points."""

    plan: KernelPlan
    path: Path
    lib: ctypes.CDLL

    @property
    def stages(self) -> int:
        """The pipeline depth compiled in."""
        return int(self.lib.atomr_stages())

    @property
    def smem_bytes(self) -> int:
        """Shared memory one CTA of the kernel uses."""
        return int(self.lib.atomr_smem_bytes())


def _load(plan: KernelPlan, path: Path) -> CompiledKernel:
    lib = ctypes.CDLL(str(path))
    lib.atomr_stages.restype = _INT
    lib.atomr_smem_bytes.restype = ctypes.c_size_t
    lib.atomr_workspace.restype = ctypes.c_size_t
    lib.atomr_run.restype = _INT
    if plan.kind in (PlanKind.GEMM, PlanKind.GEMM_FP8):
        scalar = ctypes.c_double if plan.family == "sm80" else ctypes.c_float
        lib.atomr_workspace.argtypes = [_INT, _INT, _INT, _INT]
        lib.atomr_run.argtypes = [_INT, _INT, _INT, _PTR, _PTR, _PTR, _PTR, _PTR,
                                  scalar, scalar, _INT, _PTR, _INT, _PTR]
        lib.atomr_prepare.restype = _PTR
        lib.atomr_prepare.argtypes = [*lib.atomr_run.argtypes, ctypes.POINTER(_INT)]
        lib.atomr_launch.restype = _INT
        lib.atomr_launch.argtypes = [_PTR, _PTR]
        lib.atomr_release.restype = None
        lib.atomr_release.argtypes = [_PTR]
    elif plan.kind is PlanKind.GROUPED:
        lib.atomr_workspace.argtypes = [_INT, _PTR, _INT]
        lib.atomr_run.argtypes = [_INT, _PTR, _PTR, ctypes.c_float, _PTR, _INT, _PTR]
    else:
        lib.atomr_workspace.argtypes = [_PTR]
        lib.atomr_run.argtypes = [_PTR, _PTR, _PTR, _PTR, _PTR, ctypes.c_float, _PTR, _PTR]
    kernel = CompiledKernel(plan, path, lib)
    limit = smem_limit(plan.arch)
    if kernel.smem_bytes > limit:
        raise NvccError("shared memory", f"the kernel needs {kernel.smem_bytes} bytes of "
                                 f"shared memory, more than {plan.arch}'s {limit}", plan.name)
    return kernel


def library(plan: KernelPlan) -> CompiledKernel:
    """``plan``'s kernel, loaded: from this process, the disk cache, or compiled now."""
    found = _BY_PLAN.get(plan)
    if found is not None:
        return found
    path = cache_path(plan)
    kernel = _LOADED.get(path)
    if kernel is not None:
        return kernel
    with _LOCK:
        kernel = _LOADED.get(path)
        if kernel is None:
            if not path.is_file():
                _compile(plan, path)
            kernel = _LOADED[path] = _load(plan, path)
        _BY_PLAN[plan] = kernel
    return kernel


def build(plans: Iterable[KernelPlan], jobs: int | None = None) -> list[Path]:
    """Compile every plan not in the disk cache yet, ``jobs`` nvcc processes at a time
    (default: the CPU count); answer the cache files in the plans' order."""
    todo = list(dict.fromkeys(plans))
    paths = [cache_path(p) for p in todo]
    missing = [(p, path) for p, path in zip(todo, paths, strict=True) if not path.is_file()]
    if missing:
        with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
            for future in [pool.submit(_compile, p, path) for p, path in missing]:
                future.result()
    return paths
