"""Handlers that run users' code inside a context: ``CallFunction``, ``BuildResident``,
``FreeResident`` (shared by every backend).

A function's buffers arrive as writable views of the context's arrays (NumPy on
the CPU, CuPy on CUDA, or torch tensors over them through DLPack); NumPy
arguments are copied in (uploaded on CUDA); residents arrive as their objects.
What it returns comes back with its arrays as NumPy arrays, or, with
``keep``, its device arrays copied into new buffers of the context. On CUDA the
handler runs inside the op's stream (``with stream:``), and torch's current
stream is that same stream (``torch.cuda.ExternalStream``), so the function's
GPU work is ordered with the ops on its buffers and the op's completion event
follows it. Whatever user code raises becomes a ``FunctionFailed``, except the
errors the backend classifies (``Backend.user_error``: a sticky CUDA error is
``ContextPoisoned``, running out of memory ``OutOfMemory``) and those two errors
raised by the code itself.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import (
    ContextPoisoned,
    FunctionFailed,
    GpuRuntimeError,
    InvalidArgument,
    OutOfMemory,
)
from atomr_accel.core.ops._function import (
    BufferArg,
    BuildResident,
    CallFunction,
    FreeResident,
    HostArrayArg,
    Kept,
    ResidentArg,
    UserCode,
)

if TYPE_CHECKING:
    from atomr_accel.backends._base import Backend

__all__ = ["HANDLERS", "failure_of", "refuse_reentry"]

_here = threading.local()


def refuse_reentry() -> None:
    """Raise ``InvalidArgument`` on a thread that runs user code for a context: that code
    called its own device, whose context waits for it (a call that would never end)."""
    if getattr(_here, "running", 0):
        raise InvalidArgument("a device function (or resident factory) called its own device; "
                              "the context runs it and cannot serve that call meanwhile")


def failure_of(exc: BaseException, name: str, backend: Backend) -> GpuRuntimeError:
    """The typed error of what user code ``name`` raised: ``ContextPoisoned`` or
    ``OutOfMemory`` as the code raised them (code that knows its library's sticky faults,
    a JAX or Triton error, says so), the backend's classification (a sticky CUDA error
    of CuPy or torch, out of memory), else ``FunctionFailed`` with its traceback."""
    if isinstance(exc, ContextPoisoned | OutOfMemory):
        return exc
    classified = backend.user_error(exc)
    if classified is not None:
        classified.__cause__ = exc
        return classified
    return FunctionFailed.of(name, exc)


def _torch() -> Any:
    """The torch module if this process has imported it (None else: never imported here)."""
    return sys.modules.get("torch")


class _Bridge:
    """How arrays enter a function (``arrays=``): views of buffers, uploads of host arrays."""

    def __init__(self, backend: Backend, arrays: str) -> None:
        self.backend = backend
        self.cuda = backend.name == "cuda"
        self.torch = arrays == "torch"
        if self.torch:
            import torch  # the caller checked it is installed

            self._torch_module: Any = torch

    def view(self, array: Any) -> Any:
        """A buffer's array as the function sees it (no copy)."""
        if not self.torch:
            return array
        torch = self._torch_module
        return torch.from_dlpack(array) if self.cuda else torch.from_numpy(array)

    def upload(self, data: np.ndarray[Any, Any]) -> Any:
        """A copy of a host array in the context (on the device on CUDA)."""
        return self.view(self.backend.copy_in(data))


def _resolve(value: Any, op: CallFunction, bridge: _Bridge) -> Any:
    """``value`` with buffers, host arrays and residents as the function takes them."""
    kind = type(value)
    if kind is BufferArg:
        ref = op.buffers[value.index]
        return bridge.view(bridge.backend.array(ref.buffer_id))
    if kind is ResidentArg:
        return _resident(bridge.backend, value)
    if kind is HostArrayArg:
        return bridge.upload(op.args.arrays[value.index])
    if kind is np.ndarray:
        return bridge.upload(value)
    if kind is tuple or kind is list:
        return kind(_resolve(item, op, bridge) for item in value)
    if kind is dict:
        return {key: _resolve(item, op, bridge) for key, item in value.items()}
    return value


def _resident(backend: Backend, arg: ResidentArg) -> Any:
    try:
        return backend.residents[arg.token]
    except KeyError:
        failure = backend.resident_failures.get(arg.token)
        why = f": its factory failed here ({failure})" if failure else ""
        raise InvalidArgument(
            f"resident {arg.name!r} is not built in this context{why}; it was closed, or its "
            "factory failed when the context was rebuilt") from None


def _host(value: Any) -> Any:
    """A returned array as a NumPy array of its own (None: not an array)."""
    if isinstance(value, np.ndarray):
        return np.array(value, copy=True)
    if hasattr(value, "__cuda_array_interface__") and hasattr(value, "get"):
        return value.get()  # CuPy: waits for the stream's work on it
    torch = _torch()
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().copy()
    return None


def _device(backend: Backend, value: Any) -> Any:
    """A returned array as a 1-D array of the context's own (None: not an array)."""
    xp = backend.xp
    if isinstance(value, xp.ndarray):
        array = value
    elif (torch := _torch()) is not None and isinstance(value, torch.Tensor):
        array = xp.from_dlpack(value.detach().contiguous())
    elif isinstance(value, np.ndarray):
        array = value  # a host array of a CUDA function: uploaded below
    else:
        return None
    return xp.array(array, copy=True).reshape(-1)


def _outputs(backend: Backend, value: Any, keep: bool) -> Any:
    """What a function's answer carries back: arrays as NumPy, or kept as new buffers."""
    if keep:
        array = _device(backend, value)
        if array is not None:
            dtype = DType.of(array.dtype)
            return Kept(backend.adopt(array), dtype.value, int(array.size))
    else:
        host = _host(value)
        if host is not None:
            return host
    kind = type(value)
    if kind is tuple or kind is list:
        return kind(_outputs(backend, item, keep) for item in value)
    if kind is dict:
        return {key: _outputs(backend, item, keep) for key, item in value.items()}
    return value


def _stream(backend: Backend) -> contextlib.AbstractContextManager[Any]:
    """torch's current stream made the op's stream (CUDA, with torch imported here)."""
    torch = _torch() if backend.name == "cuda" else None
    if torch is None:
        return contextlib.nullcontext()
    stream: contextlib.AbstractContextManager[Any] = torch.cuda.stream(backend.torch_stream())
    return stream


def _run_user(backend: Backend, code: UserCode, call: Callable[[], Any]) -> Any:
    """``call()``; what it raises as a typed error."""
    _here.running = getattr(_here, "running", 0) + 1
    try:
        return call()
    except BaseException as exc:  # user code may raise anything: none may end the host
        raise failure_of(exc, code.name, backend) from None
    finally:
        _here.running -= 1


def _call_function(backend: Backend, op: CallFunction) -> Any:
    code = op.code
    with _stream(backend):
        fn, (packed_args, packed_kwargs) = _run_user(  # user modules may fail to load here
            backend, code, lambda: (code.function(), op.args.unpack()))
        bridge = _Bridge(backend, op.arrays)
        args = _resolve(packed_args, op, bridge)
        kwargs = _resolve(packed_kwargs, op, bridge) if packed_kwargs else {}
        result = _run_user(backend, code, lambda: fn(*args, **kwargs))
        try:
            return _outputs(backend, result, op.keep)
        except GpuRuntimeError:
            raise
        except BaseException as exc:  # e.g. a tensor that cannot be copied out
            raise failure_of(exc, code.name, backend) from None


def _build_resident(backend: Backend, op: BuildResident) -> None:
    if op.token in backend.residents:
        return
    code = op.code

    def build() -> Any:
        args, kwargs = op.args.unpack()
        return code.function()(*args, **kwargs)

    try:
        with _stream(backend):
            backend.residents[op.token] = _run_user(backend, code, build)
    except GpuRuntimeError as exc:
        backend.resident_failures[op.token] = str(exc)
        raise
    backend.resident_failures.pop(op.token, None)


def _free_resident(backend: Backend, op: FreeResident) -> None:
    backend.residents.pop(op.token, None)
    backend.resident_failures.pop(op.token, None)


HANDLERS: dict[type[Any], Callable[[Any, Any], Any]] = {
    CallFunction: _call_function,
    BuildResident: _build_resident,
    FreeResident: _free_resident,
}
