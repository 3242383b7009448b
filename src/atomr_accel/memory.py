"""The original package's ``atomr_accel.memory``: managed memory and IPC handles."""

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

__all__ = [
    "IpcMemHandle",
    "IpcOpenedMem",
    "ManagedBufferF32",
    "Memory",
    "ipc_get_mem_handle",
    "ipc_get_mem_handle_async",
    "ipc_open_mem_handle",
    "ipc_open_mem_handle_async",
]
