"""PlacementActor: picks one of several devices for the next piece of work."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from atomr_accel.actor import Actor, ActorRef, ActorStopped, AskTimeout
from atomr_accel.core._errors import (
    DeviceUnavailable,
    GpuRuntimeError,
    InvalidArgument,
    OutOfMemory,
)
from atomr_accel.core._op import is_int
from atomr_accel.core.ops._memory import MemoryInfo
from atomr_accel.device._messages import GetStats
from atomr_accel.device._state import DeviceStats, Status

__all__ = ["AddDevice", "Place", "Placed", "PlacementActor", "Policy", "choose_device"]


class Policy(enum.Enum):
    """How a placement picks a device."""

    ROUND_ROBIN = "round_robin"
    """Each device in turn."""
    LEAST_LOADED = "least_loaded"
    """The fewest requests in flight plus queued (ties: in turn)."""
    MEMORY_FIT = "memory_fit"
    """The most free device memory among those with ``bytes_needed`` free."""


@dataclass(frozen=True, slots=True)
class Place:
    """Ask a ``PlacementActor`` for a device; it answers ``Placed``.

    ``bytes_needed`` (>= 0) rules out devices with less free memory under every
    policy; ``policy`` None means the actor's default.
    """

    bytes_needed: int = 0
    policy: Policy | None = None


@dataclass(frozen=True, slots=True)
class Placed:
    """The answer to ``Place``: the chosen device and the stats it was chosen on."""

    index: int
    device: ActorRef
    stats: DeviceStats


@dataclass(frozen=True, slots=True)
class AddDevice:
    """Tell a ``PlacementActor`` to consider one more device (the last in turn)."""

    device: ActorRef


def _fits(stats: DeviceStats, bytes_needed: int) -> bool:
    return stats.memory_free is not None and stats.memory_free >= bytes_needed


def choose_device(policy: Policy, stats: Sequence[DeviceStats], bytes_needed: int = 0,
           start: int = 0) -> int:
    """Return the index in ``stats`` that ``policy`` picks; no I/O.

    Stopped devices are never picked; with ``bytes_needed`` > 0 neither are
    devices with less free memory (or none measured). Ties go to the first
    device in turn from ``start``. Raises ``DeviceUnavailable`` when every
    device has stopped and ``OutOfMemory`` when no device has room.
    """
    count = len(stats)
    order = sorted((i for i, s in enumerate(stats) if s.status is not Status.STOPPED),
                   key=lambda i: (i - start) % count)
    if not order:
        raise DeviceUnavailable(f"no device to place on: all {count} have stopped"
                                if count else "no device to place on: none was added")
    if bytes_needed > 0 or policy is Policy.MEMORY_FIT:
        fitting = [i for i in order if _fits(stats[i], bytes_needed)]
        if not fitting:
            known = [s.memory_free for i in order if (s := stats[i]).memory_free is not None]
            most = max(known) if known else None
            raise OutOfMemory(
                f"no device has {bytes_needed} bytes free (the most free: "
                f"{'unknown' if most is None else most} bytes on {len(order)} running devices)",
                requested=bytes_needed, available=most,
            )
        order = fitting
    if policy is Policy.LEAST_LOADED:
        return min(order, key=lambda i: stats[i].in_flight + stats[i].queue_depth)
    if policy is Policy.MEMORY_FIT:
        return max(order, key=lambda i: stats[i].memory_free or 0)
    return order[0]


class PlacementActor(Actor):
    """Picks a device among ``devices`` (``DeviceActor`` refs) for each ``Place`` ask.

    Every pick asks each device for its ``DeviceStats`` (answered at once by
    the device actor, never queued behind ops) and applies ``choose_device``; a device
    never measured gets one ``MemoryInfo`` op first when memory matters. A
    device that cannot answer counts as stopped. Errors answer the ask only
    (``InvalidArgument``, ``DeviceUnavailable``, ``OutOfMemory``): the actor
    keeps its turn and keeps serving.
    """

    def __init__(self, devices: Sequence[ActorRef], policy: Policy = Policy.ROUND_ROBIN,
                 ask_timeout: float = 10.0) -> None:
        self.devices = list(devices)
        self.policy = Policy(policy)
        self.ask_timeout = ask_timeout
        self.next = 0

    async def receive(self, message: Any) -> Any:
        """Answer ``Place`` with ``Placed``; take ``AddDevice``."""
        if isinstance(message, AddDevice):
            if message.device not in self.devices:
                self.devices.append(message.device)
            return None
        if not isinstance(message, Place):
            raise TypeError(f"a placement does not handle {message!r}")
        reply = self.context.defer_reply()
        try:
            placed = await self._place(message)
        except GpuRuntimeError as exc:
            reply.set_exception(exc)
        else:
            reply.set_result(placed)
        return None

    async def _place(self, message: Place) -> Placed:
        bytes_needed, policy = message.bytes_needed, message.policy or self.policy
        if not is_int(bytes_needed) or bytes_needed < 0:
            raise InvalidArgument(f"bytes_needed must be an int >= 0, got {bytes_needed!r}")
        bytes_needed = int(bytes_needed)
        if not isinstance(policy, Policy):
            raise InvalidArgument(f"policy must be a Policy, got {policy!r}")
        devices = list(self.devices)
        needs_memory = bytes_needed > 0 or policy is Policy.MEMORY_FIT
        stats = await asyncio.gather(*(self._stats(d, needs_memory) for d in devices))
        index = choose_device(policy, stats, bytes_needed, self.next % max(1, len(devices)))
        self.next = index + 1
        return Placed(index, devices[index], stats[index])

    async def _stats(self, device: ActorRef, needs_memory: bool) -> DeviceStats:
        try:
            stats: DeviceStats = await device.ask(GetStats(), timeout=self.ask_timeout)
        except (ActorStopped, AskTimeout):
            return _STOPPED
        if needs_memory and stats.memory_free is None and stats.status is Status.READY:
            try:
                await device.ask(MemoryInfo(), timeout=self.ask_timeout)  # caches a reading
                stats = await device.ask(GetStats(), timeout=self.ask_timeout)
            except (ActorStopped, AskTimeout, GpuRuntimeError):
                pass  # still unmeasured: it does not fit
        return stats


_STOPPED = DeviceStats(
    device_id=-1, backend="", isolation="", status=Status.STOPPED, generation=0, restarts=0,
    in_flight=0, queue_depth=0, completed=0, failed=0, out_of_memory=0, host_pid=None,
    bytes_allocated=0, memory_free=None, memory_total=None,
)
