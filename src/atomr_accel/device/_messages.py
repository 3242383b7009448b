"""Messages between the device, context and kernel actors, and for observers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from atomr_accel.actor import ActorRef
from atomr_accel.core._errors import GpuRuntimeError
from atomr_accel.core._op import Op

if TYPE_CHECKING:
    from atomr_accel.device._lane import Gate
    from atomr_accel.device._state import Pending

__all__ = [
    "ContextDown",
    "ContextReady",
    "Fatal",
    "GenerationChanged",
    "GetStats",
    "Redispatch",
    "Run",
    "WatchGeneration",
]


@dataclass(frozen=True, slots=True)
class Run:
    """Run ``op`` and answer ``pending`` (device -> context or kernel actor)."""

    op: Op
    pending: Pending


@dataclass(frozen=True, slots=True)
class ContextReady:
    """A context generation is up (context -> device); ``routes`` maps library -> actor,
    ``gate`` opens the data plane to it."""

    generation: int
    routes: dict[str, ActorRef]
    gate: Gate


@dataclass(frozen=True, slots=True)
class ContextDown:
    """The context of ``generation`` is going down (context -> device)."""

    generation: int


@dataclass(frozen=True, slots=True)
class Fatal:
    """An op hit an error that ends its context generation (kernel -> context)."""

    error: GpuRuntimeError
    generation: int


@dataclass(frozen=True, slots=True)
class WatchGeneration:
    """Subscribe ``subscriber`` to ``GenerationChanged`` of this device (``unwatch`` to stop)."""

    subscriber: ActorRef
    unwatch: bool = False


@dataclass(frozen=True, slots=True)
class GenerationChanged:
    """Told to generation watchers each time the device's context comes up."""

    device_id: int
    generation: int
    standby_ms: float | None = None
    """How long the rebuild waited for the warm standby context it switched to (None: this
    context was not a standby)."""
    reruns: int = 0
    """Requests the last context died under that this one runs again."""


@dataclass(frozen=True, slots=True)
class GetStats:
    """Ask a device for its ``DeviceStats``."""


@dataclass(frozen=True, slots=True)
class Redispatch:
    """A host handed back requests it never ran: send them on if the device serves."""
