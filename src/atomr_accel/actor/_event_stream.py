"""Publish/subscribe by message type, for lifecycle events and dead letters."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from atomr_accel.actor._user_code import user_error

if TYPE_CHECKING:
    from atomr_accel.actor._ref import ActorRef

__all__ = ["EventStream", "Subscriber"]

_log = logging.getLogger("atomr_accel.actor")

Subscriber: TypeAlias = "ActorRef | Callable[[Any], object]"


class EventStream:
    """Deliver each published event to the subscribers of any class it is an instance of.

    A subscriber is an ``ActorRef`` (told the event) or a plain callable (called
    on the event loop; whatever it raises is logged, not propagated). Dead
    actor subscribers are dropped.
    """

    def __init__(self) -> None:
        self._subs: dict[type, list[Subscriber]] = {}

    def subscribe(self, subscriber: Subscriber, event_type: type = object) -> None:
        """Deliver every later event that is an instance of ``event_type`` to ``subscriber``."""
        subs = self._subs.setdefault(event_type, [])
        if subscriber not in subs:
            subs.append(subscriber)

    def unsubscribe(self, subscriber: Subscriber, event_type: type | None = None) -> None:
        """Stop delivering ``event_type`` (every type when None) to ``subscriber``."""
        for etype in [event_type] if event_type is not None else list(self._subs):
            subs = self._subs.get(etype, [])
            if subscriber in subs:
                subs.remove(subscriber)
            if not subs:
                self._subs.pop(etype, None)

    def publish(self, event: object) -> None:
        """Deliver ``event`` to its subscribers now (actors get it in their mailbox)."""
        if not self._subs:
            return
        from atomr_accel.actor._ref import ActorRef

        for etype, subs in list(self._subs.items()):
            if not isinstance(event, etype):
                continue
            for sub in list(subs):
                if isinstance(sub, ActorRef):
                    if sub.is_alive:
                        sub.tell(event)
                    else:
                        self.unsubscribe(sub, etype)
                else:
                    try:
                        sub(event)
                    except BaseException as exc:
                        error = user_error(exc, "an event stream subscriber")
                        _log.error("event stream subscriber %r raised", sub, exc_info=error)
