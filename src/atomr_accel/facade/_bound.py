"""What the original's ``X.spawn(system, name=None, device=None)`` classes share: the
device they are bound to, their ``spawn``, and the checks of their arguments."""

from __future__ import annotations

import itertools
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, ClassVar, Self

from atomr_accel.core._errors import InvalidArgument

if TYPE_CHECKING:
    from atomr_accel.facade._device import Device
    from atomr_accel.facade._system import System

__all__ = ["DeviceBound", "bound_device", "check_spawn", "check_timeout"]


def check_timeout(timeout_secs: object) -> None:
    """Require None (no limit) or a positive number of seconds (``InvalidArgument``)."""
    if timeout_secs is None:
        return
    if isinstance(timeout_secs, bool) or not isinstance(timeout_secs, int | float) \
            or not timeout_secs > 0:  # NaN is not > 0 either
        raise InvalidArgument(f"timeout_secs must be a positive number or None, "
                              f"got {timeout_secs!r}")


def check_spawn(system: object, name: object, device: object) -> None:
    """Require a ``System``, a ``str`` name (or None) and one of its devices (or None)."""
    from atomr_accel.facade._device import Device  # late: _kernels imports this module,
    from atomr_accel.facade._system import System  # and _device imports _kernels

    if not isinstance(system, System):
        raise InvalidArgument(f"system must be a System, got {type(system).__name__}")
    if name is not None and not isinstance(name, str):
        raise InvalidArgument(f"name must be a str or None, got {name!r}")
    if device is not None and not (isinstance(device, Device) and device in system.devices):
        raise InvalidArgument(f"device must be a Device of this system, got {device!r}")


async def bound_device(system: System, device: Device | None) -> Device:
    """``device``, else the system's first device, else a new one: CUDA when CuPy sees a
    GPU, the CPU backend otherwise (``spawn_device``'s ``backend="auto"``)."""
    if device is not None:
        return device
    if system.devices:
        return system.devices[0]
    return await system.spawn_device_async(backend="auto")


class DeviceBound:
    """Base of the classes bound to one device and made by ``X.spawn(system, name=None,
    device=None)``; unnamed ones are called ``<prefix>-1``, ``<prefix>-2``, ... (the
    class's ``prefix``, given as ``class X(DeviceBound, prefix="x")``; a subclass given
    none counts on with its base's)."""

    _prefix: ClassVar[str]
    _names: ClassVar[itertools.count[int]]

    def __init_subclass__(cls, *, prefix: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if prefix is not None:
            cls._prefix = prefix
            cls._names = itertools.count(1)

    def __init__(self, device: Device, name: str | None = None) -> None:
        self.device = device
        self.name = f"{self._prefix}-{next(self._names)}" if name is None else name
        self._portal = device._portal

    @classmethod
    def spawn_async(cls, system: System, name: str | None = None,
                    device: Device | None = None) -> Coroutine[Any, Any, Self]:
        """Make one bound to ``device`` if given, else to the system's first device, else
        to a new one (CUDA when a GPU is usable, the CPU backend otherwise)."""
        check_spawn(system, name, device)
        return cls._spawn(system, name, device)

    @classmethod
    async def _spawn(cls, system: System, name: str | None, device: Device | None) -> Self:
        return cls(await bound_device(system, device), name)

    @classmethod
    def spawn(cls, system: System, name: str | None = None,
              device: Device | None = None) -> Self:
        """Blocking twin of ``spawn_async``; do not call it inside a running event loop."""
        return system._portal.run_blocking(cls.spawn_async(system, name, device))
