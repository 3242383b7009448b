"""Messages and events the runtime itself produces."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from atomr_accel.actor._ref import ActorRef
    from atomr_accel.actor._supervision import Directive

__all__ = ["POISON_PILL", "DeadLetter", "Lifecycle", "LifecycleEvent", "PoisonPill", "Terminated"]


@dataclass(frozen=True, slots=True)
class Terminated:
    """Delivered to every watcher of ``ref`` once that actor has stopped, for any reason."""

    ref: ActorRef


class PoisonPill:
    """A message that stops its receiver when it reaches the front of the mailbox."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "POISON_PILL"


POISON_PILL: Final = PoisonPill()
"""The one ``PoisonPill`` instance; ``ref.tell(POISON_PILL)`` stops ``ref`` after earlier mail."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that could not be delivered (published on the event stream)."""

    message: Any
    sender: ActorRef | None
    recipient: ActorRef
    reason: str


class Lifecycle(enum.Enum):
    """What happened to an actor."""

    STARTED = "started"
    FAILED = "failed"
    RESTARTED = "restarted"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """Published on the event stream at each lifecycle step of every actor.

    ``cause`` is the exception for FAILED/RESTARTED; ``directive`` is what the
    supervisor decided for FAILED.
    """

    ref: ActorRef
    kind: Lifecycle
    cause: BaseException | None = None
    directive: Directive | None = None
