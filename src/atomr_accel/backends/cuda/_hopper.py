"""Hopper launch features on CUDA: thread-block clusters through the driver's extended
launch (``cuLaunchKernelEx`` of ``cuda.bindings.driver``) and tensor-map (TMA)
descriptors encoded with the driver's ``cuTensorMapEncodeTiled``.

A descriptor is encoded at each launch from the buffer's current address, so it
never outlives the allocation it describes. The launch goes on the op's stream
(the current CuPy stream inside the handler) and nothing here synchronizes.
"""

from __future__ import annotations

import ctypes
import importlib
from typing import TYPE_CHECKING, Any

import cupy as cp

from atomr_accel.core._errors import InvalidArgument, LibraryError, LibraryUnavailable
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._kernels import LaunchKernel
from atomr_accel.core.ops._tensor_map import TMA_DTYPES, TensorMap

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

__all__ = ["EncodedMap", "encode_tensor_map", "launch_ex", "require_hopper"]

_HOPPER = 90


def _driver() -> Any:
    """``cuda.bindings.driver`` (``LibraryUnavailable`` when cuda-bindings is missing)."""
    try:
        return importlib.import_module("cuda.bindings.driver")
    except ImportError as exc:
        raise LibraryUnavailable("cuda-driver", "cuda-bindings", "cuda", str(exc)) from None


def _check(result: Any, call: str) -> Any:
    """The values of a driver call's answer; ``LibraryError`` unless it succeeded."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if int(status) != 0:
        raise LibraryError("cuda-driver", status, f"{call} failed: {status!r}")
    return values[0] if len(values) == 1 else values


def require_hopper(backend: CudaBackend) -> None:
    """``InvalidArgument`` unless the device has compute capability 9.0 or newer."""
    if int(backend.compute_capability) < _HOPPER:
        raise InvalidArgument(
            "thread-block clusters and tensor maps need a CUDA device of compute capability "
            f"9.0 or newer; this one has {int(backend.compute_capability) / 10:.1f}")


_DATA_TYPES = {"UINT8": 0, "UINT16": 1, "UINT32": 2, "INT32": 3, "UINT64": 4, "INT64": 5,
               "FLOAT16": 6, "FLOAT32": 7, "FLOAT64": 8, "BFLOAT16": 9}
"""``CUtensorMapDataType`` values (cuda.h)."""
_SWIZZLE = {"none": 0, "32b": 1, "64b": 2, "128b": 3}
_INTERLEAVE = {"none": 0, "16b": 1, "32b": 2}
_L2 = {"none": 0, "64b": 1, "128b": 2, "256b": 3}
_OOB = {"zero": 0, "nan": 1}
_MAP_BYTES = 128
_MAP_ALIGN = 128  # alignas(128) in CUDA 13's cuda.h (64 before)


class EncodedMap:
    """The 128 bytes of one ``CUtensorMap``, in storage aligned as the driver needs."""

    def __init__(self) -> None:
        self._storage = ctypes.create_string_buffer(_MAP_BYTES + _MAP_ALIGN)
        base = ctypes.addressof(self._storage)
        self.address = base + (-base % _MAP_ALIGN)


_libcuda: Any = None


def _encode_tiled() -> Any:
    """The driver's ``cuTensorMapEncodeTiled``, called through ctypes into storage we align
    ourselves (cuda-bindings' ``CUtensorMap`` lives in Python memory aligned to 16 only)."""
    global _libcuda
    if _libcuda is None:
        _libcuda = ctypes.CDLL("libcuda.so.1")
        fn = _libcuda.cuTensorMapEncodeTiled
        u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                       u64p, u64p, u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int]
        fn.restype = ctypes.c_int
    return _libcuda.cuTensorMapEncodeTiled


def encode_tensor_map(backend: CudaBackend, view: TensorMap) -> EncodedMap:
    """The ``CUtensorMap`` of ``view`` at its buffer's current address."""
    address = int(backend.array(view.buffer.buffer_id).data.ptr) + view.offset
    align = 32 if view.interleave == "32b" else 16
    if address % align:
        raise InvalidArgument(f"a tensor map's start must be {align}-byte aligned; "
                              f"{view!r} starts at {address:#x}")
    rank = view.rank  # the driver counts dimensions innermost first
    dims = (ctypes.c_uint64 * rank)(*reversed(view.shape))
    strides = (ctypes.c_uint64 * max(rank - 1, 1))(*reversed(view.strides))
    box = (ctypes.c_uint32 * rank)(*reversed(view.box))
    steps = (ctypes.c_uint32 * rank)(*reversed(view.element_strides))
    encoded = EncodedMap()
    status = _encode_tiled()(
        encoded.address, _DATA_TYPES[TMA_DTYPES[view.dtype]], rank, address, dims, strides,
        box, steps, _INTERLEAVE[view.interleave], _SWIZZLE[view.swizzle],
        _L2[view.l2_promotion], _OOB[view.oob_fill])
    if status != 0:
        raise LibraryError("cuda-driver", status, f"cuTensorMapEncodeTiled refused {view!r}")
    return encoded


def _parameters(backend: CudaBackend, op: LaunchKernel) -> tuple[Any, list[Any]]:
    """The ``void**`` array of the kernel's parameters and what keeps each value alive."""
    keep: list[Any] = []
    pointers = (ctypes.c_void_p * max(len(op.args), 1))()
    for i, arg in enumerate(op.args):
        if isinstance(arg, GpuRef):
            value: Any = ctypes.c_uint64(int(backend.array(arg.buffer_id).data.ptr))
            address = ctypes.addressof(value)
        elif isinstance(arg, TensorMap):
            value = encode_tensor_map(backend, arg)
            address = value.address
        else:  # a NumPy scalar, passed by value with its exact width
            value = ctypes.create_string_buffer(arg.tobytes(), max(arg.nbytes, 1))
            address = ctypes.addressof(value)
        keep.append(value)
        pointers[i] = address
    return pointers, keep


def launch_ex(backend: CudaBackend, function: Any, op: LaunchKernel) -> None:
    """Launch ``function`` (a CuPy kernel function) with ``cuLaunchKernelEx`` on the
    current stream, with the op's cluster shape if it has one."""
    require_hopper(backend)
    driver = _driver()
    handle = driver.CUfunction(int(function.ptr))
    if op.non_portable_cluster:
        _check(driver.cuFuncSetAttribute(
            handle,
            driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
            "cuFuncSetAttribute")
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = op.grid
    config.blockDimX, config.blockDimY, config.blockDimZ = op.block
    config.sharedMemBytes = op.shared_mem
    config.hStream = driver.CUstream(int(cp.cuda.get_current_stream().ptr))
    attributes = []
    if op.cluster is not None:
        attribute = driver.CUlaunchAttribute()
        attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        dim = attribute.value.clusterDim
        dim.x, dim.y, dim.z = op.cluster
        attributes.append(attribute)
    config.attrs = attributes
    config.numAttrs = len(attributes)
    pointers, keep = _parameters(backend, op)
    _check(driver.cuLaunchKernelEx(config, handle, ctypes.addressof(pointers), 0),
           "cuLaunchKernelEx")
    del keep  # the driver copied the parameter values at the launch
