"""The original package's module names, declared once.

The original offered its classes from modules of their own (``atomr_accel.blas``,
``atomr_accel.system``, the compiled ``atomr_accel._native``, ...). ``SHIMS``
says, per module name, what it offers and where each name comes from here;
``DEVICE_NAMES``, what the original's ``atomr_accel.device`` offered that the
device tier's package offers beside its own names.
The modules themselves are thin files at the top of the package, written from
this declaration by ``python -m atomr_accel.original`` (a test checks that they
are current): files, rather than modules made at run time, so that type checkers,
IDEs and ``importlib.util.find_spec`` see them like any module, and so that
``import atomr_accel`` loads none of them.
"""

from __future__ import annotations

import dataclasses
import keyword
import re
from pathlib import Path

__all__ = ["DEVICE_NAMES", "SHIMS", "Shim", "render", "write_all"]


@dataclasses.dataclass(frozen=True, slots=True)
class Shim:
    """One module name of the original: its docstring and the names it offers, grouped
    by the module each is imported from."""

    doc: str
    names: tuple[tuple[str, tuple[str, ...]], ...]

    def exported(self) -> tuple[str, ...]:
        """Every name the module offers, in its ``__all__`` order."""
        return tuple(sorted(name for _, names in self.names for name in names))


_NATIVE_NAMES = (
    # system, device, buffers
    "System", "Device", "DeviceLoad", "GpuBuffer", "GpuBufferF32", "GpuBufferF64",
    "GpuBufferI32", "GpuBufferU32", "GpuBufferU8", "GpuBufferC64", "GpuBufferC128",
    # errors
    "GpuRuntimeError", "ContextPoisoned", "OutOfMemory", "Unrecoverable", "GpuRefStale",
    "LibraryError", "AskTimeout",
    # libraries
    "Blas", "Cudnn", "RnnBwdInputs", "MultiHeadAttnBwdInputs", "Fft", "RngGenerator", "Solver",
    "Collective", "NvrtcKernel", "KernelArg", "Cub", "Cutlass", "FlashAttn", "TensorRt",
    "TrtEngine",
    # graphs and memory
    "GraphCapture", "GraphScript", "GraphHandle", "Memory", "ManagedBufferF32", "IpcMemHandle",
    "IpcOpenedMem",
    # telemetry
    "NvtxKernelTrace", "NvmlActor", "CuptiSession",
    # patterns
    "DynamicBatchingServer", "InferenceCascade", "ModelReplicaPool", "FairShareScheduler",
    "HotSwapServer", "SpeculativeDecoder", "MoeRouter",
    # train
    "AsyncParameterServer", "DataParallelTrainer", "PipelineParallelTrainer",
    "TensorParallelTrainer",
    # agents
    "SharedGpuStateCoordinator", "EmbeddingCache", "CpuVectorIndex", "RagPipeline",
    "LangGraphGpuActor",
    # realtime
    "ClothSimulationActor", "FluidSimulationActor", "ParticleSystemActor", "SpatialIndexActor",
    "GpuHashMapActor", "ImageFilterPipeline",
    "__version__",
)

SHIMS: dict[str, Shim] = {
    "_native": Shim(
        "The original package's compiled module, ``atomr_accel._native``, by name.\n\n"
        "The original built its classes in Rust (PyO3) into ``atomr_accel._native`` and\n"
        "re-exported them from the package; code written for it reaches them either way\n"
        "(``_native.Device``, ``_native.DynamicBatchingServer``, ``_native.GraphCapture``,\n"
        "...). Here nothing is compiled: this module re-exports, under the same names, the\n"
        "very objects the package exports, so ``_native.Device is atomr_accel.Device``. It\n"
        "is imported only when asked for, so ``import atomr_accel`` costs nothing more.",
        (("atomr_accel", _NATIVE_NAMES),
         ("atomr_accel.facade", ("ipc_get_mem_handle", "ipc_open_mem_handle")))),
    "blas": Shim("The original package's ``atomr_accel.blas``: ``Blas``.",
                 (("atomr_accel", ("Blas",)),)),
    "blaslt": Shim(
        "Fused matmuls: the ``BlasLt`` handle (``dev.blaslt()``), its epilogues and the size\n"
        "of the auxiliary buffer that carries a forward pass's activation input to the\n"
        "backward epilogues.",
        (("atomr_accel", ("BlasLt",)),
         ("atomr_accel.core.ops._blaslt", ("Epilogue", "aux_len", "gelu_aux_ld", "relu_aux_ld")))),
    "collective": Shim(
        "The original package's ``atomr_accel.collective``: ``Collective`` (here the\n"
        "NCCL-style collectives over a world of devices, ``System.nccl_world``), its\n"
        "per-rank and grouped views, the reduction operators and the error a failed epoch\n"
        "raises.",
        (("atomr_accel", ("Collective", "CollectiveAborted")),
         ("atomr_accel.core.ops._collective", ("ReduceOp",)),
         ("atomr_accel.facade", ("CollectiveGroup", "CollectiveRank")))),
    "cub": Shim("Device-wide primitives: the ``Cub`` handle (``dev.cub()``) and its operator "
                "choices.",
                (("atomr_accel", ("Cub",)),
                 ("atomr_accel.core.ops._cub", ("ReduceKind", "ScanKind")))),
    "cudnn": Shim(
        "The original package's ``atomr_accel.cudnn`` module: the ``Cudnn`` handle, the\n"
        "builders of its two backward calls, and ``rnn_weight_count`` (the size of an RNN's\n"
        "packed weights).",
        (("atomr_accel", ("Cudnn", "MultiHeadAttnBwdInputs", "RnnBwdInputs")),
         ("atomr_accel.core.ops._rnn", ("rnn_weight_count",)))),
    "cutlass": Shim(
        "CUTLASS kernel templates: the ``Cutlass`` handle (``dev.cutlass()``), its epilogue\n"
        "visitor trees, kernel plans, ``build_kernels`` to fill the kernel cache ahead of\n"
        "time, and ``to_fp8`` / ``from_fp8`` to encode and decode the fp8 bits\n"
        "``Cutlass.gemm_fp8`` takes.",
        (("atomr_accel", ("Cutlass",)),
         ("atomr_accel.core._fp8", ("FP8_MAX", "from_fp8", "to_fp8")),
         ("atomr_accel.core.ops._cutlass", ("Activate", "Activation", "Axis", "BiasAdd",
                                            "Epilogue", "Reduce", "ResidualAdd", "Scale")),
         ("atomr_accel.core.ops._cutlass_plan", ("CUTLASS_VERSION", "FP8_FORMATS", "KernelPlan",
                                                 "PlanKind", "conv2d_plan", "gemm_fp8_plan",
                                                 "gemm_plan", "grouped_plan")),
         ("atomr_accel.facade._kernel_cache", ("build_kernels",)))),
    "fft": Shim("The original package's ``atomr_accel.fft``: ``Fft`` and the R2C size helpers.",
                (("atomr_accel", ("Fft",)),
                 ("atomr_accel.core.ops._fft", ("r2c_output_len", "r2c_output_len_2d",
                                                "r2c_output_len_3d", "r2c_output_len_many")))),
    "graph": Shim("The original package's ``atomr_accel.graph``: ``GraphScript``,\n"
                  "``GraphCapture``, ``GraphHandle`` (real graphs here; the original's were a "
                  "mock).",
                  (("atomr_accel", ("GraphCapture", "GraphHandle", "GraphScript")),)),
    "memory": Shim("The original package's ``atomr_accel.memory``: managed memory and IPC "
                   "handles.",
                   (("atomr_accel", ("IpcMemHandle", "IpcOpenedMem", "ManagedBufferF32",
                                     "Memory")),
                    ("atomr_accel.facade", ("ipc_get_mem_handle", "ipc_get_mem_handle_async",
                                            "ipc_open_mem_handle",
                                            "ipc_open_mem_handle_async")))),
    "nvrtc": Shim("The original package's ``atomr_accel.nvrtc``: ``NvrtcKernel`` and\n"
                  "``KernelArg``, and ``TensorMap``, the tensor-map (TMA) descriptor a Hopper\n"
                  "kernel takes by value.",
                  (("atomr_accel", ("KernelArg", "NvrtcKernel", "TensorMap")),
                   ("atomr_accel.facade._kernels", ("cuda_include_options",)))),
    "rng": Shim("The original package's ``atomr_accel.rng``: ``RngGenerator``.",
                (("atomr_accel", ("RngGenerator",)),)),
    "solver": Shim("The original package's ``atomr_accel.solver``: ``Solver``.",
                   (("atomr_accel", ("Solver",)),)),
    "system": Shim("The original package's ``atomr_accel.system``: ``System``.",
                   (("atomr_accel", ("System",)),)),
}
"""Each original module name (``atomr_accel.<key>``) and what it offers."""

DEVICE_NAMES: dict[str, tuple[str, str]] = {
    "DeviceLoad": ("atomr_accel.device", "DeviceStats"),
    **{name: ("atomr_accel.facade", name) for name in (
        "Device", "GpuBuffer", "GpuBufferF32", "GpuBufferF64", "GpuBufferI32", "GpuBufferU32",
        "GpuBufferU8", "GpuBufferC64", "GpuBufferC128")},
}
"""The original's ``atomr_accel.device`` names, which the device tier (a real package
here) offers beside its own: each is ``(module, name)``, looked up on first use."""

_HEADER = ("Written from ``atomr_accel.original`` by ``python -m atomr_accel.original``; "
           "edit the\ndeclaration there, not this file.")
_WIDTH = 100


def _import(source: str, names: list[str]) -> list[str]:
    """An import statement as ruff's isort writes it."""
    line = f"from {source} import {', '.join(names)}"
    if len(line) <= _WIDTH:
        return [line]
    return [f"from {source} import (", *(f"    {name}," for name in names), ")"]


def _isort_key(name: str) -> tuple[int, list[str | int]]:
    """isort's order by type (constants, then classes, then everything else), each in
    natural order (``C64`` before ``C128``)."""
    kind = 0 if name.isupper() else 1 if name[:1].isupper() else 2
    return kind, [int(part) if part.isdigit() else part
                  for part in re.split(r"(\d+)", name.lower())]


def _all_lines(names: tuple[str, ...]) -> list[str]:
    """The ``__all__`` assignment, wrapped as ruff formats a long list."""
    line = f"__all__ = [{', '.join(repr(n).replace(chr(39), chr(34)) for n in names)}]"
    if len(line) <= _WIDTH:
        return [line]
    return ["__all__ = [", *(f'    "{name}",' for name in names), "]"]


def render(name: str) -> str:
    """The text of the top-level module ``atomr_accel.<name>``."""
    shim = SHIMS[name]
    assert name.isidentifier() and not keyword.iskeyword(name)
    lines = [f'"""{shim.doc}', "", f'{_HEADER}\n"""', ""]
    sources = sorted([*shim.names, ("atomr_accel._public", ("publish as _publish",))])
    for source, names in sources:
        lines += _import(source, sorted(names, key=_isort_key))
    lines += ["", *_all_lines(shim.exported()), "", "_publish(__name__)", ""]
    return "\n".join(lines)


def write_all(package: Path) -> list[Path]:
    """Write every module of ``SHIMS`` into the package folder ``package``; answer the files
    that changed."""
    changed = []
    for name in SHIMS:
        path = package / f"{name}.py"
        text = render(name)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed.append(path)
    return changed
