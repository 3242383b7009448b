"""The Python facade: ``System``, ``Device``, typed buffers and library handles."""

from atomr_accel.facade import _buffers, _handles
from atomr_accel.facade._attn_inputs import MultiHeadAttnBwdInputs
from atomr_accel.facade._buffers import *  # noqa: F403 - GpuBuffer and its class per dtype
from atomr_accel.facade._collective import Collective, CollectiveGroup, CollectiveRank
from atomr_accel.facade._device import Device
from atomr_accel.facade._functions import DeviceFunction, Resident
from atomr_accel.facade._graph_script import GraphCapture, GraphHandle, GraphScript
from atomr_accel.facade._graphs import Graph, GraphRecorder
from atomr_accel.facade._handles import *  # noqa: F403 - the catalogued libraries' handles
from atomr_accel.facade._kernel_args import KernelArg
from atomr_accel.facade._kernels import Modules, Nvrtc, NvrtcKernel
from atomr_accel.facade._libraries import Library
from atomr_accel.facade._memory import (
    IpcMemHandle,
    IpcOpenedMem,
    ManagedBufferF32,
    Memory,
    ipc_get_mem_handle,
    ipc_get_mem_handle_async,
    ipc_open_mem_handle,
    ipc_open_mem_handle_async,
)
from atomr_accel.facade._onnx import OnnxEngine
from atomr_accel.facade._placement import Placement
from atomr_accel.facade._rnn_inputs import RnnBwdInputs
from atomr_accel.facade._system import System
from atomr_accel.facade._tensorrt import TensorRt, TrtEngine

__all__ = [
    "Collective",
    "CollectiveGroup",
    "CollectiveRank",
    "Device",
    "DeviceFunction",
    "Resident",
    "Graph",
    "GraphCapture",
    "GraphHandle",
    "GraphRecorder",
    "GraphScript",
    "IpcMemHandle",
    "IpcOpenedMem",
    "KernelArg",
    "Library",
    "ManagedBufferF32",
    "Memory",
    "Modules",
    "MultiHeadAttnBwdInputs",
    "Nvrtc",
    "OnnxEngine",
    "NvrtcKernel",
    "Placement",
    "RnnBwdInputs",
    "System",
    "TensorRt",
    "TrtEngine",
    "ipc_get_mem_handle",
    "ipc_get_mem_handle_async",
    "ipc_open_mem_handle",
    "ipc_open_mem_handle_async",
]
__all__ += _buffers.__all__
__all__ += _handles.__all__
