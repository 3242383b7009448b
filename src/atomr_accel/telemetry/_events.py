"""The dashboard's supervision log: an actor that keeps the recent lifecycle events of a system."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from atomr_accel.actor import Actor, ActorRef, Lifecycle, LifecycleEvent
from atomr_accel.device import GenerationChanged, WatchGeneration
from atomr_accel.device._world import WorldEvent

__all__ = ["EVENT_KINDS", "EventLog", "GetEvents", "WatchDevice"]

EVENT_KINDS = ("context_down", "context_restarted", "context_ready", "device_stopped",
               "actor_failed", "actor_restarted", "world_aborted", "world_ready")
"""The kinds of supervision event the dashboard lists.

``context_down``: a device's context actor failed (``detail`` holds the error and
the supervisor's directive); ``context_restarted``: it was restarted;
``context_ready``: a context generation is serving (after a rebuild: the new
generation, with the standby wait and the requests run again when there were
any); ``device_stopped``: a device stopped serving for good (its context
stopped past the restart budget, or the device actor stopped); ``actor_failed`` /
``actor_restarted``: any other actor (a blueprint's) failed or was restarted;
``world_aborted`` / ``world_ready``: a collective world (``System.nccl_world``)
aborted an epoch (a member's context went down) / serves a new one (rebuilt).
"""


@dataclass(frozen=True, slots=True)
class WatchDevice:
    """Log the lifecycle of the device actor ``ref`` called ``name``."""

    name: str
    ref: ActorRef


@dataclass(frozen=True, slots=True)
class GetEvents:
    """Ask for the logged events whose ``seq`` is above ``after`` (a list of dicts)."""

    after: int = 0


class EventLog(Actor):
    """Keeps the last ``capacity`` supervision events of its system, oldest first.

    Subscribes to the system's event stream (``LifecycleEvent``, ``WorldEvent``) and
    to each watched device's ``GenerationChanged``. Each event is a JSON-ready dict:
    ``seq`` (rising from 1), ``time`` (seconds since the epoch), ``kind`` (one
    of ``EVENT_KINDS``), ``actor`` (its path), ``device`` (the device's name, or
    None) and ``detail`` (text).
    """

    def __init__(self, capacity: int = 200) -> None:
        self.events: deque[dict[str, Any]] = deque(maxlen=capacity)
        self.devices: dict[str, str] = {}  # device actor path -> device name
        self.stopped: set[str] = set()  # devices whose stop is logged
        self.seq = 0
        self.context.system.event_stream.subscribe(self.context.self_ref, LifecycleEvent)
        self.context.system.event_stream.subscribe(self.context.self_ref, WorldEvent)

    async def receive(self, message: Any) -> Any:
        """Log events; answer ``GetEvents``; watch devices."""
        if isinstance(message, LifecycleEvent):
            self._lifecycle(message)
        elif isinstance(message, GenerationChanged):
            sender = self.context.sender
            path = "" if sender is None else sender.path
            detail = f"generation {message.generation} is serving"
            if message.standby_ms is not None:
                detail += f" (standby context, waited {message.standby_ms:.1f} ms)"
            if message.reruns:
                detail += f"; {message.reruns} request(s) run again"
            self._log("context_ready", path, self.devices.get(path), detail)
        elif isinstance(message, WorldEvent):
            self._log(f"world_{message.kind}", f"world {message.world}", None,
                      f"epoch {message.epoch}: {message.detail}")
        elif isinstance(message, WatchDevice):
            self.devices[message.ref.path] = message.name
            message.ref.tell(WatchGeneration(self.context.self_ref))
        elif isinstance(message, GetEvents):
            return [event for event in self.events if event["seq"] > message.after]
        else:
            raise TypeError(f"the dashboard's event log does not handle {message!r}")
        return None

    def _lifecycle(self, event: LifecycleEvent) -> None:
        path = event.ref.path
        parent = path.rsplit("/", 1)[0]
        cause = "" if event.cause is None else repr(event.cause)
        if path in self.devices:
            device = self.devices[path]
            if event.kind is Lifecycle.STOPPED and device not in self.stopped:
                self.stopped.add(device)
                self._log("device_stopped", path, device, "the device actor stopped")
            elif event.kind is Lifecycle.FAILED:
                self._log("actor_failed", path, device, _failed(event))
            return
        if path.endswith("/context") and parent in self.devices:
            device = self.devices[parent]
            if event.kind is Lifecycle.FAILED:
                self._log("context_down", path, device, _failed(event))
            elif event.kind is Lifecycle.RESTARTED:
                self._log("context_restarted", path, device, f"restarted after {cause}")
            elif event.kind is Lifecycle.STOPPED and device not in self.stopped:
                self.stopped.add(device)
                self._log("device_stopped", path, device,
                          "its context stopped for good: requests now fail")
            return
        if any(path.startswith(d + "/") for d in self.devices):
            return  # kernel actors stop and start with their context: already logged
        if event.kind is Lifecycle.FAILED:
            self._log("actor_failed", path, None, _failed(event))
        elif event.kind is Lifecycle.RESTARTED:
            self._log("actor_restarted", path, None, f"restarted after {cause}")

    def _log(self, kind: str, actor: str, device: str | None, detail: str) -> None:
        self.seq += 1
        self.events.append({"seq": self.seq, "time": time.time(), "kind": kind,
                            "actor": actor, "device": device, "detail": detail})

    async def post_stop(self) -> None:
        """Leave the event stream."""
        self.context.system.event_stream.unsubscribe(self.context.self_ref)


def _failed(event: LifecycleEvent) -> str:
    directive = "" if event.directive is None else f"; supervisor: {event.directive.name}"
    return f"{event.cause!r}{directive}"
