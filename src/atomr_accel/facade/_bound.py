"""What the original's ``X.spawn(system, name=None, device=None)`` classes share: the
device they are bound to, and the checks of their arguments."""

from __future__ import annotations

from typing import TYPE_CHECKING

from atomr_accel.core._errors import InvalidArgument

if TYPE_CHECKING:
    from atomr_accel.facade._device import Device
    from atomr_accel.facade._system import System

__all__ = ["bound_device", "check_spawn", "check_timeout"]


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
