"""The lease vocabulary of ``SharedGpuStateCoordinator``: its errors, its answers, its
defaults, the records it keeps and the messages its client sends it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from atomr_accel.actor import ActorRef, Reply
from atomr_accel.core._errors import GpuRuntimeError

__all__ = ["CoordinatorStats", "LeaseError", "LeaseInfo", "LeaseOwnerStopped", "LeaseTimeout",
           "StaleLeaseToken"]

WRITE: Final = "write"
READ: Final = "read"
LEASE_SECS: Final = 30.0
"""Default lease time: a lease not renewed for this long expires."""
ACQUIRE_TIMEOUT: Final = 10.0
"""The original's ``acquire_write`` time-out default, seconds."""
CALL_TIMEOUT: Final = 5.0
"""Time-out of the coordinator's quick calls (release, renew, check, stats)."""
_ANSWER_GRACE: Final = 5.0
"""How much longer than an acquire's own time-out its ask waits (the coordinator answers
a time-out itself, with ``LeaseTimeout``)."""


class LeaseError(GpuRuntimeError):
    """Base of the coordinator's errors."""


class LeaseTimeout(LeaseError, TimeoutError):
    """An acquire waited ``timeout_secs`` without getting its lease (the queue behind it
    is unchanged), or a fenced call ran past its ``timeout_secs``."""


class StaleLeaseToken(LeaseError):
    """A token that is not a live lease (released, expired, its owner dead, never issued,
    or of the wrong kind): whoever holds it may not touch the shared state."""

    def __init__(self, token: object, why: str) -> None:
        super().__init__(f"lease token {token!r} is stale: {why}")
        self.token = token


class LeaseOwnerStopped(LeaseError):
    """The actor given as an acquire's ``owner`` stopped before the lease was granted."""


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """A live lease: its token, holder, kind (``"write"`` or ``"read"``) and the seconds
    left before it expires (on the coordinator's clock)."""

    token: int
    agent_id: str | int
    mode: str
    expires_in: float


@dataclass(frozen=True, slots=True)
class CoordinatorStats:
    """The coordinator's state and counters.

    ``writer`` is the write lease's token (None when none is held), ``readers``
    the read leases' tokens, ``waiting`` the queued acquires, ``last_token``
    the newest token issued. Counters: leases ``granted``, ``expired``,
    ``released`` by their holders, released because their ``owner`` died
    (``owner_releases``), releases of stale tokens (``stale_releases``,
    no-ops), acquires that timed out (``timeouts``) and stale tokens refused
    by ``check``, ``renew`` and ``fenced`` (``refused``).
    """

    writer: int | None
    readers: tuple[int, ...]
    waiting: int
    last_token: int
    granted: int
    expired: int
    released: int
    owner_releases: int
    stale_releases: int
    timeouts: int
    refused: int


class _Tokens:
    """The last token issued; held by the Props, so a restarted coordinator (which
    forgets its leases) still never issues a token twice."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = 0


@dataclass(slots=True)
class _Lease:
    token: int
    agent_id: str | int
    mode: str
    owner: ActorRef | None
    expires_at: float
    pinned: int = 0  # fenced calls running under it: it does not expire meanwhile


@dataclass(slots=True)
class _Waiter:
    id: int
    agent_id: str | int
    mode: str
    owner: ActorRef | None
    reply: Reply


@dataclass(frozen=True, slots=True)
class _Acquire:
    agent_id: str | int
    mode: str
    owner: ActorRef | None
    timeout_secs: float


@dataclass(frozen=True, slots=True)
class _Release:
    token: int
    mode: str


@dataclass(frozen=True, slots=True)
class _Renew:
    token: int


@dataclass(frozen=True, slots=True)
class _Check:
    token: int


@dataclass(frozen=True, slots=True)
class _Fenced:
    token: int
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    timeout_secs: float


@dataclass(frozen=True, slots=True)
class _FencedDone:
    token: int
    renew: bool  # the call ended in time: its lease is renewed


@dataclass(frozen=True, slots=True)
class _GiveUp:
    waiter_id: int
    timed_out: bool


class _Sweep:
    __slots__ = ()


_SWEEP: Final = _Sweep()
