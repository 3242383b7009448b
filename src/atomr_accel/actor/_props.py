"""Props: how to build an actor, and its mailbox settings."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from atomr_accel.actor._actor import Actor

__all__ = ["Mailbox", "Overflow", "Props"]


class Overflow(enum.Enum):
    """What a bounded mailbox does with a message that does not fit."""

    FAIL = "fail"
    """Refuse it: ``tell``/``ask``/``send`` raise ``MailboxFull``; it counts as a dead letter."""
    BACKPRESSURE = "backpressure"
    """Make an awaiting sender (``await ref.send``/``await ref.ask``) wait for room;
    a plain ``tell`` cannot wait and raises ``MailboxFull``."""


@dataclass(frozen=True, slots=True)
class Mailbox:
    """Mailbox settings: ``capacity=None`` is unbounded (the default)."""

    capacity: int | None = None
    overflow: Overflow = Overflow.FAIL

    def __post_init__(self) -> None:
        if self.capacity is not None and self.capacity < 1:
            raise ValueError("mailbox capacity must be >= 1 or None")


class Props:
    """A recipe for an actor: ``factory(*args, **kwargs)`` builds each incarnation.

    The factory runs again on every restart, so it must build a fresh instance.
    ``with_mailbox`` and ``with_stash_capacity`` return changed copies.
    """

    __slots__ = ("args", "factory", "kwargs", "mailbox", "stash_capacity")

    def __init__(self, factory: Callable[..., Actor], /, *args: Any, **kwargs: Any) -> None:
        if not callable(factory):
            raise TypeError(f"Props needs a callable factory, got {factory!r}")
        self.factory = factory
        self.args = args
        self.kwargs = kwargs
        self.mailbox = Mailbox()
        self.stash_capacity: int | None = None

    def with_mailbox(
        self, capacity: int | None, overflow: Overflow = Overflow.FAIL
    ) -> Props:
        """Return a copy whose actor gets a mailbox of ``capacity`` with ``overflow``."""
        return self._copy(mailbox=replace(self.mailbox, capacity=capacity, overflow=overflow))

    def with_stash_capacity(self, capacity: int | None) -> Props:
        """Return a copy whose ``stash()`` raises ``StashOverflow`` past ``capacity``."""
        if capacity is not None and capacity < 0:
            raise ValueError("stash capacity must be >= 0 or None")
        return self._copy(stash_capacity=capacity)

    def _copy(self, **changes: Any) -> Props:
        new = Props(self.factory, *self.args, **self.kwargs)
        new.mailbox = changes.get("mailbox", self.mailbox)
        new.stash_capacity = changes.get("stash_capacity", self.stash_capacity)
        return new

    def new_instance(self) -> Actor:
        """Call the factory."""
        return self.factory(*self.args, **self.kwargs)

    def __repr__(self) -> str:
        name = getattr(self.factory, "__qualname__", repr(self.factory))
        return f"Props({name}, mailbox={self.mailbox}, stash_capacity={self.stash_capacity})"
