"""An asyncio actor runtime with Akka/OTP-style supervision.

Start with ``ActorSystem``, ``Actor`` and ``Props``; see ``docs/actors.md``.
"""

from atomr_accel.actor._actor import Actor, ActorContext
from atomr_accel.actor._clock import Clock, ManualClock, MonotonicClock
from atomr_accel.actor._errors import (
    ActorError,
    ActorInitializationError,
    ActorStopped,
    AskTimeout,
    InvalidActorName,
    MailboxFull,
    StashOverflow,
    SystemClosed,
    UserCodeError,
)
from atomr_accel.actor._event_stream import EventStream
from atomr_accel.actor._messages import (
    POISON_PILL,
    DeadLetter,
    Lifecycle,
    LifecycleEvent,
    PoisonPill,
    Terminated,
)
from atomr_accel.actor._props import Mailbox, Overflow, Props
from atomr_accel.actor._ref import ActorRef, Reply
from atomr_accel.actor._supervision import (
    AllForOneStrategy,
    Decider,
    Directive,
    OneForOneStrategy,
    RestartBudget,
    SupervisorStrategy,
    default_decider,
)
from atomr_accel.actor._system import ActorSystem
from atomr_accel.actor._user_code import is_own_cancellation, user_code, user_error

__all__ = [
    "POISON_PILL",
    "Actor",
    "ActorContext",
    "ActorError",
    "ActorInitializationError",
    "ActorRef",
    "ActorStopped",
    "ActorSystem",
    "AllForOneStrategy",
    "AskTimeout",
    "Clock",
    "DeadLetter",
    "Decider",
    "Directive",
    "EventStream",
    "InvalidActorName",
    "Lifecycle",
    "LifecycleEvent",
    "Mailbox",
    "MailboxFull",
    "ManualClock",
    "MonotonicClock",
    "OneForOneStrategy",
    "Overflow",
    "PoisonPill",
    "Props",
    "Reply",
    "RestartBudget",
    "StashOverflow",
    "SupervisorStrategy",
    "SystemClosed",
    "Terminated",
    "UserCodeError",
    "default_decider",
    "is_own_cancellation",
    "user_code",
    "user_error",
]
