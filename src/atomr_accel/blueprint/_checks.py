"""The argument checks every blueprint shares: counts, names, waits, time-outs and the
system."""

from __future__ import annotations

import math

from atomr_accel.core._errors import InvalidArgument
from atomr_accel.facade import System

__all__ = ["TIMEOUT", "require_name", "require_positive_int", "require_system",
           "require_timeout", "require_wait"]

TIMEOUT = 5.0
"""The default ``timeout_secs`` of the blueprints' calls that need a bound, seconds."""


def require_positive_int(name: str, value: object, *, allow_none: bool = False) -> None:
    """Raise ``InvalidArgument`` unless ``value`` is an int >= 1 (or None when allowed)."""
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgument(f"{name} must be an int >= 1, got {value!r}")


def require_name(value: object, what: str) -> str:
    """``value`` if it is a non-empty str; ``InvalidArgument`` naming ``what`` else."""
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} must be a non-empty str, got {value!r}")
    return value


def require_wait(name: str, value: object) -> None:
    """Raise ``InvalidArgument`` unless ``value`` is a finite number of seconds >= 0."""
    if (not isinstance(value, int | float) or isinstance(value, bool)
            or not math.isfinite(value) or value < 0):
        raise InvalidArgument(f"{name} must be a finite number of seconds >= 0, got {value!r}")


def require_timeout(timeout_secs: object) -> float:
    """``timeout_secs`` as a float; ``InvalidArgument`` unless it is a finite number > 0."""
    if (not isinstance(timeout_secs, int | float) or isinstance(timeout_secs, bool)
            or not math.isfinite(timeout_secs) or timeout_secs <= 0):
        raise InvalidArgument(f"timeout_secs must be a positive number of seconds, "
                              f"got {timeout_secs!r}")
    return float(timeout_secs)


def require_system(system: object) -> System:
    """``system`` if it is a facade ``System`` (``System.open``); ``InvalidArgument`` else."""
    if not isinstance(system, System):
        raise InvalidArgument(f"this blueprint runs in a System (System.open), "
                              f"got {type(system).__name__}")
    return system
