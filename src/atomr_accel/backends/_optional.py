"""Optional Python packages behind some CUDA libraries, imported on first use.

``require("cudnn")`` returns the module a library runs on (``cudnn`` for the
cuDNN frontend, ``nvmath`` for cuBLASLt) or raises ``LibraryUnavailable``
naming the package and the pyproject extra that installs it. A failed import
is remembered, so a missing package costs one attempt per process.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from types import ModuleType

from atomr_accel.core._errors import LibraryUnavailable

__all__ = ["EVERY_BACKEND", "OPTIONAL", "Optional", "require", "unavailable"]


@dataclass(frozen=True, slots=True)
class Optional:
    """A library's Python module, the package that provides it and the extra that installs it."""

    module: str
    package: str
    extra: str
    program: str = ""
    """A program the library runs as well (``nvcc``), looked up on first use."""


OPTIONAL: dict[str, Optional] = {
    "cudnn": Optional("cudnn", "nvidia-cudnn-frontend", "cudnn"),
    "flashattn": Optional("cudnn", "nvidia-cudnn-frontend", "cudnn"),
    "blaslt": Optional("nvmath", "nvmath-python", "blaslt"),
    "cupti": Optional("cupti.cupti", "cupti-python", "cupti"),
    "onnx": Optional("onnxruntime", "onnxruntime", "onnx"),
    "tensorrt": Optional("tensorrt", "tensorrt", "tensorrt"),
    "cutlass": Optional("cutlass_library", "nvidia-cutlass", "cutlass", program="nvcc"),
}
"""Library name -> what it needs on CUDA (libraries not listed need nothing optional)."""

EVERY_BACKEND = frozenset({"onnx", "tensorrt"})
"""Libraries whose package is needed on every backend, the CPU's included (the others run
on NumPy there)."""


@functools.cache
def _import(module: str) -> ModuleType | Exception:
    try:
        return importlib.import_module(module)
    except Exception as exc:  # ImportError, or a loader error from a missing shared library
        return exc


def unavailable(library: str) -> LibraryUnavailable | None:
    """The error a call of ``library`` would raise here, or None when it can run."""
    need = OPTIONAL.get(library)
    if need is None:
        return None
    found = _import(need.module)
    if isinstance(found, Exception):
        return LibraryUnavailable(library, need.package, need.extra,
                                  f"{type(found).__name__}: {found}")
    if need.program == "nvcc":
        from atomr_accel.backends._cutlass_build import find_nvcc
        if find_nvcc() is None:
            return LibraryUnavailable(library, "nvcc (the CUDA toolkit)", need.extra,
                                      "nvcc is not on PATH, CUDA_HOME or /usr/local/cuda")
    return None


def require(library: str) -> ModuleType:
    """The module ``library`` runs on; raises ``LibraryUnavailable`` when it does not import."""
    error = unavailable(library)
    if error is not None:
        raise error
    found = _import(OPTIONAL[library].module)
    assert isinstance(found, ModuleType)
    return found
