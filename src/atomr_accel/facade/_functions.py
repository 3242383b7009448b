"""Device functions and residents: users' own code run inside a device's context.

``Device.function(fn)`` makes a ``DeviceFunction``; calling it sends a
``CallFunction`` op through the device like any op (the data plane while the
device is ready, stashed during a rebuild, completed when its GPU work has
finished, re-run on the next context when ``pure``). ``Device.resident(factory)``
builds a ``Resident`` inside the context; the device builds it again on every
new context before anything else runs there. See ``docs/functions.md``.
"""

from __future__ import annotations

import importlib.util
import secrets
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import numpy as np

from atomr_accel.backends import capabilities
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._function import (
    ARRAY_KINDS,
    BufferArg,
    BuildResident,
    CallFunction,
    FreeResident,
    HostArrayArg,
    Packed,
    ResidentArg,
    UserCode,
)
from atomr_accel.facade._buffers import GpuBuffer, buffer_for
from atomr_accel.facade._portal import blocking

if TYPE_CHECKING:
    from atomr_accel.facade._device import Device

__all__ = ["DeviceFunction", "Resident", "make_function", "make_resident"]


def _code(fn: Callable[..., Any], name: str | None, isolation: str, what: str) -> UserCode:
    """``fn`` as it travels: pickled now unless it runs in this process (the thread host)."""
    if not callable(fn):
        raise InvalidArgument(f"{what} takes a callable, got {type(fn).__name__}")
    label = name if name is not None else getattr(fn, "__name__", None) or type(fn).__name__
    if not isinstance(label, str) or not label:
        raise InvalidArgument(f"name must be a non-empty str, got {name!r}")
    code = UserCode(fn, label, secrets.randbits(62) + 1)
    if isolation != "thread":
        try:
            code.payload  # noqa: B018 - pickled once, here, for every call
        except Exception as exc:
            raise InvalidArgument(f"{label} cannot be sent to its context: {exc}") from exc
    return code


def _array_kind(arrays: str, backend: str) -> str:
    """``arrays`` checked against the backend: ``"auto"`` made concrete."""
    if arrays not in ARRAY_KINDS:
        raise InvalidArgument(f"arrays must be one of {', '.join(map(repr, ARRAY_KINDS))}, "
                              f"got {arrays!r}")
    if arrays == "auto":
        return capabilities(backend).array_module
    if arrays == "cupy" and capabilities(backend).array_module != "cupy":
        raise InvalidArgument("arrays='cupy' needs a CUDA device; this one is "
                              f"{backend!r} (use 'numpy', 'torch' or 'auto')")
    if arrays == "numpy" and capabilities(backend).device_memory:
        raise InvalidArgument("arrays='numpy' cannot view CUDA buffers without a copy; use "
                              "'cupy', 'torch' or 'auto'")
    if arrays == "torch" and importlib.util.find_spec("torch") is None:
        raise InvalidArgument("arrays='torch' needs PyTorch: pip install torch")
    return arrays


_BESIDE = 64 << 10
"""NumPy arguments this large travel beside the arguments' pickle (``HostArrayArg``)."""


class _Packer:
    """Turns a call's arguments into what travels: buffers by index, residents by token,
    large NumPy arrays by index into ``arrays`` (the host carries them its own way: the
    process host copies them into shared memory once instead of pickling them)."""

    __slots__ = ("arrays", "buffers", "device")

    def __init__(self, device: Device) -> None:
        self.device = device
        self.buffers: list[GpuRef] = []
        self.arrays: list[np.ndarray[Any, Any]] = []

    def pack(self, value: Any) -> Any:
        kind = type(value)
        if kind is tuple or kind is list:
            return kind(self.pack(item) for item in value)
        if kind is dict:
            return {key: self.pack(item) for key, item in value.items()}
        if isinstance(value, GpuBuffer | GpuRef):
            self.buffers.append(self.device.ref_of(value, "argument"))
            return BufferArg(len(self.buffers) - 1)
        if kind is np.ndarray and value.nbytes >= _BESIDE and not value.dtype.hasobject:
            self.arrays.append(value)
            return HostArrayArg(len(self.arrays) - 1)
        if isinstance(value, Resident):
            return value.arg(self.device)
        return value  # smaller NumPy arrays too: the context uploads them


def _buffers_of(device: Device, value: Any) -> Any:
    """A function's answer with the buffers it kept as ``GpuBuffer``s owned by ``device``."""
    kind = type(value)
    if kind is GpuRef:
        return buffer_for(device, value)
    if kind is tuple or kind is list:
        return kind(_buffers_of(device, item) for item in value)
    if kind is dict:
        return {key: _buffers_of(device, item) for key, item in value.items()}
    return value


class DeviceFunction:
    """A user's function bound to a device: ``f(*args, **kwargs)`` (blocking) or
    ``await f.call_async(*args, **kwargs)`` runs it inside the device's context.

    Buffers (``GpuBuffer``) arrive as writable array views, NumPy arrays as device
    arrays (uploaded), ``Resident``s as their objects, anything else as itself, also
    inside lists, tuples and dicts. Arrays it returns come back as NumPy arrays
    (``keep=True``: as ``GpuBuffer``s of the device). Both take ``timeout_secs``
    (None: the system's ``op_timeout``). Raises ``FunctionFailed`` for what the code
    raised, ``ContextPoisoned`` / ``Unrecoverable`` for a sticky fault,
    ``OutOfMemory``, ``WorkerLost`` for a worker that died under a call not declared
    ``pure``, ``InvalidArgument`` for arguments that cannot travel (nothing is sent).
    """

    def __init__(self, device: Device, fn: Callable[..., Any], *, pure: bool, arrays: str,
                 keep: bool, name: str | None) -> None:
        if not isinstance(pure, bool) or not isinstance(keep, bool):
            raise InvalidArgument("pure and keep must be True or False")
        self.device = device
        self.arrays = _array_kind(arrays, device.backend)
        self.pure = pure
        self.keep = keep
        self._code = _code(fn, name, device.isolation, "function()")
        self._portal = device._portal
        self._book = device._state.functions

    @property
    def name(self) -> str:
        """The name its calls are counted under (``name=``, else the function's)."""
        return self._code.name

    def _op(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallFunction:
        packer = _Packer(self.device)
        packed = Packed(packer.pack(args), packer.pack(kwargs) if kwargs else {},
                        arrays=tuple(packer.arrays))
        if (packer.buffers or self.keep) and self.device.journal is not None:
            self._journalable(packed)
        return CallFunction(self._code, packed, tuple(packer.buffers), self.arrays, self.keep,
                            self.pure)

    def _journalable(self, packed: Packed) -> None:
        """Refuse, before it runs, a call the device's journal could not store: the journal
        keeps every call that names or keeps buffers (to replay it after a rebuild),
        pickled, so its function and arguments must pickle even where the context is in
        this process."""
        try:
            self._code.payload  # noqa: B018 - pickled once, kept for every later call
            packed.pickled()  # as the arguments are now: what a replay will run on
        except Exception as exc:
            raise InvalidArgument(
                f"{self.name} names or keeps buffers of a device with a journal, which "
                f"stores the call to replay it, but it cannot be pickled: {exc}") from exc

    def call_async(self, *args: Any, timeout_secs: float | None = None,
                   **kwargs: Any) -> Coroutine[Any, Any, Any]:
        """Run the function on ``args`` inside the context; its answer (see the class)."""
        return self._call(self._op(args, kwargs), timeout_secs)

    async def _call(self, op: CallFunction, timeout_secs: float | None) -> Any:
        began = time.perf_counter()
        failed = True
        try:
            result = await self.device.run_async(op, timeout_secs, checked=True)
            failed = False
        finally:
            self._book.record(self._code.name, time.perf_counter() - began, failed)
        return _buffers_of(self.device, result) if self.keep else result

    __call__ = blocking(call_async)

    def __repr__(self) -> str:
        return f"DeviceFunction({self.name!r}, arrays={self.arrays!r}, pure={self.pure})"


class Resident:
    """A user object living inside a device's context, made there by its factory and made
    again on every new context (before anything else runs there). Pass it to a device
    function to use it. ``close()`` frees it."""

    def __init__(self, device: Device, build: BuildResident) -> None:
        self.device = device
        self._build = build
        self._portal = device._portal
        self._closed = False

    @property
    def name(self) -> str:
        """Its name (``name=``, else the factory's)."""
        return self._build.code.name

    @property
    def closed(self) -> bool:
        """True once ``close`` has run."""
        return self._closed

    def arg(self, device: Device) -> ResidentArg:
        """What stands for it in a call's arguments (``InvalidArgument`` once closed, or for
        a call on another device)."""
        if self._closed:
            raise InvalidArgument(f"resident {self.name!r} is closed")
        if device is not self.device:
            raise InvalidArgument(f"resident {self.name!r} lives on another device")
        return ResidentArg(self._build.token, self.name)

    async def close_async(self, *, timeout_secs: float | None = None) -> None:
        """Free it in the context; the device builds it no more (again: nothing)."""
        if self._closed:
            return
        self._closed = True
        self.device._state.functions.forget(self._build.token)
        await self.device.run_async(FreeResident(self._build.token), timeout_secs,
                                    checked=True)

    close = blocking(close_async)

    def __repr__(self) -> str:
        return f"Resident({self.name!r}{', closed' if self._closed else ''})"


def make_function(device: Device, fn: Callable[..., Any], *, pure: bool = False,
                  arrays: str = "auto", keep: bool = False,
                  name: str | None = None) -> DeviceFunction:
    """``Device.function``: see ``DeviceFunction``."""
    return DeviceFunction(device, fn, pure=pure, arrays=arrays, keep=keep, name=name)


async def make_resident(device: Device, factory: Callable[..., Any], args: tuple[Any, ...],
                        kwargs: dict[str, Any], name: str | None,
                        timeout_secs: float | None) -> Resident:
    """``Device.resident_async``: build it now; ``FunctionFailed`` if the factory raised."""
    code = _code(factory, name, device.isolation, "resident()")
    build = BuildResident(code.token, code, Packed(args, kwargs))
    book = device._state.functions
    book.register(build, code.name)  # a context built from now on builds it too
    try:
        await device.run_async(build, timeout_secs, checked=True)
    except BaseException:
        book.forget(code.token)
        raise
    return Resident(device, build)

