"""The original package's ``atomr_accel.memory``: managed memory and IPC handles.

Written from ``atomr_accel.original`` by ``python -m atomr_accel.original``; edit the
declaration there, not this file.
"""

from atomr_accel import IpcMemHandle, IpcOpenedMem, ManagedBufferF32, Memory
from atomr_accel._public import publish as _publish
from atomr_accel.facade import (
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

_publish(__name__)
