"""Supervision decisions: directives, strategies and restart budgets (no I/O)."""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from typing import TypeAlias

from atomr_accel.actor._clock import Clock, MonotonicClock
from atomr_accel.actor._errors import ActorInitializationError
from atomr_accel.actor._user_code import user_error

__all__ = [
    "AllForOneStrategy",
    "Decider",
    "Directive",
    "OneForOneStrategy",
    "RestartBudget",
    "SupervisorStrategy",
    "default_decider",
]


class Directive(enum.Enum):
    """What a supervisor does with a failed child."""

    RESUME = "resume"
    """Keep the child and its state; drop the failed message."""
    RESTART = "restart"
    """Replace the child's instance with a fresh one from its Props; keep its mailbox."""
    STOP = "stop"
    """Stop the child for good."""
    ESCALATE = "escalate"
    """Fail the supervisor itself with the child's error."""


Decider: TypeAlias = Callable[[BaseException], Directive]


def default_decider(exc: BaseException) -> Directive:
    """Stop on ``ActorInitializationError``, restart on anything else (Akka's default)."""
    if isinstance(exc, ActorInitializationError):
        return Directive.STOP
    return Directive.RESTART


class RestartBudget:
    """Restart intensity: at most ``max_restarts`` restarts within ``within`` seconds.

    ``max_restarts=None`` allows any number; ``within=None`` counts forever.
    """

    __slots__ = ("_clock", "_stamps", "max_restarts", "within")

    def __init__(self, max_restarts: int | None, within: float | None, clock: Clock) -> None:
        self.max_restarts = max_restarts
        self.within = within
        self._clock = clock
        self._stamps: deque[float] = deque()

    def allow(self) -> bool:
        """Record a restart request; return False when it would exceed the budget."""
        if self.max_restarts is None:
            return True
        now = self._clock.now()
        if self.within is not None:
            while self._stamps and now - self._stamps[0] > self.within:
                self._stamps.popleft()
        if len(self._stamps) >= self.max_restarts:
            return False
        self._stamps.append(now)
        return True


class SupervisorStrategy:
    """How an actor treats its failing children; see the two concrete strategies.

    ``decider`` maps an exception to a ``Directive``. More than ``max_restarts``
    restarts within ``within`` seconds stops the child instead (OTP restart
    intensity). ``clock`` is injectable for tests.
    """

    applies_to_all: bool = False

    def __init__(
        self,
        max_restarts: int | None = 3,
        within: float | None = 60.0,
        decider: Decider = default_decider,
        clock: Clock | None = None,
    ) -> None:
        if max_restarts is not None and max_restarts < 0:
            raise ValueError("max_restarts must be >= 0 or None")
        if within is not None and within <= 0:
            raise ValueError("within must be > 0 or None")
        self.max_restarts = max_restarts
        self.within = within
        self.decider = decider
        self.clock: Clock = clock or MonotonicClock()

    def new_budget(self) -> RestartBudget:
        """A fresh restart budget for one child."""
        return RestartBudget(self.max_restarts, self.within, self.clock)

    def decide(self, exc: BaseException) -> Directive:
        """Apply the decider; a decider that raises (anything) means ESCALATE."""
        try:
            directive = self.decider(exc)
        except BaseException as raised:  # the supervisor's own cancellation is raised again
            user_error(raised, "a supervisor's decider")
            return Directive.ESCALATE
        if not isinstance(directive, Directive):
            raise TypeError(f"decider returned {directive!r}, not a Directive")
        return directive

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_restarts={self.max_restarts}, within={self.within}, "
            f"decider={getattr(self.decider, '__name__', self.decider)!r})"
        )


class OneForOneStrategy(SupervisorStrategy):
    """The directive applies to the failing child only."""


class AllForOneStrategy(SupervisorStrategy):
    """RESTART and STOP apply to all children of the supervisor; RESUME to the failing one."""

    applies_to_all = True
