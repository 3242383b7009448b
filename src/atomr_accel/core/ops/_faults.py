"""Fault injection: an op that makes the context fail on purpose (tests, demo, chaos)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from atomr_accel.core._op import Op, require

__all__ = ["FaultKind", "InjectFault"]


class FaultKind(enum.Enum):
    """Which failure to cause."""

    POISON = "poison"
    """A sticky context fault: ``ContextPoisoned`` (on CUDA, a real illegal-address kernel)."""
    OOM = "oom"
    """An allocation failure: ``OutOfMemory``; the context stays usable."""
    UNRECOVERABLE = "unrecoverable"
    """A fault the device cannot come back from: ``Unrecoverable``."""
    CRASH = "crash"
    """The context's process dies at once (SIGKILL); only meaningful on the process host."""


@dataclass(frozen=True, slots=True)
class InjectFault(Op):
    """Make the context fail with ``kind``; ``delay`` seconds of work first (0 for none)."""

    kind: FaultKind
    delay: float = 0.0

    def validate(self) -> None:
        require(isinstance(self.kind, FaultKind), f"kind must be a FaultKind, got {self.kind!r}")
        require(self.delay >= 0, f"delay must be >= 0, got {self.delay}")
